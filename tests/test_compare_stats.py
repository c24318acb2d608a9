"""pipeline/compare/stats.py: role-group composition, statistics across seeds, verdicts.

t intervals, sign tests and verdicts on known answers, the comparison of the synthetic seeds of
tests/synthetic_seeds.py, summary.json's parts and the headline."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import synthetic_seeds as syn
from refusals import one_line

from pipeline.compare import stats as compare
from pipeline.compare.claims import CLAIM_KIND, CLAIMS, PRIMARY_EFFECT
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import CURVE_COLUMNS

CFG = CompareConfig()


FDR = 0.05


def scored(seed: int = 0) -> pd.DataFrame:
    inp = syn.seed_inputs(seed)
    return compare.with_roles(inp.scores, inp.heads)


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


T_975_2 = 4.302652729749462  # Student's t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)


def curves_of(steps_per_seed: dict[int, list[int]]):
    """curve.tsv rows of each seed at its steps: tokens 100 x step, train_loss seed + step / 10,
    the other measures 0.5 x seed."""
    import pandas as pd

    rows = [
        {"seed": seed, "step": step, "tokens": 100 * step, "train_loss": seed + step / 10,
         "eval_loss": 0.5 * seed, "induction": 0.5 * seed, "prev_token": 0.5 * seed, "icl": 0.5 * seed}
        for seed, steps in steps_per_seed.items()
        for step in steps
    ]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def two_seeds() -> compare.Comparison:
    """The comparison of synthetic seeds 0 and 1 (read only)."""
    return compare.compare([syn.seed_inputs(s) for s in (0, 1)], CFG, EDGE, FDR)


@pytest.fixture(scope="module")
def three_seeds() -> compare.Comparison:
    """The comparison of synthetic seeds 0, 1 and 2 (read only)."""
    return compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE, FDR)


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


def test_a_head_without_a_role_is_named():
    inp = syn.seed_inputs(0)
    with pytest.raises(UserError) as caught:
        compare.with_roles(inp.scores, inp.heads[~((inp.heads["layer"] == 1) & (inp.heads["head"] == 2))])
    assert caught.value.where == "heads.csv"
    one_line(caught, "(1, 2)")


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


def test_compare_across_seeds(three_seeds):
    result = three_seeds
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
    with pytest.raises(UserError) as caught:
        compare.compare([a, b], CFG, EDGE, FDR)
    assert (caught.value.where, caught.value.value) == ("curve.tsv", [0, 1])  # the seeds whose steps differ
    one_line(caught)


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
def test_a_claim_against_both_rotations_holds_or_fails_only_against_both(three_seeds, bcda, dabc, expected):
    summary = copy.deepcopy(three_seeds.summary)
    for rotation, word in (("errata_bcda", bcda), ("errata_dabc", dabc)):
        summary["claims"]["m"][rotation]["verdict"] = word
    summary["claims"]["m"]["errata_dabc"]["mean"] = -2.0
    headline = compare.headline(summary)
    assert headline["verdict"]["m"] == expected
    assert headline["mean"]["m_min"] == -2.0  # the lower of the rotations' means


def test_sign_test_leaves_ties_and_nan_out():
    """3 of 3 above: P = 2 x (1/2)^3 = 0.25; 2 of 3: P = 1; ties and NaN leave 2 of 2: 0.5."""
    assert compare.sign_test([1.0, 2.0, 3.0], 0.0) == pytest.approx(0.25)
    assert compare.sign_test([-1.0, 2.0, 3.0], 0.0) == pytest.approx(1.0)
    assert compare.sign_test([1.0, 2.0, 0.0, math.nan], 0.0) == pytest.approx(0.5)
    assert compare.sign_test([-1.0, -2.0, -3.0], 0.0) == pytest.approx(0.25)
    assert compare.sign_test([0.5, 0.5, math.nan], 0.5) is None


def test_t_interval_of_one_two_three():
    """Mean 2, sample sd 1: 2 -+ t(0.975, 2) / sqrt(3)."""
    lo, hi = compare.t_interval([1.0, 2.0, 3.0, math.nan], 0.95)
    half = T_975_2 / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)
    assert compare.t_interval([4.0, 4.0], 0.95) == (4.0, 4.0)
    assert compare.t_interval([4.0, math.nan], 0.95) == (None, None)


def test_t_interval_reads_a_missing_value_as_nan_and_computes_in_float64():
    """summary.json writes a missing value as null: None is left out like NaN ((1, 3, 2): 2 -+
    t(0.975, 2) / sqrt 3). float32 values (0.5, 1.5, 4.0, exact in float32: mean 2, sample sd
    sqrt 3.25) give their interval in float64, to 1e-12, not rounded to float32 (~1e-8)."""
    lo, hi = compare.t_interval([1.0, None, 3.0, 2.0], 0.95)
    half = T_975_2 / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)
    lo, hi = compare.t_interval(np.array([0.5, 1.5, 4.0], dtype=np.float32), 0.95)
    half = T_975_2 * math.sqrt(3.25) / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)


def test_verdict_at_the_edges_of_its_rules():
    values = [0.2, 0.3, 0.4]
    assert compare.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, values, 3) == "holds"
    # the interval's lower end must exceed the limit, not reach it
    assert compare.verdict({"n": 3, "lo": 0.0, "hi": 0.5}, 0.0, values, 3) == "inconclusive"
    assert compare.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, values, 4) == "inconclusive"  # too few seeds
    assert compare.verdict({"n": 3, "lo": None, "hi": None}, 0.0, values, 3) == "inconclusive"
    assert compare.verdict({"n": 0, "lo": None, "hi": None}, 0.0, [], 3) == "untestable"
    below = [-0.2, -0.3, -0.4]
    assert compare.verdict({"n": 3, "lo": -0.5, "hi": -0.1}, 0.0, below, 3) == "fails"
    # hi must lie below the threshold, not on it
    assert compare.verdict({"n": 3, "lo": -0.5, "hi": 0.0}, 0.0, below, 3) == "inconclusive"
    mixed = [-0.2, -0.3, 0.4]  # the interval below, one seed above: neither
    assert compare.verdict({"n": 3, "lo": -0.5, "hi": -0.1}, 0.0, mixed, 3) == "inconclusive"
    assert compare.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, [0.2, -0.3, 0.4], 3) == "inconclusive"


def test_summary_json_is_indented_strict_json_ending_in_a_newline():
    text = '{\n  "b": 1,\n  "a": [\n    1,\n    null\n  ]\n}\n'
    assert compare.summary_json({"b": 1, "a": [1, None]}) == text
    with pytest.raises(ValueError):  # NaN is not JSON: strict json refuses it
        compare.summary_json({"a": math.nan})


def test_json_safe_turns_nan_into_null_and_numpy_scalars_into_python():
    import numpy as np

    nested = {"c": np.float64(1.5), "d": np.int64(2)}
    safe = compare._json_safe({"a": math.nan, "b": nested, "e": 0.5, "f": "x"})
    assert safe == {"a": None, "b": {"c": 1.5, "d": 2}, "e": 0.5, "f": "x"}
    assert type(safe["b"]["c"]) is float and type(safe["b"]["d"]) is int


def test_nothing_to_compare_is_refused():
    with pytest.raises(UserError) as caught:
        compare.compare([], CompareConfig(), 0.1, 0.05)
    assert (caught.value.where, caught.value.value) == ("seeds", [])
    one_line(caught)


def test_order_puts_kinds_first_unknown_values_last_alphabetically_and_keeps_ties_in_their_order():
    """Kinds in KINDS order (Q, K, V), then values it does not know by name (A before Z); rows
    that tie on every key keep the order they came in (a stable sort), here 5 rows of each kind."""
    import pandas as pd

    kinds = ["V", "Z", "K", "A", "Q"] * 5
    frame = pd.DataFrame({"kind": kinds, "row": range(25)})
    got = compare._order(frame, ["kind"])
    expected = [r for k in ("Q", "K", "V", "A", "Z") for r in range(25) if kinds[r] == k]
    assert got["row"].tolist() == expected  # Q: 4, 9, 14, 19, 24; K: 2, 7, ...
    assert got.index.tolist() == list(range(25))


def test_headline_of_a_summary_without_the_causal_check_leaves_its_cells_empty():
    """A summary with no causal_check, m_by_kind or detection_limits (say, one written before
    they existed): the verdicts and means of its claims, and empty cells for the rest. A claim
    with one hypothesis ("-") keeps its name; one with two shows both verdicts when they differ
    and the rotated hypothesis's mean."""
    summary = {
        "n_seeds": 3,
        "claims": {
            "b": {"-": {"verdict": "holds", "mean": 0.4}},
            "a": {
                "rotated": {"verdict": "holds", "mean": 0.2},
                "true": {"verdict": "inconclusive", "mean": 0.1},
            },
        },
        "training": {"final_loss": 2.5},
    }
    assert compare.headline(summary) == {
        "n_seeds": 3,
        "verdict": {"b": "holds", "a": "holds/inconclusive"},
        "mean": {"b": 0.4, "a_rotated": 0.2},
        "training": {"final_loss": 2.5},
        "m_by_kind": {},
        "c_vs_roles": {"pr_auc_true": None, "role_pr_auc": None},
        "detection_limit_K": {},
    }


