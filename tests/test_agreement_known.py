"""`pipeline.behaviour.agreement` on known answers worked out by hand: the causal-edge t-test's
degrees of freedom with two batches, the rows in the order the pairs first appear, ROC-AUC with a
single non-causal edge, and the role-only ranker's scores as floats."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pipeline.behaviour import agreement


def batches_of(effects: dict[tuple[str, int, int, int, int], list[float]]) -> pd.DataFrame:
    """ablation_batches.csv's rows: batch b of each pair (PAIR) with loss_effect effects[pair][b]."""
    return pd.DataFrame(
        [
            {"batch": b, **dict(zip(agreement.PAIR, pair, strict=True)), "loss_effect": e}
            for pair, es in effects.items()
            for b, e in enumerate(es)
        ]
    )


def test_two_batches_test_against_t_with_one_degree_of_freedom():
    """Two batches: 1 degree of freedom, t_{0.95, 1} = 6.3138 (t_{0.95, 2} would be 2.9200).
    Effects (1.0, 1.5): mean 1.25, sd sqrt(0.125), t = 1.25 / (sd / sqrt 2) = 5: within the noise.
    Effects (1.0, 1.1): mean 1.05, sd sqrt(0.005), t = 1.05 / 0.05 = 21: beyond it."""
    got = agreement.causal_edges(
        batches_of({("K", 0, 0, 1, 0): [1.0, 1.5], ("K", 0, 1, 1, 0): [1.0, 1.1]}), "loss_effect", 0.01
    )
    assert got["n"].tolist() == [2, 2]
    assert got["mean"].tolist() == pytest.approx([1.25, 1.05])
    assert got["sd"].tolist() == pytest.approx([math.sqrt(0.125), math.sqrt(0.005)])
    assert got["causal"].tolist() == [False, True]


def test_causal_edges_keep_the_order_in_which_the_pairs_first_appear():
    """One row per pair, in the batches' order of first appearance (not sorted by kind or head)."""
    pairs = [("V", 0, 2, 1, 1), ("K", 0, 1, 1, 0), ("Q", 0, 0, 1, 2), ("K", 0, 0, 1, 1)]
    batches = batches_of({p: [0.5, 0.6, 0.7] for p in pairs})
    got = agreement.causal_edges(batches.sort_values("batch", kind="stable"), "loss_effect", 0.01)
    assert [tuple(r) for r in got[agreement.PAIR].itertuples(index=False)] == pairs
    assert got["causal"].all()


def test_roc_auc_with_a_single_non_causal_edge():
    """One negative is enough for ROC-AUC: the fraction of positives that outscore it."""
    assert agreement.roc_auc(np.array([True, False]), np.array([1.0, 0.0])) == 1.0
    assert agreement.roc_auc(np.array([True, True, False]), np.array([0.1, 0.9, 0.5])) == 0.5
    assert math.isnan(agreement.roc_auc(np.array([True, True]), np.array([0.1, 0.9])))  # no negative
    assert math.isnan(agreement.roc_auc(np.array([False, False]), np.array([0.1, 0.9])))  # no positive


def test_role_scores_are_floats():
    """The role-only ranker's scores, like the measures it is ranked beside, are floats: 2.0 for a
    circuit pair, 1.0 for two named roles, 0.0 otherwise."""
    roles = pd.DataFrame(
        [(0, 0, "previous_token"), (0, 1, "other"), (1, 0, "induction")], columns=["layer", "head", "role"]
    )
    pairs = pd.DataFrame([("K", 0, 0, 1, 0), ("V", 0, 0, 1, 0), ("K", 0, 1, 1, 0)], columns=agreement.PAIR)
    got = agreement.role_scores(pairs, roles)
    assert got.dtype == np.float64
    assert got.tolist() == [2.0, 1.0, 0.0]


