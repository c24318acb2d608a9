"""Known answers for the agreement of scores with the ablation (pipeline/behaviour/agreement.py): the
size of an effect, not its sign; the first of tied sources; an edge at min_effect; each effect's
own ranking."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.behaviour import agreement

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
