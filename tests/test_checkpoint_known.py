"""checkpoint.read_index's one-line refusals name the file, the entry and the offending value."""

from __future__ import annotations

import fractions
import json

import pytest
import torch

from pipeline import checkpoint
from pipeline.errors import UserError


def test_an_entry_naming_the_wrong_file_is_refused_with_the_name_it_has(tmp_path):
    (tmp_path / "step0000010.safetensors").write_bytes(b"")
    entries = [{"step": 10, "tokens": 80, "file": "step10.safetensors"}]
    (tmp_path / "index.json").write_text(json.dumps({"seed": 0, "checkpoints": entries}))
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'index.json'}: checkpoints[0].file = 'step10.safetensors': "
        "expected 'step0000010.safetensors'"
    )
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
    assert str(caught.value) == (
        f"{tmp_path / 'index.json'}: checkpoints: missing or empty: expected a list of {{step, tokens, file}}"
    )


# --- load_state's and read_index's refusals, each message whole -----------------------------


def test_a_missing_checkpoint_is_refused_naming_its_path(tmp_path):
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "absent.safetensors")
    assert str(caught.value) == f"{tmp_path / 'absent.safetensors'}: checkpoint not found"


def test_a_pickle_asking_for_a_class_is_refused_naming_it(tmp_path):
    torch.save({"a": fractions.Fraction(1, 2)}, tmp_path / "f.pt")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "f.pt")
    assert str(caught.value) == (
        f"{tmp_path / 'f.pt'}: refused: not a plain tensor checkpoint (it would call or build "
        "fractions.Fraction: loading it could run code; save plain tensors or safetensors)"
    )


def test_a_torch_file_that_is_not_a_mapping_of_tensors_is_refused(tmp_path):
    for name, saved in (("list.pt", [torch.zeros(1)]), ("int.pt", {"a": 1})):
        torch.save(saved, tmp_path / name)
        with pytest.raises(UserError) as caught:
            checkpoint.load_state(tmp_path / name)
        assert str(caught.value) == f"{tmp_path / name}: refused: expected a mapping of names to tensors"


def test_an_unknown_suffix_is_refused_naming_it_and_the_known_ones(tmp_path):
    (tmp_path / "m.ckpt").write_bytes(b"x")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "m.ckpt")
    assert str(caught.value) == (
        f"{tmp_path / 'm.ckpt'}: unknown checkpoint format '.ckpt': use .safetensors, .pt or .pth"
    )


def test_an_unreadable_safetensors_file_is_refused_with_the_readers_first_line(tmp_path):
    """The reason in brackets is safetensors' own wording (0.8: "header too small")."""
    (tmp_path / "e.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as caught:
        checkpoint.load_state(tmp_path / "e.safetensors")
    assert str(caught.value) == (
        f"{tmp_path / 'e.safetensors'}: not a readable safetensors file "
        "(Error while deserializing header: header too small)"
    )


def write_index(directory, entries) -> None:
    (directory / "index.json").write_text(json.dumps({"seed": 0, "checkpoints": entries}))


def test_an_entry_that_is_not_step_tokens_file_is_refused_showing_it(tmp_path):
    for entry in (3, {"step": True, "tokens": 80, "file": "step0000001.safetensors"}):
        write_index(tmp_path, [entry])
        with pytest.raises(UserError) as caught:
            checkpoint.read_index(tmp_path)
        assert str(caught.value) == (
            f"{tmp_path / 'index.json'}: checkpoints[0] = {entry!r}: "
            "expected {step: int, tokens: int, file: str}"
        )


def test_a_step_not_above_the_one_before_is_refused_naming_both(tmp_path):
    (tmp_path / "step0000010.safetensors").write_bytes(b"")
    entry = {"step": 10, "tokens": 80, "file": "step0000010.safetensors"}
    write_index(tmp_path, [entry, entry])
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'index.json'}: checkpoints[1].step = 10: must be greater than the one before (10)"
    )


def test_a_listed_checkpoint_that_is_missing_is_refused_naming_its_path(tmp_path):
    write_index(tmp_path, [{"step": 10, "tokens": 80, "file": "step0000010.safetensors"}])
    with pytest.raises(UserError) as caught:
        checkpoint.read_index(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'step0000010.safetensors'}: checkpoint not found (listed in index.json)"
    )


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
    assert str(caught.value) == (
        f"{tmp_path / 'g.pt'}: refused: not a plain tensor checkpoint (Unsupported operand {ord('n')})"
    )