def test_spearman_of_scores_spread_less_than_one_is_defined_and_ranks_the_size_of_the_effect():
    """Composition scores lie in [0, 1]: a spread of 0.3 is a spread. |effect| (0.3, 0.1, 0.2)
    ranks (3, 1, 2), score (0.1, 0.2, 0.4) ranks (1, 2, 3): d = (2, -1, -1), sum d^2 = 6,
    rho = 1 - 6 * 6 / (3 * (9 - 1)) = -0.5. Only kind K, variant true has rows: the rest None."""
    pairs = [("K", 0, a, 1, 0) for a in range(3)]
    effects = pd.DataFrame(pairs, columns=agreement.PAIR).assign(loss_effect=[-0.3, 0.1, 0.2])
    scores = pd.DataFrame(pairs, columns=agreement.PAIR).assign(variant="true", score=[0.1, 0.2, 0.4])
    got = agreement.spearman(effects, scores, "loss_effect")
    assert got["K"]["true"] == pytest.approx(-0.5)
    assert got["Q"]["true"] is None and got["K"]["errata_bcda"] is None


def test_a_pair_whose_earlier_head_has_no_role_is_refused_naming_that_head():
    """heads.csv without head 0.0: the pair 0.0 -> 1.0 is refused naming its earlier head (0, 0),
    the one missing, not its later head (1, 0), which has a role."""
    roles = pd.DataFrame([(0, 1, "other"), (1, 0, "induction")], columns=["layer", "head", "role"])
    pairs = pd.DataFrame([("K", 0, 0, 1, 0)], columns=agreement.PAIR)
    with pytest.raises(ValueError) as caught:
        agreement.role_scores(pairs, roles)
    assert str(caught.value) == "no role for head (0, 0)"


def test_roc_auc_and_average_precision_read_zero_one_labels_as_booleans():
    """Labels 0/1 (ints, as a 0/1 column reads) mean causal / not causal, as True / False.
    Scores (0.1, 0.8, 0.4, 0.6), positives the 0.8 and the 0.4: of the 2 x 2 (positive, negative)
    pairs, 0.8 beats 0.1 and 0.6, 0.4 beats 0.1 only: ROC-AUC 3/4. Average precision: at 0.8
    recall 1/2 at precision 1, at 0.4 recall 1 at precision 2/3: 1/2 + 1/2 x 2/3 = 5/6."""
    labels, score = np.array([0, 1, 1, 0]), np.array([0.1, 0.8, 0.4, 0.6])
    assert agreement.roc_auc(labels, score) == pytest.approx(0.75, abs=1e-15)
    assert agreement.average_precision(labels, score) == pytest.approx(5 / 6, abs=1e-15)
    assert agreement.roc_auc(labels == 1, score) == pytest.approx(0.75, abs=1e-15)


def test_an_effect_constant_over_the_batches_is_causal_without_a_division_warning():
    """Effects 0.5, 0.5, 0.5: sd 0, so t = 0.5 / 0 is infinite; no spread to exceed, the edge is
    causal (it reaches min_effect) and no RuntimeWarning is raised. Effects 0, 0, 0: t = 0 / 0,
    not causal (below min_effect), silently too."""
    import warnings

    batches = batches_of({("K", 0, 0, 1, 0): [0.5, 0.5, 0.5], ("K", 0, 1, 1, 0): [0.0, 0.0, 0.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = agreement.causal_edges(batches, "loss_effect", 0.01)
    assert got["sd"].tolist() == [0.0, 0.0]
    assert got["causal"].tolist() == [True, False]


def test_ranking_reads_a_score_column_of_python_objects_with_none_undefined():
    """scores.csv's score column as Python objects (pandas leaves one so when it concatenates onto
    an empty table), None undefined: K true scores 0.9, 0.5, None into 1.0, the first and the last
    causal. The undefined score ranks last: ROC-AUC (3 + 1 - 3) / (2 x 1) = 1/2; average precision:
    at 0.9 recall 1/2 at precision 1, at 0.5 no new recall, then recall 1 at precision 2/3: 5/6."""
    pairs = [("K", 0, a, 1, 0) for a in range(3)]
    causal = pd.DataFrame(pairs, columns=agreement.PAIR).assign(causal=[True, False, True])
    scores = pd.DataFrame(pairs, columns=agreement.PAIR).assign(
        variant="true", score=pd.Series([0.9, 0.5, None], dtype=object)
    )
    got = agreement.ranking(causal, scores)["K"]["true"]
    assert got["roc_auc"] == pytest.approx(0.5, abs=1e-15)
    assert got["pr_auc"] == pytest.approx(5 / 6, abs=1e-15)
    assert (got["causal"], got["pairs"]) == (2, 3)
