"""Known answers for claims whose rotations and cells differ (pipeline/compare/claims.py): each
fixture is asymmetric where a wrong rotation or cell would otherwise give the right answer."""

from __future__ import annotations

import json

import pytest
import synthetic_seeds as syn
from test_compare import long_table, value  # one seed's long table (EDGE 0.1, FDR 0.05), a cell of it

from pipeline.compare.claims import CLAIM_KIND, PRIMARY_EFFECT

EDGE, FDR = 0.1, 0.05


# --- claims whose rotations differ; verdicts; reading a seed ---------------------------------


def test_claims_a_and_d_take_the_worse_rotation():
    """synthetic_seeds, with one change: D A B C (rotated denominators) also gets a V edge
    other <- other of excess 0.25, so its selectivity drops to (0.5 - 0.25) / 0.75 = 1/3 while
    B C D A's stays 49/51, and it draws a V edge (not K only)."""
    inp = syn.seed_inputs(0)
    s = inp.scores
    row = (s["kind"] == "V") & (s["variant"] == "errata_dabc") & (s["src_head"] == 2) & (s["dst_head"] == 2)
    assert row.sum() == 1
    s.loc[row, "score"] = s.loc[row, "baseline_mean"] + 0.25
    t = long_table(inp)
    assert value(t, claim="a", statistic="selectivity", variant="errata_dabc") == pytest.approx(1 / 3)
    assert value(t, claim="a", statistic="selectivity", variant="errata_bcda") == pytest.approx(49 / 51)
    true_sel = value(t, claim="a", statistic="selectivity", variant="true")
    assert true_sel == pytest.approx(-1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(1 / 3 + 1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="true") == pytest.approx(2 / 3 + 1 / 13)
    assert value(t, claim="d", statistic="only_k_one_source", variant="errata_dabc") == 0.0
    assert value(t, claim="d", statistic="only_k_one_source", variant="errata_bcda") == 1.0
    assert value(t, claim="d", statistic="d", hypothesis="rotated") == 0.0


def test_claim_c_reads_the_interaction_of_its_effect_and_k_and_no_other_cell():
    """synthetic_seeds' agreement, changed everywhere but where claim (c) reads (the pair-specific
    parts' Spearman, "interaction", of its effect, claims.PRIMARY_EFFECT, and K): elsewhere, and in
    the raw Spearman of that very cell, the corrected score agrees worst and the rotations best,
    every PR-AUC and ROC-AUC favours the rotations. (c) stays 0.5 - 0.2, (c_inv) 0.4 - 0.2, (c_proj)
    0.3 - 0.2, the same under either denominator hypothesis."""
    inp = syn.seed_inputs(0)
    inp.agreement = json.loads(json.dumps(syn.AGREEMENT))  # its cells are shared dicts: unshare them
    ours = ("true", "invariant", "projection")
    for effect, per_effect in inp.agreement.items():
        for statistic in ("spearman", "interaction"):
            for kind, per_kind in per_effect[statistic].items():
                if (statistic, effect, kind) != ("interaction", PRIMARY_EFFECT, CLAIM_KIND):
                    for v in per_kind:
                        per_kind[v] = -0.9 if v in ours else 0.9
        for per_kind in per_effect["ranking"].values():
            for v, ranked in per_kind.items():
                ranked["pr_auc"] = ranked["roc_auc"] = 0.0 if v in ours else 1.0
    t = long_table(inp)
    assert value(t, claim="c", statistic="c") == pytest.approx(0.5 - 0.2)
    assert value(t, claim="c_inv", statistic="c_inv") == pytest.approx(0.4 - 0.2)
    assert value(t, claim="c_proj", statistic="c_proj") == pytest.approx(0.3 - 0.2)
