"""pipeline/behaviour/agreement.py: does a composition score predict the causal ablation.

Known answers worked out by hand for the causal edges and their t-test, the rankings (PR-AUC,
ROC-AUC), the role-only ranker, Spearman's rho of the raw effect, and the scale-free comparison
that claim (c) reads: multiplying a score or an effect by any function of the writer alone or of
the reader alone leaves it exactly as it is."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from refusals import one_line

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


def pairs_table() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two earlier heads into two later heads, every kind: effects and scores of known ranks."""
    keys = [(k, 0, a, 1, b) for k in "QKV" for a in range(2) for b in range(2)]
    effects = pd.DataFrame(keys, columns=["kind", "src_layer", "src_head", "dst_layer", "dst_head"])
    effects["loss_effect"] = [
        -0.1,
        0.2,
        0.3,
        0.4,
    ] * 3  # |effect| ranks 1..4; top source of b=0: a=1, of b=1: a=1
    effects["attn_effect"] = 0.0
    effects["heldout_loss_effect"] = [0.5, 0.001, 0.1, 0.002] * 3  # b=0: a=0; b=1 below min_effect
    rows = []
    for variant, score in (
        ("true", [1, 2, 3, 4]),
        ("errata_bcda", [4, 3, 2, 1]),
        ("errata_dabc", [1, np.nan, 3, 2]),
    ):
        for (kind, i, a, j, b), s in zip(keys, score * 3, strict=True):
            rows.append(
                dict(kind=kind, variant=variant, src_layer=i, src_head=a, dst_layer=j, dst_head=b, score=s)
            )
    return effects, pd.DataFrame(rows)


