"""Tick labels that can be read: in the path-ablation scatter grids (one panel per kind and
variant, each on its own scale) no two tick labels of an axis overlap, whatever the data's
range, at the size the figures stage draws them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.present.figures import heads as heads_figures
from pipeline.tables import VARIANTS


def grid_inputs(x_range: tuple[float, float], y_range: tuple[float, float], n: int = 60):
    """Seeded ablation effects and scores whose excess spans `x_range` and effect `y_range`, every
    kind and variant (ranges like a trained model's: the report's ablation_pattern.png)."""
    rng = np.random.default_rng(0)
    keys = pd.DataFrame({
        "src_layer": 0, "src_head": np.arange(n) % 8, "dst_layer": 1, "dst_head": np.arange(n) // 8,
    })  # fmt: skip
    effects, scores = [], []
    for kind in ("Q", "K", "V"):
        pairs = keys.assign(kind=kind)
        effects.append(pairs.assign(pattern_effect=rng.uniform(*y_range, n)))
        for variant in VARIANTS:
            scores.append(pairs.assign(variant=variant, score=rng.uniform(*x_range, n), baseline_mean=0.0))
    return pd.concat(effects, ignore_index=True), pd.concat(scores, ignore_index=True)


GAP = 0.5  # the least space between two tick labels, in ems of their font (a space is ~0.3)


def overlapping_ticks(fig) -> list[str]:
    """`panel axis: label, label` for each pair of neighbouring tick labels closer than GAP once
    drawn (the report's grids had -0.150 and -0.125 0.3 em apart: they read as one number)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            pad = [GAP / 2 * t.get_fontsize() * fig.dpi / 72 for t in labels]
            boxes = [t.get_window_extent(renderer).padded(p) for t, p in zip(labels, pad, strict=True)]
            for i in range(len(labels) - 1):
                if boxes[i].overlaps(boxes[i + 1]):
                    pair = f"{labels[i].get_text()}, {labels[i + 1].get_text()}"
                    found.append(f"{ax.get_title()} {name}: {pair}")
    return found


@pytest.mark.parametrize(
    "x_range",
    [(-0.15, 0.025), (-0.0213, 0.0287), (-0.2, 3.1), (-1234.5, 2345.6), (0.000123, 0.000987)],
)
def test_the_ablation_grids_tick_labels_do_not_overlap(x_range):
    import matplotlib.pyplot as plt

    effects, scores = grid_inputs(x_range, (0.0183, 0.4712))
    fig = heads_figures.ablation_vs_composition(effects, scores, "pattern_effect")
    try:
        assert overlapping_ticks(fig) == []
    finally:
        plt.close(fig)


def test_the_overlap_check_can_fail():
    """Ten long labels on a narrow axis overlap, and the check says so."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(np.linspace(0, 1, 10), [f"{v:.4f}" for v in np.linspace(-0.15, 0.025, 10)])
    try:
        assert overlapping_ticks(fig)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("n_heads", [3, 8, 12, 32])
def test_the_composition_heatmaps_label_heads_legibly(n_heads):
    """Every head labelled up to eight a side, every second (fourth, ..) beyond: no overlap."""
    import matplotlib.pyplot as plt

    from pipeline.present.figures import composition as composition_figures

    rng = np.random.default_rng(n_heads)
    heads = np.arange(n_heads)
    src, dst = np.meshgrid(heads, heads)
    scores = pd.concat(
        pd.DataFrame(
            {
                "kind": "K",
                "variant": v,
                "src_layer": 0,
                "src_head": src.ravel(),
                "dst_layer": 1,
                "dst_head": dst.ravel(),
                "score": rng.normal(size=src.size),
                "baseline_mean": 0.0,
            }
        )  # fmt: skip
        for v in VARIANTS
    )
    fig = composition_figures.composition_heatmap(scores, "K")
    try:
        assert overlapping_ticks(fig) == []
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        step = -(-n_heads // 8)  # ceil
        assert labels == [str(h) for h in range(0, n_heads, step)] and len(labels) <= 8
    finally:
        plt.close(fig)
