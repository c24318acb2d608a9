"""pipeline/model/tl_checkpoint.py against TransformerLens as the oracle, both directions. 3.9
(`interop`): our checkpoints load into `HookedTransformer` with equal logits, a random
attention-only `HookedTransformer` (state dict + config.json, LayerNorm folded or not) loads into
ours with equal logits, and such a checkpoint runs the whole pipeline to figures. 4.x (`interop4`,
in .venv-tl4): our checkpoints written in 4.x's form load into `TransformerBridge.boot_native` with
equal logits and attention patterns; a bridge's weights (live, or saved as 4.x's training loop
saves them) read into ours with equal logits; our name mapping is 4.x's `convert_tl_checkpoint`;
the round trip is exact; bridges our model cannot run are refused naming the field."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from models import random_model
from safetensors.torch import load_file
from tl_oracle import SHAPE, TOKENS, bridge_of, hooked, ours, random_bridge, tl_config_json

from pipeline import checkpoint
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint

VARIANTS = list(itertools.product(["standard", "shortformer"], [None, "LN"]))
NORMS = [None, "LN"]


@pytest.mark.interop
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_our_checkpoint_loads_into_hooked_transformer(tmp_path, pos, norm):
    tl = pytest.importorskip("transformer_lens")
    cfg = ModelConfig(positional_embedding_type=pos, normalization_type=norm, **SHAPE)
    ours = random_model(cfg, seed=1, dtype=torch.float32, bias_std=0.1)
    checkpoint.save_state(tmp_path / "model.safetensors", ours.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(cfg)))

    config = json.loads((tmp_path / "config.json").read_text())
    theirs = tl.HookedTransformer(
        tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"})
    )
    state, _ = checkpoint.load_state(tmp_path / "model.safetensors")
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith((".mask", ".IGNORE")) for k in missing)
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(theirs(tokens), ours(tokens), atol=1e-5, rtol=0)


@pytest.mark.interop
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_hooked_transformer_checkpoint_loads_into_ours(tmp_path, pos, norm):
    pytest.importorskip("transformer_lens")
    config = {
        **SHAPE,
        "positional_embedding_type": pos,
        "normalization_type": norm,
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=3)
    state = theirs.state_dict()  # includes the mask and IGNORE buffers
    assert any(k.endswith(".mask") for k in state)
    torch.save(state, tmp_path / "model.pth")  # a plain tensor dict: loads with weights_only=True
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pth", tmp_path / "config.json")
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(ours(tokens), theirs(tokens), atol=1e-5, rtol=0)
        assert torch.allclose(ours.run_with_cache(tokens)[0], theirs(tokens), atol=1e-5, rtol=0)


@pytest.mark.interop
def test_processed_hooked_transformer_lnpre_loads(tmp_path):
    """TransformerLens folds LayerNorm on from_pretrained, leaving normalization_type LNPre."""
    pytest.importorskip("transformer_lens")
    config = {
        **SHAPE,
        "positional_embedding_type": "standard",
        "normalization_type": "LN",
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=5)
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = theirs(tokens).log_softmax(-1)
    theirs.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert theirs.cfg.normalization_type == "LNPre"
    torch.save(theirs.state_dict(), tmp_path / "model.pt")
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pt", tmp_path / "config.json")
    with torch.no_grad():
        assert torch.allclose(ours(tokens).log_softmax(-1), before, atol=1e-5)


@pytest.mark.interop
@pytest.mark.slow
def test_transformer_lens_checkpoint_runs_the_whole_pipeline_to_figures(tmp_path):
    """A random HookedTransformer in TransformerLens's attn-only-2l layout (LayerNorm,
    standard positions, a vocabulary of its own), shrunk, saved as TransformerLens saves
    it (torch.save of its state dict, config.json from its cfg): the real `dvc repro`
    with train.source=load produces every figure and the report."""
    pytest.importorskip("transformer_lens")
    from dvc_repo import dvc, git, make_repo, set_config

    repo = make_repo(tmp_path / "repo", commit=False)
    config = {
        "n_layers": 2,
        "n_heads": 4,
        "d_head": 8,
        "d_model": 32,
        "n_ctx": 32,
        "d_vocab": 300,
        "positional_embedding_type": "standard",
        "normalization_type": "LN",
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=11)
    (repo / "checkpoints" / "attn-only-2l").mkdir(parents=True)
    torch.save(theirs.state_dict(), repo / "checkpoints" / "attn-only-2l" / "model.pth")
    (repo / "checkpoints" / "attn-only-2l" / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    # after the checkpoint exists: the config step refuses a local checkpoint that does not
    set_config(repo, ["train.source=load", "train.checkpoint=attn-only-2l/model.pth"])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "TransformerLens checkpoint")
    dvc(repo, "repro")

    out = repo / "outputs"
    loaded = tl_checkpoint.load_model(out / "train/seed0/model.safetensors", out / "train/seed0/config.json")
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        assert torch.allclose(loaded(tokens), theirs(tokens), atol=1e-5)
    manifest = json.loads((out / "train/seed0/manifest.json").read_text())
    assert manifest["checkpoint"]["path"].endswith("attn-only-2l/model.pth")
    steps = json.loads((out / "weights/seed0/summary.json").read_text())["steps"]
    assert any(s.startswith("folded LayerNorm") for s in steps)
    for name in ("errata_diagram.png", "composition_K.png"):
        assert (out / "figures/seed0" / name).stat().st_size > 0
    assert (out / "report/index.html").is_file()


@pytest.mark.interop4
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


@pytest.mark.interop4
@pytest.mark.parametrize("norm", NORMS)
def test_our_name_mapping_is_transformer_lens_4s_own(bridge_class, norm):
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    model = ours(norm)
    bridge = bridge_of(bridge_class, model)
    _, mine = tl_checkpoint.bridge_checkpoint(model.cfg, model.state_dict())
    theirs = convert_tl_checkpoint(dict(model.state_dict()), bridge.cfg)
    assert mine.keys() == theirs.keys() == bridge.state_dict().keys()
    assert all(torch.equal(mine[k], theirs[k]) and torch.equal(mine[k], bridge.state_dict()[k]) for k in mine)


@pytest.mark.interop4
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


@pytest.mark.interop4
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


@pytest.mark.interop4
def test_a_folded_bridge_reads_with_the_same_predictions(bridge_class):
    bridge = random_bridge(bridge_class, "LN", seed=5)
    with torch.no_grad():
        before = bridge(TOKENS).log_softmax(-1)
    bridge.process_weights(fold_ln=True, center_writing_weights=True, center_unembed=True)
    state, config = tl_checkpoint.bridge_state_dict(bridge)
    model = tl_checkpoint.build_model(tl_checkpoint.from_tl_config(config), state)
    with torch.no_grad():
        assert torch.allclose(model(TOKENS).log_softmax(-1), before, atol=1e-5)


@pytest.mark.interop4
@pytest.mark.parametrize(
    "fields,field",
    [
        ({"attn_only": False, "d_mlp": 64}, "attn_only = False"),
        ({"positional_embedding_type": "rotary"}, "positional_embedding_type = 'rotary'"),
        ({"normalization_type": "RMS"}, "normalization_type = 'RMS'"),
        ({"n_key_value_heads": 2}, "n_key_value_heads = 2"),
    ],
    ids=["mlp", "rotary", "rms", "gqa"],
)
def test_bridges_our_model_cannot_run_are_refused_naming_the_field(bridge_class, fields, field):
    bridge = random_bridge(bridge_class, "LN", **fields)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(bridge)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"bridge.cfg: {field}: ")
