"""The blind mutation score's own parts (`make mutate-blind`, tools/mutation_score.py): mutmut's
configuration covers every module with the fast tier, a sample is drawn by its seed alone, the
score counts what the tests caught among what ran, and a mutant's run that hangs ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import mutation_score  # noqa: E402

MUTMUT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def test_mutmut_mutates_every_module_of_pipeline_and_stages_with_the_fast_tier():
    assert MUTMUT["source_paths"] == ["pipeline", "stages"]
    assert not MUTMUT.get("do_not_mutate") and not MUTMUT.get("only_mutate")
    selection = MUTMUT["pytest_add_cli_args_test_selection"]
    assert selection[0] == "tests"
    runs = Expression.compile(selection[selection.index("-m") + 1])
    assert runs.evaluate(lambda marker: False)  # an unmarked test runs
    for left_out in ("slow", "interop4", "source"):  # subprocess runs, the other venv, the code's text
        assert not runs.evaluate(lambda marker, m=left_out: marker == m), left_out
    # what the fast tier reads beside the code (the committed run's verdicts: docs' generated text)
    for name in ("conf", "data", "hydra_plugins", "docs", "dvc.lock", "CHANGELOG.md", "outputs/compare"):
        assert name in MUTMUT["also_copy"], name


def test_the_score_counts_timeouts_as_caught_and_survivors_and_unreached_mutants_against():
    c = Counter({"mutants": 20, "killed": 12, "timeout": 2, "survived": 2, "no tests": 1, "suspicious": 1})
    c["not checked"], c["check was interrupted by user"] = 1, 1  # neither judged
    assert mutation_score.score(c) == pytest.approx(14 / 18)
    assert mutation_score.score(Counter({"mutants": 3, "not checked": 3})) is None


def test_a_samples_whole_score_weighs_each_subpackage_by_its_size():
    # a: 10 sampled of 100, 6 caught (60%); b: all 10 of 10 caught. Pooled: 16 / 20; weighed:
    # (100 x 0.6 + 10 x 1) / 110.
    a = Counter({"mutants": 10, "killed": 6, "survived": 4})
    b = Counter({"mutants": 10, "killed": 10})
    assert mutation_score.stratified_score({"a": a, "b": b}, {"a": 100, "b": 10}) == pytest.approx(70 / 110)
    # a subpackage with nothing judged yet is left out, not counted as 0
    c = Counter({"mutants": 5, "not checked": 5})
    assert mutation_score.stratified_score({"b": b, "c": c}, {"b": 10, "c": 50}) == 1.0
    assert mutation_score.stratified_score({"c": c}, {"c": 50}) is None


def test_groups_are_the_subpackages_the_ground_and_stages():
    base = mutation_score.ROOT / "mutants"
    assert mutation_score.group_of(base / "pipeline/circuits/strands.py") == "circuits"
    assert mutation_score.group_of(base / "pipeline/present/figures/heads.py") == "present"
    assert mutation_score.group_of(base / "pipeline/config.py") == "ground"
    assert mutation_score.group_of(base / "stages/train.py") == "stages"


def test_the_wilson_interval_matches_its_known_values():
    # 90 of 100: the textbook 95% Wilson interval [0.8256, 0.9448]; 0 of 10: upper z^2 / (n + z^2)
    z2 = 1.959964**2
    assert mutation_score.wilson(90, 100) == pytest.approx((0.825634, 0.944771), abs=1e-5)
    assert mutation_score.wilson(0, 10) == pytest.approx((0.0, z2 / (10 + z2)), abs=1e-6)
    # all caught: the lower end is n / (n + z^2), below 100% however many were judged
    assert mutation_score.wilson(200, 200) == pytest.approx((200 / (200 + z2), 1.0), abs=1e-6)
    assert mutation_score.wilson(0, 0) == (0.0, 1.0)  # nothing judged: nothing known


WHERE = {"circuits": "pipeline/circuits/strands.py", "ground": "pipeline/io.py", "stages": "stages/train.py"}


def _found(groups: dict[str, int], status: str = "not checked") -> dict:
    base = mutation_score.ROOT / "mutants"
    return {
        f"{group}.x_f__mutmut_{i}": (status, base / WHERE[group])
        for group, count in groups.items()
        for i in range(1, count + 1)
    }


def test_a_sample_draws_n_per_subpackage_by_its_seed_whatever_has_run():
    found = _found({"circuits": 50, "ground": 30, "stages": 4})
    picked = mutation_score.sample(found, 10, seed="a1b2c3")
    counts = Counter(mutation_score.group_of(path) for _, path in picked.values())
    assert counts == {"circuits": 10, "ground": 10, "stages": 4}  # all of a smaller subpackage
    assert all(found[name] == value for name, value in picked.items())
    # the draw depends on the names and the seed only: not on statuses, nor on the dict's order
    run = {name: ("killed", path) for name, (_, path) in reversed(list(found.items()))}
    assert set(mutation_score.sample(run, 10, seed="a1b2c3")) == set(picked)
    assert set(mutation_score.sample(found, 10, seed="7")) != set(picked)
    # a seed given as a number draws what the same seed given as text does (make passes text)
    assert mutation_score.sample(found, 10, seed=7) == mutation_score.sample(found, 10, seed="7")


def test_a_function_moved_to_another_module_keeps_its_mutants_in_the_sample():
    # module a holds f and g; after a split, g lives in module b of the same subpackage
    where = mutation_score.ROOT / "mutants/pipeline/circuits"
    before = {
        f"pipeline.circuits.a.x_{fn}__mutmut_{i}": ("killed", where / "a.py")
        for fn in "fg"
        for i in range(40)
    }
    after = {
        name.replace(".a.x_g", ".b.x_g"): (status, where / ("b.py" if ".x_g" in name else "a.py"))
        for name, (status, _) in before.items()
    }
    picked_before = mutation_score.sample(before, 12, seed="s")
    picked_after = mutation_score.sample(after, 12, seed="s")
    assert {n.rsplit(".", 1)[-1] for n in picked_before} == {n.rsplit(".", 1)[-1] for n in picked_after}
    assert any(".b.x_g" in n for n in picked_after)


def test_a_samples_run_tests_every_mutant_not_caught_yet():
    found = {
        "a": ("suspicious", None),
        "b": ("not checked", None),
        "c": ("survived", None),
        "d": ("killed", None),
        "e": ("segfault", None),
        "f": ("timeout", None),
        "g": ("no tests", None),
    }
    assert mutation_score.to_run(found) == ["a", "b", "c", "e", "g"]


def _mutants(root: Path, statuses: dict[str, dict[str, int | None]]) -> None:
    """mutmut's record as it leaves it: mutants/<file>.py.meta, exit codes by mutant name."""
    for file, codes in statuses.items():
        meta = root / "mutants" / f"{file}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": codes}))


