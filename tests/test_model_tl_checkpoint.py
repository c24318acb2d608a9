"""pipeline/model/tl_checkpoint.py: checkpoints in TransformerLens's formats, read and written.

HookedTransformer config.json and state dicts checked against our model, TransformerBridge (4.x)
state dicts and config to ours and back bit for bit, and each refusal naming the field or key."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from models import random_model
from refusals import one_line
from safetensors.torch import load_file
from tl_oracle import SHAPE, TOKENS, bridge_of, hooked, ours, random_bridge, tl_config_json

from pipeline import checkpoint
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import Transformer

STANDARD_LN = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="standard", normalization_type="LN",
)  # fmt: skip


class Bridge:
    """What `bridge_state_dict` reads of a TransformerBridge: `cfg.to_dict()` and `state_dict()`."""

    def __init__(self, config: dict, state: dict):
        self.cfg = SimpleNamespace(to_dict=lambda: dict(config))
        self._state = state

    def state_dict(self) -> dict:
        return dict(self._state)


CFG = ModelConfig(
    n_layers=2, n_heads=2, d_head=4, d_model=16, n_ctx=16, d_vocab=24, positional_embedding_type="standard"
)


STANDARD = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="standard", normalization_type=None,
)  # fmt: skip


NORMS = [None, "LN"]


def write_bridge_state(tmp_path, state, config=None):
    checkpoint.save_state(tmp_path / "model.safetensors", state)
    config = config or {**tl_checkpoint.tl_config(STANDARD), "architecture": "TransformerLensNative"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "model.safetensors", tmp_path / "config.json"


def bridge_state():
    return tl_checkpoint.bridge_checkpoint(STANDARD, random_model(STANDARD).state_dict())[1]


def test_a_bridge_reads_in_process_as_our_state_and_config():
    model = random_model(STANDARD_LN, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD_LN, model.state_dict())
    state, tl = tl_checkpoint.bridge_state_dict(Bridge(config, bridge_state))
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert tl == tl_checkpoint.tl_config(STANDARD_LN)


def test_a_bridge_whose_shapes_disagree_with_its_config_names_the_config():
    model = random_model(STANDARD_LN, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD_LN, model.state_dict())
    bad = {**bridge_state, "blocks.1.attn.q.weight": torch.zeros(8, 16)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge(config, bad))
    # the state dict and the weight, its shape, the config's heads and where the config came from
    heads = ("[8, 16]", "n_heads x d_head = 3 x 4")
    assert caught.value.where == "bridge.state_dict(): blocks.1.attn.q.weight"
    assert one_line(caught, *heads).endswith("bridge.cfg")
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_bridge_state(bad, STANDARD_LN, "their/config.json")
    assert caught.value.where == "blocks.1.attn.q.weight"
    assert one_line(caught, *heads).endswith(" their/config.json")
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_bridge_state(bad, STANDARD_LN)  # the default source
    assert one_line(caught, *heads).endswith(" config.json")


def test_a_bridge_whose_config_is_refused_names_bridge_cfg():
    """A bridge with MLPs (attn_only false) is refused before its state dict is read, naming
    `bridge.cfg`, the object its config came from."""
    model = random_model(STANDARD_LN, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD_LN, model.state_dict())
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge({**config, "attn_only": False}, bridge_state))
    assert (caught.value.where, caught.value.value) == ("bridge.cfg: attn_only", False)
    one_line(caught)


def test_a_written_bridge_checkpoint_says_its_format(tmp_path):
    model = random_model(STANDARD_LN, dtype=torch.float32)
    out = tl_checkpoint.write_bridge_checkpoint(tmp_path / "bridge", STANDARD_LN, model.state_dict())
    _, metadata = checkpoint.load_state(out / "model.safetensors")
    assert metadata == {"format": "TransformerBridge"}


def test_attn_scale_must_be_sqrt_d_head_even_for_one_dimensional_heads():
    one = replace(STANDARD_LN, d_head=1, normalization_type=None)
    assert tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(one), "attn_scale": 1.0}) == one
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(one), "attn_scale": 3.0})
    assert (caught.value.where, caught.value.value) == ("config.json: attn_scale", 3.0)
    one_line(caught, "sqrt(d_head) = 1")


def test_a_bridges_positive_attn_scale_is_what_it_divides_by():
    """TransformerLens 4.3's native attention divides by attn_scale whenever it is > 0 (0.5 too),
    and by sqrt(d_head) when it is absent: 0.5 is refused, absent is read as sqrt(d_head)."""
    bridge = {**tl_checkpoint.tl_config(STANDARD_LN), "architecture": tl_checkpoint.NATIVE}
    assert "attn_scale" not in bridge and tl_checkpoint.from_tl_config(bridge) == STANDARD_LN
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config({**bridge, "attn_scale": 0.5})
    assert (caught.value.where, caught.value.value) == ("config.json: attn_scale", 0.5)
    one_line(caught, "sqrt(d_head) = 2")


def test_a_bridge_missing_a_weight_is_refused_naming_its_state_dict_and_the_weight():
    """from_bridge_state maps only the keys present; the check against our model finds the
    unembedding missing and names the object it came from, `bridge.state_dict()`."""
    model = random_model(STANDARD_LN, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD_LN, model.state_dict())
    del bridge_state["unembed.weight"]
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge(config, bridge_state))
    assert caught.value.where == "bridge.state_dict(): unembed.W_U"
    one_line(caught)


def test_a_state_dict_is_a_bridges_only_with_embed_weight_and_without_embed_w_e():
    one = torch.zeros(1)
    assert tl_checkpoint.is_bridge_state({"embed.weight": one}) is True
    assert tl_checkpoint.is_bridge_state({"embed.W_E": one}) is False
    assert tl_checkpoint.is_bridge_state({"embed.weight": one, "embed.W_E": one}) is False
    assert tl_checkpoint.is_bridge_state({}) is False
    assert tl_checkpoint.is_bridge_state({"pos_embed.W_pos": one}) is False


def test_a_config_json_that_is_not_an_object_is_refused_naming_it():
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config([1, 2])
    assert caught.value.where == "config.json"
    one_line(caught)


def test_a_config_json_without_a_size_is_refused_naming_the_first_missing_field():
    raw = {k: v for k, v in tl_checkpoint.tl_config(CFG).items() if k not in ("d_model", "n_ctx")}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config(raw, "their/config.json")
    one_line(caught)
    assert (caught.value.where, caught.value.problem) == (
        "their/config.json: d_model",
        "missing from config.json",
    )


def test_neel_nandas_config_without_normalization_keeps_its_normalization_type():
    raw = {"n_layers": 2, "shortformer_pos": True, "normalization_type": "LN"}
    out = tl_checkpoint.neel_translated(raw)
    assert out["normalization_type"] == "LN" and out["positional_embedding_type"] == "shortformer"
    assert tl_checkpoint.neel_translated({"normalization": None})["normalization_type"] is None


def test_a_bad_field_of_a_checkpoint_without_config_json_names_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "model.safetensors"
    checkpoint.save_state(path, Transformer(CFG).state_dict())
    fields = {"positional_embedding_type": "alibi", "normalization_type": None, "attn_only": True}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.read_checkpoint(path, fields)
    # the file, then the config read off its shapes, then the field, its value and the choices
    assert caught.value.where == f"{path}: the shapes in {path}: positional_embedding_type"
    assert caught.value.value == "alibi"
    one_line(caught, "standard, shortformer")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_tensor_with_nan_or_inf_is_refused_naming_the_file_and_the_tensor(bad):
    torch.manual_seed(0)
    state = dict(Transformer(CFG).state_dict())
    with torch.device("meta"):
        expected = Transformer(CFG).state_dict()
    clean = tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert clean.keys() == expected.keys()
    state["blocks.1.attn.W_V"] = state["blocks.1.attn.W_V"].clone()
    state["blocks.1.attn.W_V"][1, 3, 2] = bad
    with pytest.raises(UserError) as caught:
        tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert caught.value.where == "m.safetensors: blocks.1.attn.W_V"
    one_line(caught)


def test_mlp_weights_where_the_config_is_attention_only_are_refused_naming_the_first_mlp_key():
    """A TransformerLens-layout checkpoint with MLPs whose config.json says attention-only is
    refused by the alphabetically first MLP key, inside the file's name, not loaded without them."""
    torch.manual_seed(0)
    state = dict(Transformer(CFG).state_dict())
    state["blocks.1.mlp.W_in"] = torch.zeros(16, 64)
    state["blocks.0.mlp.b_out"] = torch.zeros(16)
    with torch.device("meta"):
        expected = Transformer(CFG).state_dict()
    with pytest.raises(UserError) as caught:
        tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert caught.value.where == "m.safetensors: blocks.0.mlp.b_out"
    one_line(caught)


