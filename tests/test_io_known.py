"""pipeline.io's refusals and its best-effort clean, in cases the stages cannot set up on a
root-run machine: a directory it may not write (os.access says so), and a leftover of a killed
write that cannot be removed whole."""

from __future__ import annotations

import errno
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


def test_an_output_directory_where_a_file_is_is_refused_naming_it(tmp_path):
    out = tmp_path / "a-file"
    out.write_bytes(b"")
    with pytest.raises(UserError) as caught:
        io.ensure_dir(out)
    assert str(caught.value) == f"{out}: cannot create output directory ({os.strerror(errno.EEXIST)})"


def test_a_full_disk_while_writing_a_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(UserError) as caught, io.atomic_path(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(caught.value) == f"{path}: cannot write ({os.strerror(errno.ENOSPC)})"
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_a_directory_is_refused_naming_the_directory(tmp_path):
    path = tmp_path / "checkpoints"
    with pytest.raises(UserError) as caught, io.atomic_dir(path):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    assert str(caught.value) == f"{path}: cannot write ({os.strerror(errno.EFBIG)})"
    assert list(tmp_path.iterdir()) == []


def test_a_json_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    path = tmp_path / "origin.json"
    with pytest.raises(UserError) as caught:
        io.read_json(path)
    assert str(caught.value) == f"{path}: file not found"


def test_a_json_file_that_is_not_json_is_refused_with_the_parsers_message(tmp_path):
    path = tmp_path / "origin.json"
    path.write_text("{oops")
    with pytest.raises(UserError) as caught:
        io.read_json(path)
    assert str(caught.value) == (
        f"{path}: not valid JSON "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    )
