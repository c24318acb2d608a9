"""Figures across seeds: each seed a dot, the mean a bar with its t interval.

Inputs are the compare stage's tables: `claims` (the long table: a row per seed and
statistic), `stats` (each statistic's n, mean, lo, hi) and the per-seed training curves.
A panel's columns are selections of the long table by its dimensions.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ...compare.claims import CLAIMS
from ...tables import HYPOTHESES, MEASURES, ROLES
from . import Caption

VARIANT_LABELS = {
    "true": "corrected",
    "errata_bcda": "BCDA\nrot. den.",
    "errata_dabc": "DABC\nrot. den.",
    "errata_bcda_trueden": "BCDA\ntrue den.",
    "errata_dabc_trueden": "DABC\ntrue den.",
    "invariant": "basis-\ninvariant",
    "projection": "projection\nkernel",
}
HYPOTHESIS_LABELS = {"rotated": "rotated\ndenominators", "true": "true\ndenominators"}


def _select(frame: pd.DataFrame, where: dict) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        mask &= (frame[column] == value).to_numpy()
    return frame[mask]


def dots_with_ci(
    ax: Axes,
    claims: pd.DataFrame,
    stats: pd.DataFrame,
    columns: list[dict],
    labels: list[str],
    threshold: float | None = None,
    ci: float = 0.95,
) -> None:
    """At x = i, selection i of the long table: a dot per seed (spread sideways),
    the mean and its interval."""
    seeds = sorted(claims["seed"].unique())
    offsets = np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else np.zeros(1)  # fixed: same picture
    empty = True
    for i, where in enumerate(columns):
        per_seed = _select(claims, where).set_index("seed")["value"].reindex(seeds).astype(float)
        empty &= bool(per_seed.isna().all())
        ax.scatter(
            i + offsets, per_seed.to_numpy(), s=18, color="0.45", zorder=2, label="seed" if i == 0 else None
        )
        s = _select(stats, where)
        if len(s) and pd.notna(s["mean"].iloc[0]):
            ax.hlines(
                s["mean"].iloc[0],
                i - 0.28,
                i + 0.28,
                color="black",
                lw=2,
                zorder=3,
                label="mean" if i == 0 else None,
            )
        if len(s) and pd.notna(s["lo"].iloc[0]) and pd.notna(s["hi"].iloc[0]):
            label = f"{ci:.0%} CI" if i == 0 else None
            ax.vlines(i + 0.3, s["lo"].iloc[0], s["hi"].iloc[0], color="#d62728", lw=2, zorder=3, label=label)
    if threshold is not None:
        ax.axhline(threshold, color="0.6", lw=1, ls="--", zorder=1)
    if empty:  # say why the panel is empty
        ax.text(
            0.5,
            0.5,
            "no seed has the heads\nthis needs",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
    ax.set_xticks(range(len(columns)), labels, fontsize=7)
    ax.set_xlim(-0.6, len(columns) - 0.4)


def claims_figure(claims: pd.DataFrame, stats: pd.DataFrame, ci: float) -> Figure:
    """The errata's claims, per seed and across seeds: a panel per claim of the registry
    (compare.claims.CLAIMS) that is not a restatement, titled with its label, its own number for
    each of its sides (denominator hypotheses or rotations) and then its restatements' beside it,
    the threshold dashed; two rows, so that at a report page's width (about 1200 px) its labels
    keep their size; the last cell holds the legend."""
    panels = [name for name, c in CLAIMS.items() if c.restates is None]
    columns = 4
    rows = -(-(len(panels) + 1) // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(3.3 * columns, 3.6 * rows))
    axes = list(grid.flat)
    for ax, name in zip(axes, panels, strict=False):
        claim = CLAIMS[name]
        selections, labels = [], []
        for who in (name, *(n for n, c in CLAIMS.items() if c.restates == name)):
            for column, side in CLAIMS[who].sides():
                selections.append({"claim": who, "statistic": who, column: side})
                labels.append(_side_label(who, column, side))
        dots_with_ci(ax, claims, stats, selections, labels, threshold=claim.threshold, ci=ci)
        ax.set_title(textwrap.fill(f"({name}) {claim.label}", 40), fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    for ax in axes[len(panels) :]:
        ax.axis("off")
    axes[len(panels)].legend(handles, names, loc="center", frameon=False, fontsize=11)
    fig.suptitle(f"The errata's claims across {claims['seed'].nunique()} seed(s)")
    fig.tight_layout()
    return fig


def _side_label(name: str, column: str, side: str) -> str:
    """A tick label: the measure a restatement puts in the corrected score's place, then the side
    (a denominator hypothesis, a rotation) where the claim has several."""
    claim = CLAIMS[name]
    who = claim.label if claim.restates else "corrected"
    if column == "variant":
        return f"{who}\n- {VARIANT_LABELS[side].split(chr(10))[0]}"
    if side in HYPOTHESIS_LABELS:
        return f"{who}\n{HYPOTHESIS_LABELS[side]}" if claim.restates else HYPOTHESIS_LABELS[side]
    return who


def roles_figure(claims: pd.DataFrame, stats: pd.DataFrame) -> Figure:
    """How many heads of each role, per seed."""
    present = set(claims.loc[claims["claim"] == "roles", "statistic"])
    roles = [r for r in ROLES if r in present]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    columns = [{"claim": "roles", "statistic": r} for r in roles]
    dots_with_ci(ax, claims, stats, columns, [r.replace("_", "\n") for r in roles])
    ax.set_ylabel("heads")
    ax.set_title(f"Head roles across {claims['seed'].nunique()} seed(s)")
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
    for ax, (column, title) in zip(axes, panels, strict=True):
        for seed, curve in curves.groupby("seed", sort=True):
            ax.plot(curve["tokens"], curve[column], lw=0.8, alpha=0.6, label=f"seed {seed}")
        ax.plot(mean["tokens"], mean[column], color="black", lw=2, label="mean")
        ax.set_xlabel("tokens seen")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def timing_figure(claims: pd.DataFrame, stats: pd.DataFrame, ci: float) -> Figure:
    """Through training: each measure's lag (clear step minus induction phase step), and claim (t)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    lags = [{"claim": "t", "statistic": "lag", "variant": m} for m in MEASURES]
    dots_with_ci(left, claims, stats, lags, [VARIANT_LABELS[m] for m in MEASURES], threshold=0.0, ci=ci)
    left.set_ylabel("steps")
    left.set_title(
        "K-composition of the top induction <- prev-token pair becomes a discovery:\n"
        "steps after the induction phase change (< 0: before)",
        fontsize=9,
    )
    rotations = HYPOTHESES["rotated"]
    per_rotation = [{"claim": "t", "statistic": "t", "variant": r} for r in rotations]
    dots_with_ci(
        right, claims, stats, per_rotation, [VARIANT_LABELS[r].split("\n")[0] for r in rotations], 0.0, ci
    )
    right.set_ylabel("steps")
    right.set_title("(t) corrected clear step -\neach rotation's", fontsize=9)
    handles, names = left.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"Composition through training, {claims['seed'].nunique()} seed(s)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# what each figure shows, by the stem the compare stage saves it as (the report's captions)
