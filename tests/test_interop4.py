"""TransformerLens 4.x (4.3, the `interop4` extra, in its own venv: `make test` runs these in
.venv-tl4) as the oracle on the weights of tests/test_interop.py's 3.9 tests: our checkpoints
written in 4.x's form load into `TransformerBridge.boot_native` with equal logits and attention
patterns; a bridge's weights (live, or its state dict saved as 4.x's own training loop saves it)
read into ours with equal logits; our name mapping equals 4.x's `convert_tl_checkpoint`; the
round trip is exact; and the notebook API on a bridge equals the composition stage's files.
Shortformer positions, our default, have no 4.x form (tests/test_bridge_format.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from models import random_model
from safetensors.torch import load_file

from pipeline import checkpoint, io, params
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from stages import composition as composition_stage
from stages import weights as weights_stage

pytestmark = pytest.mark.interop4
PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"

# tests/test_interop.py's shape and weights (seed 1, float32, biases std 0.1), standard positions
SHAPE = {"n_layers": 2, "n_heads": 4, "d_head": 8, "d_model": 32, "n_ctx": 16, "d_vocab": 50}
NORMS = [None, "LN"]
TOKENS = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))


def ours(norm: str | None, seed: int = 1):
    cfg = ModelConfig(positional_embedding_type="standard", normalization_type=norm, **SHAPE)
    return random_model(cfg, seed=seed, dtype=torch.float32, bias_std=0.1)


def bridge_of(bridge_class, model):
    """A bridge loaded from our checkpoint written in 4.x's form, as a 4.x user loads it."""
    config, state = tl_checkpoint.bridge_checkpoint(model.cfg, model.state_dict())
    bridge = bridge_class.boot_native(json.loads(json.dumps(config)))
    bridge.load_state_dict(state, strict=True)
    return bridge.eval()


def random_bridge(bridge_class, norm: str | None, seed: int = 3, **fields):
    """TransformerLens 4.x's own random attention-only bridge, every parameter perturbed (LN too)."""
    config = {**SHAPE, "attn_only": True, "positional_embedding_type": "standard", "normalization_type": norm}
    bridge = bridge_class.boot_native({**config, **fields, "seed": seed, "device": "cpu"})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in bridge.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if "ln" in name else 0.05))
    return bridge.eval()


@pytest.mark.parametrize("norm", NORMS)
def test_our_checkpoint_loads_into_a_bridge_with_equal_logits_and_patterns(tmp_path, bridge_class, norm):
    model = ours(norm)
    out = tl_checkpoint.write_bridge_checkpoint(tmp_path / "bridge", model.cfg, model.state_dict())
    bridge = bridge_class.boot_native(json.loads((out / "config.json").read_text()))
    loaded = bridge.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    assert not loaded.missing_keys and not loaded.unexpected_keys
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(TOKENS)
        our_logits, our_cache = model.run_with_cache(TOKENS)
    assert torch.allclose(logits, our_logits, atol=1e-5, rtol=0)
    for layer in range(SHAPE["n_layers"]):
        theirs = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, query_pos, key_pos]
        assert torch.allclose(theirs, our_cache.pattern[layer], atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", NORMS)
def test_our_name_mapping_is_transformer_lens_4s_own(bridge_class, norm):
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    model = ours(norm)
    bridge = bridge_of(bridge_class, model)
    _, mine = tl_checkpoint.bridge_checkpoint(model.cfg, model.state_dict())
    theirs = convert_tl_checkpoint(dict(model.state_dict()), bridge.cfg)
    assert mine.keys() == theirs.keys() == bridge.state_dict().keys()
    assert all(torch.equal(mine[k], theirs[k]) and torch.equal(mine[k], bridge.state_dict()[k]) for k in mine)


@pytest.mark.parametrize("norm", NORMS)
def test_a_bridge_reads_into_ours_with_equal_logits_and_back_exactly(bridge_class, norm):
    bridge = random_bridge(bridge_class, norm)
    state, config = tl_checkpoint.bridge_state_dict(bridge)
    model = tl_checkpoint.build_model(tl_checkpoint.from_tl_config(config), state)
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), bridge(TOKENS), atol=1e-5, rtol=0)
    _, again = tl_checkpoint.bridge_checkpoint(model.cfg, state)  # the round trip: bit for bit
    original = bridge.state_dict()
    assert again.keys() == original.keys() and all(torch.equal(again[k], original[k]) for k in again)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_bridges_saved_state_dict_loads_as_train_checkpoint(tmp_path, bridge_class, suffix):
    """4.x's own training loop saves `torch.save(model.state_dict(), ...)` (tools/training.py);
    its config is `bridge.cfg.to_dict()` (a dtype and a device: written as strings)."""
    bridge = random_bridge(bridge_class, "LN", seed=4)
    path = tmp_path / f"model{suffix}"
    if suffix == ".pt":
        torch.save(bridge.state_dict(), path)
    else:
        checkpoint.save_state(path, bridge.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(bridge.cfg.to_dict(), default=str))
    model = tl_checkpoint.load_model(path, tmp_path / "config.json")
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), bridge(TOKENS), atol=1e-5, rtol=0)


