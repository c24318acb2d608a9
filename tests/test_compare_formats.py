"""Each statistic's range and its one number format (pipeline/compare/formats.py), on inputs
written by hand: intervals clipped to a statistic's range, each statistic's decimals from its
largest mean or interval end over every row, no signed zero; and every statistic the compare
stage computes has a declared range that holds its values."""

from __future__ import annotations

import math

import pandas as pd
import synthetic_seeds as syn

from pipeline import tables
from pipeline.compare import formats
from pipeline.compare.claims import CLAIMS

# --- ranges and formats ------------------------------------------------------------------


def test_an_interval_is_clipped_to_the_statistics_range_and_a_missing_end_stays_missing():
    assert formats.UNIT.clip(-0.2, 1.03) == (0.0, 1.0)
    assert formats.UNIT.clip(0.2, 0.7) == (0.2, 0.7)
    assert formats.COUNT.clip(-3.0, 5.0) == (0.0, 5.0)
    lo, hi = formats.UNIT.clip(math.nan, 1.5)
    assert math.isnan(lo) and hi == 1.0
    assert formats.UNIT.clip(None, None) == (None, None)


def test_a_format_prints_the_mean_and_its_clipped_interval_or_the_mean_alone():
    unit = formats.Format(formats.UNIT, 2)
    assert unit.interval(0.84, 0.65, 1.03) == "0.84 [0.65, 1.00]"
    assert unit.interval(0.84, math.nan, 1.03) == "0.84"
    assert unit.interval(0.84, 0.5, None) == "0.84"
    count = formats.Format(formats.COUNT, 1)
    assert (count.value(3.0), count.mean(2.25)) == ("3", "2.2")


def stats_rows(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["claim", "statistic", "mean", "lo", "hi"])


def test_each_statistics_decimals_come_from_its_largest_number_over_every_row():
    stats = stats_rows(
        ("e", "excess", 12.3, 10.0, 14.6),  # REAL: unbounded; the largest, 14.6 -> one decimal
        ("e", "excess", 0.05, 0.01, 0.09),  # a later, smaller row does not lower it
        ("e", "relative", -0.5, -0.9, 0.002),
        ("e", "excess_anisotropy", -0.5, -500.0, 10.0),  # the lower end the largest: 500 -> none
        ("e", "z_growth", 0.05, 0.01, 0.09),  # small: 0.09 -> 0.0900, four decimals
        ("t", "lag", 150.0, 90.0, 210.0),  # WHOLE: the mean of steps, none from 100 on
        ("c", "pr_auc_at_0.05", 0.8, 0.7, 1.2),  # UNIT: two decimals, whatever the interval
    )
    found = formats.Formats(stats)
    assert found("e", "excess").places == 1
    assert found("e", "relative").places == 3
    assert found("e", "excess_anisotropy").places == 0
    assert found("e", "z_growth").places == 4
    assert found("t", "lag") == formats.Format(formats.WHOLE, 0)
    assert found("c", "pr_auc_at_0.05") == formats.Format(formats.UNIT, 2)
    assert found("e", "never_seen") == formats.Format(formats.REAL, 2)


def test_a_clipped_end_does_not_set_the_decimals():
    # a PR-AUC-like UNIT row cannot, but an unbounded one with a range: causal_share >= 0
    stats = stats_rows(("e", "causal_share", 0.05, -30.0, 0.09))
    assert formats.Formats(stats)("e", "causal_share").places == 4  # -30 clipped to 0: 0.09 sets it


def test_a_clipped_end_is_clipped_to_its_own_claims_range_for_training_and_roles_rows():
    stats = stats_rows(
        # training's eval_loss is >= 0 (its own range, not the default's): -40 clipped to 0, 5.0 sets
        # three significant digits -> two decimals (unclipped, 40 would give one)
        ("training", "eval_loss", 2.5, -40.0, 5.0),
        # every statistic of roles is a count >= 0: -150 clipped to 0, 9 < 100 -> a tenth (not none)
        ("roles", "induction", 2.0, -150.0, 9.0),
    )
    found = formats.Formats(stats)
    assert found("training", "eval_loss") == formats.Format(formats.NONNEGATIVE, 2)
    assert found("training", "eval_loss").interval(2.5, -40.0, 5.0) == "2.50 [0.00, 5.00]"
    assert found("roles", "induction") == formats.Format(formats.COUNT, 1)
    assert found("roles", "induction").interval(2.0, -150.0, 9.0) == "2.0 [0.0, 9.0]"