CAPTIONS = {
    "claims": Caption(
        "the claims",
        "The errata's claims across seeds",
        "A panel per claim, titled with what its per-seed number is: a grey dot per seed, the mean over "
        "seeds (black bar) and its t interval (red, as computed: the tables clip it to the statistic's "
        "range), and the threshold the claim must clear (dashed). A claim tested under each denominator "
        "hypothesis, or against each rotation, has a column for each; its restatements with another "
        "measure in the corrected score's place stand to the right of its own columns.",
    ),
    "timing": Caption(
        "timing",
        "When each measure sees the induction circuit, across seeds",
        "Left: for each measure, the step from which the K-composition of the top induction <- "
        "previous-token pair stays a discovery, minus the step at which induction reaches 0.5 (below 0: "
        "the measure sees the circuit before the phase change). Right: claim (t), the corrected score's "
        "clear step minus each rotation's (above 0: the original sees it earlier). Dots: seeds; bar: "
        "mean; red: t interval.",
    ),
    "curves": Caption(
        "training curves",
        "Training curves of every seed",
        "Held-out loss, the best induction score and the best previous-token score against tokens seen: "
        "a thin line per seed, the mean over seeds thick.",
    ),
    "roles": Caption(
        "head roles",
        "Heads of each role across seeds",
        "How many heads each seed's classifier gives each role (a grey dot per seed), with the mean and "
        "its t interval. Heads are compared across seeds by role, not by index.",
    ),
}
