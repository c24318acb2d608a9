"""Atomic artifact writing: every file goes to a temporary sibling, then `os.replace`.

A stage killed mid-write leaves at most a hidden `.<name>.tmp-*` file, never a
truncated artifact under the real name; `clean_stale` removes such leftovers
when a stage starts again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import UserError

TMP_MARK = ".tmp-"

# Failures of the storage, not of the code: a full disk or quota, a file-size limit, a
# read-only or vanished filesystem. They end a stage in one line naming the file.
STORAGE_ERRORS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)


def ensure_dir(path: str | Path) -> Path:
    """Create directory `path` (and parents), or fail naming it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(str(path), f"cannot create output directory ({e.strerror})") from None
    if not os.access(path, os.W_OK):
        raise UserError(str(path), "output directory is not writable")
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it to `path`.

    On any exception the temporary file is removed and `path` is left untouched; a
    storage failure (`STORAGE_ERRORS`: disk full, file too large, ...) becomes a
    `UserError` naming `path`.
    """
    path = Path(path)
    ensure_dir(path.parent)
    if path.is_dir() and not path.is_symlink():  # os.replace would fail with IsADirectoryError, or
        # (an empty one) put a file in the folder's place
        raise UserError(str(path), "is a directory: name the file to write, not a folder")
    tmp_path: Path | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb") as f:  # data on disk before the rename makes it visible
            os.fsync(f.fileno())
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, path)
    except BaseException as e:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in STORAGE_ERRORS:
            raise UserError(str(path), f"cannot write ({e.strerror})") from None
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` whole (a
    directory of files that belong together, like training's checkpoints). On any exception
    it is removed and `path` is left untouched."""
    path = Path(path)
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # deepest first
    ensure_dir(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in made:  # the directories made for it, while nothing else is in them
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(e, OSError) and e.errno in STORAGE_ERRORS:
            raise UserError(str(path), f"cannot write ({e.strerror})") from None
        raise


@contextlib.contextmanager
def atomic_files(directory: str | Path) -> Iterator[Path]:
    """Yield a temporary directory; on success move every file written there into `directory`,
    replacing only the files of the same names: whatever else `directory` holds is the user's and
    stays. A new `directory` appears whole (`atomic_dir`); in an existing one, nothing is moved
    until every file is written, and each move is a rename. A `directory` that is a file, or a
    name to write that is a folder there, is refused in one line, and nothing in it changes."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise UserError(
            str(path), "is a file, not a directory: name a folder to write into (new or existing)"
        )
    if not path.exists():
        with atomic_dir(path) as tmp:
            yield tmp
        return
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}", dir=path))  # `clean_stale`'s pattern
    try:
        yield tmp
        written = sorted(tmp.iterdir())
        for f in written:
            if (path / f.name).is_dir() and not (path / f.name).is_symlink():
                raise UserError(str(path / f.name), "is a directory: cannot write the file of that name")
        for f in written:
            os.replace(f, path / f.name)  # each written whole (atomic_path) and fsynced
    except BaseException as e:
        if isinstance(e, OSError) and e.errno in STORAGE_ERRORS:
            raise UserError(str(path), f"cannot write ({e.strerror})") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_with(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Call `writer(tmp_path)` and atomically move the result to `path`."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    return write_with(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    """Sorted keys, fixed indentation, trailing newline: byte-identical for equal data."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def write_npy(path: str | Path, array: Any) -> Path:
    """A numpy array as `.npy` (never pickled). Through a file object: `np.save` given a path
    would append ".npy" to the temporary name."""

    def save(tmp: Path) -> None:
        import numpy as np

        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)

    return write_with(path, save)


def write_csv(path: str | Path, frame: Any, sep: str = ",", float_format: str = "%.10g") -> Path:
    """A pandas DataFrame as CSV (or TSV), no index, fixed float format (stable bytes)."""
    return write_with(
        path,
        lambda tmp: frame.to_csv(tmp, sep=sep, index=False, float_format=float_format, lineterminator="\n"),
    )


def clean_stale(directory: str | Path) -> None:
    """Remove temporary files (and directories) a killed run left in `directory`."""
    directory = Path(directory)
    if directory.is_dir():
        for leftover in directory.glob(f".*{TMP_MARK}*"):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, str]:
    """{"path", "sha256"}: how origin.json names a file a later stage must find unchanged."""
    return {"path": Path(path).as_posix(), "sha256": sha256_file(path)}


def require_number(value: Any, where: str) -> float:
    """A number read from a JSON file a stage wrote (NaN allowed: undefined), or a one-line
    refusal naming `where` (the file and key): a string or a list would reach the arithmetic."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(where, "expected a number", value)
    return float(value)


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "file not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(str(path), f"not valid JSON ({e})") from None