def test_a_config_with_mlps_reads_its_size_activation_and_placement():
    """attn_only false: d_mlp, act_fn and parallel_attn_mlp are read; absent attn_only follows d_mlp
    (a config that names no d_mlp is attention-only); an activation or a gated MLP our model does not
    compute is refused naming the field."""
    base = {**SHAPE, "positional_embedding_type": "standard", "normalization_type": "LN"}
    mlp = {**base, "attn_only": False, "d_mlp": 64, "act_fn": "gelu_new", "parallel_attn_mlp": True}
    cfg = tl_checkpoint.from_tl_config(mlp)
    assert (cfg.d_mlp, cfg.act_fn, cfg.parallel_attn_mlp, cfg.attn_only) == (64, "gelu_new", True, False)
    assert tl_checkpoint.from_tl_config({**base, "d_mlp": 64, "act_fn": "relu"}).d_mlp == 64
    assert tl_checkpoint.from_tl_config(base).attn_only
    assert tl_checkpoint.from_tl_config(tl_checkpoint.tl_config(cfg)) == cfg
    for field, value in [("act_fn", "solu_ln"), ("gated_mlp", True), ("d_mlp", None)]:
        with pytest.raises(UserError) as caught:
            tl_checkpoint.from_tl_config({**mlp, field: value})
        assert caught.value.where == f"config.json: {field}"
        one_line(caught)


