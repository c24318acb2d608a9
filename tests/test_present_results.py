"""The generated result text (pipeline/present/results.py): its blocks rendered from a verdicts.json,
written between their markers and nowhere else, and the committed README.md and docs/results.md
exactly what the committed run's verdicts.json gives."""

from __future__ import annotations

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


def block(name: str, body: str = "old") -> str:
    start, end = (results.MARK.format(name=name, edge=e) for e in ("start", "end"))
    return f"{start}\n{body}\n{end}"


def test_each_block_is_rendered_from_the_summary_and_written_between_its_markers(summary):
    text = f"# a page\n\nwords before\n{block('verdicts')}\nwords after\n"
    got = results.fill(text, results.render(summary, ("verdicts",)), "README.md")
    assert got.startswith("# a page\n\nwords before\n") and got.endswith("\nwords after\n")
    table = got.split(results.MARK.format(name="verdicts", edge="start"))[1].split("\n<!--")[0]
    rows = [r for r in table.strip().splitlines()[2:]]
    assert len(rows) == sum(len(s) for s in summary["claims"].values())  # a row per claim and side
    assert "| (b) |" in table and "**holds**" in table and "**uncalibrated**" in table
    assert results.fill(got, results.render(summary, ("verdicts",)), "README.md") == got  # idempotent


def test_the_calibration_and_agreement_blocks_read_the_run(summary):
    text = results.render(summary, ("calibration", "agreement"))
    assert "| invariant | 9 / 18 | 0 / 18 | 0 / 18 | no |" in text["calibration"]
    assert "| keys | least read | true | 0.2 (7.0), 0.2 (7.0), 0.2 (7.0) |" in text["calibration"]
    assert "| true | 0.50 [0.50, 0.50] | 0.60 [0.60, 0.60] |" in text["agreement"]


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