def stat_rows(*rows) -> pd.DataFrame:
    """stats.csv rows (claim, statistic, mean, lo, hi), every other dimension "-"."""
    return pd.DataFrame(
        [(c, "-", "-", "-", "-", st, 3, m, 0.1, lo, hi) for c, st, m, lo, hi in rows],
        columns=tables.STATS_COLUMNS,
    )


def test_one_number_format_per_statistic_with_intervals_inside_its_range():
    """The report's finding, number by number: "1 [1, 1]" beside "0.993 [0.963, 1.023]" (both
    PR-AUC), "-9 [-18, -0]", PR-AUC "0.84 [0.65, 1.03]", a 0/1 indicator "0.3 [-1.1, 1.8]"."""
    found = formats.Formats(
        stat_rows(
            ("c", "pr_auc", 1.0, 1.0, 1.0), ("c", "pr_auc_at_0.05", 0.993, 0.963, 1.023),
            ("t", "lag", -9.2, -18.4, -0.04), ("e", "excess", 0.01234, 0.0051, 0.0196),
        )
    )  # fmt: skip
    pr_auc = found("c", "pr_auc")
    assert pr_auc == found("c", "pr_auc_at_0.05") == found("c", "role_pr_auc_at_0.1")  # one format
    assert pr_auc.interval(1.0, 1.0, 1.0) == "1.00 [1.00, 1.00]"
    assert pr_auc.interval(0.993, 0.963, 1.023) == "0.99 [0.96, 1.00]"  # clipped to [0, 1]
    assert pr_auc.interval(0.84, 0.65, 1.03) == "0.84 [0.65, 1.00]"
    indicator = found("d", "d")
    assert indicator.interval(1 / 3, -1.1008, 1.7676) == "0.33 [0.00, 1.00]"
    assert [indicator.value(v) for v in (0.0, 1.0, 0.0)] == ["0", "1", "0"]  # whole per seed
    lag = found("t", "lag")  # steps: whole per seed, their mean to a tenth below 100
    assert lag.interval(-9.2, -18.4, -0.04) == "-9.2 [-18.4, 0.0]"  # no signed zero
    assert lag.value(-50.0) == "-50"
    assert found("e", "excess").interval(0.01234, 0.0051, 0.0196) == "0.0123 [0.0051, 0.0196]"  # 3 digits
    assert found("c", "spearman").interval(0.9, 0.7, 1.2) == "0.90 [0.70, 1.00]"  # rho: [-1, 1]
    assert found("c", "causal_edges").interval(0.67, -0.77, 2.1) == "0.7 [0.0, 2.1]"  # a count: >= 0
    assert found("m", "m").interval(-3.0, -10.46, 4.46) == "-3.0 [-10.5, 4.5]"  # a difference: unbounded
    assert found("roles", "induction").value(2.0) == "2"  # heads with a role: a count
    assert found("training", "induction").interval(0.9, 0.8, 1.1) == "0.90 [0.80, 1.00]"  # a score
    assert pr_auc.interval(0.5, None, None) == "0.50" and pr_auc.mean(float("nan")) == "–"


def test_no_signed_zeros():
    assert formats.fixed(-0.004, 2) == "0.00" and formats.fixed(-0.0, 0) == "0"
    assert formats.fixed(-0.6, 0) == "-1" and formats.fixed(None, 2) == formats.fixed(math.nan, 2) == "–"


def test_every_statistic_has_a_declared_range():
    """DOMAINS (and the role ablation's endings, the training's and roles' statistics) decide
    every statistic's range: a new statistic of the compare stage must be added there."""
    from pipeline.compare import stats as compare
    from pipeline.config import CompareConfig

    result = compare.compare([syn.seed_inputs(s) for s in (0, 1)], CompareConfig(), 0.1, 0.05)
    pairs = result.stats[["claim", "statistic"]].drop_duplicates()
    missing = [(c, s) for c, s in pairs.itertuples(index=False) if formats.domain(c, s, default=None) is None]
    assert missing == []
    assert set(CLAIMS) <= set(formats.DOMAINS)  # each claim's own number
    # every value of every statistic lies in its range (so clipping only ever cuts an interval)
    for r in result.claims.dropna(subset=["value"]).itertuples(index=False):
        d = formats.domain(r.claim, r.statistic)
        assert d.lo <= r.value <= d.hi, r
        assert not d.whole or float(r.value).is_integer(), r