def test_attn_scale_is_not_judged_against_a_d_head_that_is_not_a_positive_integer():
    """sqrt(d_head) means nothing for d_head = 0, -4, 4.0 or null: the attention scale passes, and
    d_head itself is refused by name (not `attn_scale: must be sqrt(d_head) = 0`, nor math's
    domain error on sqrt(-4))."""
    for d_head in (0, -4, 4.0, None):
        assert tl_checkpoint._is_sqrt_d_head(3.0, {"d_head": d_head}) is True
    assert tl_checkpoint._is_sqrt_d_head(2.0, {"d_head": 4}) is True
    assert tl_checkpoint._is_sqrt_d_head(3.0, {"d_head": 4}) is False
    raw = tl_checkpoint.tl_config(CFG)
    for d_head in (0, -4, 4.0):
        with pytest.raises(UserError) as caught:
            tl_checkpoint.from_tl_config({**raw, "d_head": d_head, "attn_scale": 3.0})
        assert (caught.value.where, caught.value.value) == ("config.json: d_head", d_head)
        assert "attn_scale" not in one_line(caught)


def test_a_checkpoint_without_config_json_missing_a_sized_weight_is_refused_naming_it():
    """Without config.json the sizes come from W_Q, W_pos and W_E: the first one missing is named."""
    torch.manual_seed(0)
    state = Transformer(CFG).state_dict()
    sizes = {"n_layers": 2, "n_heads": 2, "d_head": 4, "d_model": 16, "n_ctx": 16, "d_vocab": 24}
    assert tl_checkpoint.inferred_config(state, {"attn_only": True}) == {"attn_only": True, **sizes}
    for missing in ("blocks.0.attn.W_Q", "pos_embed.W_pos", "embed.W_E"):
        partial = {k: v for k, v in state.items() if k != missing}
        with pytest.raises(UserError) as caught:
            tl_checkpoint.inferred_config(partial, {})
        assert caught.value.where == missing
        one_line(caught)


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
    assert (caught.value.where, caught.value.value) == ("positional_embedding_type", "shortformer")
    one_line(caught)
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
    unset = {k: v for k, v in bridge.items() if k != "use_attn_scale"}  # the bridge's default: True
    for divides_by_5 in ({**bridge, "attn_scale": 5.0}, {**unset, "attn_scale": 5.0}):
        with pytest.raises(UserError) as caught:
            tl_checkpoint.from_tl_config(divides_by_5)
        assert (caught.value.where, caught.value.value) == ("config.json: attn_scale", 5.0)
        one_line(caught, "sqrt(d_head) = 2")
    absent = {k: v for k, v in bridge.items() if k != "normalization_type"}  # the bridge's default: LN
    assert tl_checkpoint.from_tl_config(absent).normalization_type == "LN"


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("blocks.0.mlp.in.weight", torch.zeros(64, 16), ()),
        ("blocks.1.attn.q.weight", torch.zeros(8, 16), ("[8, 16]", "n_heads x d_head = 3 x 4")),
        ("blocks.0.attn.hook_z", torch.zeros(1), ()),
    ],
    ids=["mlp", "heads", "unknown"],
)
def test_bad_bridge_state_dicts_are_refused_naming_the_key(tmp_path, key, value, named):
    """The file, then the key; a shape that does not split into the config's heads with both."""
    path, config = write_bridge_state(tmp_path, {**bridge_state(), key: value})
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(path, config)
    assert caught.value.where == f"{path}: {key}"
    one_line(caught, *named)