def role_table() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three earlier heads into two later ones, every kind, with hand-set causal labels: the
    circuit pair 0.0 -> 1.0 (previous_token -> induction) and 0.2 -> 1.1 (other -> other) causal."""
    roles = pd.DataFrame(
        [
            (0, 0, "previous_token"),
            (0, 1, "duplicate_token"),
            (0, 2, "other"),
            (1, 0, "induction"),
            (1, 1, "other"),
        ],
        columns=["layer", "head", "role"],
    )
    pairs = [(kind, 0, a, 1, b) for kind in "QKV" for b in range(2) for a in range(3)]
    causal = pd.DataFrame(pairs, columns=agreement.PAIR)
    causal["causal"] = [(a, b) in ((0, 0), (2, 1)) for _, _, a, _, b in pairs]
    return causal, roles


def scaled_pairs(
    seed: int = 0, noise: float = 0.5
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """Every (kind, 0.a -> 1.b) pair of 8 x 8 heads, and for each a pair term, a writer scale and a
    reader scale (lognormal); effect = pair term x writer scale x reader scale x lognormal noise."""
    rng = np.random.default_rng(seed)
    pairs = pd.DataFrame(
        [(k, 0, a, 1, b) for k in ("Q", "K", "V") for a in range(8) for b in range(8)], columns=agreement.PAIR
    )
    pair = rng.lognormal(size=len(pairs))
    writer = rng.lognormal(size=8)[pairs["src_head"]]
    reader = rng.lognormal(size=8)[pairs["dst_head"]]
    effect = pair * writer * reader * rng.lognormal(sigma=noise, size=len(pairs))
    return pairs.assign(pattern_effect=effect), pair, writer, reader


def scores_of(pairs: pd.DataFrame, by_variant: dict[str, np.ndarray]) -> pd.DataFrame:
    cells = pairs[agreement.PAIR]
    return pd.concat([cells.assign(variant=v, score=s) for v, s in by_variant.items()], ignore_index=True)


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
    assert "(1, 0)" not in one_line(caught, "(0, 0)")


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


def test_spearman_known_answers_and_nan_safety():
    effects, scores = pairs_table()
    rho = agreement.spearman(effects, scores, "loss_effect")
    assert rho["K"]["true"] == pytest.approx(1.0) and rho["Q"]["errata_bcda"] == pytest.approx(-1.0)
    assert rho["V"]["errata_dabc"] == pytest.approx(0.5)  # NaN pair dropped: ranks (1,3,4) vs (1,3,2)
    assert agreement.spearman(effects, scores, "attn_effect")["K"]["true"] is None  # constant effect


def test_top_source_known_answers():
    effects, scores = pairs_table()
    top = agreement.top_source(effects, scores, "loss_effect", min_effect=0.01)
    # by ablation, both later heads' top source is a=1; by score: true a=1 (both), bcda a=0 (both),
    # dabc: b=0 has a=1 (3 > 1), b=1 has only a=1 defined (2; the NaN skipped)
    assert top["K"]["true"] == {"match": 2, "heads": 2}
    assert top["K"]["errata_bcda"] == {"match": 0, "heads": 2}
    assert top["K"]["errata_dabc"] == {"match": 2, "heads": 2}
    held = agreement.top_source(effects, scores, "heldout_loss_effect", min_effect=0.01)
    assert held["Q"]["true"] == {"match": 0, "heads": 1}  # b=1's effects all < 0.01: not counted
    assert held["Q"]["errata_bcda"] == {"match": 1, "heads": 1}
    assert agreement.top_source(effects, scores, "attn_effect", 0.01)["K"]["true"] == {"match": 0, "heads": 0}


def test_causal_edges_exceed_their_batch_to_batch_spread():
    pair = {"kind": "K", "src_layer": 0, "dst_layer": 1, "dst_head": 0}
    effects = {  # three batches per source head
        0: [0.10, 0.11, 0.12],  # mean 0.11, sd 0.01: t = 19 > t_{0.95, 2} = 2.92: causal
        1: [0.30, -0.10, 0.10],  # mean 0.10, sd 0.2: t = 0.87: within its noise
        2: [0.004, 0.005, 0.006],  # beyond its noise but below min_effect 0.01
        3: [-0.2, -0.21, -0.22],  # ablation lowers the loss: the circuit hurts; never causal
        4: [0.05, 0.05, 0.05],  # no spread at all: its size decides
    }
    batches = pd.DataFrame(
        [
            {"batch": b, **pair, "src_head": a, "loss_effect": e}
            for a, es in effects.items()
            for b, e in enumerate(es)
        ]
    )
    got = agreement.causal_edges(batches, "loss_effect", min_effect=0.01).set_index("src_head")
    assert got["causal"].to_dict() == {0: True, 1: False, 2: False, 3: False, 4: True}
    assert got.loc[0, "mean"] == pytest.approx(0.11) and got.loc[0, "sd"] == pytest.approx(0.01)
    one = agreement.causal_edges(batches[batches["batch"] == 1], "loss_effect", 0.01)  # no spread to measure
    assert one.set_index("src_head")["causal"].to_dict() == {0: True, 1: False, 2: False, 3: False, 4: True}


def test_ranking_known_answers():
    labels = np.array([True, False, True, False, False])
    # scores rank: 0.9 (T), 0.8 (F), 0.7 (T), then the rest: AP = 1/2 (1/1) + 1/2 (2/3)
    assert agreement.average_precision(labels, np.array([0.9, 0.8, 0.7, 0.1, 0.2])) == pytest.approx(
        0.5 + 0.5 * 2 / 3
    )
    # ROC-AUC: of 2 x 3 (causal, not) pairs, the causal one wins 5 (0.7 loses to 0.8)
    assert agreement.roc_auc(labels, np.array([0.9, 0.8, 0.7, 0.1, 0.2])) == pytest.approx(5 / 6)
    # ties share: every score equal gives 1/2; an undefined score ranks last
    assert agreement.roc_auc(labels, np.ones(5)) == pytest.approx(0.5)
    assert agreement.average_precision(labels, np.ones(5)) == pytest.approx(2 / 5)
    assert agreement.roc_auc(labels, np.array([np.nan, 0.8, 0.7, 0.1, 0.2])) == pytest.approx(2 / 6)
    assert np.isnan(agreement.average_precision(np.zeros(3, bool), np.arange(3.0)))  # nothing causal


def test_ranking_reads_the_causal_edges_per_kind_and_measure():
    effects, scores = pairs_table()
    batches = pd.concat([effects.assign(batch=b) for b in range(3)])  # no spread: causal when >= 0.01
    ranked = agreement.ranking(agreement.causal_edges(batches, "heldout_loss_effect", 0.01), scores)
    # held-out: (a, b) = (0, 0) 0.5 and (1, 0) 0.1 causal; true scores 1, 3 of [1, 2, 3, 4]
    assert ranked["K"]["true"]["causal"] == 2 and ranked["K"]["true"]["pairs"] == 4
    assert ranked["K"]["true"]["roc_auc"] == pytest.approx(1 / 4)  # 3 beats 2, loses to 4; 1 loses both
    assert ranked["K"]["errata_bcda"]["roc_auc"] == pytest.approx(3 / 4)


def test_role_only_ranker_known_answers():
    """Scores 2 for previous_token or recent_window -> induction under Q and K, 1 for two named
    roles, else 0; V names no circuit pair. K's order: 2 (causal), 1, then four 0s (one causal):
    AP = 1/2 x 1 + 1/2 x 2/6 = 2/3, ROC-AUC = (4 + 3/2) / 8. V: the causal circuit pair ties with
    0.1 -> 1.0 at 1: AP = 1/2 x 1/2 + 1/2 x 2/6 = 5/12."""
    causal, roles = role_table()
    k = causal[causal["kind"] == "K"]
    assert agreement.role_scores(k, roles).tolist() == [2, 1, 0, 0, 0, 0]
    v = causal[causal["kind"] == "V"]
    assert agreement.role_scores(v, roles).tolist() == [1, 1, 0, 0, 0, 0]
    ranked = agreement.role_ranking(causal, roles)
    for kind in "QK":
        assert ranked[kind]["pr_auc"] == pytest.approx(2 / 3) and ranked[kind]["roc_auc"] == pytest.approx(
            5.5 / 8
        )
        assert (ranked[kind]["causal"], ranked[kind]["pairs"]) == (2, 6)
    assert ranked["V"]["pr_auc"] == pytest.approx(5 / 12)
    # a recent-window source is a circuit source too; a head without a role is refused
    recent = roles.assign(role=roles["role"].replace({"previous_token": "recent_window"}))
    assert agreement.role_scores(k, recent).tolist() == [2, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError) as caught:
        agreement.role_scores(k, roles.iloc[:4])
    one_line(caught, "(1, 1)")


def test_pair_part_removes_any_writer_and_reader_factor_exactly():
    effects, pair, writer, reader = scaled_pairs()
    k = effects[effects["kind"] == "K"]
    mine = k.assign(pattern_effect=pair[: len(k)])
    scaled = k.assign(pattern_effect=pair[: len(k)] * writer[: len(k)] ** 3 / reader[: len(k)])
    assert agreement.pair_part(scaled, "pattern_effect") == pytest.approx(
        agreement.pair_part(mine, "pattern_effect"), abs=1e-7
    )
    # the residual of an additive fit: it sums to 0 over each writer and over each reader
    part = agreement.pair_part(mine, "pattern_effect").reshape(8, 8)
    assert np.abs(part.sum(0)).max() < 1e-7 and np.abs(part.sum(1)).max() < 1e-7  # to the snap grid
    # undefined where the log is (a zero or negative value), and the rest fitted without it
    holes = mine.assign(pattern_effect=np.where(np.arange(64) == 5, 0.0, mine["pattern_effect"]))
    got = agreement.pair_part(holes, "pattern_effect")
    assert np.isnan(got[5]) and np.isfinite(np.delete(got, 5)).all()


def test_scores_that_differ_only_in_how_they_follow_a_heads_scale_get_the_same_agreement():
    """The synthetic check of claim (c): the same pair term, multiplied by the writer's scale, by the
    reader's, by their inverses, or by nothing, gives exactly the same rho; the raw-effect Spearman
    (scale included) prefers the score that follows the writer's scale, as the effect does."""
    effects, pair, writer, reader = scaled_pairs()
    versions = {
        "true": pair, "errata_bcda": pair * writer, "errata_dabc": pair * writer**2 / reader,
        "errata_bcda_trueden": pair / writer, "errata_dabc_trueden": pair * reader**0.5,
    }  # fmt: skip
    scores = scores_of(effects, versions)
    rho, main_share = agreement.interaction(effects, scores, "pattern_effect")
    for kind in ("Q", "K", "V"):
        values = list(rho[kind].values())
        assert max(values) - min(values) < 1e-12 and values[0] > 0.5, (kind, rho[kind])
        assert 0.3 < main_share[kind] < 0.9  # the scales explain much of the raw effect's variance
    raw = agreement.spearman(effects, scores, "pattern_effect")["K"]
    assert raw["errata_bcda"] > raw["true"] > raw["errata_bcda_trueden"]  # scale rewarded there
    # and c itself, the corrected score's rho minus the better rotation's, is 0 to rounding
    assert rho["K"]["true"] - max(rho["K"]["errata_bcda"], rho["K"]["errata_dabc"]) == pytest.approx(
        0.0, abs=1e-12
    )


