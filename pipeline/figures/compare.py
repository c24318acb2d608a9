"""Figures across seeds: each seed a dot, the mean a bar with its bootstrap interval.

Inputs are the compare stage's tables: `seeds` (one row per seed), `stats` (column, n,
mean, lo, hi) and the per-seed training curves.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pipeline.tables import ROLES, VARIANTS

VARIANT_LABELS = {
    "true": "corrected",
    "errata_bcda": "original\n(B C D A)",
    "errata_dabc": "original\n(D A B C)",
}


def dots_with_ci(
    ax: Axes,
    seeds: pd.DataFrame,
    stats: pd.DataFrame,
    columns: list[str],
    labels: list[str],
    threshold: float | None = None,
    ci: float = 0.95,
) -> None:
    """At x = i, column i: one dot per seed (spread sideways by seed), the mean and its `ci` interval."""
    by_column = stats.set_index("column")
    n = len(seeds)
    offsets = np.linspace(-0.15, 0.15, n) if n > 1 else np.zeros(1)  # fixed spread: same picture every run
    for i, column in enumerate(columns):
        values = seeds[column].astype(float).to_numpy()
        ax.scatter(i + offsets, values, s=18, color="0.45", zorder=2, label="seed" if i == 0 else None)
        s = by_column.loc[column]
        if pd.notna(s["mean"]):
            ax.hlines(
                s["mean"], i - 0.28, i + 0.28, color="black", lw=2, zorder=3, label="mean" if i == 0 else None
            )
        if pd.notna(s["lo"]) and pd.notna(s["hi"]):
            ax.vlines(
                i + 0.3,
                s["lo"],
                s["hi"],
                color="#d62728",
                lw=2,
                zorder=3,
                label=f"{ci:.0%} CI" if i == 0 else None,
            )
    if threshold is not None:
        ax.axhline(threshold, color="0.6", lw=1, ls="--", zorder=1)
    if seeds[columns].isna().all().all():  # say why the panel is empty
        ax.text(
            0.5,
            0.5,
            "no seed has the heads\nthis needs",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
    ax.set_xticks(range(len(columns)), labels)
    ax.set_xlim(-0.6, len(columns) - 0.4)


def claims_figure(seeds: pd.DataFrame, stats: pd.DataFrame, z_threshold: float, ci: float) -> Figure:
    """The errata's three claims, per seed and across seeds."""
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.8))
    labels = [VARIANT_LABELS[v] for v in VARIANTS]
    dots_with_ci(
        axes[0], seeds, stats, [f"a_selectivity_{v}" for v in VARIANTS], labels, threshold=0.0, ci=ci
    )
    axes[0].set_title("(a) K induction <- prev-token:\nselectivity (> 0: strongest of all)", fontsize=10)
    dots_with_ci(axes[1], seeds, stats, ["b"], ["corrected"], threshold=z_threshold, ci=ci)
    axes[1].set_title("(b) K induction <- recent-window:\nmax z against the null", fontsize=10)
    dots_with_ci(axes[2], seeds, stats, [f"b_rel_{v}" for v in VARIANTS], labels, threshold=0.0, ci=ci)
    axes[2].set_title("(b) recent-window / prev-token\ncomposition (max excess)", fontsize=10)
    dots_with_ci(axes[3], seeds, stats, [f"c_rho_K_{v}" for v in VARIANTS], labels, threshold=0.0, ci=ci)
    axes[3].set_title("(c) K: Spearman rho with\nthe ablation effects", fontsize=10)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"The errata's claims across {len(seeds)} seed(s)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def roles_figure(seeds: pd.DataFrame, stats: pd.DataFrame) -> Figure:
    """How many heads of each role, per seed."""
    roles = [r for r in ROLES if f"n_{r}" in seeds.columns]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    dots_with_ci(ax, seeds, stats, [f"n_{r}" for r in roles], [r.replace("_", "\n") for r in roles])
    ax.set_ylabel("heads")
    ax.set_title(f"Head roles across {len(seeds)} seed(s)")
    fig.tight_layout()
    return fig


def curves_figure(curves: pd.DataFrame, mean: pd.DataFrame) -> Figure:
    """Training curves: a thin line per seed, the mean over seeds thick."""
    panels = [
        ("eval_loss", "held-out loss"),
        ("induction", "best induction score"),
        ("prev_token", "best previous-token score"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.4))
    for ax, (column, title) in zip(axes, panels):
        for seed, curve in curves.groupby("seed", sort=True):
            ax.plot(curve["tokens"], curve[column], lw=0.8, alpha=0.6, label=f"seed {seed}")
        ax.plot(mean["tokens"], mean[column], color="black", lw=2, label="mean")
        ax.set_xlabel("tokens seen")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
