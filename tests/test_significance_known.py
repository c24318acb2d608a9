"""Known answers for each step of pipeline/circuits/significance.py on hand-made score tables:
every count and quotient below is worked out by hand in the comments. Fast: numpy and pandas
only, no model."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from pipeline.circuits import significance

FDR = 0.05


def rows(z, kind="K", variant="true", src_layer=0, dst_layer=1) -> pd.DataFrame:
    """One row per value of z, writers 0, 1, ... of one block, reader 0."""
    z = np.asarray(z, dtype=float)
    return pd.DataFrame({
        "kind": kind, "variant": variant, "src_layer": src_layer, "src_head": np.arange(len(z)),
        "dst_layer": dst_layer, "dst_head": 0, "z": z,
    })  # fmt: skip


def as_objects(frame: pd.DataFrame) -> pd.DataFrame:
    """The same table with z as Python objects, None where undefined (as read from JSON)."""
    return frame.assign(z=pd.Series([None if math.isnan(v) else v for v in frame["z"]], dtype=object))


# --- step 2: the null's centre and scale ----------------------------------------------


def test_empirical_null_needs_three_finite_values_and_keeps_a_spread_below_one():
    # three finite values are enough: median 2, |z - 2| = 1, 0, 2: MAD 1
    assert significance.empirical_null(np.array([1.0, 2.0, 4.0, np.nan])) == pytest.approx((2.0, 1.4826))
    # a spread below one is the placebo pairs' own (the floor is null_of's, not this function's)
    centre, scale = significance.empirical_null(np.array([0.0, 0.1, 0.2]))
    assert centre == pytest.approx(0.1) and scale == pytest.approx(0.1 * 1.4826)
    # None (undefined, as a JSON list gives it) counts as NaN, not as a value
    assert significance.empirical_null([1.0, None, 2.0, 4.0]) == pytest.approx((2.0, 1.4826))


def test_null_of_floors_each_family_and_keeps_every_family_in_order():
    placebo = pd.concat([
        rows([1.0, 2.0]),  # K true: two defined pairs only: no null
        rows([5.0, 5.0, 5.0, 5.0], kind="V"),  # no spread: centre 5, Haar's scale 1
        rows([-2.0, 0.0, 4.0], kind="Q"),  # centre 0, MAD 2 (|z| = 2, 0, 4): scale 2.9652
        rows([-5.0, -4.0, -3.0], kind="Q", variant="errata_bcda"),  # centre -4 -> 0, scale 1.4826
    ], ignore_index=True)  # fmt: skip
    null = significance.null_of(placebo)
    assert list(null.index.names) == ["kind", "variant"] and list(null.columns) == ["centre", "scale"]
    assert null.index.tolist() == [("K", "true"), ("V", "true"), ("Q", "true"), ("Q", "errata_bcda")]
    assert (null.dtypes == np.float64).all()
    assert np.isnan(null.loc[("K", "true")].to_numpy(dtype=float)).all()
    assert null.loc[("V", "true")].tolist() == [5.0, 1.0]
    assert null.loc[("Q", "true")].tolist() == pytest.approx([0.0, 2 * 1.4826])
    assert null.loc[("Q", "errata_bcda")].tolist() == pytest.approx([0.0, 1.4826])
    # later pairs of K true have no null: z_cal NaN, and so no p and no discovery
    later = rows([100.0])
    assert np.isnan(significance.standardised(later, null)).all()
    # no placebo pairs at all: an empty null of float columns
    empty = significance.null_of(placebo.iloc[:0])
    assert (
        len(empty) == 0 and list(empty.columns) == ["centre", "scale"] and (empty.dtypes == np.float64).all()
    )
    assert list(empty.index.names) == ["kind", "variant"]


# --- step 3: conformal p and the fitted tail ---------------------------------------------


def test_conformal_p_of_a_pool_of_one_and_of_none():
    # pool {2}: 1 at or above 0 -> (1 + 1) / 2; none above 3 -> 1 / 2
    assert significance.conformal_p(np.array([0.0, 3.0]), np.array([2.0])).tolist() == [1.0, 0.5]
    assert np.isnan(significance.conformal_p(np.array([0.0]), np.array([]))).all()  # no pool: no p
    assert np.isnan(significance.conformal_p(np.array([0.0]), np.array([np.nan]))).all()
    # None among the values is undefined: NaN p
    p = significance.conformal_p([1.5, None], [1.0, np.nan, 2.0, 3.0])
    assert p[0] == 3 / 4 and math.isnan(p[1])  # 2 of 3 at or above 1.5, the NaN not counted


def test_benjamini_hochberg_of_one_p_and_of_a_list_with_none():
    assert significance.benjamini_hochberg(np.array([0.3])).tolist() == [0.3]  # m = 1: q = p
    q = significance.benjamini_hochberg([0.02, None, 0.01])  # m = 2: 0.01 * 2 / 1, 0.02 * 2 / 2
    assert q[0] == pytest.approx(0.02) and math.isnan(q[1]) and q[2] == pytest.approx(0.02)
    # p m / i: 0.01 * 3, 0.02 * 3 / 2, 0.9; the running minimum from the largest
    q = significance.benjamini_hochberg(np.array([0.9, 0.02, 0.01]))
    assert q.tolist() == pytest.approx([0.9, 0.03, 0.03])


def test_the_tail_counts_strictly_above_u_and_needs_five():
    pool = np.arange(1.0, 27.0)  # 26 values: u = the 80th percentile = 21 exactly, 22..26 above
    u, share, beta = significance.tail(pool)
    assert (u, share, beta) == pytest.approx((21.0, 6 / 27, 3.0))  # mean excess of 1..5
    assert significance.tail(list(pool) + [None]) == pytest.approx((21.0, 6 / 27, 3.0))  # None: not counted
    assert significance.tail(np.array([np.nan])) is None and significance.tail(np.array([])) is None
    # at u itself the conformal p (21 and the five above it: 7 / 27), just beyond it the tail
    p = significance.null_p(np.array([21.0, 22.0]), pool)
    assert p[0] == 7 / 27 and p[1] == pytest.approx(6 / 27 * math.exp(-1 / 3))
    p = significance.null_p([22.0, None], pool)  # None: undefined
    assert p[0] == pytest.approx(6 / 27 * math.exp(-1 / 3)) and math.isnan(p[1])


def test_null_p_is_quiet_for_undefined_and_extreme_values():
    pool = np.arange(1.0, 27.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = significance.null_p(np.array([np.nan, -1e308, 1e308]), pool)  # exp overflows below u
    assert math.isnan(p[0]) and p[1] == 1.0 and p[2] == 0.0


# --- step 4 and calibrate: BH per family, discoveries ----------------------------------


def test_a_q_exactly_at_the_fdr_is_a_discovery_and_an_undefined_pair_never_is():
    # 19 placebo values spread 1 apart (no tail: fewer than five above u); the later pair above all
    # of them: p = 1 / 20 = 0.05 = q (m = 1, the NaN pair not counted): a discovery at fdr 0.05
    placebo = rows(np.linspace(-9.0, 9.0, 19), src_layer=1, dst_layer=1)
    later = rows([50.0, np.nan])
    scores, _ = significance.calibrate(later, placebo, FDR)
    assert scores.loc[0, "p"] == 0.05 and scores.loc[0, "q"] == 0.05 and scores.loc[0, "discovery"]
    assert np.isnan(scores.loc[1, ["z_cal", "p", "q"]].to_numpy(dtype=float)).all()
    assert not scores.loc[1, "discovery"]
    assert scores["discovery"].dtype == bool
    assert all(scores[c].dtype == np.float64 for c in ("z_cal", "p", "q"))


def test_calibrate_reads_a_z_of_python_objects_as_numbers():
    """z with None where undefined (as JSON gives it) is calibrated as the same table of floats."""
    rng = np.random.default_rng(3)
    placebo = pd.concat([rows(rng.normal(size=30), src_layer=1, dst_layer=1),
                         rows(rng.normal(size=30), src_layer=1, dst_layer=0)], ignore_index=True)  # fmt: skip
    later = rows([0.5, 9.0, np.nan])
    want = significance.calibrate(later, placebo, FDR)
    got = significance.calibrate(as_objects(later), as_objects(placebo), FDR)
    for a, b in zip(got, want, strict=True):
        for c in ("z_cal", "p", "q", "discovery"):
            assert a[c].tolist() == pytest.approx(b[c].tolist(), nan_ok=True), c
    limits = significance.detection_limits(as_objects(later), as_objects(placebo), FDR)
    assert limits == significance.detection_limits(later, placebo, FDR)
    tested = want[1].assign(discovery=False)
    assert significance.family_rates(as_objects(tested))["n_pairs"].tolist() == [30, 30]
    assert significance.discovery_table(as_objects(want[0]))["n_pairs"].tolist() == [2]


def test_a_family_without_placebo_pairs_has_no_p_and_the_others_are_tested():
    placebo = rows(np.linspace(-9.0, 9.0, 19), src_layer=1, dst_layer=1)
    later = pd.concat([rows([50.0, 0.0], kind="V"), rows([50.0, 0.0])], ignore_index=True)
    scores, _ = significance.calibrate(later, placebo, FDR)
    assert np.isnan(scores.loc[:1, ["z_cal", "p", "q"]].to_numpy(dtype=float)).all()
    # K: p = 1 / 20 and 11 / 20 (0..9 at or above 0), q = 0.1 and 0.55: neither passes 0.05
    assert scores.loc[2:, "q"].tolist() == pytest.approx([0.1, 0.55])
    assert scores["discovery"].tolist() == [False, False, False, False]
    assert scores["p"].dtype == np.float64 and scores["q"].dtype == np.float64


def test_calibrate_without_placebo_pairs_tests_nothing():
    placebo = rows([]).astype({"src_head": int})
    scores, tested = significance.calibrate(rows([50.0]), placebo, FDR)
    assert np.isnan(scores[["z_cal", "p", "q"]].to_numpy(dtype=float)).all() and not scores["discovery"].any()
    assert len(tested) == 0 and list(tested.columns) == [*placebo.columns, "z_cal", "p", "q", "discovery"]
    assert (
        all(tested[c].dtype == np.float64 for c in ("z_cal", "p", "q")) and tested["discovery"].dtype == bool
    )


# --- power: the lone pair's bar -------------------------------------------------------


def test_the_lone_pair_bar_at_its_edges():
    pool = np.arange(1.0, 200.0)  # u = 159.4, share 41 / 200
    # a family of one: its bar is where the tail reaches fdr
    u, share, beta = significance.tail(pool)
    assert significance.lone_pair_bar(pool, 1, FDR) == pytest.approx(u + beta * math.log(share / FDR))
    # where the tail's bar would be u itself (share m / fdr = 1), the conformal one: above the
    # (k + 1)-th largest, k = 41 - 1: 159 (p just above it: 41 / 200 = fdr)
    assert significance.lone_pair_bar(pool, 1, 41 / 200) == 159.0
    assert math.isnan(significance.lone_pair_bar(pool, 0, FDR))  # no family: no bar
    # no tail (3 values): conformal, p <= 0.45 needs none at or above (p 1 / 4; one: 2 / 4): above 3
    assert significance.lone_pair_bar(np.array([1.0, 2.0, 3.0]), 1, 0.45) == 3.0
    assert significance.lone_pair_bar(np.array([1.0, 2.0, 3.0]), 2, 0.45) == math.inf  # 0.225 < 1 / 4
    # every p passes (fdr 1, m 1): k = n, no value to clear: -inf
    assert significance.lone_pair_bar(np.array([1.0, 2.0, 3.0]), 1, 1.0) == -math.inf


def test_detection_limits_per_family_in_the_order_of_the_scores():
    placebo = pd.concat([
        rows(np.arange(1.0, 200.0) / 10.0, kind="V", src_layer=1, dst_layer=1),  # centre 10, scale 1.4826 * 5
        rows(np.array([0.0, 1.0, 2.0]), src_layer=1, dst_layer=1),  # K true: conformal only, p >= 1 / 4
    ], ignore_index=True)  # fmt: skip
    later = pd.concat(
        [rows([1.0, 2.0], kind="V"), rows([0.0, np.nan]), rows([0.0], kind="Q")], ignore_index=True
    )
    limits = significance.detection_limits(later, placebo, FDR)
    assert list(limits) == ["V", "K", "Q"] and all(list(v) == ["true"] for v in limits.values())
    v = limits["V"]["true"]
    assert list(v) == ["z_cal", "raw_z", "centre", "scale"]
    centre, scale = 10.0, 1.4826 * 5.0
    pool = (np.arange(1.0, 200.0) / 10.0 - centre) / scale
    bar = significance.lone_pair_bar(pool, 2, FDR)  # m = 2 defined pairs
    assert v == pytest.approx({"z_cal": bar, "raw_z": centre + scale * bar, "centre": centre, "scale": scale})
    # K: m = 1 (the NaN pair not counted), p >= 1 / 4 > fdr: unreachable, None in JSON
    assert limits["K"]["true"] == {"z_cal": None, "raw_z": None, "centre": 1.0, "scale": 1.4826}
    # Q has no placebo pairs: no null, no bar
    assert limits["Q"]["true"] == dict.fromkeys(("z_cal", "raw_z", "centre", "scale"))


# --- the false-positive summaries -------------------------------------------------------


def test_family_rates_and_summary_count_defined_pairs_and_families_with_any_discovery():
    tested = pd.concat([
        rows([1.0, 2.0, np.nan], src_layer=1, dst_layer=1).assign(discovery=[True, True, False]),
        rows([1.0], src_layer=0, dst_layer=0).assign(discovery=[False]),
        rows([np.nan], kind="V", src_layer=0, dst_layer=0).assign(discovery=[False]),
        rows([3.0, 4.0], src_layer=1, dst_layer=0).assign(discovery=[True, False]),
    ], ignore_index=True)  # fmt: skip
    rates = significance.family_rates(tested)
    assert rates.to_dict("list") == {
        "src_layer": [1, 0, 0, 1], "dst_layer": [1, 0, 0, 0], "kind": ["K", "K", "V", "K"],
        "variant": ["true"] * 4, "n_pairs": [2, 1, 0, 1 + 1], "discoveries": [2, 0, 0, 1],
        "any": [True, False, False, True],
    }  # fmt: skip
    assert rates["n_pairs"].dtype == np.int64 and rates["discoveries"].dtype == np.int64
    summary = significance.family_summary(tested)
    assert list(summary) == ["L0->L0", "L1->L0", "L1->L1", "all"]  # sorted by block, then all
    assert summary["L0->L0"] == {"families": 1, "with_discovery": 0, "rate": 0.0}  # V: no defined pair
    assert summary["L1->L1"] == {"families": 1, "with_discovery": 1, "rate": 1.0}
    assert summary["all"] == {"families": 3, "with_discovery": 2, "rate": 2 / 3}
    none = significance.family_summary(tested.assign(z=np.nan, discovery=False))
    assert none["all"] == {"families": 0, "with_discovery": 0, "rate": None}


def test_discovery_table_rates_over_defined_pairs():
    frame = pd.concat([
        rows([1.0, 2.0, np.nan, 4.0]).assign(discovery=[True, False, False, False]),
        rows([5.0], kind="V").assign(discovery=[True]),
        rows([np.nan], kind="Q").assign(discovery=[True]),  # no defined pair: no rate
    ], ignore_index=True)  # fmt: skip
    table = significance.discovery_table(frame)
    assert table[["kind", "variant", "n_pairs", "discoveries"]].to_dict("list") == {
        "kind": ["K", "V", "Q"], "variant": ["true"] * 3, "n_pairs": [3, 1, 0], "discoveries": [1, 1, 1],
    }  # fmt: skip
    assert table["n_pairs"].dtype == np.int64 and table["discoveries"].dtype == np.int64
    assert table["rate"].tolist()[:2] == [1 / 3, 1.0] and math.isnan(table["rate"].iloc[2])