def test_a_score_that_knows_the_pair_term_beats_one_that_does_not():
    effects, pair, writer, reader = scaled_pairs(1)
    rng = np.random.default_rng(7)
    scores = scores_of(effects, {"true": pair, "errata_bcda": rng.lognormal(size=len(pair)) * writer})
    rho, _ = agreement.interaction(effects, scores, "pattern_effect")
    assert rho["K"]["true"] > 0.6 and abs(rho["K"]["errata_bcda"]) < 0.35
    undefined = scores.assign(score=np.where(scores["variant"] == "errata_bcda", np.nan, scores["score"]))
    assert agreement.interaction(effects, undefined, "pattern_effect")[0]["K"]["errata_bcda"] is None


def test_the_pair_parts_of_a_two_by_two_layer_pair_tie_exactly_whatever_the_order_of_the_rows():
    """Two writers x two readers: the additive fit leaves +e and -e, each twice, equal in exact
    arithmetic; snapped, they are equal in floats too, in any row order, so their ranks (and the
    Spearman rho built on them) do not depend on the order of the sums."""
    frame = pd.DataFrame(
        {"src_layer": 0, "src_head": [0, 0, 1, 1], "dst_layer": 1, "dst_head": [0, 1, 0, 1],
         "pattern_effect": [0.3, 0.011, 0.07, 0.9]}
    )  # fmt: skip
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        part = agreement.pair_part(frame.iloc[order].reset_index(drop=True), "pattern_effect")
        assert len(set(np.abs(part))) == 1 and sorted(part)[0] == -sorted(part)[-1], part


