"""Checkpoints: safe formats only, config.json in HookedTransformerConfig names, and
one-line refusals that name the key (and both shapes) for checkpoints we cannot run."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline import checkpoint
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import AttnOnlyTransformer

CFG = ModelConfig(n_layers=2, n_heads=2, d_head=4, d_model=8, n_ctx=8, d_vocab=10, normalization_type="LN")


def write(tmp_path, state, config: dict | None = None, name: str = "model.safetensors"):
    path = tmp_path / name
    if name.endswith(".safetensors"):
        checkpoint.save_state(path, state)
    else:
        torch.save(state, path)
    (tmp_path / "config.json").write_text(json.dumps(config or tl_checkpoint.tl_config(CFG)))
    return path, tmp_path / "config.json"


def one_line(caught) -> str:
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_safetensors_round_trip_keeps_tensors_and_metadata(tmp_path):
    model = AttnOnlyTransformer(CFG)
    path = checkpoint.save_state(tmp_path / "m.safetensors", model.state_dict(), {"seed": 3})
    state, meta = checkpoint.load_state(path)
    assert meta == {"seed": "3"}
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    loaded = tl_checkpoint.load_model(*write(tmp_path, model.state_dict()))
    tokens = torch.randint(0, 10, (2, 8))
    assert torch.equal(loaded(tokens), model(tokens))


def test_config_json_uses_hooked_transformer_field_names():
    cfg = tl_checkpoint.tl_config(CFG)
    for key in (
        "n_layers",
        "d_model",
        "n_heads",
        "d_head",
        "n_ctx",
        "d_vocab",
        "positional_embedding_type",
        "normalization_type",
        "attn_only",
    ):
        assert key in cfg
    assert cfg["attn_only"] is True
    assert tl_checkpoint.from_tl_config(cfg) == CFG


class NotATensor:  # unpickling this would run code in a real attack; weights_only must refuse it
    pass


def test_pickled_objects_are_refused(tmp_path):
    torch.save({"embed.W_E": NotATensor()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="refused") as caught:
        checkpoint.load_state(tmp_path / "evil.pt")
    one_line(caught)


def test_plain_tensor_pth_loads_with_weights_only(tmp_path):
    model = AttnOnlyTransformer(CFG)
    loaded = tl_checkpoint.load_model(*write(tmp_path, model.state_dict(), name="model.pth"))
    assert torch.equal(loaded.embed.W_E, model.embed.W_E)


def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "m.ckpt").write_bytes(b"x")
    with pytest.raises(UserError, match="unknown checkpoint format"):
        checkpoint.load_state(tmp_path / "m.ckpt")
    with pytest.raises(UserError, match="not found"):
        checkpoint.load_state(tmp_path / "absent.safetensors")


def test_shape_mismatch_names_the_key_and_both_shapes(tmp_path):
    state = AttnOnlyTransformer(CFG).state_dict()
    state["blocks.1.attn.W_K"] = torch.zeros(2, 8, 5)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    text = one_line(caught)
    assert "blocks.1.attn.W_K" in text and "[2, 8, 5]" in text and "[2, 8, 4]" in text


@pytest.mark.parametrize(
    "change,key",
    [
        ({"attn_only": False}, "attn_only"),
        ({"positional_embedding_type": "rotary"}, "positional_embedding_type"),
        ({"normalization_type": "RMS"}, "normalization_type"),
        ({"use_attn_scale": False}, "use_attn_scale"),
        ({"attn_scale": 3.0}, "attn_scale"),
        ({"d_vocab_out": 11}, "d_vocab_out"),
        ({"n_heads": 2.5}, "n_heads"),
        ({"eps": 1e-6}, "eps"),
    ],
)
def test_config_we_cannot_run_is_refused_naming_the_field(tmp_path, change, key):
    config = {**tl_checkpoint.tl_config(CFG), **change}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, AttnOnlyTransformer(CFG).state_dict(), config))
    assert f"config.json: {key}" in one_line(caught)


# every row of tl_checkpoint.UNSUPPORTED, in its order: a value it refuses, and the message
REFUSED = {
    "model_type": (
        "gpt2",
        "a Hugging Face transformers config.json (save_pretrained): TransformerLens 4.x wraps such a "
        "model with its MLPs; only attention-only models are read (HookedTransformerConfig or "
        "TransformerBridgeConfig fields)",
    ),
    "attn_only": (False, "not an attention-only model (it has MLPs)"),
    "architecture": (
        "GPT2LMHeadModel",
        "a TransformerBridge of a Hugging Face architecture: only TransformerLensNative "
        "(boot_native) is read",
    ),
    "use_attn_scale": (False, "attention scores must be divided by sqrt(d_head)"),
    "attention_dir": ("bidirectional", "only causal attention is supported"),
    "final_rms": (True, "RMS norm is not supported"),
    "use_local_attn": (True, "local attention is not supported"),
    "use_qk_norm": (True, "query/key norms are not supported"),
    "post_embedding_ln": (True, "a LayerNorm after the embedding is not supported"),
    "use_normalization_before_and_after": (True, "post-attention norms are not supported"),
    "scale_attn_by_inverse_layer_idx": (True, "per-layer attention scaling is not supported"),
    "n_key_value_heads": (1, "grouped-query attention is not supported"),  # CFG has 2 heads
    "attn_scores_soft_cap": (50.0, "soft-capped scores are not supported"),
    "output_logits_soft_cap": (30.0, "soft-capped logits are not supported"),
    "d_vocab_out": (11, "must equal d_vocab"),
    "eps": (1e-6, "LayerNorm eps must be 1e-05"),
    "attn_scale": (3.0, "must be sqrt(d_head) = 2"),  # CFG's d_head is 4
}


@pytest.mark.parametrize("field", list(REFUSED))
def test_every_unsupported_setting_is_refused_with_its_reason(field):
    value, reason = REFUSED[field]
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(CFG), field: value})
    assert str(caught.value) == f"config.json: {field} = {value!r}: {reason}"


def test_every_row_of_the_table_has_a_refused_case():
    assert [row[0] for row in tl_checkpoint.UNSUPPORTED] == list(REFUSED)


@pytest.mark.parametrize(
    "change",
    [
        {"final_rms": None},
        {"n_key_value_heads": None},
        {"n_key_value_heads": 2},  # as many as the query heads: no grouping
        {"attn_scores_soft_cap": None},
        {"attn_scores_soft_cap": 0},
        {"output_logits_soft_cap": -1.0},
        {"d_vocab_out": -1},
        {"d_vocab_out": None},
        {"attn_scale": 2.0},
        {"attn_scale": None},
    ],
    ids=str,
)
def test_settings_our_model_computes_the_same_way_are_accepted(change):
    assert tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(CFG), **change}) == CFG


def test_the_first_unsupported_setting_in_the_tables_order_is_named():
    config = {**tl_checkpoint.tl_config(CFG), "eps": 1e-6, "use_qk_norm": True, "attn_scale": 3.0}
    with pytest.raises(UserError, match="^config.json: use_qk_norm = True: "):
        tl_checkpoint.from_tl_config(config)


def test_mlp_weights_are_refused_naming_the_key(tmp_path):
    state = {**AttnOnlyTransformer(CFG).state_dict(), "blocks.0.mlp.W_in": torch.zeros(8, 32)}
    with pytest.raises(UserError, match=r"blocks\.0\.mlp\.W_in.*not an attention-only model") as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    one_line(caught)


def test_missing_and_unexpected_keys_are_refused(tmp_path):
    state = AttnOnlyTransformer(CFG).state_dict()
    del state["blocks.1.attn.W_O"]
    with pytest.raises(UserError, match=r"blocks\.1\.attn\.W_O: missing"):
        tl_checkpoint.load_model(*write(tmp_path, state))
    state = {**AttnOnlyTransformer(CFG).state_dict(), "blocks.2.attn.W_Q": torch.zeros(2, 8, 4)}
    with pytest.raises(UserError, match=r"blocks\.2\.attn\.W_Q: unexpected key"):
        tl_checkpoint.load_model(*write(tmp_path, state))


def test_transformer_lens_buffers_are_ignored_and_lnpre_gets_identity_norms(tmp_path):
    model = AttnOnlyTransformer(CFG)
    state = {k: v for k, v in model.state_dict().items() if ".ln1." not in k and not k.startswith("ln_final")}
    state["blocks.0.attn.mask"] = torch.ones(8, 8, dtype=torch.bool).tril()
    state["blocks.0.attn.IGNORE"] = torch.tensor(-1e5)
    config = {**tl_checkpoint.tl_config(CFG), "normalization_type": "LNPre"}
    loaded = tl_checkpoint.load_model(*write(tmp_path, state, config))
    assert torch.equal(loaded.blocks[0].ln1.w, torch.ones(8)) and torch.equal(
        loaded.ln_final.b, torch.zeros(8)
    )


def test_transformer_lens_own_config_spelling(tmp_path):
    """TransformerLens's attn-only checkpoints write `normalization` and `shortformer_pos`."""
    config = {
        k: v
        for k, v in tl_checkpoint.tl_config(CFG).items()
        if k not in ("normalization_type", "positional_embedding_type")
    }
    config.update(normalization="LN", shortformer_pos=True)
    assert tl_checkpoint.from_tl_config(config).positional_embedding_type == "shortformer"
    assert tl_checkpoint.from_tl_config(config).normalization_type == "LN"


def test_metadata_order_never_changes_the_bytes(tmp_path):
    """safetensors writes metadata in hash-map order; we sort it (byte-identical artifacts)."""
    state = AttnOnlyTransformer(CFG).state_dict()
    meta = {f"key{i}": f"value {i}" for i in range(8)}
    first = checkpoint.save_state(tmp_path / "a.safetensors", state, meta).read_bytes()
    for i in range(5):
        shuffled = dict(sorted(meta.items(), key=lambda kv: hash((kv[0], i))))
        assert checkpoint.save_state(tmp_path / "b.safetensors", state, shuffled).read_bytes() == first
    loaded, read_meta = checkpoint.load_state(tmp_path / "b.safetensors")
    assert read_meta == meta and all(torch.equal(loaded[k], v) for k, v in state.items())
