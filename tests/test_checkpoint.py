"""Checkpoints (pipeline/checkpoint.py, with pipeline/model/tl_checkpoint.py's reading of them):
safe formats only, config.json in HookedTransformerConfig names, and one-line refusals naming
the file, key and value of a checkpoint or index.json we cannot read or run."""

from __future__ import annotations

import fractions
import json

import pytest
import torch
from refusals import refused
from safetensors import safe_open

from pipeline import checkpoint
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import Transformer

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
    model = Transformer(CFG)
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
    assert cfg["attn_only"] is True and cfg["act_fn"] is None
    # an attention-only model's config.json names no MLP or rotary field (checkpoints keep their bytes)
    assert not set(cfg) & {*tl_checkpoint.MLP_FIELDS, *tl_checkpoint.ROTARY_FIELDS} - {"act_fn"}
    assert tl_checkpoint.from_tl_config(cfg) == CFG


class NotATensor:  # unpickling this would run code in a real attack; weights_only must refuse it
    pass


def test_pickled_objects_are_refused(tmp_path):
    torch.save({"embed.W_E": NotATensor()}, tmp_path / "evil.pt")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "evil.pt")
    assert f"{__name__}.NotATensor" in refused(caught, tmp_path / "evil.pt")  # what it would build


def test_plain_tensor_pth_loads_with_weights_only(tmp_path):
    model = Transformer(CFG)
    loaded = tl_checkpoint.load_model(*write(tmp_path, model.state_dict(), name="model.pth"))
    assert torch.equal(loaded.embed.W_E, model.embed.W_E)


def test_a_pt_file_holding_its_state_under_state_dict_loads_that_state(tmp_path):
    """A training script's `torch.save({"state_dict": ..., "step": ...})`: the state inside."""
    state = Transformer(CFG).state_dict()
    torch.save({"state_dict": state, "step": torch.tensor(7)}, tmp_path / "model.pt")
    loaded, meta = checkpoint.load_state(tmp_path / "model.pt")
    assert meta == {} and list(loaded) == list(state)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_shape_mismatch_names_the_key_and_both_shapes(tmp_path):
    state = Transformer(CFG).state_dict()
    state["blocks.1.attn.W_K"] = torch.zeros(2, 8, 5)
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    text = one_line(caught)
    assert "blocks.1.attn.W_K" in text and "[2, 8, 5]" in text and "[2, 8, 4]" in text  # key, shapes