def test_a_folded_bridge_reads_with_the_same_predictions(bridge_class):
    bridge = random_bridge(bridge_class, "LN", seed=5)
    with torch.no_grad():
        before = bridge(TOKENS).log_softmax(-1)
    bridge.process_weights(fold_ln=True, center_writing_weights=True, center_unembed=True)
    state, config = tl_checkpoint.bridge_state_dict(bridge)
    model = tl_checkpoint.build_model(tl_checkpoint.from_tl_config(config), state)
    with torch.no_grad():
        assert torch.allclose(model(TOKENS).log_softmax(-1), before, atol=1e-5)


@pytest.mark.parametrize(
    "fields,message",
    [
        (
            {"attn_only": False, "d_mlp": 64},
            "bridge.cfg: attn_only = False: not an attention-only model",
        ),
        (
            {"positional_embedding_type": "rotary"},
            "bridge.cfg: positional_embedding_type = 'rotary': ",
        ),
        ({"normalization_type": "RMS"}, "bridge.cfg: normalization_type = 'RMS': "),
        ({"n_key_value_heads": 2}, "bridge.cfg: n_key_value_heads = 2: grouped-query attention"),
    ],
    ids=["mlp", "rotary", "rms", "gqa"],
)
def test_bridges_our_model_cannot_run_are_refused_naming_the_field(bridge_class, fields, message):
    bridge = random_bridge(bridge_class, "LN", **fields)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(bridge)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(message)


def test_the_api_on_a_bridge_equals_the_composition_stages_files(tmp_path, bridge_class):
    """The same weights through the weights and composition stages (their entry points, on
    params.yaml's analysis settings) and through `api.composition` on a bridge holding them:
    every table and the summary written by the same writer, byte for byte."""
    from pipeline import api  # the notebook API's module, imported where it is tested

    model = random_model(replace(random_model("tiny").cfg, positional_embedding_type="standard"), seed=7)
    model = model.float()
    train = tmp_path / "train"
    checkpoint.save_state(io.ensure_dir(train) / "model.safetensors", model.state_dict())
    io.write_json(train / "config.json", tl_checkpoint.tl_config(model.cfg))
    argv = ["--params", str(PARAMS), "--model", str(train / "model.safetensors")]
    argv += ["--config", str(train / "config.json")]
    assert weights_stage.main([*argv, "--out", str(tmp_path / "weights")]) == 0
    heads = str(tmp_path / "weights" / "heads.safetensors")
    stage = tmp_path / "composition"
    assert (
        composition_stage.main(
            ["--params", str(PARAMS), "--weights", heads, "--seed", "3", "--out", str(stage)]
        )
        == 0
    )

    result = api.composition(bridge_of(bridge_class, model), seed=3, config=params.load(PARAMS))
    mine = tmp_path / "api"
    for name in ("scores", "invariant", "projection", "placebo", "channels", "channels_placebo"):
        io.write_csv(mine / f"{name}.csv", getattr(result, name))
        assert (mine / f"{name}.csv").read_bytes() == (stage / f"{name}.csv").read_bytes(), name
    io.write_json(mine / "summary.json", result.summary)
    assert (mine / "summary.json").read_bytes() == (stage / "summary.json").read_bytes()


def test_the_projection_kernel_is_transformer_lens_4s_head_affinity(bridge_class):
    """Our projection measure (pipeline/circuits/projection.py) on a bridge's weights equals 4.x's
    `attention_head_subspace_affinity` (normalized) for every kind and later pair."""
    from transformer_lens.tools.analysis.projection_kernel import attention_head_subspace_affinity

    from pipeline.circuits import projection, weights

    bridge = random_bridge(bridge_class, None)
    state, _ = tl_checkpoint.bridge_state_dict(bridge)
    ours = projection.projection_scores(weights.from_state_dict({k: v.double() for k, v in state.items()}))
    for kind in ("Q", "K", "V"):
        theirs = attention_head_subspace_affinity(bridge, target_role=kind).normalized.double()
        mine = ours[ours["kind"] == kind]
        index = [
            torch.as_tensor(mine[c].to_numpy()) for c in ("src_layer", "src_head", "dst_layer", "dst_head")
        ]
        want = theirs[tuple(index)]
        assert mine["score"].tolist() == pytest.approx(want.tolist(), abs=1e-6), kind
