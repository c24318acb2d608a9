"""TransformerLens 4.x's checkpoint form (TransformerBridge, native architecture) without 4.x:
our name mapping both ways, its layout written out by hand, a written bridge checkpoint read
back through the same path as `train.checkpoint`, and the one-line refusals. TransformerLens
4.x itself, as the oracle on the same weights, is tests/test_interop4.py's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from models import random_model

from pipeline import checkpoint
from pipeline.config import ModelConfig, TrainConfig
from pipeline.errors import UserError
from pipeline.model import origin, tl_checkpoint

ROOT = Path(__file__).resolve().parents[1]
STANDARD = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="standard", normalization_type=None,
)  # fmt: skip
NORMS = [None, "LN"]


def one_line(caught) -> str:
    text = str(caught.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("norm", NORMS)
def test_to_bridge_and_back_is_exact(norm):
    model = random_model(STANDARD, normalization_type=norm)
    state = model.state_dict()
    config, bridge = tl_checkpoint.bridge_checkpoint(model.cfg, state)
    assert config == {**tl_checkpoint.tl_config(model.cfg), "architecture": tl_checkpoint.NATIVE}
    back = tl_checkpoint.from_bridge_state(bridge, model.cfg)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_bridge_layout_is_linear_heads_concatenated_head_major():
    """q.weight row h * d_head + i is head h's query direction i (nn.Linear's [out, in]); o.weight
    column h * d_head + i is what head h's value direction i writes; unembed.weight is W_U^T."""
    model = random_model(STANDARD)
    state = model.state_dict()
    _, bridge = tl_checkpoint.bridge_checkpoint(model.cfg, state)
    d = STANDARD.d_head
    for h, i in [(0, 0), (1, 3), (2, 2)]:
        for x in "QKV":
            assert torch.equal(
                bridge[f"blocks.1.attn.{x.lower()}.weight"][h * d + i], state[f"blocks.1.attn.W_{x}"][h, :, i]
            )
            assert bridge[f"blocks.1.attn.{x.lower()}.bias"][h * d + i] == state[f"blocks.1.attn.b_{x}"][h, i]
        assert torch.equal(bridge["blocks.1.attn.o.weight"][:, h * d + i], state["blocks.1.attn.W_O"][h, i])
    assert torch.equal(bridge["unembed.weight"], state["unembed.W_U"].T)
    assert torch.equal(bridge["embed.weight"], state["embed.W_E"])
    assert tuple(bridge["blocks.0.attn.q.weight"].shape) == (3 * 4, 16)
    assert tuple(bridge["blocks.0.attn.o.weight"].shape) == (16, 3 * 4)


@pytest.mark.parametrize("norm", NORMS)
def test_a_written_bridge_checkpoint_reads_back_as_the_same_model(tmp_path, norm):
    model = random_model(STANDARD, normalization_type=norm, dtype=torch.float32)
    out = tl_checkpoint.write_bridge_checkpoint(tmp_path / "bridge", model.cfg, model.state_dict())
    saved, _ = checkpoint.load_state(out / "model.safetensors")
    assert "blocks.0.attn.q.weight" in saved and "blocks.0.attn.W_Q" not in saved
    assert json.loads((out / "config.json").read_text())["architecture"] == "TransformerLensNative"
    loaded = tl_checkpoint.load_model(out / "model.safetensors", out / "config.json")
    assert loaded.cfg == model.cfg
    tokens = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


def test_shortformer_has_no_bridge_form_and_nothing_is_written(tmp_path):
    model = random_model("tiny")  # shortformer: our default
    with pytest.raises(UserError) as caught:
        tl_checkpoint.write_bridge_checkpoint(tmp_path / "bridge", model.cfg, model.state_dict())
    assert one_line(caught).startswith("positional_embedding_type = 'shortformer': shortformer positions")
    assert not (tmp_path / "bridge").exists()


def test_native_attention_scale_is_read_as_the_bridge_computes_it():
    """TransformerLens 4.3's native attention divides by sqrt(d_head) unless use_attn_scale and
    attn_scale > 0 (model_bridge/sources/native/model.py); HookedTransformer divides by 1 when
    use_attn_scale is false (refused: tests/test_checkpoint.py)."""
    bridge = {**tl_checkpoint.tl_config(STANDARD), "architecture": "TransformerLensNative"}
    for change in (
        {"use_attn_scale": False},
        {"attn_scale": -1.0},
        {"use_attn_scale": False, "attn_scale": 5.0},
    ):
        assert tl_checkpoint.from_tl_config({**bridge, **change}) == STANDARD
    with pytest.raises(UserError, match=r"^config.json: attn_scale = 5.0: must be sqrt\(d_head\) = 2$"):
        tl_checkpoint.from_tl_config({**bridge, "attn_scale": 5.0})
    absent = {k: v for k, v in bridge.items() if k != "normalization_type"}  # the bridge's default: LN
    assert tl_checkpoint.from_tl_config(absent).normalization_type == "LN"