@pytest.mark.parametrize(
    "change,key",
    [
        ({"attn_only": False}, "d_mlp"),  # MLPs of no size
        ({"positional_embedding_type": "alibi"}, "positional_embedding_type"),
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
        tl_checkpoint.load_model(*write(tmp_path, Transformer(CFG).state_dict(), config))
    assert f"config.json: {key}" in one_line(caught)


# every row of tl_checkpoint.UNSUPPORTED, in its order: a value it refuses
REFUSED = {
    "model_type": "gpt2",
    "d_mlp": 0,
    "act_fn": "solu_ln",
    "gated_mlp": True,
    "rotary_dim": 0,
    "use_NTK_by_parts_rope": True,
    "use_yarn_rope": True,
    "use_dynamic_ntk_rope": True,
    "rotary_scaling_factor": 2.0,
    "use_logn_attn": True,
    "architecture": "GPT2LMHeadModel",
    "use_attn_scale": False,
    "attention_dir": "bidirectional",
    "final_rms": True,
    "use_local_attn": True,
    "use_qk_norm": True,
    "post_embedding_ln": True,
    "use_normalization_before_and_after": True,
    "scale_attn_by_inverse_layer_idx": True,
    "n_key_value_heads": 1,  # CFG has 2 heads
    "attn_scores_soft_cap": 50.0,
    "output_logits_soft_cap": 30.0,
    "d_vocab_out": 11,
    "eps": 1e-6,
    "attn_scale": 3.0,  # CFG's d_head is 4: sqrt(d_head) = 2
}


# the MLPs' rows judge a model with MLPs, rotary_dim's one with rotary positions: the rest of such a config
CONTEXT = {
    "d_mlp": {"attn_only": False, "act_fn": "gelu_new"},
    "act_fn": {"attn_only": False, "d_mlp": 64},
    "rotary_dim": {"positional_embedding_type": "rotary"},
}


@pytest.mark.parametrize("field", list(REFUSED))
def test_every_unsupported_setting_is_refused_with_its_rows_reason(field):
    """Refused naming the field and its value, with the reason of the field's own row."""
    raw = {**tl_checkpoint.tl_config(CFG), **CONTEXT.get(field, {}), field: REFUSED[field]}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config(raw)
    [reason] = [row[3] for row in tl_checkpoint.UNSUPPORTED if row[0] == field]
    message = refused(caught, f"config.json: {field}", REFUSED[field])
    assert message.endswith(reason if isinstance(reason, str) else reason(raw))


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
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config(config)
    refused(caught, "config.json: use_qk_norm", True)


def test_mlp_weights_are_refused_naming_the_key(tmp_path):
    state = {**Transformer(CFG).state_dict(), "blocks.0.mlp.W_in": torch.zeros(8, 32)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    assert "blocks.0.mlp.W_in" in one_line(caught)


def test_missing_and_unexpected_keys_are_refused(tmp_path):
    state = Transformer(CFG).state_dict()
    del state["blocks.1.attn.W_O"]
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    assert "blocks.1.attn.W_O" in one_line(caught)
    state = {**Transformer(CFG).state_dict(), "blocks.2.attn.W_Q": torch.zeros(2, 8, 4)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.load_model(*write(tmp_path, state))
    assert "blocks.2.attn.W_Q" in one_line(caught)


def test_transformer_lens_buffers_are_ignored_and_lnpre_gets_identity_norms(tmp_path):
    model = Transformer(CFG)
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
    state = Transformer(CFG).state_dict()
    meta = {f"key{i}": f"value {i}" for i in range(8)}
    first = checkpoint.save_state(tmp_path / "a.safetensors", state, meta).read_bytes()
    for i in range(5):
        shuffled = dict(sorted(meta.items(), key=lambda kv: hash((kv[0], i))))
        assert checkpoint.save_state(tmp_path / "b.safetensors", state, shuffled).read_bytes() == first
    loaded, read_meta = checkpoint.load_state(tmp_path / "b.safetensors")
    assert read_meta == meta and all(torch.equal(loaded[k], v) for k, v in state.items())


def test_an_entry_naming_the_wrong_file_is_refused_with_the_name_it_has(tmp_path):
    (tmp_path / "step0000010.safetensors").write_bytes(b"")
    entries = [{"step": 10, "tokens": 80, "file": "step10.safetensors"}]
    (tmp_path / "index.json").write_text(json.dumps({"seed": 0, "checkpoints": entries}))
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    message = refused(caught, f"{tmp_path / 'index.json'}: checkpoints[0].file", "step10.safetensors")
    assert "'step0000010.safetensors'" in message  # the name it must have
    entries[0]["file"] = "step0000010.safetensors"
    (tmp_path / "index.json").write_text(json.dumps({"seed": 0, "checkpoints": entries}))
    assert checkpoint.read_index(tmp_path) == entries


@pytest.mark.parametrize(
    "index", [[{"step": 10, "tokens": 80, "file": "step0000010.safetensors"}], "x", 3, None]
)
def test_an_index_that_is_not_an_object_is_refused_naming_its_checkpoints(tmp_path, index):
    """index.json must be an object holding "checkpoints": a bare list of the entries (or any other
    JSON value) is the same one-line refusal as an object without them."""
    (tmp_path / "step0000010.safetensors").write_bytes(b"")
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    refused(caught, f"{tmp_path / 'index.json'}: checkpoints")


# --- load_state's and read_index's refusals, each message whole -----------------------------


def test_a_missing_checkpoint_is_refused_naming_its_path(tmp_path):
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "absent.safetensors")
    refused(caught, tmp_path / "absent.safetensors")


def test_a_pickle_asking_for_a_class_is_refused_naming_it(tmp_path):
    torch.save({"a": fractions.Fraction(1, 2)}, tmp_path / "f.pt")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "f.pt")
    assert "fractions.Fraction" in refused(caught, tmp_path / "f.pt")


def test_a_torch_file_that_is_not_a_mapping_of_tensors_is_refused(tmp_path):
    for name, saved in (("list.pt", [torch.zeros(1)]), ("int.pt", {"a": 1})):
        torch.save(saved, tmp_path / name)
        with pytest.raises(UserError) as caught:
            checkpoint.load_state(tmp_path / name)
        refused(caught, tmp_path / name)


def test_an_unknown_suffix_is_refused_naming_it_and_the_known_ones(tmp_path):
    (tmp_path / "m.ckpt").write_bytes(b"x")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "m.ckpt")
    message = refused(caught, tmp_path / "m.ckpt")
    assert all(suffix in message for suffix in ("'.ckpt'", ".safetensors", ".pt", ".pth"))


def test_an_unreadable_safetensors_file_is_refused_with_the_readers_first_line(tmp_path):
    """The reason in brackets is safetensors' own wording (0.8: "header too small")."""
    (tmp_path / "e.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "e.safetensors")
    with pytest.raises(Exception) as read:  # the reader's own refusal of the file
        safe_open(str(tmp_path / "e.safetensors"), framework="pt")
    assert f"({str(read.value).splitlines()[0]})" in refused(caught, tmp_path / "e.safetensors")


def write_index(directory, entries) -> None:
    (directory / "index.json").write_text(json.dumps({"seed": 0, "checkpoints": entries}))


def test_an_entry_that_is_not_step_tokens_file_is_refused_showing_it(tmp_path):
    for entry in (3, {"step": True, "tokens": 80, "file": "step0000001.safetensors"}):
        write_index(tmp_path, [entry])
        with pytest.raises(UserError) as caught:
            checkpoint.read_index(tmp_path)
        refused(caught, f"{tmp_path / 'index.json'}: checkpoints[0]", entry)


def test_a_step_not_above_the_one_before_is_refused_naming_both(tmp_path):
    (tmp_path / "step0000010.safetensors").write_bytes(b"")
    entry = {"step": 10, "tokens": 80, "file": "step0000010.safetensors"}
    write_index(tmp_path, [entry, entry])
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    message = refused(caught, f"{tmp_path / 'index.json'}: checkpoints[1].step", 10)
    assert "(10)" in message  # and the one before


def test_a_listed_checkpoint_that_is_missing_is_refused_naming_its_path(tmp_path):
    write_index(tmp_path, [{"step": 10, "tokens": 80, "file": "step0000010.safetensors"}])
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    assert "index.json" in refused(caught, tmp_path / "step0000010.safetensors")  # where it is listed


def test_the_refusal_reason_is_the_first_sentence_of_the_first_line_not_about_weights_only():
    """torch's advice (lines naming weights_only, or starting "Weights only load failed") is dropped,
    a "WeightsUnpickler error:" prefix cut off, and of the first line left only its first sentence."""
    text = (
        "Weights only load failed. Something about the default.\n"
        "Re-running with weights_only=False will likely succeed.\n"
        "\n"
        "  WeightsUnpickler error: Unsupported operand 110. Check the documentation.\n"
        "A later line. Not this one.\n"
    )
    assert checkpoint._refusal_reason(RuntimeError(text)) == "Unsupported operand 110"
    assert checkpoint._refusal_reason(RuntimeError("Invalid magic number; corrupt file?")) == (
        "Invalid magic number; corrupt file?"
    )
    assert checkpoint._refusal_reason(EOFError("")) == "EOFError"  # nothing left: the exception's type


def test_a_torch_file_of_garbage_bytes_is_refused_with_the_unpicklers_own_reason(tmp_path):
    """b"not a ..." read as a pickle: its first byte, "n" (110), is no opcode weights_only accepts."""
    (tmp_path / "g.pt").write_bytes(b"not a torch file at all")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "g.pt")
    assert f" {ord('n')})" in refused(caught, tmp_path / "g.pt")  # the opcode it stopped at