def test_a_sample_is_scored_per_subpackage_and_checked_against_its_target(tmp_path, monkeypatch, capsys):
    # circuits: 3 killed (exit 1), 1 timeout (36), 1 survived (0): 4 of 5 caught, 80% < 95%;
    # ground: 2 killed, 1 no tests (33), 1 never run: 2 of 3, 66.7% < 85%; stages: 1 survived, no target
    _mutants(
        tmp_path,
        {
            "pipeline/circuits/strands.py": {f"c{i}": code for i, code in enumerate([1, 1, 1, 36, 0])},
            "pipeline/io.py": {"g0": 1, "g1": 1, "g2": 33, "g3": None},
            "stages/train.py": {"s0": 0},
        },
    )
    monkeypatch.setattr(mutation_score, "ROOT", tmp_path)
    assert mutation_score.main(["--sample", "5", "--seed", "x"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["circuits"][1:9] == ["5", "5", "3", "1", "1", "0", "80.0%", "95%"]
    assert rows["ground"][1:9] == ["4", "3", "2", "0", "0", "1", "66.7%", "85%"]
    assert rows["stages"][1:9] == ["1", "1", "0", "0", "1", "0", "0.0%", "-"]
    assert rows["circuits"][9] == "37.6-96.4%"  # Wilson, 4 of 5
    # the whole: each subpackage's score weighed by its mutants in all (5, 4 and 1 here)
    assert rows["all"][7] == f"{100 * (5 * 0.8 + 4 * 2 / 3 + 1 * 0.0) / 10:.1f}%"
    assert mutation_score.main(["--sample", "5", "--seed", "x", "--check"]) == 1
    assert capsys.readouterr().err.strip() == "below target: circuits, ground"
    assert mutation_score.main(["--sample", "5", "--seed", "x", "--names"]) == 0
    assert capsys.readouterr().out.split() == ["c4", "g2", "g3", "s0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sample", "0"], "--sample must be at least 1, got 0"),
        (["--names"], "--names lists a sample's mutants: give --sample N"),
    ],
)
def test_a_bad_sample_request_is_one_line_and_exit_2(argv, message, capsys):
    assert mutation_score.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"mutation_score: {message}"


def test_a_stuck_mutant_run_ends_by_sigalrm_which_mutmut_records_as_suspicious():
    from mutmut.stats import status_by_exit_code

    code = "import conftest, time; conftest.mutant_watchdog(1); time.sleep(30)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", timeout=25)
    assert proc.returncode == -signal.SIGALRM
    assert status_by_exit_code[-signal.SIGALRM] == "suspicious"
    assert mutation_score.to_run({"a": ("suspicious", None)}) == ["a"]  # run again by the next sample
