"""Known answers of pipeline/compare/stats.py's small functions worked out by hand: the exact sign
test (binomial, ties and NaN left out), Student's t interval of three values, the verdict at the
edges of its rules, summary.json's text, and the refusal of an empty comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.compare import stats
from pipeline.config import CompareConfig
from pipeline.errors import UserError

T_975_2 = 4.302652729749462  # Student's t, 97.5th percentile, 2 degrees of freedom (tables: 4.303)


def test_sign_test_known_answers():
    """3 of 3 above: P = 2 x (1/2)^3 = 0.25; 2 of 3: P = 1; ties and NaN leave 2 of 2: 0.5."""
    assert stats.sign_test([1.0, 2.0, 3.0], 0.0) == pytest.approx(0.25)
    assert stats.sign_test([-1.0, 2.0, 3.0], 0.0) == pytest.approx(1.0)
    assert stats.sign_test([1.0, 2.0, 0.0, math.nan], 0.0) == pytest.approx(0.5)
    assert stats.sign_test([-1.0, -2.0, -3.0], 0.0) == pytest.approx(0.25)
    assert stats.sign_test([0.5, 0.5, math.nan], 0.5) is None


def test_t_interval_of_one_two_three():
    """Mean 2, sample sd 1: 2 -+ t(0.975, 2) / sqrt(3)."""
    lo, hi = stats.t_interval([1.0, 2.0, 3.0, math.nan], 0.95)
    half = T_975_2 / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)
    assert stats.t_interval([4.0, 4.0], 0.95) == (4.0, 4.0)
    assert stats.t_interval([4.0, math.nan], 0.95) == (None, None)


def test_t_interval_reads_a_missing_value_as_nan_and_computes_in_float64():
    """summary.json writes a missing value as null: None is left out like NaN ((1, 3, 2): 2 -+
    t(0.975, 2) / sqrt 3). float32 values (0.5, 1.5, 4.0, exact in float32: mean 2, sample sd
    sqrt 3.25) give their interval in float64, to 1e-12, not rounded to float32 (~1e-8)."""
    lo, hi = stats.t_interval([1.0, None, 3.0, 2.0], 0.95)
    half = T_975_2 / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)
    lo, hi = stats.t_interval(np.array([0.5, 1.5, 4.0], dtype=np.float32), 0.95)
    half = T_975_2 * math.sqrt(3.25) / math.sqrt(3)
    assert lo == pytest.approx(2 - half, rel=1e-12) and hi == pytest.approx(2 + half, rel=1e-12)


def test_verdict_at_the_edges_of_its_rules():
    values = [0.2, 0.3, 0.4]
    assert stats.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, values, 3) == "holds"
    # the interval's lower end must exceed the limit, not reach it
    assert stats.verdict({"n": 3, "lo": 0.0, "hi": 0.5}, 0.0, values, 3) == "inconclusive"
    assert stats.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, values, 4) == "inconclusive"  # too few seeds
    assert stats.verdict({"n": 3, "lo": None, "hi": None}, 0.0, values, 3) == "inconclusive"
    assert stats.verdict({"n": 0, "lo": None, "hi": None}, 0.0, [], 3) == "untestable"
    below = [-0.2, -0.3, -0.4]
    assert stats.verdict({"n": 3, "lo": -0.5, "hi": -0.1}, 0.0, below, 3) == "fails"
    assert stats.verdict({"n": 3, "lo": -0.5, "hi": 0.0}, 0.0, below, 3) == "inconclusive"  # hi must be below
    mixed = [-0.2, -0.3, 0.4]  # the interval below, one seed above: neither
    assert stats.verdict({"n": 3, "lo": -0.5, "hi": -0.1}, 0.0, mixed, 3) == "inconclusive"
    assert stats.verdict({"n": 3, "lo": 0.1, "hi": 0.5}, 0.0, [0.2, -0.3, 0.4], 3) == "inconclusive"


def test_summary_json_is_indented_strict_json_ending_in_a_newline():
    text = '{\n  "b": 1,\n  "a": [\n    1,\n    null\n  ]\n}\n'
    assert stats.summary_json({"b": 1, "a": [1, None]}) == text
    with pytest.raises(ValueError, match="not JSON compliant"):
        stats.summary_json({"a": math.nan})


def test_json_safe_turns_nan_into_null_and_numpy_scalars_into_python():
    import numpy as np

    nested = {"c": np.float64(1.5), "d": np.int64(2)}
    safe = stats._json_safe({"a": math.nan, "b": nested, "e": 0.5, "f": "x"})
    assert safe == {"a": None, "b": {"c": 1.5, "d": 2}, "e": 0.5, "f": "x"}
    assert type(safe["b"]["c"]) is float and type(safe["b"]["d"]) is int


def test_nothing_to_compare_is_refused():
    with pytest.raises(UserError) as caught:
        stats.compare([], CompareConfig(), 0.1, 0.05)
    assert str(caught.value) == "seeds = []: no seeds to compare"


def test_order_puts_kinds_first_unknown_values_last_alphabetically_and_keeps_ties_in_their_order():
    """Kinds in KINDS order (Q, K, V), then values it does not know by name (A before Z); rows
    that tie on every key keep the order they came in (a stable sort), here 5 rows of each kind."""
    import pandas as pd

    kinds = ["V", "Z", "K", "A", "Q"] * 5
    frame = pd.DataFrame({"kind": kinds, "row": range(25)})
    got = stats._order(frame, ["kind"])
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
    assert stats.headline(summary) == {
        "n_seeds": 3,
        "verdict": {"b": "holds", "a": "holds/inconclusive"},
        "mean": {"b": 0.4, "a_rotated": 0.2},
        "training": {"final_loss": 2.5},
        "m_by_kind": {},
        "c_vs_roles": {"pr_auc_true": None, "role_pr_auc": None},
        "detection_limit_K": {},
    }


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


def test_mean_curve_averages_the_seeds_at_each_step_and_refuses_different_steps():
    """Seeds 0 and 2 at steps 0 and 10: train_loss (0 + 2) / 2 + step / 10 = 1 and 2, the rest 0.5,
    tokens an integer. Seed 2 at steps 0 and 20 instead: refused, naming both seeds."""
    got = stats.mean_curve(curves_of({0: [0, 10], 2: [0, 10]}))
    assert list(got.columns) == list(stats.CURVE_COLUMNS)
    assert got["step"].tolist() == [0, 10] and got["tokens"].tolist() == [0, 1000]
    assert got["tokens"].dtype == "int64"
    assert got["train_loss"].tolist() == pytest.approx([1.0, 2.0])
    assert got["eval_loss"].tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(UserError) as caught:
        stats.mean_curve(curves_of({0: [0, 10], 2: [0, 20]}))
    assert str(caught.value) == (
        "curve.tsv = [0, 2]: seeds were evaluated at different steps (different train configs?)"
    )


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
    assert stats._detection_limits(claims) == {
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
    real = stats.seed_statistics

    def seed_statistics(*args):
        own.append(real(*args))
        return own[-1]

    monkeypatch.setattr(stats, "seed_statistics", seed_statistics)
    monkeypatch.setattr(stats, "across_seeds", across_seeds)
    with pytest.raises(Handed) as caught:
        stats.compare([syn.seed_inputs(s) for s in (0, 2)], CompareConfig(), 0.1, 0.05)
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
    out = stats._causal_check(claims_csv, stats_csv)
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
    got = stats.group_composition(scored)
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
        stats.compare([good, bad], CompareConfig(), 0.1, 0.05)
    assert str(caught.value) == "heads.csv of seed 2: lists a head twice"
