"""pipeline.io's refusals and its best-effort clean, in cases the stages cannot set up on a
root-run machine: a directory it may not write (os.access says so), and a leftover of a killed
write that cannot be removed whole."""

from __future__ import annotations

import os

import pytest

from pipeline import io
from pipeline.errors import UserError


def test_an_output_directory_it_may_not_write_is_refused_naming_it(tmp_path, monkeypatch):
    out = tmp_path / "outputs" / "seed0"
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only mount, say
    with pytest.raises(UserError) as caught:
        io.ensure_dir(out)
    assert str(caught.value) == f"{out}: output directory is not writable"
    assert out.is_dir()  # created, then found read-only


def test_a_leftover_that_cannot_be_removed_whole_does_not_stop_the_clean(tmp_path, monkeypatch):
    stuck = tmp_path / f".channels{io.TMP_MARK}abc"
    stuck.mkdir()
    (stuck / "busy").write_bytes(b"")
    loose = tmp_path / f".summary.json{io.TMP_MARK}def"
    loose.write_bytes(b"")
    kept = tmp_path / "summary.json"
    kept.write_bytes(b"{}")
    unlink = os.unlink

    def refusing(path, *args, **kwargs):  # a file in use on a network mount, say
        if os.fspath(path).endswith("busy"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)
    io.clean_stale(tmp_path)
    assert not loose.exists() and kept.exists()
    assert (stuck / "busy").exists()  # left for a later clean


def test_json_is_written_sorted_indented_by_two_with_a_trailing_newline(tmp_path):
    path = io.write_json(tmp_path / "summary.json", {"b": 1, "a": [1.5, None]})
    assert path.read_bytes() == b'{\n  "a": [\n    1.5,\n    null\n  ],\n  "b": 1\n}\n'