# --- agreement: sizes, not signs; each effect its own ranking ------------------------------


def pair_rows(kind: str, values: dict[tuple[int, int], float], column: str) -> pd.DataFrame:
    """{(src_head, dst_head): value} of layer 0 -> layer 1 pairs as table rows."""
    return pd.DataFrame(
        [
            {"kind": kind, "src_layer": 0, "src_head": a, "dst_layer": 1, "dst_head": b, column: v}
            for (a, b), v in values.items()
        ]
    )


def test_spearman_and_top_source_rank_the_size_of_an_effect_not_its_sign():
    # the largest effect is negative: by size the ranks agree with the score exactly, by sign not
    effect = {(0, 0): -0.9, (1, 0): 0.5, (2, 0): -0.3, (0, 1): 0.1}
    score = {(0, 0): 4.0, (1, 0): 3.0, (2, 0): 2.0, (0, 1): 1.0}
    effects = pair_rows("K", effect, "loss_effect")
    scores = pair_rows("K", score, "score").assign(variant="true")
    assert agreement.spearman(effects, scores, "loss_effect")["K"]["true"] == pytest.approx(1.0)
    # later head 1.0: its largest |effect| is from 0.0, its top score too; 1.1's only source 0.0,
    # whose effect 0.1 is exactly min_effect: counted (reaches)
    top = agreement.top_source(effects, scores, "loss_effect", min_effect=0.1)
    assert top["K"]["true"] == {"match": 2, "heads": 2}