def test_mean_curve_averages_the_seeds_at_each_step_and_refuses_different_steps():
    """Seeds 0 and 2 at steps 0 and 10: train_loss (0 + 2) / 2 + step / 10 = 1 and 2, the rest 0.5,
    tokens an integer. Seed 2 at steps 0 and 20 instead: refused, naming both seeds."""
    got = compare.mean_curve(curves_of({0: [0, 10], 2: [0, 10]}))
    assert list(got.columns) == list(compare.CURVE_COLUMNS)
    assert got["step"].tolist() == [0, 10] and got["tokens"].tolist() == [0, 1000]
    assert got["tokens"].dtype == "int64"
    assert got["train_loss"].tolist() == pytest.approx([1.0, 2.0])
    assert got["eval_loss"].tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(UserError) as caught:
        compare.mean_curve(curves_of({0: [0, 10], 2: [0, 20]}))
    assert (caught.value.where, caught.value.value) == ("curve.tsv", [0, 2])  # the seeds, by number
    one_line(caught)


def test_detection_limits_are_claim_m_detection_limit_values_by_seed_kind_and_measure():
    """Only claim m's detection_limit rows count: seed 0 K true 2.5 and errata 3.5, Q true 4.0;
    seed 2 K true 1.5. Claim m's other statistic and another claim's detection_limit are left out."""
    import pandas as pd

    rows = [
        (0, "m", "K", "true", "detection_limit", 2.5),
        (0, "m", "K", "errata_bcda", "detection_limit", 3.5),
        (0, "m", "Q", "true", "detection_limit", 4.0),
        (2, "m", "K", "true", "detection_limit", 1.5),
        (2, "m", "K", "true", "discoveries", 7.0),
        (2, "b", "K", "errata_bcda", "detection_limit", 9.0),
    ]
    claims = pd.DataFrame(rows, columns=["seed", "claim", "kind", "variant", "statistic", "value"])
    assert compare._detection_limits(claims) == {
        "seed0": {"K": {"true": 2.5, "errata_bcda": 3.5}, "Q": {"true": 4.0}},
        "seed2": {"K": {"true": 1.5}},
    }


