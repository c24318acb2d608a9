"""checkpoint.read_index's one-line refusals name the file, the entry and the offending value."""

from __future__ import annotations

import json

import pytest

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
