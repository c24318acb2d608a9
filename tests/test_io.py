"""pipeline.io's refusals and its best-effort clean, in cases the stages cannot set up on a
root-run machine: a directory it may not write (os.access says so), and a leftover of a killed
write that cannot be removed whole."""

from __future__ import annotations

import errno
import json
import os

import pytest
from refusals import refused

from pipeline import io
from pipeline.errors import UserError


def test_an_output_directory_it_may_not_write_is_refused_naming_it(tmp_path, monkeypatch):
    out = tmp_path / "outputs" / "seed0"
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only mount, say
    with pytest.raises(UserError) as caught:
        io.ensure_dir(out)
    refused(caught, out)
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
    assert os.strerror(errno.EEXIST) in refused(caught, out)  # the system's reason, passed on


def test_a_full_disk_while_writing_a_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(UserError) as caught, io.atomic_path(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert os.strerror(errno.ENOSPC) in refused(caught, path)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_a_directory_is_refused_naming_the_directory(tmp_path):
    path = tmp_path / "checkpoints"
    with pytest.raises(UserError) as caught, io.atomic_dir(path):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    assert os.strerror(errno.EFBIG) in refused(caught, path)
    assert list(tmp_path.iterdir()) == []


def test_a_json_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    path = tmp_path / "origin.json"
    with pytest.raises(UserError) as caught:
        io.read_json(path)
    refused(caught, path)


def test_a_json_file_that_is_not_json_is_refused_with_the_parsers_message(tmp_path):
    path = tmp_path / "origin.json"
    path.write_text("{oops")
    with pytest.raises(UserError) as caught:
        io.read_json(path)
    with pytest.raises(ValueError) as parsed:
        json.loads("{oops")
    assert str(parsed.value) in refused(caught, path)


def tree(root) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def test_files_written_into_a_folder_in_use_replace_only_their_own_names(tmp_path):
    """`atomic_files` into an existing folder adds or replaces the files it writes; the user's
    other files and folders stay, byte for byte, and no temporary is left."""
    folder = tmp_path / "mine"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "a.txt").write_bytes(b"keep")
    (folder / "config.json").write_bytes(b"old")
    (folder / "analysis.ipynb").write_bytes(b"{}")
    with io.atomic_files(folder) as tmp:
        io.write_text(tmp / "config.json", "new\n")
        io.write_text(tmp / "model.safetensors", "weights\n")
    assert tree(folder) == {
        "analysis.ipynb": b"{}", "config.json": b"new\n", "model.safetensors": b"weights\n",
        "notes": None, "notes/a.txt": b"keep",
    }  # fmt: skip


def test_files_are_moved_only_when_every_one_is_written(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"old")
    with pytest.raises(RuntimeError), io.atomic_files(folder) as tmp:
        io.write_text(tmp / "config.json", "new\n")
        raise RuntimeError("the second file fails")
    assert tree(folder) == {"config.json": b"old"}


def test_writing_into_a_file_or_onto_a_folder_is_one_line_and_changes_nothing(tmp_path):
    (tmp_path / "a-file").write_bytes(b"mine")
    with pytest.raises(UserError) as caught, io.atomic_files(tmp_path / "a-file"):
        pass
    refused(caught, tmp_path / "a-file")
    (tmp_path / "mine" / "config.json").mkdir(parents=True)
    (tmp_path / "mine" / "config.json" / "x").write_bytes(b"x")
    before = tree(tmp_path)
    with pytest.raises(UserError) as caught, io.atomic_files(tmp_path / "mine") as tmp:
        io.write_text(tmp / "config.json", "new\n")
    refused(caught, tmp_path / "mine" / "config.json")
    with pytest.raises(UserError) as caught:
        io.write_text(tmp_path / "mine" / "config.json", "new\n")  # a file where a folder stands
    refused(caught, tmp_path / "mine" / "config.json")
    assert tree(tmp_path) == before
