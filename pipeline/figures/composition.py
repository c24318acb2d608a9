"""Composition figures: heatmaps of score minus baseline, and the errata diagram."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

KINDS = ("Q", "K", "V")


def composition_heatmap(scores: pd.DataFrame, kind: str, variant: str = "true") -> Figure:
    """Score minus baseline for every (earlier head, later head) pair, one panel per layer pair."""
    sel = scores[(scores["kind"] == kind) & (scores["variant"] == variant)]
    pairs = sorted(set(zip(sel["src_layer"], sel["dst_layer"])))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), squeeze=False)
    for ax, (src, dst) in zip(axes[0], pairs):
        block = sel[(sel["src_layer"] == src) & (sel["dst_layer"] == dst)]
        grid = block.pivot(index="dst_head", columns="src_head", values="score") - block.pivot(
            index="dst_head", columns="src_head", values="baseline_mean"
        )
        vmax = max(float(np.nanmax(np.abs(grid.values))), 1e-12) if grid.size else 1.0
        im = ax.imshow(grid.values, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_xlabel(f"layer {src} head (writes)")
        ax.set_ylabel(f"layer {dst} head (reads)")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]))
        fig.colorbar(im, ax=ax, shrink=0.8, label="score - baseline")
    fig.suptitle(f"{kind}-composition ({variant})")
    fig.tight_layout()
    return fig

