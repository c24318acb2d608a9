"""The compare stage: role-group composition, the errata's claims per seed as one long table
(known answers under both denominator hypotheses), t intervals and verdicts across seeds, and
the stage's files (exact seeds, byte-stable, one-line errors).

Inputs are the hand-made tables of `synthetic_seeds` (planted values, see its docstring).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import synthetic_seeds as syn

from pipeline import params
from pipeline.compare import read
from pipeline.compare import stats as compare
from pipeline.compare.claims import CLAIMS, claim, selectivity
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import CURVE_COLUMNS
from stages import compare as compare_stage

CFG = CompareConfig()
FDR = 0.05


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
    assert cell["discoveries"] == 2
    assert g.loc[("K", "true", "induction", "recent_window"), "discoveries"] == 1
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
    assert selectivity(s, "true") == pytest.approx((0.30 - 0.35) / (0.30 + 0.35))  # V other<-other wins
    assert selectivity(s, "errata_bcda") == pytest.approx((0.50 - 0.01) / (0.50 + 0.01))
    assert math.isnan(selectivity(s, "true", dst="induction", src="duplicate_token"))  # no such heads


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def long_table(inp) -> pd.DataFrame:
    s = compare.with_roles(inp.scores, inp.heads)
    return compare.seed_statistics(inp, s, compare.group_composition(s), EDGE, FDR)


def value(table: pd.DataFrame, **where) -> float:
    rows = table
    for column, v in where.items():
        rows = rows[rows[column] == v]
    assert len(rows) == 1, where
    return float(rows["value"].iloc[0])


def test_seed_statistics_claims_known_values():
    inp = syn.seed_inputs(2)
    t = long_table(inp)
    assert list(t.columns) == list(compare.LONG_COLUMNS) and set(t["seed"]) == {2}
    assert not t.duplicated(compare.DIMENSIONS).any()  # one row per statistic
    assert (
        value(t, claim="roles", statistic="induction") == 2
        and value(t, claim="roles", statistic="other") == 2
    )
    assert value(t, claim="training", statistic="eval_loss") == pytest.approx(1.8)
    # (a): true's strongest composition is V other <- other; each rotation singles out K induction <- prev,
    # the original's selectivity (the less selective rotation) minus the corrected one's
    assert value(t, claim="a", statistic="selectivity", variant="true") == pytest.approx(-1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51 + 1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="true") == pytest.approx(
        (0.05 - 0.01) / (0.05 + 0.01) + 1 / 13
    )
    # (b): one discovery among true K induction <- recent_window (1.0 <- 0.1, not 1.1 <- 0.1)
    assert value(t, claim="b", statistic="b") == 1
    assert value(t, claim="b", statistic="relative", variant="true") == pytest.approx(2 / 3)
    assert value(t, claim="b", statistic="relative", variant="errata_dabc") == pytest.approx(0.01 / 0.50)
    # (m): K discoveries, 3 true against 2 under each rotation, one row per rotation; Q and V beside
    # it (m_kind): Q 0 true against 1 (B C D A) and 0 (D A B C); V 1 against none
    assert value(t, claim="m", statistic="discoveries", kind="K", variant="true") == 3
    assert value(t, claim="m", statistic="discoveries", kind="Q", variant="errata_bcda") == 1
    for rotation in ("errata_bcda", "errata_dabc"):
        assert value(t, claim="m", statistic="m", variant=rotation) == 3 - 2
        assert value(t, claim="m", statistic="m_kind", kind="K", variant=rotation) == 3 - 2
    assert value(t, claim="m", statistic="m_kind", kind="Q", variant="errata_bcda") == -1
    assert value(t, claim="m", statistic="m_kind", kind="Q", variant="errata_dabc") == 0
    assert value(t, claim="m", statistic="m_kind", kind="V", variant="errata_dabc") == 1
    # beside them the raw rule: z > 3 for five true pairs (the 0.05 pair: z = 5 k) and every errata
    # pair (background z 10); and the placebo pairs' false-positive rate
    assert value(t, claim="m", statistic="raw_z_above_3", kind="K", variant="true") == 4
    assert value(t, claim="m", statistic="raw_z_above_3", kind="Q", variant="errata_bcda") == 9
    assert value(t, claim="m", statistic="placebo_rate", kind="K", variant="errata_dabc") == pytest.approx(
        1 / 3
    )
    assert value(t, claim="m", statistic="placebo_rate", kind="K", variant="errata_bcda") == 0
    # (d): the paper's plotting (excess > 0.1) draws three true K pairs and one V; only K edges, all
    # from head 0.0, under rotated denominators; nothing drawn under true ones
    assert value(t, claim="d", statistic="drawn", kind="K", variant="true") == 3
    assert value(t, claim="d", statistic="layer0_k_sources", variant="errata_bcda") == 1
    assert value(t, claim="d", statistic="d", hypothesis="rotated") == 1.0
    assert value(t, claim="d", statistic="d", hypothesis="true") == 0.0
    assert value(t, claim="d", statistic="only_k_one_source", variant="true") == 0.0  # V edges too
    # (c): PR-AUC 0.8 against the better rotation's 0.6 (every effect alike here); chance 2 / 9 beside it
    e = "heldout_loss_effect"
    assert value(t, claim="c", statistic="pr_auc", kind="K", variant="true", effect=e) == pytest.approx(0.8)
    assert value(
        t, claim="c", statistic="roc_auc", kind="K", variant="errata_dabc", effect=e
    ) == pytest.approx(0.7)
    assert value(t, claim="c", statistic="causal_edges", kind="K", effect=e) == 2
    assert value(t, claim="c", statistic="causal_fraction", kind="K", effect=e) == pytest.approx(2 / 9)
    assert value(t, claim="c", statistic="top_source", kind="K", variant="true", effect=e) == 1.0
    # (c) compares the pair-specific parts: 0.5 against the better rotation's 0.2, one value whatever
    # the denominators; the raw-effect comparison beside it, per hypothesis: 0.6 against 0.3
    assert value(t, claim="c", statistic="c") == pytest.approx(0.5 - 0.2)
    for h in ("rotated", "true"):
        assert value(t, claim="c", statistic="c_raw", hypothesis=h) == pytest.approx(0.6 - 0.3)
    assert value(t, claim="c", statistic="interaction", kind="K", variant="projection", effect=e) == 0.3
    assert value(t, claim="c", statistic="main_share", kind="V", effect=e) == 0.9
    # (e): the two discovered induction <- previous_token pairs' alignment 4 and 2 times chance, their
    # writer's other reader (1.2) at chance; the rotated-over-true excess is all alignment
    ln2 = math.log(2)
    assert value(t, claim="e", statistic="e", kind="K") == pytest.approx(1.5 * ln2)
    assert value(t, claim="e", statistic="alignment", kind="K") == pytest.approx(1.5 * ln2)
    assert value(t, claim="e", statistic="other_alignment", kind="K") == pytest.approx(0.0, abs=1e-12)
    assert value(t, claim="e", statistic="excess", kind="K") == pytest.approx(0.75 * ln2)
    assert value(t, claim="e", statistic="excess_alignment", kind="K") == pytest.approx(0.75 * ln2)
    assert value(t, claim="e", statistic="excess_anisotropy", kind="K") == pytest.approx(0.0, abs=1e-12)
    assert value(t, claim="e", statistic="output_query", kind="K") == pytest.approx(-ln2)
    assert value(t, claim="e", statistic="pairs", kind="K") == 2
    assert value(t, claim="e", statistic="effective_channels", kind="K") == 3.0
    assert value(t, claim="e", statistic="top_share", kind="K") == pytest.approx(0.5)
    assert value(t, claim="e", statistic="channel_discoveries", kind="K") == 1
    assert value(t, claim="e", statistic="causal_share", kind="K") == pytest.approx(0.7)


def test_claim_c_reports_the_role_only_baseline_and_every_threshold():
    """synthetic_seeds' agreement (its docstring): beside each score's PR-AUC, the role-only
    ranker's (0.4), and for the pattern effect every variant's PR-AUC, the role-only ranker's and
    the causal edges at each threshold; at 0.1 no edge is causal, so every PR-AUC is undefined."""
    t = long_table(syn.seed_inputs(1))
    p = "pattern_effect"
    for e in ("heldout_loss_effect", "loss_effect", "attn_effect", p):
        assert value(t, claim="c", statistic="role_pr_auc", kind="K", effect=e) == pytest.approx(0.4)
    assert value(t, claim="c", statistic="causal_edges_at_0.05", kind="K", effect=p) == 1
    assert value(t, claim="c", statistic="causal_edges_at_0.01", kind="Q", effect=p) == 2
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="true", effect=p) == 1.0
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="errata_dabc", effect=p) == 0.25
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="invariant", effect=p) == 0.5
    assert value(t, claim="c", statistic="pr_auc_at_0.02", kind="K", variant="true", effect=p) == 0.8
    assert value(t, claim="c", statistic="role_pr_auc_at_0.05", kind="K", effect=p) == 0.5
    assert math.isnan(value(t, claim="c", statistic="role_pr_auc_at_0.1", kind="K", effect=p))
    assert math.isnan(value(t, claim="c", statistic="pr_auc_at_0.1", kind="K", variant="true", effect=p))
    # only the thresholded effect has rows per threshold; (c) itself reads min_effect's cut
    assert not ((t["statistic"] == "pr_auc_at_0.05") & (t["effect"] != p)).any()
    c = t[(t["claim"] == "c") & (t["statistic"] == "c")]
    assert set(c["effect"]) == {p} and c["value"].to_numpy() == pytest.approx([0.5 - 0.2])


def test_each_claim_is_one_unit_and_the_long_table_keeps_its_order():
    """A claim's rows are its own number under each of its hypotheses and the auxiliary statistics
    it describes (so the report can say what each is); a restatement with the invariant measure
    sits beside the claim it restates, hypothesis by hypothesis."""
    t = long_table(syn.seed_inputs(0))
    for name, c in CLAIMS.items():
        rows = t[t["claim"] == name]
        own = rows[rows["statistic"] == name]
        column = "variant" if c.versus else "hypothesis"  # one row per rotation, or per hypothesis
        assert list(own[column]) == [side for _, side in c.sides()], name
        assert set(rows["statistic"]) == {name, *c.auxiliary}, name
    order = [
        "training",
        "roles",
        "role_ablation",
        "a",
        "b",
        "b_inv",
        "m",
        "m_inv",
        "d",
        "c",
        "c_inv",
        "c_proj",
        "e",
        "t",
    ]
    assert list(dict.fromkeys(t["claim"])) == order
    own = t[t["statistic"].isin(["c", "c_inv", "c_proj"])]
    assert list(own["claim"]) == ["c", "c_inv", "c_proj"] and set(own["hypothesis"]) == {"-"}
    with pytest.raises(ValueError, match="defined twice"):
        claim("a", "a copy", "its number", 0.0)(lambda seed: iter(()))


def test_seed_without_recent_window_heads_leaves_claim_b_out():
    inp = syn.seed_inputs(0)
    inp.heads.loc[inp.heads["role"] == "recent_window", "role"] = "other"
    inp.agreement = {"heldout_loss_effect": {"spearman": {"K": {"true": None}}, "top_source": {}}}
    t = long_table(inp)
    assert math.isnan(value(t, claim="b", statistic="b"))
    assert math.isnan(value(t, claim="b", statistic="relative", variant="true"))
    assert math.isnan(value(t, claim="c", statistic="c"))  # no agreement
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51 + 1 / 13)


def test_a_head_without_a_role_is_named():
    inp = syn.seed_inputs(0)
    with pytest.raises(UserError, match=r"heads.csv.*\(1, 2\)"):
        compare.with_roles(inp.scores, inp.heads[~((inp.heads["layer"] == 1) & (inp.heads["head"] == 2))])


# --- across seeds --------------------------------------------------------------------


def test_t_interval_known_answers():
    assert compare.t_interval([1.0], 0.95) == (None, None)
    assert compare.t_interval([2.0, math.nan], 0.95) == (None, None)
    assert compare.t_interval([0.5, 0.5, 0.5], 0.95) == (0.5, 0.5)
    # mean 2, sd 1, n 3: 2 -+ t_{0.975, 2} / sqrt(3), t_{0.975, 2} = 4.302653
    lo, hi = compare.t_interval([1.0, 2.0, 3.0], 0.95)
    assert lo == pytest.approx(2 - 4.302653 / 3**0.5, abs=1e-6) and hi == pytest.approx(
        2 + 4.302653 / 3**0.5, abs=1e-6
    )
    lo80, hi80 = compare.t_interval([1.0, 2.0, 3.0], 0.8)  # t_{0.9, 2} = 1.885618
    assert hi80 - lo80 == pytest.approx(2 * 1.885618 / 3**0.5, abs=1e-6)


def test_sign_test_known_answers():
    assert compare.sign_test([1.0, 2.0, 3.0], 0.0) == pytest.approx(0.25)  # 2 x (1/2)^3
    assert compare.sign_test([1.0, 2.0, 3.0, 4.0, 5.0, -1.0], 0.0) == pytest.approx(14 / 64)
    assert compare.sign_test([0.0, 0.0], 0.0) is None  # every value on the limit


@pytest.mark.parametrize(
    "stat, values, expected",
    [
        ({"n": 0, "lo": None, "hi": None}, [], "untestable"),
        ({"n": 1, "lo": None, "hi": None}, [1.0], "inconclusive"),
        ({"n": 3, "lo": 0.1, "hi": 0.5}, [0.2, 0.3, 0.4], "holds"),
        ({"n": 3, "lo": -0.5, "hi": -0.1}, [-0.2, -0.3, -0.4], "fails"),
        ({"n": 3, "lo": -0.1, "hi": 0.5}, [0.2, 0.3, -0.01], "inconclusive"),
        ({"n": 3, "lo": 0.1, "hi": 0.5}, [0.2, 0.3, 0.0], "inconclusive"),  # one seed on the threshold
        ({"n": 2, "lo": 0.1, "hi": 0.5}, [0.2, 0.4], "inconclusive"),  # fewer than min_seeds = 3
    ],
)
def test_verdict(stat, values, expected):
    assert compare.verdict(stat, 0.0, values, min_seeds=3) == expected


def test_compare_across_seeds():
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE, FDR)
    assert list(result.claims["seed"].unique()) == [0, 1, 2]
    assert list(result.groups["seed"].unique()) == [0, 1, 2]
    assert list(result.roles["seed"].unique()) == [0, 1, 2]
    summary = result.summary
    assert summary["n_seeds"] == 3
    b = summary["claims"]["b"]["-"]
    assert (b["mean"], b["lo"], b["hi"]) == (1.0, 1.0, 1.0)  # one discovery in every seed
    for name, hypothesis, expected in [
        ("a", "rotated", "holds"), ("a", "true", "holds"), ("b", "-", "holds"),
        ("m", "errata_bcda", "holds"), ("m", "errata_dabc", "holds"),
        # the invariant measure fails the surrogate check: its discovery claims get no verdict
        ("m_inv", "errata_bcda", "uncalibrated"), ("b_inv", "-", "uncalibrated"), ("d", "rotated", "holds"),
        ("d", "true", "fails"), ("c", "-", "holds"), ("c_inv", "-", "holds"), ("c_proj", "-", "holds"),
        ("t", "errata_bcda", "holds"), ("t", "errata_dabc", "holds"),
    ]:  # fmt: skip
        assert summary["claims"][name][hypothesis]["verdict"] == expected, (name, hypothesis)
    a = summary["claims"]["a"]["rotated"]
    assert a["seeds_holding"] == 3 and a["seeds_failing"] == 0 and a["seeds_tested"] == 3
    assert a["threshold"] == 0.0 and a["sign_p"] == pytest.approx(0.25)
    assert a["per_seed"] == {"0": pytest.approx(49 / 51 + 1 / 13)} | {
        s: pytest.approx(49 / 51 + 1 / 13) for s in ("1", "2")
    }
    assert summary["claims"]["d"]["true"]["threshold"] == 0.5 and b["threshold"] == 0.5
    assert summary["claims"]["m_inv"]["errata_dabc"]["seeds_failing"] == 0  # 2 - 2 in every seed
    assert summary["claims"]["b_inv"]["-"]["seeds_failing"] == 3  # computed, shown, no verdict
    assert summary["claims"]["t"]["errata_dabc"]["per_seed"] == {s: 200.0 for s in ("0", "1", "2")}
    assert summary["training"]["eval_loss"] == pytest.approx(1.9) and summary["roles"]["induction"] == 2
    # the run's calibration: the invariant measure discovers in 9 of 18 surrogate families, beyond
    # what an FDR of 0.05 allows (binomial p far below 0.01); every other measure in none
    measures = summary["calibration"]["measures"]
    assert (
        measures["invariant"]["surrogate"]["with_discovery"] == 9 and not measures["invariant"]["calibrated"]
    )
    assert all(measures[m]["calibrated"] for m in syn.MEASURES if m != "invariant")
    assert summary["calibration"]["power"]["keys"]["least_read"]["true"]["strength"] == {
        "0": 0.2,
        "1": 0.2,
        "2": 0.2,
    }
    assert summary["calibration"]["non_composing"]["true"]["bulk_p"]["1"] == 0.5
    assert list(summary) == [
        "n_seeds",
        "rule",
        "claims",
        "calibration",
        "causal_check",
        "m_by_kind",
        "detection_limits",
        "training",
        "roles",
        "role_ablation",
    ]
    assert summary["role_ablation"]["induction_heldout_loss_effect"] == pytest.approx(0.05)
    assert summary["role_ablation"]["induction_probe_loss_effect"] == pytest.approx(1.2)
    assert summary["role_ablation"]["previous_token_heldout_loss_effect"] is None  # no such head
    assert summary["role_ablation"]["induction_placebo_p"] == pytest.approx(0.5)
    assert summary["role_ablation"]["induction_serves_heldout"] == 0  # one placebo set lies above
    check = summary["causal_check"]  # claim (c)'s cell: K, the later head's pattern on held-out text
    assert (check["kind"], check["effect"]) == ("K", "pattern_effect")
    assert check["causal_edges"] == {"0": 2.0, "1": 2.0, "2": 2.0}
    assert check["role_pr_auc"]["mean"] == pytest.approx(0.4) and check["role_pr_auc"]["lo"] == 0.4
    assert check["role_pr_auc"]["per_seed"] == {s: pytest.approx(0.4) for s in ("0", "1", "2")}
    assert check["pr_auc"]["true"]["mean"] == pytest.approx(0.8) and check["pr_auc"]["true"]["lo"] == 0.8
    assert check["roc_auc"]["errata_dabc"]["per_seed"] == {s: pytest.approx(0.7) for s in ("0", "1", "2")}
    assert list(a) == [
        "verdict", "seeds_holding", "seeds_failing", "seeds_tested", "mean", "lo", "hi", "sign_p",
        "per_seed", "threshold",
    ]  # fmt: skip
    # the headline (summary.json, DVC metrics): one verdict and one number per claim, the training
    headline = result.headline
    assert list(headline) == [
        "n_seeds", "verdict", "mean", "training", "m_by_kind", "c_vs_roles", "detection_limit_K"
    ]  # fmt: skip
    # (c) beside the role-only ranker, on the role-free edges at 0.05 (synthetic_seeds: 1.0 and 0.5)
    assert headline["c_vs_roles"] == {"pr_auc_true": pytest.approx(1.0), "role_pr_auc": pytest.approx(0.5)}
    assert headline["n_seeds"] == 3
    assert list(headline["verdict"]) == list(summary["claims"])
    assert headline["verdict"]["a"] == "holds" and headline["mean"]["a_rotated"] == a["mean"]  # both hold
    assert headline["verdict"]["d"] == "holds/fails"  # rotated / true denominators
    assert headline["verdict"]["b"] == "holds" and headline["mean"]["b"] == 1.0
    assert headline["verdict"]["m"] == "holds" and headline["mean"]["m_min"] == 1.0  # against both
    assert headline["verdict"]["m_inv"] == "uncalibrated" and headline["verdict"]["t"] == "holds"
    assert headline["mean"]["t_min"] == 100.0  # the rotation clearing later
    assert headline["m_by_kind"] == {"Q": {"errata_bcda": -1.0, "errata_dabc": 0.0},
                                     "K": {"errata_bcda": 1.0, "errata_dabc": 1.0},
                                     "V": {"errata_bcda": 1.0, "errata_dabc": 1.0}}  # fmt: skip
    assert list(headline["detection_limit_K"]) == ["seed0", "seed1", "seed2"]
    assert list(headline["detection_limit_K"]["seed0"]) == ["true", "errata_bcda", "errata_dabc"]
    assert headline["training"] == summary["training"]
    columns = 1 + len(headline["verdict"]) + len(headline["mean"]) + len(headline["training"])
    assert headline["verdict"]["e"] == "holds" and headline["mean"]["e"] == pytest.approx(1.5 * math.log(2))
    assert columns == 1 + 2 * len(CLAIMS) + 3  # n_seeds, a verdict and a mean per claim, training
    assert sum(len(v) for v in headline["m_by_kind"].values()) == 6
    # every statistic of the long table has its row across seeds; a t interval where seeds differ
    stats = result.stats.set_index(compare.DIMENSIONS)
    assert len(stats) == len(result.claims.drop_duplicates(compare.DIMENSIONS))
    row = stats.loc[("training", "-", "-", "-", "-", "eval_loss")]  # 2.0, 1.9, 1.8
    assert row["mean"] == pytest.approx(1.9) and row["sd"] == pytest.approx(0.1)
    assert row["hi"] - row["mean"] == pytest.approx(4.302653 * 0.1 / 3**0.5, abs=1e-6)
    # the mean training curve, step by step
    assert list(result.mean_curve["eval_loss"]) == pytest.approx([4.0, 3.0, 1.9])
    assert result.mean_curve["tokens"].dtype.kind == "i"


def test_one_seed_has_no_interval_and_no_verdict():
    result = compare.compare([syn.seed_inputs(0)], CFG, EDGE, FDR)
    assert result.summary["claims"]["b"]["-"] == {
        "verdict": "inconclusive",
        "seeds_holding": 1,
        "seeds_failing": 0,
        "seeds_tested": 1,
        "mean": 1.0,
        "lo": None,
        "hi": None,
        "sign_p": 1.0,
        "per_seed": {"0": 1.0},
        "threshold": 0.5,
        "seeds_absent": 0,
    }
    json.loads(compare.summary_json(result.summary))


def test_seeds_evaluated_at_different_steps_are_refused():
    a, b = syn.seed_inputs(0), syn.seed_inputs(1)
    b.curve = b.curve.assign(step=[0, 5, 20])
    with pytest.raises(UserError, match="different steps"):
        compare.compare([a, b], CFG, EDGE, FDR)


def test_stale_seed_dirs(tmp_path):
    for name in ("seed0", "seed1", "seed10", "seedX"):
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "train" / "seed3").write_text("a file, not a seed directory")
    stale = read.stale_seed_dirs([tmp_path / "train", tmp_path / "missing"], [0])
    assert [p.name for p in stale] == ["seed1", "seed10"]


def test_report_describes_every_statistic():
    from pipeline.present import report

    result = compare.compare([syn.seed_inputs(0)], CFG, EDGE, FDR)
    pairs = result.claims[["claim", "statistic"]].drop_duplicates()
    assert all(report.describe(c, s) for c, s in zip(pairs["claim"], pairs["statistic"], strict=True))


# --- the stage -----------------------------------------------------------------------


def write_params(path: Path, overrides: list[str]) -> Path:
    path.write_text(params.dump(params.compose(overrides)))  # real Hydra compose of conf/
    return path


def run_stage(tmp_path: Path, dirs: dict, out: Path, seeds: str) -> int:
    p = write_params(
        tmp_path / f"params-{out.name}.yaml",
        [f"seeds={seeds}", "analysis.compare.dpi=40"],
    )
    return compare_stage.main(
        [
            "--params",
            str(p),
            "--train",
            str(dirs["train"]),
            "--calibration",
            str(dirs["calibration"]),
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
    "verdicts.json",
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
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    inputs = [syn.seed_inputs(s) for s in (0, 1, 2)]
    inputs[2].agreement = json.loads(json.dumps(syn.AGREEMENT))
    inputs[2].agreement["pattern_effect"]["interaction"]["K"]["true"] = 0.9
    result = compare.compare(inputs, CFG, EDGE, FDR)
    fig = compare_figures.claims_figure(result.claims, result.stats, 0.95)
    [c_axis] = [ax for ax in fig.axes if ax.get_title().startswith("(c)")]
    dots = [c.get_offsets()[:, 1].tolist() for c in c_axis.collections if isinstance(c, PathCollection)]
    # (c), (c_inv), (c_proj): a dot per seed; the corrected score's third seed at 0.9 - 0.2
    assert [sorted(d) for d in dots] == [
        pytest.approx([0.3, 0.3, 0.7]),
        pytest.approx([0.2] * 3),
        pytest.approx([0.1] * 3),
    ]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_claims_under_the_invariant_measure_known_values():
    long = long_table(syn.seed_inputs(0))
    assert value(long, claim="b_inv", statistic="b_inv", variant="invariant") == 0  # 1.0 <- 0.1 not found
    assert value(long, claim="m", statistic="discoveries", kind="K", variant="invariant") == 2
    assert value(long, claim="m", statistic="discoveries", kind="V", variant="invariant") == 0
    for rotation in ("errata_bcda", "errata_dabc"):  # K: 2 invariant against 2 of each rotation
        assert value(long, claim="m_inv", statistic="m_inv", variant=rotation) == 2 - 2
    assert value(long, claim="c_inv", statistic="c_inv") == pytest.approx(0.4 - 0.2)  # interaction rho
    assert value(long, claim="c_proj", statistic="c_proj") == pytest.approx(0.3 - 0.2)


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
    assert value(long, claim="t", statistic="t", kind="K", variant="errata_bcda") == 400 - 300
    assert value(long, claim="t", statistic="t", kind="K", variant="errata_dabc") == 400 - 200
    assert value(long, claim="t", statistic="z_growth", kind="K", variant="true") == pytest.approx(0.7)
    assert value(long, claim="t", statistic="z_growth", kind="K", variant="errata_dabc") == pytest.approx(1.8)
    assert value(long, claim="t", statistic="z_growth_ratio", kind="K") == pytest.approx(1.3 / 0.7)
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE, FDR)
    for rotation, steps in (("errata_bcda", 100.0), ("errata_dabc", 200.0)):
        t = result.summary["claims"]["t"][rotation]
        assert (t["verdict"], t["seeds_holding"], t["mean"]) == ("holds", 3, steps)


def test_t_is_untestable_with_one_checkpoint():
    """A loaded model is its own only checkpoint: every measure "clears" at step 0, which is no
    order in time; (t) is untestable, not inconclusive at 0."""
    from dataclasses import replace

    one = syn.steps().iloc[[-1]].assign(step=0, tokens=0)  # discovered under every measure
    seeds = [replace(syn.seed_inputs(s), steps=one) for s in (0, 1, 2)]
    assert math.isnan(value(long_table(seeds[0]), claim="t", statistic="t", kind="K", variant="errata_bcda"))
    result = compare.compare(seeds, CFG, EDGE, FDR)
    for rotation in ("errata_bcda", "errata_dabc"):
        t = result.summary["claims"]["t"][rotation]
        assert (t["verdict"], t["seeds_tested"], t["mean"]) == ("untestable", 0, None), t


@pytest.mark.parametrize(
    "bcda, dabc, expected",
    [
        ("holds", "holds", "holds"),
        ("fails", "fails", "fails"),
        ("holds", "inconclusive", "inconclusive"),  # against one rotation only: not the claim
        ("fails", "holds", "inconclusive"),
        ("untestable", "untestable", "untestable"),
    ],
)
def test_a_claim_against_both_rotations_holds_or_fails_only_against_both(bcda, dabc, expected):
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE, FDR)
    summary = result.summary
    for rotation, word in (("errata_bcda", bcda), ("errata_dabc", dabc)):
        summary["claims"]["m"][rotation]["verdict"] = word
    summary["claims"]["m"]["errata_dabc"]["mean"] = -2.0
    headline = compare.headline(summary)
    assert headline["verdict"]["m"] == expected
    assert headline["mean"]["m_min"] == -2.0  # the lower of the rotations' means
