"""pipeline/present/figures/heads.py: the head figures of the planted model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import planted
import pytest

from pipeline.behaviour import heads
from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig, HeadsConfig
from pipeline.tables import VARIANTS

LENGTH = 7


CFG = HeadsConfig(eval_sequences=32, repeat_length=LENGTH, window_length=planted.WINDOW)


PLANTED_ROLES = {
    (0, 0): "previous_token", (0, 1): "first_token", (0, 2): "duplicate_token",
    (1, 0): "induction", (1, 1): "current_token", (1, 2): "recent_window",
}  # fmt: skip


def scores_of(hw: weights.HeadWeights) -> pd.DataFrame:
    return composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


@pytest.fixture(scope="module")
def planted_result(planted_scores):
    model, hw = planted.model(), weights.from_state_dict(planted.state_dict())
    repeated, heldout = planted.repeated(32, LENGTH, 0), planted.random_tokens(32, planted.N_CTX, 1)
    return heads.analyse_batches(model, hw, repeated, heldout, CFG, planted_scores)


def test_attention_pattern_panels_are_titled_with_roles(planted_result):
    from pipeline.present.figures import heads as heads_figures

    pattern = planted_result.example["pattern"].numpy()
    fig = heads_figures.attention_patterns(pattern, planted_result.table, LENGTH)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"{l}.{h} {role.replace('_', ' ')}" for (l, h), role in PLANTED_ROLES.items()]
    first = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(first, pattern[0, 0])  # the pattern itself, not a copy of another head's


def test_copying_vs_qk_places_the_induction_head_top_right_and_names_undefined_heads(planted_result):
    from pipeline.present.figures import heads as heads_figures

    fig = heads_figures.copying_vs_qk(planted_result.table)
    (ax,) = fig.axes
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(points, [[1.0, 1.0]])  # only 1.0 has both scores defined
    (note,) = [t.get_text() for t in ax.texts if "1.1" in t.get_text()]
    assert "1.1, 1.2" in note  # the heads left out, named


def test_ablation_figure_shows_each_variants_rho(planted_result, planted_scores):
    from pipeline.present.figures import heads as heads_figures

    scores = planted_scores
    rho = {"K": {"true": 0.5, "errata_bcda": None}}
    fig = heads_figures.ablation_vs_composition(planted_result.ablation, scores, "attn_effect", rho, ("K",))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == len(VARIANTS) and titles[0].startswith("K true") and "0.50" in titles[0]
    for title, v in zip(titles[1:], VARIANTS[1:], strict=True):  # each variant's panel, its rho undefined
        assert title.startswith(f"K {v}:") and not any(c.isdigit() for c in title.split(":", 1)[1])
    k_true = fig.axes[0].collections[0].get_offsets()
    assert len(k_true) == 9 and k_true[:, 1].max() > 0.8  # 3 x 3 pairs; the planted edge's induction drop
