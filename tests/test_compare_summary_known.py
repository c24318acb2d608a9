"""Known answers of summary.json's parts (pipeline/compare/stats.py) on the synthetic seeds
(tests/synthetic_seeds.py): a claim that no seed tested, (m) per kind and rotation, claim (c)'s cell
read from its own kind only, the comparison's frames seed first and numbered afresh, and the
defaults of with_roles and sign_test."""

from __future__ import annotations

import pandas as pd
import pytest
import synthetic_seeds as syn

from pipeline.compare import stats as compare
from pipeline.compare.claims import CLAIM_KIND, CLAIMS, PRIMARY_EFFECT
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import CURVE_COLUMNS

CFG = CompareConfig()
EDGE, FDR = 0.1, 0.05


@pytest.fixture(scope="module")
def two_seeds() -> compare.Comparison:
    """The comparison of synthetic seeds 0 and 1 (read only)."""
    return compare.compare([syn.seed_inputs(s) for s in (0, 1)], CFG, EDGE, FDR)


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
    assert str(caught.value) == "heads.csv: lists a head twice"


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