def test_compare_numbers_the_long_table_afresh_over_the_seeds_in_their_order(monkeypatch):
    """Two seeds' long tables (each numbered 0 .. n - 1 by seed_statistics) are one table numbered
    0 .. 2n - 1, seed 0's rows then seed 2's, as seed_statistics gave them. (The statistics across
    seeds are cut off: only the long table handed to them is read.)"""
    import pandas as pd
    import synthetic_seeds as syn

    class Handed(Exception):
        pass

    def across_seeds(claims, cfg):
        raise Handed(claims)

    own = []
    real = compare.seed_statistics

    def seed_statistics(*args):
        own.append(real(*args))
        return own[-1]

    monkeypatch.setattr(compare, "seed_statistics", seed_statistics)
    monkeypatch.setattr(compare, "across_seeds", across_seeds)
    with pytest.raises(Handed) as caught:
        compare.compare([syn.seed_inputs(s) for s in (0, 2)], CompareConfig(), 0.1, 0.05)
    (claims,) = caught.value.args
    n = len(own[0])
    assert n > 0 and all(table.index.tolist() == list(range(n)) for table in own)
    assert claims.index.tolist() == list(range(2 * n))
    assert claims["seed"].tolist() == [0] * n + [2] * n
    expected = pd.DataFrame(
        [row for table in own for row in table.itertuples(index=False)], columns=own[0].columns
    )
    pd.testing.assert_frame_equal(claims, expected)