def write_bridge_state(tmp_path, state, config=None):
    checkpoint.save_state(tmp_path / "model.safetensors", state)
    config = config or {**tl_checkpoint.tl_config(STANDARD), "architecture": "TransformerLensNative"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "model.safetensors", tmp_path / "config.json"


def bridge_state():
    return tl_checkpoint.bridge_checkpoint(STANDARD, random_model(STANDARD).state_dict())[1]


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"blocks.0.mlp.in.weight": torch.zeros(64, 16)},
            "blocks.0.mlp.in.weight: not an attention-only model (it has MLP weights)",
        ),
        (
            {"blocks.1.attn.q.weight": torch.zeros(8, 16)},
            "blocks.1.attn.q.weight: shape [8, 16] disagrees with n_heads x d_head = 3 x 4 from ",
        ),
        (
            {"blocks.0.attn.hook_z": torch.zeros(1)},
            "blocks.0.attn.hook_z: unexpected key: not a TransformerBridge state dict",
        ),
    ],
    ids=["mlp", "heads", "unknown"],
)
def test_bad_bridge_state_dicts_are_refused_naming_the_key(tmp_path, change, message):
    path, config = write_bridge_state(tmp_path, {**bridge_state(), **change})
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(path, config)
    assert one_line(caught).startswith(f"{path}: {message}")


def test_a_hugging_face_config_is_refused_naming_model_type(tmp_path):
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 16}
    path, config = write_bridge_state(tmp_path, bridge_state(), hf)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(path, config)
    assert one_line(caught).startswith(
        f"{config}: model_type = 'gpt2': a Hugging Face transformers config.json"
    )


def test_a_bridge_state_dict_without_config_json_is_refused(tmp_path):
    path, _ = write_bridge_state(tmp_path, bridge_state())
    with pytest.raises(UserError, match="n_heads cannot be read from its shapes"):
        tl_checkpoint.read_checkpoint(path, {"positional_embedding_type": "standard"})


def test_train_checkpoint_may_name_a_saved_models_directory(tmp_path):
    model = random_model(STANDARD)
    tl_checkpoint.write_bridge_checkpoint(tmp_path / "seed0", model.cfg, model.state_dict())
    (tmp_path / "empty").mkdir()
    t = TrainConfig(source="load", checkpoint="seed{seed}", checkpoint_dir=str(tmp_path))
    assert origin.checkpoint_path(t, 0) == tmp_path / "seed0" / "model.safetensors"
    chosen = origin.choose(t, 0)
    assert chosen["config"]["path"] == str(tmp_path / "seed0" / "config.json")
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(replace(t, checkpoint="empty"), 0)
    assert one_line(caught) == (
        f"train.checkpoint = 'empty': {tmp_path / 'empty'} is a directory without model.safetensors: "
        "name the weights file"
    )


def test_a_weight_with_no_bridge_counterpart_is_refused_naming_it():
    """An MLP weight under HookedTransformer's names (blocks.0.mlp.W_in) has no native
    attention-only bridge name: refused in one line naming the key, nothing else."""
    model = random_model(STANDARD)
    state = {**model.state_dict(), "blocks.0.mlp.W_in": torch.zeros(16, 64)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_checkpoint(model.cfg, state)
    assert one_line(caught) == (
        "blocks.0.mlp.W_in: has no TransformerBridge (native, attention-only) counterpart"
    )


def test_a_bridge_directory_named_as_train_checkpoint_is_composed_recorded_and_loaded(tmp_path):
    """docs/public-models.md: `train.checkpoint` may name the directory holding a bridge's
    model.safetensors and config.json. `python -m pipeline.params` accepts it (its value and its
    files), the origin stage records the files in it, and the train stage loads the same model."""
    from dvc_repo import TINY

    from pipeline import params
    from stages import origin as origin_stage
    from stages import train as train_stage

    model = random_model(STANDARD, dtype=torch.float32)
    tl_checkpoint.write_bridge_checkpoint(tmp_path / "checkpoints" / "bridge", model.cfg, model.state_dict())
    load = ["train=load", "train.checkpoint=bridge", f"train.checkpoint_dir={tmp_path / 'checkpoints'}"]
    p = tmp_path / "params.yaml"
    assert params.main([*TINY, *load, "--conf", str(ROOT / "conf"), "--out", str(p)]) == 0
    assert origin_stage.main(["--params", str(p), "--seed", "0", "--out", str(tmp_path / "origin")]) == 0
    chosen = json.loads((tmp_path / "origin" / "origin.json").read_text())
    assert chosen["checkpoint"]["path"] == str(tmp_path / "checkpoints" / "bridge" / "model.safetensors")
    origin_json = str(tmp_path / "origin" / "origin.json")
    assert train_stage.main(["--params", str(p), "--seed", "0", "--origin", origin_json,
                             "--out", str(tmp_path / "train"), "--no-progress"]) == 0  # fmt: skip
    loaded = tl_checkpoint.load_model(
        tmp_path / "train" / "model.safetensors", tmp_path / "train" / "config.json"
    )
    tokens = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
