"""Every command's `--help` (each stage, `python -m pipeline.params`, `pipeline.restore` and
`pipeline.overrides`) is read by people: whole sentences, each printed once, every argument
explained. The structure is checked, never a sentence."""

from __future__ import annotations

import argparse
import re
from importlib import import_module
from pathlib import Path

import pytest

from pipeline import cli

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.stem for p in (ROOT / "stages").glob("*.py") if p.stem != "__init__")
COMMANDS = [
    *(f"stages.{name}" for name in STAGES),
    "pipeline.params",
    "pipeline.restore",
    "pipeline.overrides",
]


def whole_sentence(text: str | None) -> bool:
    """Starts with a capital letter (its first letter, after a quote or a backtick) and ends with
    a full stop."""
    text = " ".join((text or "").split())
    first = next((c for c in text if c.isalpha()), "")
    return first.isupper() and text.endswith(".")


def test_whole_sentence():
    assert whole_sentence("The directory to write.") and whole_sentence('"Seeds" are listed.')
    assert not whole_sentence("output directory") and not whole_sentence("The seed")
    assert not whole_sentence(None)


def shown_help(module: str, capsys, monkeypatch) -> tuple[argparse.ArgumentParser, str]:
    """`python -m <module> --help`, run in-process: the parser that printed it, and what it printed."""
    printed = []
    print_help = argparse.ArgumentParser.print_help

    def recording(self, file=None):
        printed.append(self)
        return print_help(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", recording)
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        import_module(module).main(["--help"])
    assert done.value.code == 0
    [parser] = printed
    return parser, capsys.readouterr().out


@pytest.mark.parametrize("module", COMMANDS)
def test_help_is_whole_sentences_each_printed_once(module, capsys, monkeypatch):
    parser, text = shown_help(module, capsys, monkeypatch)
    assert text.startswith(f"usage: python -m {module} "), text
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    repeated = {p for p in paragraphs if paragraphs.count(p) > 1}
    assert not repeated, repeated
    assert whole_sentence(parser.description), parser.description
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):  # argparse's own line
            continue
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings or action.dest
        assert whole_sentence(action.help), (action.option_strings or action.dest, action.help)


def test_a_stage_docstring_is_split_into_its_summary_and_the_rest():
    first, rest = cli.split_doc("Do one thing.\n\n    python -m stages.x \\\n        --out o\n\nAt length.\n")
    assert first == "Do one thing."
    assert rest.splitlines() == ["    python -m stages.x \\", "        --out o", "", "At length."]
    assert cli.split_doc("Only this.") == ("Only this.", None)
    assert cli.split_doc(None) == (None, None)