def test_causal_check_of_a_statistic_stats_lacks_is_empty_and_one_it_has_is_read_back():
    """_causal_check with stats.csv holding only (c)'s K pattern_effect Spearman row of "true"
    (mean 0.5, interval 0.25 to 0.75) and claims.csv that row's two seeds (0.4, 0.6): that entry
    is read back, every other statistic (PR-AUC, the role ranker) has no mean, interval or seeds."""
    import pandas as pd

    cell = {"claim": "c", "kind": "K", "effect": "pattern_effect", "hypothesis": "-"}
    claims_csv = pd.DataFrame(
        [
            {**cell, "seed": s, "statistic": "spearman", "variant": "true", "value": v}
            for s, v in ((0, 0.4), (1, 0.6))
        ]
    )
    stats_csv = pd.DataFrame(
        [{**cell, "statistic": "spearman", "variant": "true", "n": 2, "mean": 0.5, "lo": 0.25, "hi": 0.75}]
    )
    out = compare._causal_check(claims_csv, stats_csv)
    empty = {"mean": None, "lo": None, "hi": None, "per_seed": {}}
    assert out["spearman"]["true"] == {"mean": 0.5, "lo": 0.25, "hi": 0.75, "per_seed": {"0": 0.4, "1": 0.6}}
    assert out["spearman"]["errata_bcda"] == empty
    assert out["role_pr_auc"] == empty
    assert out["at_0.05"]["pr_auc"]["true"] == empty and out["at_0.05"]["role_pr_auc"] == empty


def test_group_composition_keeps_cells_whose_labels_print_alike_in_the_order_they_came():
    """_order ranks unknown roles by their text, so a source role "1" (text) and 1 (a number) tie;
    group_composition keeps their cells in the order the scores list them ("1" first), as the
    stable sort does, not in a sorted order (numbers before text)."""
    import pandas as pd

    scored = pd.DataFrame(
        {
            "kind": ["K", "K", "K"],
            "variant": ["true"] * 3,
            "dst_role": ["induction"] * 3,
            "src_role": ["1", 1, "1"],
            "excess": [0.5, 0.25, 0.125],
            "z": [1.0, 2.0, 3.0],
            "discovery": [True, False, True],
        }
    )
    got = compare.group_composition(scored)
    assert got["src_role"].tolist() == ["1", 1]
    assert got["n_pairs"].tolist() == [2, 1]
    assert got["max_excess"].tolist() == [0.5, 0.25]
    assert got["discoveries"].tolist() == [2, 0]


def test_compare_names_the_seed_whose_heads_csv_lists_a_head_twice():
    """Seed 2's heads.csv with its first head listed twice: the error names that seed's file."""
    import dataclasses

    import pandas as pd
    import synthetic_seeds as syn

    good = syn.seed_inputs(0)
    bad = syn.seed_inputs(2)
    bad = dataclasses.replace(bad, heads=pd.concat([bad.heads, bad.heads.iloc[:1]], ignore_index=True))
    with pytest.raises(UserError) as caught:
        compare.compare([good, bad], CompareConfig(), 0.1, 0.05)
    assert caught.value.where == "heads.csv of seed 2"
    one_line(caught)


def test_a_claim_no_seed_tested_is_untestable_with_no_numbers(two_seeds):
    claims = two_seeds.claims[two_seeds.claims["claim"] != "b"]
    stats = two_seeds.stats[two_seeds.stats["claim"] != "b"]
    b = compare.summarize(claims, stats, CFG)["claims"]["b"]["-"]
    assert b == {
        "verdict": "untestable",
        "seeds_holding": 0,
        "seeds_failing": 0,
        "seeds_tested": 0,
        "mean": None,
        "lo": None,
        "hi": None,
        "sign_p": None,
        "per_seed": {},
        "threshold": CLAIMS["b"].threshold,
        "seeds_absent": 0,
    }


def test_m_by_kind_is_the_mean_and_interval_of_each_kind_against_each_rotation(two_seeds):
    stats = two_seeds.stats
    rows = stats[(stats["claim"] == "m") & (stats["statistic"] == "m_kind")]
    assert len(rows) == 6  # Q, K, V against two rotations
    expected: dict = {}
    for r in rows.itertuples():
        expected.setdefault(r.kind, {})[r.variant] = {"mean": r.mean, "lo": r.lo, "hi": r.hi}
    assert two_seeds.summary["m_by_kind"] == expected
    assert two_seeds.summary["m_by_kind"]["Q"]["errata_bcda"] == {"mean": -1.0, "lo": -1.0, "hi": -1.0}


