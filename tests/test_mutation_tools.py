"""The blind mutation check's own parts (`make mutate-blind`): mutmut's configuration covers every
module, the score's rule for equivalent mutants excuses only what it says, the equivalents and
allowed lists are well formed, and the hollowing that finds tests asserting nothing hollows what
it says (tools/mutation_score.py, tools/hollow_tests.py)."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import hollow_tests  # noqa: E402
import mutation_score  # noqa: E402

MUTMUT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def test_mutmut_mutates_every_module_of_pipeline_and_stages_with_the_fast_tier():
    assert MUTMUT["source_paths"] == ["pipeline", "stages"]
    assert not MUTMUT.get("do_not_mutate") and not MUTMUT.get("only_mutate")
    selection = MUTMUT["pytest_add_cli_args_test_selection"]
    assert selection[0] == "tests" and selection[selection.index("-m") + 1] == hollow_tests.FAST
    for folder in ("conf", "data", "hydra_plugins", "docs"):  # what the tests read beside the code
        assert folder in MUTMUT["also_copy"]


@pytest.mark.parametrize(
    ("removed", "added", "equivalent"),
    [
        ('x = torch.einsum("lde,lhef->lhdf", R, W)', 'x = torch.einsum("LDE,LHEF->LHDF", R, W)', True),
        ("b = torch.einsum('le,lde->ld', b, R)", "b = torch.einsum('LE,LDE->LD', b, R)", True),
        ('x = torch.einsum("lde,lhef->lhdf", R, W)', 'x = torch.einsum("lde,lhef->lhfd", R, W)', False),
        ('x = torch.einsum("lde,lhef->lhdf", R, W)', 'x = torch.einsum("lde,lhef->lhdf", W, R)', False),
        ('x = torch.einsum("lde,lhef->lhdf", R, W)', "x = None", False),
        ('name = "W_Q"', 'name = "w_q"', False),  # case matters outside einsum's labels
        ('torch.einsum("ij,jk->ik", a, b).sum(dim=0)', 'torch.einsum("IJ,JK->IK", a, b).SUM(dim=0)', False),
    ],
)
def test_the_einsum_case_rule_excuses_only_relabelled_subscripts(removed, added, equivalent):
    assert mutation_score._einsum_case(removed, added) is equivalent
    diff = f"--- a.py\n+++ a.py\n@@ -1 +1 @@\n-{removed}\n+{added}"
    assert (mutation_score.rule_of(diff) == "einsum-case") is equivalent


def test_a_rule_applies_to_one_changed_line_only():
    two = '--- a\n+++ a\n-einsum("ab->a", x)\n-y = 1\n+einsum("AB->A", x)\n+y = 2'
    assert mutation_score.rule_of(two) is None


def test_the_score_counts_timeouts_as_caught_and_leaves_out_equivalent_and_unchecked():
    c = Counter({"mutants": 20, "killed": 12, "timeout": 2, "survived": 2, "no tests": 1, "equivalent": 1})
    c["not checked"] = 2
    assert mutation_score.score(c) == pytest.approx(14 / 17)
    assert mutation_score.score(Counter({"mutants": 3, "not checked": 3})) is None


def test_a_samples_whole_score_weighs_each_subpackage_by_its_size():
    # a: 10 sampled of 100, 2 equivalent, 6 of 8 caught (75%): about 80 judged mutants in all;
    # b: all 10 of 10, 10 of 10 caught. Pooled: 16 / 18; weighed: (80 x 0.75 + 10 x 1) / 90.
    a = Counter({"mutants": 10, "killed": 6, "survived": 2, "equivalent": 2})
    b = Counter({"mutants": 10, "killed": 10})
    assert mutation_score.stratified_score({"a": a, "b": b}, {"a": 100, "b": 10}) == pytest.approx(70 / 90)
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


def test_every_equivalent_entry_names_a_mutant_its_change_and_one_reason(tmp_path):
    entries = mutation_score.load_equivalents()  # the kept lists parse, each with its reason
    assert all(e.mutant.startswith(("pipeline.", "stages.")) and e.change and e.reason for e in entries)
    (tmp_path / "x.toml").write_text('[[equivalent]]\nmutant = "pipeline.io.x_f__mutmut_1"\nchange = "a"\n')
    with pytest.raises(SystemExit, match="x.toml: entry 1 needs mutant, change and a one-line reason"):
        mutation_score.load_equivalents(tmp_path)


def test_every_allowed_hollow_pass_names_an_existing_test_and_one_reason():
    allowed = hollow_tests.load_allowed()
    assert allowed
    for test, reason in allowed.items():
        file, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / file).read_text(), test
        assert reason and "\n" not in reason


def test_hollowing_returns_none_from_every_function_and_keeps_the_rest():
    source = '''
"""Module doc."""
K = 3


def f(x):
    """Doc of f."""
    return x + K


class C:
    y = 2

    def m(self):
        def inner():
            return 1
        return inner() + self.y

    @property
    def p(self):
        return 5
'''
    namespace: dict = {}
    exec(compile(hollow_tests.hollow(source), "hollow", "exec"), namespace)
    assert namespace["K"] == 3 and namespace["C"].y == 2  # constants and class attributes stay
    assert namespace["f"](1) is None and namespace["f"].__doc__ == "Doc of f."
    assert namespace["C"]().m() is None and namespace["C"]().p is None
    tree = ast.parse(hollow_tests.hollow(source))
    assert ast.get_docstring(tree) == "Module doc."


def test_a_test_files_modules_are_the_pipeline_and_stage_modules_it_imports(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text(
        "import numpy\n"
        "from pipeline.circuits import strands, composition as comp\n"
        "from pipeline.errors import UserError\n"
        "import pipeline.io\n"
        "from stages import weights as weights_stage\n"
        "def test_y():\n"
        "    from pipeline.compare.stats import t_interval\n"
    )
    assert hollow_tests.imported_modules(test) == {
        "pipeline.circuits.strands",
        "pipeline.circuits.composition",
        "pipeline.errors",
        "pipeline.io",
        "stages.weights",
        "pipeline.compare.stats",
    }


def test_the_wilson_interval_matches_its_known_values():
    # 90 of 100: the textbook 95% Wilson interval [0.8256, 0.9448]; 0 of 10: upper z^2 / (n + z^2)
    z2 = 1.959964**2
    assert mutation_score.wilson(90, 100) == pytest.approx((0.825634, 0.944771), abs=1e-5)
    assert mutation_score.wilson(0, 10) == pytest.approx((0.0, z2 / (10 + z2)), abs=1e-6)
    # all caught: the lower end is n / (n + z^2), below 100% however many were judged
    assert mutation_score.wilson(200, 200) == pytest.approx((200 / (200 + z2), 1.0), abs=1e-6)
    assert mutation_score.wilson(0, 0) == (0.0, 1.0)  # nothing judged: nothing known


def _found(groups: dict[str, int], status: str = "not checked") -> dict:
    base = mutation_score.ROOT / "mutants"
    where = {
        "circuits": "pipeline/circuits/strands.py",
        "ground": "pipeline/io.py",
        "stages": "stages/train.py",
    }
    return {
        f"{group}.x_f__mutmut_{i}": (status, base / where[group])
        for group, count in groups.items()
        for i in range(1, count + 1)
    }


def test_a_sample_draws_n_per_subpackage_by_its_seed_whatever_has_run():
    found = _found({"circuits": 50, "ground": 30, "stages": 4})
    picked = mutation_score.sample(found, 10)
    counts = Counter(mutation_score.group_of(path) for _, path in picked.values())
    assert counts == {"circuits": 10, "ground": 10, "stages": 4}  # all of a smaller subpackage
    assert all(found[name] == value for name, value in picked.items())
    # the draw depends on the names and the seed only: not on statuses, nor on the dict's order
    run = {name: ("killed", path) for name, (_, path) in reversed(list(found.items()))}
    assert set(mutation_score.sample(run, 10)) == set(picked)
    assert set(mutation_score.sample(found, 10, seed=7)) != set(picked)
    # a larger sample contains no fewer of each group and stays within the names
    assert set(mutation_score.sample(found, 40)) <= set(found)


def test_a_full_runs_time_is_the_stratified_estimate_with_its_interval():
    # a: 2 of 4 mutants sampled, 1 s and 3 s -> 4 x 2 s = 8 s, variance 4^2 x 2 / 2 x (1 - 2/4) = 8;
    # b: all 3 of 3 sampled -> exactly 15 s, no variance (the finite-population correction is 0)
    times = {"a": [1.0, 3.0], "b": [5.0, 5.0, 5.0]}
    total, low, high = mutation_score.full_run_estimate(times, {"a": 4, "b": 3})
    half = 1.959964 * 8**0.5
    assert (total, low, high) == pytest.approx((23.0, 23.0 - half, 23.0 + half))
    # every mutant sampled: the sum itself, known exactly
    assert mutation_score.full_run_estimate({"a": [2.0, 4.0]}, {"a": 2}) == pytest.approx((6.0, 6.0, 6.0))
    # the interval never runs below no time at all
    assert mutation_score.full_run_estimate({"a": [0.0, 100.0]}, {"a": 1000})[1] == 0.0


def test_the_estimate_line_gives_hours_on_the_workers_or_says_why_not():
    found = _found({"circuits": 4, "stages": 3})
    names = sorted(found)
    sampled = {n: found[n] for n in names[:2] + names[4:]}  # 2 of circuits' 4, all 3 of stages'
    seconds = dict(zip(sorted(sampled), [3600.0, 10800.0, 1800.0, 1800.0, 1800.0], strict=True))
    line = mutation_score.estimate_line(found, sampled, seconds, workers=2)
    # circuits 4 x 2 h = 8 h, stages 3 x 0.5 h = 1.5 h: 9.5 h serial, 4.75 h on 2 workers
    assert line.startswith("a full run (7 mutants), estimated from the sample's test times: 4.8 h on 2 ")
    assert "not estimated" in mutation_score.estimate_line(found, sampled, {}, workers=2)
    one = {n: seconds[n] for n in list(seconds)[1:]}  # one circuits mutant timed: no spread to measure
    assert "not estimated" in mutation_score.estimate_line(found, sampled, one, workers=2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sample", "0"], "--sample must be at least 1, got 0"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--names"], "--names lists a sample's mutants: give --sample N"),
    ],
)
def test_a_bad_sample_request_is_one_line_and_exit_2(argv, message, capsys):
    assert mutation_score.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"mutation_score: {message}"


def test_a_stuck_mutant_run_ends_by_sigalrm_which_mutmut_records_as_suspicious_and_reruns():
    import signal
    import subprocess

    from mutmut.stats import status_by_exit_code

    code = "import conftest, time; conftest.mutant_watchdog(1); time.sleep(30)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", timeout=25)
    assert proc.returncode == -signal.SIGALRM
    assert status_by_exit_code[-signal.SIGALRM] == "suspicious"
    found = {
        "a": ("suspicious", None),
        "b": ("not checked", None),
        "c": ("survived", None),
        "d": ("killed", None),
        "e": ("segfault", None),
    }
    assert mutation_score.to_run(found) == ["a", "b"]
