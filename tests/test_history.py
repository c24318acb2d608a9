"""No history in the product: the docs, code, tests, tools and config say what the project does
now. Its past lives in CHANGELOG.md (newest first) and in dvc.lock (the run it records); a commit
hash or a story of an earlier design anywhere else goes stale the day it is written, and a reader
cannot tell it from a statement about today's code.

Scanned: every text file git tracks, but CHANGELOG.md, dvc.lock and outputs/ (the run's own
records) and this file, which must spell out what it looks for. A failure lists file:line for
each hit."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HISTORY_FILES = {"CHANGELOG.md", "dvc.lock"}
HISTORY_DIRS = ("outputs/",)

# A git commit id, abbreviated (7 characters, git's shortest) up to whole (40): hex digits with at
# least one digit and one letter, as a word. A sha256 digest (64) is longer and is not matched.
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w])")

# Stories of an earlier design: each says what the code was, not what it is.
NARRATIVES = [
    r"issue #?\d+",
    r"until this commit",
    r"before issue",
    r"used to be",
    r"no longer",
    r"previously",
    r"the old ",
    r" was the default",
]
NARRATIVE = re.compile("|".join(NARRATIVES), re.IGNORECASE)

HEX_RUN = "0123456789abcdef" * 4


def placeholder(word: str) -> bool:
    """A run of consecutive hex digits ('0123456789ab', 'abcdef0123...'): the made-up commit that
    tests of commit handling need, never a real one (a real id's digits are random)."""
    return word in HEX_RUN


def commit_ids(line: str) -> list[str]:
    # (?<![\w.]) above: the digits after a decimal point ('4.708892148e-09') are a number
    return [m.group(0) for m in COMMIT.finditer(line) if not placeholder(m.group(0))]


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    paths = []
    for name in filter(None, listed.split("\0")):
        if name in HISTORY_FILES or name.startswith(HISTORY_DIRS):
            continue
        path = ROOT / name
        if path == Path(__file__).resolve():  # the detectors and their known answers
            continue
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary: images, arrays, weights
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        paths.append(path)
    return paths


def hits(path: Path) -> list[str]:
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        what = commit_ids(line) + [m.group(0) for m in NARRATIVE.finditer(line)]
        if what:
            found.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(map(repr, what))}")
    return found


# --- the detectors on known answers ------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "measured at e7a91c4 on 2 cores",
        "(b52d8f3)",
        "commit 7f3e9a1c5b2d4e6f8091a2b3c4d5e6f708192a3b is whole",
    ],
)
def test_a_commit_id_is_found(line):
    assert commit_ids(line)


@pytest.mark.parametrize(
    "line",
    [
        "deadbee",  # no digit: a word, not an id
        "1234567",  # no letter: a number
        "a3f",  # shorter than git's shortest id
        "x = 4.708892148e-09",  # a number's digits
        "sha256 " + "ab12" * 16,  # a sha256 digest, 64 characters
        "the cached snapshot 0123456789ab of the repo",  # a made-up id of consecutive digits
        "commit abcdef0123456789abcdef0123456789abcdef01",
        "d_model 768, step1500abc",  # inside a longer word
    ],
)
def test_what_is_not_a_commit_id(line):
    assert commit_ids(line) == []


@pytest.mark.parametrize(
    "line",
    [
        "This replaces z > 3 (issue 21).",
        "see issue #4",
        "the code setup, the default until this commit",
        "Before issue 33 the default was code.",
        "It used to be slower.",
        "the pair is no longer a discovery",
        "previously measured",
        "the old null",
        "when code was the default",
    ],
)
def test_a_narrative_is_found(line):
    assert NARRATIVE.search(line)


def test_placeholder_is_only_a_run_of_consecutive_digits():
    assert placeholder("0123abc") is False and placeholder("abcdef0") is True
    assert placeholder("456789abc") is True and placeholder("e7a91c4") is False


# --- the product -------------------------------------------------------------------------------


def test_no_commit_ids_or_narratives_outside_the_changelog():
    """Every hit is a line to rewrite as what the code does now, or to move into CHANGELOG.md."""
    found = [hit for path in tracked_text_files() for hit in hits(path)]
    assert not found, "history outside CHANGELOG.md and dvc.lock:\n" + "\n".join(found)


def test_the_changelog_exists_and_is_newest_first():
    changelog = ROOT / "CHANGELOG.md"
    assert changelog.is_file()
    dates = re.findall(r"^## .*?(\d{4}-\d{2}-\d{2})", changelog.read_text(encoding="utf-8"), re.M)
    assert dates, "CHANGELOG.md has no dated '## ' sections"
    assert dates == sorted(dates, reverse=True)