def test_a_tie_in_scores_makes_the_first_earlier_head_the_top_source():
    # into 1.0, sources 0.0 and 0.1 score the same; the ablation's top source is 0.0
    effects = pair_rows("K", {(0, 0): 0.5, (1, 0): 0.2}, "loss_effect")
    scores = pair_rows("K", {(0, 0): 1.0, (1, 0): 1.0}, "score").assign(variant="true")
    assert agreement.top_source(effects, scores, "loss_effect", 0.01)["K"]["true"] == {"match": 1, "heads": 1}
    flipped = effects.assign(loss_effect=[0.2, 0.5])  # the ablation's top source is now 0.1
    assert agreement.top_source(flipped, scores, "loss_effect", 0.01)["K"]["true"] == {"match": 0, "heads": 1}


def test_an_edge_at_min_effect_and_beyond_its_one_sided_noise_is_causal():
    effects = {  # three batches each; min_effect 0.25 (exact in binary)
        0: [0.25, 0.25, 0.25],  # exactly min_effect, no spread: causal
        1: [0.25, 0.5, 0.75],  # mean 0.5, sd 0.25: t = 3.46, above t_{0.95, 2} = 2.92 (below 4.30)
        2: [0.0, 0.5, 1.0],  # mean 0.5, sd 0.5: t = 1.73, within its noise
        3: [0.125, 0.125, 0.125],  # below min_effect
    }
    batches = pd.DataFrame(
        [
            {"batch": b, "kind": "K", "src_layer": 0, "src_head": a, "dst_layer": 1, "dst_head": 0,
             "loss_effect": e}
            for a, es in effects.items()
            for b, e in enumerate(es)
        ]
    )  # fmt: skip
    got = agreement.causal_edges(batches, "loss_effect", min_effect=0.25).set_index("src_head")
    assert got["causal"].to_dict() == {0: True, 1: True, 2: False, 3: False}
    assert got.loc[1, "sd"] == pytest.approx(0.25) and got.loc[0, "mean"] == 0.25


def test_each_effects_ranking_is_built_from_that_effect():
    # four sources into 1.0; each effect makes a different one causal; the score ranks 0 > 1 > 2 > 3
    rows = []
    for a, effect in enumerate(agreement.EFFECTS):
        for b in range(3):
            sizes = {e: 0.5 if e == effect else 0.0 for e in agreement.EFFECTS}
            rows.append({"batch": b, "kind": "K", "src_layer": 0, "src_head": a, "dst_layer": 1,
                         "dst_head": 0, **sizes})  # fmt: skip
    batches = pd.DataFrame(rows)
    effects = batches.groupby(agreement.PAIR, sort=False)[list(agreement.EFFECTS)].mean().reset_index()
    scores = pair_rows("K", {(0, 0): 4.0, (1, 0): 3.0, (2, 0): 2.0, (3, 0): 1.0}, "score").assign(
        variant="true"
    )
    summary = agreement.summarize(effects, scores, 0.01, batches)
    # the causal edge at rank 1, 2, 3, 4: average precision 1, 1/2, 1/3, 1/4; ROC-AUC 1, 2/3, 1/3, 0
    want = {"heldout_loss_effect": (1.0, 1.0), "loss_effect": (0.5, 2 / 3), "attn_effect": (1 / 3, 1 / 3),
            "pattern_effect": (1 / 4, 0.0)}  # fmt: skip
    assert list(want) == list(agreement.EFFECTS)
    for effect, (pr, roc) in want.items():
        ranked = summary[effect]["ranking"]["K"]["true"]
        assert (ranked["causal"], ranked["pairs"]) == (1, 4), effect
        assert ranked["pr_auc"] == pytest.approx(pr) and ranked["roc_auc"] == pytest.approx(roc), effect
    # the pattern effect cut at each threshold: its edge (0.5) is causal up to 0.1
    for cut in summary["pattern_effect"]["by_threshold"].values():
        assert cut["ranking"]["K"]["true"]["causal"] == 1 and cut["ranking"]["K"]["true"]["pr_auc"] == 0.25
    # and each effect's statistics, under their keys, are the functions' own
    for effect in agreement.EFFECTS:
        rhos, share = agreement.interaction(effects, scores, effect)
        got = summary[effect]
        assert (got["interaction"], got["main_share"]) == (rhos, share), effect
        assert got["spearman"] == agreement.spearman(effects, scores, effect), effect
        assert got["top_source"] == agreement.top_source(effects, scores, effect, 0.01), effect
