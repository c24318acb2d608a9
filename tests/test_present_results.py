"""The generated result text (pipeline/present/results.py): its blocks rendered from a verdicts.json,
written between their markers and nowhere else, and the committed README.md and docs/results.md
exactly what the committed run's verdicts.json gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import synthetic_seeds as syn

from pipeline.compare import stats
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.present import results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def summary() -> dict:
    return stats.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CompareConfig(), 0.1, 0.05).summary


def cells(markdown: str) -> list[list[str]]:
    """The body rows of the markdown tables in `markdown`, each as its cells (the header and
    the |---| line dropped)."""
    rows, previous = [], ""
    for line in markdown.splitlines():
        if line.startswith("|") and not line.startswith("|---") and previous.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        previous = line if line.startswith("|") else ""
    return rows


def lines(markdown: str) -> list[str]:
    """The body rows of a markdown table, as lines."""
    return [line for line in markdown.splitlines() if line.startswith("| ")][1:]


def block(name: str, body: str = "old") -> str:
    start, end = (results.MARK.format(name=name, edge=e) for e in ("start", "end"))
    return f"{start}\n{body}\n{end}"


def test_each_block_is_rendered_from_the_summary_and_written_between_its_markers(summary):
    text = f"# a page\n\nwords before\n{block('verdicts')}\nwords after\n"
    got = results.fill(text, results.render(summary, ("verdicts",)), "README.md")
    assert got.startswith("# a page\n\nwords before\n") and got.endswith("\nwords after\n")
    table = got.split(results.MARK.format(name="verdicts", edge="start"))[1].split("\n<!--")[0]
    rows = cells(table)
    assert len(rows) == sum(len(s) for s in summary["claims"].values())  # a row per claim and side
    assert [r[0] for r in rows] == [f"({name})" for name, sides in summary["claims"].items() for _ in sides]
    verdicts = [s["verdict"] for sides in summary["claims"].values() for s in sides.values()]
    # each side's verdict, in bold (a label's norms, ||B A||, hold bars of their own: not split on them)
    assert [re.search(r"\| \*\*(\w+)\*\* \|", line).group(1) for line in lines(table)] == verdicts
    assert {"holds", "uncalibrated"} <= set(verdicts)
    assert results.fill(got, results.render(summary, ("verdicts",)), "README.md") == got  # idempotent


def test_the_calibration_and_agreement_blocks_read_the_run(summary):
    text = results.render(summary, ("calibration", "agreement"))
    assert ["invariant", "9 / 18", "0 / 18", "0 / 18", "no"] in cells(text["calibration"])
    assert ["keys", "least read", "true", "0.2 (7.0), 0.2 (7.0), 0.2 (7.0)"] in cells(text["calibration"])
    assert ["true", "0.50 [0.50, 0.50]", "0.60 [0.60, 0.60]"] in cells(text["agreement"])


def test_a_file_without_the_block_is_refused_naming_it(summary):
    with pytest.raises(UserError, match="README.md.*'verdicts'"):
        results.fill("no markers here", results.render(summary, ("verdicts",)), "README.md")


def test_the_committed_text_is_what_the_committed_runs_verdicts_give():
    """README.md and docs/results.md against the run committed beside them: `make results` after
    a run whose verdicts changed is what keeps them true."""
    from pipeline import io

    verdicts = io.read_json(ROOT / "outputs" / "compare" / "verdicts.json")
    for path in (
        ROOT / "README.md",
        *(ROOT / "docs" / name for name in ("results.md", "claims.md", "maths.md")),
    ):
        text = path.read_text()
        assert results.fill(text, results.render(verdicts, results.FILES[path.name]), str(path)) == text, path


def test_main_rewrites_every_file_given_and_a_one_seed_mean_has_no_interval(tmp_path):
    """`python -m pipeline.present.results` on a one-seed run: each file named is rewritten from
    the run's verdicts, and a mean over one seed stands without an interval."""
    from pipeline import io

    one = stats.compare([syn.seed_inputs(0)], CompareConfig(), 0.1, 0.05).summary
    io.write_json(tmp_path / "verdicts.json", one)
    given = [tmp_path / "README.md", tmp_path / "results.md"]
    for path in given:
        path.write_text("\n".join(["before", *map(block, results.FILES[path.name]), "after\n"]))
    assert results.main([str(tmp_path / "verdicts.json"), *map(str, given)]) == 0
    sides = [s for claim in one["claims"].values() for s in claim.values()]
    for path in given:
        text = path.read_text()
        assert "\nold\n" not in text, path  # every block of the file rewritten
        table = lines(text.split(results.MARK.format(name="verdicts", edge="end"))[0])
        # the cell after each side's bold verdict (a label's norms, ||B A||, hold bars of their own)
        means = [re.search(r"\| \*\*\w+\*\* \| ([^|]+) \|", line).group(1).strip() for line in table]
        assert means == [results.fixed(s["mean"], 2) for s in sides], path
