"""The compare stage: role-group composition, the errata's claims per seed as one long table
(known answers under both denominator hypotheses), bootstrap intervals across seeds, and
the stage's files (exact seeds, byte-stable, one-line errors).

Inputs are the hand-made tables of `synthetic_seeds` (planted values, see its docstring).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic_seeds as syn

from pipeline import params
from pipeline.compare import read
from pipeline.compare import stats as compare
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import CURVE_COLUMNS
from stages import compare as compare_stage

CFG = CompareConfig(bootstrap_samples=2000)


def scored(seed: int = 0) -> pd.DataFrame:
    inp = syn.seed_inputs(seed)
    return compare.with_roles(inp.scores, inp.heads)


# --- one seed ------------------------------------------------------------------------


def test_group_composition_known_values():
    k = syn.scale_of(1)
    g = compare.group_composition(scored(1)).set_index(compare.GROUP_KEYS)
    cell = g.loc[("K", "true", "induction", "previous_token")]
    assert cell["n_pairs"] == 2
    assert cell["max_excess"] == pytest.approx(0.30 * k)
    assert cell["mean_excess"] == pytest.approx((0.30 + 0.25) / 2 * k)
    assert cell["max_z"] == pytest.approx(0.30 * k / 0.01)
    assert g.loc[("K", "errata_bcda", "induction", "recent_window"), "max_excess"] == pytest.approx(0.01 * k)
    assert g.loc[("V", "true", "other", "other"), "n_pairs"] == 1
    # every head pair lands in exactly one cell of each (kind, variant)
    assert g["n_pairs"].sum() == len(syn.scores())
    # rows come in the fixed order: kinds, then variants, then roles
    assert list(g.index.get_level_values("kind").unique()) == ["Q", "K", "V"]
    assert list(g.index.get_level_values("variant").unique()) == list(syn.MEASURES)


def test_group_composition_skips_undefined_errata_scores():
    s = scored()
    errata_prev = (
        (s["variant"] == "errata_bcda") & (s["kind"] == "K") & (s["dst_head"] == 0) & (s["src_head"] == 0)
    )
    s.loc[errata_prev, ["score", "excess", "z"]] = math.nan  # a rotated strand that is exactly zero
    g = compare.group_composition(s).set_index(compare.GROUP_KEYS)
    cell = g.loc[("K", "errata_bcda", "induction", "previous_token")]
    assert cell["n_pairs"] == 2 and cell["max_excess"] == pytest.approx(0.40)


def test_selectivity_known_values():
    s = scored()
    assert compare.selectivity(s, "true") == pytest.approx(
        (0.30 - 0.35) / (0.30 + 0.35)
    )  # V other<-other wins
    assert compare.selectivity(s, "errata_bcda") == pytest.approx((0.50 - 0.01) / (0.50 + 0.01))
    assert math.isnan(compare.selectivity(s, "true", dst="induction", src="duplicate_token"))  # no such heads


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def long_table(inp) -> pd.DataFrame:
    s = compare.with_roles(inp.scores, inp.heads)
    return compare.seed_statistics(inp, s, compare.group_composition(s), EDGE, CFG)


def value(table: pd.DataFrame, **where) -> float:
    rows = table
    for column, v in where.items():
        rows = rows[rows[column] == v]
    assert len(rows) == 1, where
    return float(rows["value"].iloc[0])


def test_seed_statistics_claims_known_values():
    inp = syn.seed_inputs(2)
    t = long_table(inp)
    k = syn.scale_of(2)
    assert list(t.columns) == list(compare.LONG_COLUMNS) and set(t["seed"]) == {2}
    assert not t.duplicated(compare.DIMENSIONS).any()  # one row per statistic
    assert (
        value(t, claim="roles", statistic="induction") == 2
        and value(t, claim="roles", statistic="other") == 2
    )
    assert value(t, claim="training", statistic="eval_loss") == pytest.approx(1.8)
    # (a): true's strongest composition is V other <- other; each rotation singles out K induction <- prev
    assert value(t, claim="a", statistic="selectivity", variant="true") == pytest.approx(-1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51)
    assert value(t, claim="a", statistic="a", hypothesis="true") == pytest.approx(
        (0.05 - 0.01) / (0.05 + 0.01)
    )
    # (b)
    assert value(t, claim="b", statistic="b") == pytest.approx(20 * k)
    assert value(t, claim="b", statistic="relative", variant="true") == pytest.approx(2 / 3)
    assert value(t, claim="b", statistic="relative", variant="errata_dabc") == pytest.approx(0.01 / 0.50)
    # (m): excess > 0.1 draws four true pairs (three K, one V), two of each rotated-denominator
    # rotation (K), none with true denominators
    assert value(t, claim="m", statistic="drawn", kind="K", variant="true") == 3
    assert value(t, claim="m", statistic="m", hypothesis="rotated") == 4 - 2
    assert value(t, claim="m", statistic="m", hypothesis="true") == 4 - 0
    # (d): only K edges, all from head 0.0, under rotated denominators; nothing drawn under true ones
    assert value(t, claim="d", statistic="layer0_k_sources", variant="errata_bcda") == 1
    assert value(t, claim="d", statistic="d", hypothesis="rotated") == 1.0
    assert value(t, claim="d", statistic="d", hypothesis="true") == 0.0
    assert value(t, claim="d", statistic="only_k_one_source", variant="true") == 0.0  # V edges too
    # (mz): z > 3 for five true pairs (the 0.05 pair: z = 5 k), every errata pair (background z 10)
    assert value(t, claim="mz", statistic="mz") == 5 - 27
    # (c): top source 2/2 (true) against 1/2; Spearman 0.6 against the better rotation's 0.3
    e = "heldout_loss_effect"
    assert value(t, claim="c", statistic="top_source", kind="K", variant="true", effect=e) == 1.0
    assert value(t, claim="c", statistic="c", hypothesis="true") == pytest.approx(0.5)
    assert value(t, claim="c", statistic="spearman_gain", hypothesis="rotated") == pytest.approx(0.6 - 0.3)


def test_seed_without_recent_window_heads_leaves_claim_b_out():
    inp = syn.seed_inputs(0)
    inp.heads.loc[inp.heads["role"] == "recent_window", "role"] = "other"
    inp.agreement = {"heldout_loss_effect": {"spearman": {"K": {"true": None}}, "top_source": {}}}
    t = long_table(inp)
    assert math.isnan(value(t, claim="b", statistic="b"))
    assert math.isnan(value(t, claim="b", statistic="relative", variant="true"))
    assert math.isnan(value(t, claim="c", statistic="c", hypothesis="rotated"))  # no top-source counts
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51)  # unaffected


def test_a_head_without_a_role_is_named():
    inp = syn.seed_inputs(0)
    with pytest.raises(UserError, match=r"heads.csv.*\(1, 2\)"):
        compare.with_roles(inp.scores, inp.heads[~((inp.heads["layer"] == 1) & (inp.heads["head"] == 2))])


# --- across seeds --------------------------------------------------------------------


def test_bootstrap_known_answers():
    assert compare.bootstrap_ci([1.0], CFG) == (None, None)
    assert compare.bootstrap_ci([2.0, math.nan], CFG) == (None, None)
    assert compare.bootstrap_ci([0.5, 0.5, 0.5], CFG) == (0.5, 0.5)
    # two seeds: resampled means are x1 (1/4), the midpoint (1/2), x2 (1/4): the 95% interval is [x1, x2]
    assert compare.bootstrap_ci([1.0, 3.0], CFG) == (1.0, 3.0)
    lo, hi = compare.bootstrap_ci([0.0, 1.0, 2.0], CFG)
    assert 0.0 <= lo < 1.0 < hi <= 2.0 and lo == pytest.approx(2.0 - hi, abs=0.05)  # symmetric data
    # a narrower level gives a narrower interval
    lo80, hi80 = compare.bootstrap_ci(
        [0.0, 1.0, 2.0, 5.0, 3.0], CompareConfig(ci=0.8, bootstrap_samples=2000)
    )
    lo95, hi95 = compare.bootstrap_ci([0.0, 1.0, 2.0, 5.0, 3.0], CFG)
    assert lo95 <= lo80 < hi80 <= hi95


def test_bootstrap_is_seeded():
    x = [0.1, 0.7, 0.3, 0.9, 0.4]
    assert compare.bootstrap_ci(x, CFG) == compare.bootstrap_ci(x, CFG)
    other = compare.bootstrap_ci(x, CompareConfig(bootstrap_samples=2000, bootstrap_seed=1))
    assert other != compare.bootstrap_ci(x, CFG)


@pytest.mark.parametrize(
    "stat, expected",
    [
        ({"n": 0, "lo": None, "hi": None}, "untestable"),
        ({"n": 1, "lo": None, "hi": None}, "inconclusive"),
        ({"n": 3, "lo": 0.1, "hi": 0.5}, "holds"),
        ({"n": 3, "lo": -0.5, "hi": -0.1}, "fails"),
        ({"n": 3, "lo": -0.1, "hi": 0.5}, "inconclusive"),
    ],
)
def test_verdict(stat, expected):
    assert compare.verdict(stat, 0.0) == expected


def test_compare_across_seeds():
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE)
    assert list(result.claims["seed"].unique()) == [0, 1, 2]
    assert list(result.groups["seed"].unique()) == [0, 1, 2]
    assert list(result.roles["seed"].unique()) == [0, 1, 2]
    summary = result.summary
    assert summary["n_seeds"] == 3
    b = summary["claims"]["b"]["-"]
    assert b["mean"] == pytest.approx(22.0) and 20.0 <= b["lo"] < 22.0 < b["hi"] <= 24.0
    for name, hypothesis, expected in [
        ("a", "rotated", "holds"), ("a", "true", "holds"), ("b", "-", "holds"), ("m", "true", "holds"),
        ("mz", "-", "fails"), ("d", "rotated", "holds"), ("d", "true", "fails"), ("c", "true", "holds"),
    ]:  # fmt: skip
        assert summary["claims"][name][hypothesis]["verdict"] == expected, (name, hypothesis)
    a = summary["claims"]["a"]["rotated"]
    assert a["seeds_holding"] == 3 and a["seeds_tested"] == 3 and a["threshold"] == 0.0
    assert summary["claims"]["d"]["true"]["threshold"] == 0.5 and b["threshold"] == 3.0
    assert summary["training"]["eval_loss"] == pytest.approx(1.9) and summary["roles"]["induction"] == 2
    assert list(summary) == ["n_seeds", "claims", "training", "roles"]
    assert list(a) == ["verdict", "seeds_holding", "seeds_tested", "mean", "lo", "hi", "threshold"]
    # every statistic of the long table has its row across seeds
    stats = result.stats.set_index(compare.DIMENSIONS)
    assert len(stats) == len(result.claims.drop_duplicates(compare.DIMENSIONS))
    assert stats.loc[("c", "true", "K", "-", "heldout_loss_effect", "c"), "lo"] == pytest.approx(0.5)
    # the mean training curve, step by step
    assert list(result.mean_curve["eval_loss"]) == pytest.approx([4.0, 3.0, 1.9])
    assert result.mean_curve["tokens"].dtype.kind == "i"


def test_one_seed_has_no_interval_and_no_verdict():
    result = compare.compare([syn.seed_inputs(0)], CFG, EDGE)
    assert result.summary["claims"]["b"]["-"] == {
        "verdict": "inconclusive",
        "seeds_holding": 1,
        "seeds_tested": 1,
        "mean": 20.0,
        "lo": None,
        "hi": None,
        "threshold": 3.0,
    }
    json.loads(compare.summary_json(result.summary))


def test_seeds_evaluated_at_different_steps_are_refused():
    a, b = syn.seed_inputs(0), syn.seed_inputs(1)
    b.curve = b.curve.assign(step=[0, 5, 20])
    with pytest.raises(UserError, match="different steps"):
        compare.compare([a, b], CFG, EDGE)


def test_stale_seed_dirs(tmp_path):
    for name in ("seed0", "seed1", "seed10", "seedX"):
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "train" / "seed3").write_text("a file, not a seed directory")
    stale = read.stale_seed_dirs([tmp_path / "train", tmp_path / "missing"], [0])
    assert [p.name for p in stale] == ["seed1", "seed10"]


def test_report_describes_every_statistic():
    from pipeline import report

    result = compare.compare([syn.seed_inputs(0)], CFG, EDGE)
    pairs = result.claims[["claim", "statistic"]].drop_duplicates()
    assert all(report.describe(c, s) for c, s in zip(pairs["claim"], pairs["statistic"], strict=True))


# --- the stage -----------------------------------------------------------------------


def write_params(path: Path, overrides: list[str]) -> Path:
    path.write_text(params.dump(params.compose(overrides)))  # real Hydra compose of conf/
    return path


def run_stage(tmp_path: Path, dirs: dict, out: Path, seeds: str) -> int:
    p = write_params(
        tmp_path / f"params-{out.name}.yaml",
        [f"seeds={seeds}", "analysis.compare.bootstrap_samples=500", "analysis.compare.dpi=40"],
    )
    return compare_stage.main(
        [
            "--params",
            str(p),
            "--train",
            str(dirs["train"]),
            "--composition",
            str(dirs["composition"]),
            "--heads",
            str(dirs["heads"]),
            "--dynamics",
            str(dirs["dynamics"]),
            "--out",
            str(out),
        ]
    )


EXPECTED_FILES = {
    "claims.csv",
    "stats.csv",
    "groups.csv",
    "roles.csv",
    "curves.tsv",
    "summary.json",
    "figures/claims.png",
    "figures/claims.svg",
    "figures/roles.png",
    "figures/roles.svg",
    "figures/curves.png",
    "figures/curves.svg",
    "figures/timing.png",
    "figures/timing.svg",
}


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_stage_reads_exactly_the_listed_seeds_and_is_byte_stable(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0, 1, 2])
    assert run_stage(tmp_path, dirs, tmp_path / "a", "[2,0]") == 0
    assert "seed1 is not in seeds" in capsys.readouterr().err  # a shrunk list: named, left out
    first = files(tmp_path / "a")
    assert set(first) == EXPECTED_FILES
    claims = pd.read_csv(tmp_path / "a" / "claims.csv")
    assert list(claims["seed"].unique()) == [2, 0]  # the order of params.yaml
    assert set(pd.read_csv(tmp_path / "a" / "groups.csv")["seed"]) == {0, 2}
    assert set(pd.read_csv(tmp_path / "a" / "roles.csv")["seed"]) == {0, 2}
    json.loads(first["summary.json"], parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
    curves = pd.read_csv(tmp_path / "a" / "curves.tsv", sep="\t")
    assert list(curves.columns) == list(CURVE_COLUMNS)
    assert curves["eval_loss"].iloc[-1] == pytest.approx((2.0 + 1.8) / 2)
    # same inputs and config: the same bytes, figures included
    assert run_stage(tmp_path, dirs, tmp_path / "b", "[2,0]") == 0
    assert files(tmp_path / "b") == first


def test_stage_missing_input_is_one_line_naming_the_file(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0,1]") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seed1" in err and "file not found" in err
    assert not (tmp_path / "out" / "claims.csv").exists()  # nothing half-written


def test_stage_heads_without_roles_is_named(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    heads_csv = dirs["heads"] / "seed0" / "heads.csv"
    pd.read_csv(heads_csv).drop(columns="role").to_csv(heads_csv, index=False)
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0]") == 2
    err = capsys.readouterr().err
    assert "heads.csv" in err and "'role'" in err


def test_stage_summary_without_agreement_is_named(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    (dirs["heads"] / "seed0" / "summary.json").write_text(json.dumps({"roles": {}}))
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0]") == 2
    assert "summary.json: agreement" in capsys.readouterr().err


def test_figures_show_every_seed():
    from pipeline.figures import compare as compare_figures

    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE)
    fig = compare_figures.claims_figure(result.claims, result.stats, 3.0, 0.95)
    b_axis = fig.axes[1]
    dots = np.concatenate(
        [
            c.get_offsets()
            for c in b_axis.collections
            if hasattr(c, "get_offsets") and len(c.get_offsets()) == 3
        ]
    )
    # (b) with the corrected score, then with the invariant measure: both planted at 0.20 / 0.01
    assert sorted(dots[:, 1]) == pytest.approx([20.0, 20.0, 22.0, 22.0, 24.0, 24.0])
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_claims_under_the_invariant_measure_known_values():
    long = long_table(syn.seed_inputs(0))  # scale 1
    assert value(long, claim="b_inv", statistic="b_inv", variant="invariant") == pytest.approx(0.20 / 0.01)
    # invariant: the 4 planted K pairs clear z > 3 (background 0.02 / 0.01 = 2 does not);
    # every errata pair does (0.01 / 0.001 = 10): 4 - 27
    assert value(long, claim="mz_inv", statistic="pairs_z", kind="K", variant="invariant") == 4
    assert value(long, claim="mz_inv", statistic="pairs_z", kind="V", variant="invariant") == 0
    assert value(long, claim="mz_inv", statistic="mz_inv") == 4 - 27
    for h in ("rotated", "true"):  # top source 2/2 against the better rotation's 1/2
        assert value(long, claim="c_inv", statistic="c_inv", hypothesis=h) == pytest.approx(0.5)
    assert (
        value(
            long,
            claim="c",
            statistic="top_source",
            kind="K",
            variant="invariant",
            effect="heldout_loss_effect",
        )
        == 1.0
    )


def test_timing_through_training_known_values():
    long = long_table(syn.seed_inputs(0))
    assert value(long, claim="t", statistic="phase_step") == 300
    clear = {"true": 400, "errata_bcda": 300, "errata_dabc": 200, "invariant": 300}  # synthetic_seeds doc
    for m, step in clear.items():
        assert value(long, claim="t", statistic="clear_step", kind="K", variant=m) == step
        assert value(long, claim="t", statistic="lag", kind="K", variant=m) == step - 300
    assert (
        value(long, claim="t", statistic="clear_step", kind="K", variant="errata_dabc_trueden") == 200
    )  # same z
    assert value(long, claim="t", statistic="t", kind="K") == 400 - 300  # the later rotation
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1)], CFG, EDGE)
    t = result.summary["claims"]["t"]["-"]
    assert (t["verdict"], t["seeds_holding"], t["mean"]) == ("holds", 2, 100.0)


def test_timing_figure_shows_every_measure():
    from pipeline.figures import compare as compare_figures

    result = compare.compare([syn.seed_inputs(s) for s in (0, 1)], CFG, EDGE)
    fig = compare_figures.timing_figure(result.claims, result.stats, 0.95)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(ticks) == len(syn.MEASURES) and "basis-\ninvariant" in ticks
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_names_match_the_modules_that_write_the_tables():
    """The vocabularies the tables share have one home, pipeline/tables.py."""
    from pipeline import composition, heads, tables

    assert composition.VARIANTS is tables.VARIANTS and tuple(composition.PARTS) == tables.VARIANTS
    assert set(heads.ROLE_SCORE) | {"other"} == set(tables.ROLES)