def test_claim_c_reads_its_own_kind_only(two_seeds):
    """(c)'s cell is kind K (CLAIM_KIND): other kinds' rows of claim c, here made different, stay out."""
    claims = two_seeds.claims.copy()
    other = (claims["claim"] == "c") & (claims["kind"] != CLAIM_KIND)
    assert other.any()
    claims.loc[other, "value"] = 99.0
    check = compare.summarize(claims, two_seeds.stats, CFG)["causal_check"]
    assert (check["kind"], check["effect"]) == (CLAIM_KIND, PRIMARY_EFFECT)
    assert check["causal_edges"] == {"0": 2.0, "1": 2.0}
    assert 99.0 not in check["spearman"]["true"]["per_seed"].values()


def test_the_comparisons_frames_are_seed_first_and_numbered_afresh(two_seeds):
    assert list(two_seeds.curves.columns) == ["seed", *CURVE_COLUMNS]
    for frame in (two_seeds.groups, two_seeds.roles, two_seeds.curves):
        assert frame.columns[0] == "seed" and "index" not in frame.columns
        assert list(frame.index) == list(range(len(frame)))
        assert list(frame["seed"].unique()) == [0, 1]


def test_with_roles_names_heads_csv_by_default():
    heads = pd.DataFrame({"layer": [0, 0], "head": [1, 1], "role": ["other", "other"]})
    with pytest.raises(UserError) as caught:
        compare.with_roles(syn.seed_inputs(0).scores, heads)
    assert caught.value.where == "heads.csv"
    one_line(caught)


def test_sign_test_reads_a_missing_value_as_nan():
    """summary.json writes a missing value as null: None is left out like NaN (3 of 3 above: 0.25)."""
    assert compare.sign_test([3.0, None, 2.0, 5.0], 1.0) == pytest.approx(0.25)


def test_claim_c_reads_its_own_kind_and_effect_only_in_the_stats_too(two_seeds):
    """(c)'s means and intervals come from the stats rows of claim c, kind K and PRIMARY_EFFECT
    alone: every other row of claim c, and every K row of PRIMARY_EFFECT of another claim (c_inv),
    here set to 99 and put first, stays out. Spearman's rho of the true measure: 0.6 on both seeds."""
    stats = two_seeds.stats
    own = (stats["claim"] == "c") & (stats["kind"] == CLAIM_KIND) & (stats["effect"] == PRIMARY_EFFECT)
    near = (
        (stats["claim"] == "c") | ((stats["kind"] == CLAIM_KIND) & (stats["effect"] == PRIMARY_EFFECT))
    ) & ~own
    assert set(stats.loc[near, "kind"]) == {"Q", "K", "V"} and "c_inv" in set(stats.loc[near, "claim"])
    decoys = stats[near].assign(mean=99.0, lo=99.0, hi=99.0)
    check = compare.summarize(two_seeds.claims, pd.concat([decoys, stats[~near]]), CFG)["causal_check"]
    assert check["spearman"]["true"] == {"mean": 0.6, "lo": 0.6, "hi": 0.6, "per_seed": {"0": 0.6, "1": 0.6}}
    for key in ("spearman", "pr_auc", "roc_auc"):
        for m, cell in check[key].items():
            row = stats[own & (stats["statistic"] == key) & (stats["variant"] == m)]
            assert (cell["mean"], cell["lo"], cell["hi"]) == tuple(row[["mean", "lo", "hi"]].iloc[0]), (
                key,
                m,
            )


def test_a_verdict_needs_the_whole_interval_beyond_the_threshold():
    """Every seed above 0, but the interval's lower end exactly at 0: inconclusive, not holds (nor,
    mirrored, fails)."""
    holds_but_touches = {"n": 3, "lo": 0.0, "hi": 0.4}
    assert compare.verdict(holds_but_touches, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "inconclusive"
    assert compare.verdict({"n": 3, "lo": 1e-9, "hi": 0.4}, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "holds"
    assert compare.verdict({"n": 3, "lo": -0.4, "hi": 0.0}, 0.0, [-0.1, -0.2, -0.3], 3) == "inconclusive"
