"""pipeline/circuits/composition.py on the planted model: its one composing pair scores highest."""

from __future__ import annotations

import pandas as pd
import planted
import pytest

from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig


def scores_of(hw: weights.HeadWeights) -> pd.DataFrame:
    return composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


def test_planted_pair_has_the_largest_true_k_composition(planted_scores):
    scores = planted_scores
    true_k = scores[(scores["kind"] == "K") & (scores["variant"] == "true")]
    best = true_k.loc[true_k["score"].idxmax()]
    assert (best["src_layer"], best["src_head"], best["dst_layer"], best["dst_head"]) == (0, 0, 1, 0)
    assert best["score"] == pytest.approx(0.25)  # two rank-16 isometries: 1 / sqrt(16)
    others = true_k.drop(best.name)["score"].dropna()
    assert len(others) > 0 and others.abs().max() < 1e-12