def test_a_hugging_face_config_is_refused_naming_model_type(tmp_path):
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 16}
    path, config = write_bridge_state(tmp_path, bridge_state(), hf)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(path, config)
    assert (caught.value.where, caught.value.value) == (f"{config}: model_type", "gpt2")
    one_line(caught)


def test_a_bridge_state_dict_without_config_json_is_refused(tmp_path):
    path, _ = write_bridge_state(tmp_path, bridge_state())
    with pytest.raises(UserError) as caught:
        tl_checkpoint.read_checkpoint(path, {"positional_embedding_type": "standard"})
    one_line(caught, path, "n_heads")  # the file, and the size its shapes cannot give


def test_a_weight_with_no_bridge_counterpart_is_refused_naming_it():
    """An MLP weight under HookedTransformer's names (blocks.0.mlp.W_in) has no native
    attention-only bridge name: refused in one line naming the key, nothing else."""
    model = random_model(STANDARD)
    state = {**model.state_dict(), "blocks.0.mlp.W_in": torch.zeros(16, 64)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_checkpoint(model.cfg, state)
    assert caught.value.where == "blocks.0.mlp.W_in"
    one_line(caught)


VARIANTS = list(itertools.product(["standard", "shortformer", "rotary"], [None, "LN"]))
ROTARY = {"rotary_dim": 4}  # half of d_head turns, as Pythia's quarter: the rest passes unturned
# attention-only, then an MLP after attention (GPT-2's activation) and one beside it (Pythia's placement)
MLPS = {
    "attn-only": {},
    "mlp": {"d_mlp": 64, "act_fn": "gelu_new"},
    "parallel-mlp": {"d_mlp": 48, "act_fn": "relu", "parallel_attn_mlp": True},
}


@pytest.mark.interop
@pytest.mark.parametrize("mlp", list(MLPS.values()), ids=list(MLPS))
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_our_checkpoint_loads_into_hooked_transformer(tmp_path, pos, norm, mlp):
    tl = pytest.importorskip("transformer_lens")
    rotary = ROTARY if pos == "rotary" else {}
    cfg = ModelConfig(positional_embedding_type=pos, normalization_type=norm, **SHAPE, **mlp, **rotary)
    ours = random_model(cfg, seed=1, dtype=torch.float32, bias_std=0.1)
    checkpoint.save_state(tmp_path / "model.safetensors", ours.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(cfg)))

    config = json.loads((tmp_path / "config.json").read_text())
    theirs = tl.HookedTransformer(
        tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"})
    )
    state, _ = checkpoint.load_state(tmp_path / "model.safetensors")
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith(checkpoint.TL_BUFFERS) for k in missing)
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(theirs(tokens), ours(tokens), atol=1e-5, rtol=0)


@pytest.mark.interop
@pytest.mark.parametrize("mlp", list(MLPS.values()), ids=list(MLPS))
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_hooked_transformer_checkpoint_loads_into_ours(tmp_path, pos, norm, mlp):
    pytest.importorskip("transformer_lens")
    config = {
        **SHAPE,
        "positional_embedding_type": pos,
        "normalization_type": norm,
        "attn_only": not mlp,
        "act_fn": None,
        **mlp,
        **(ROTARY if pos == "rotary" else {}),
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
