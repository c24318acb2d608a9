"""Composition figures: heatmaps of score minus baseline, the errata diagram, and for deeper
models the discoveries over every layer pair.

Inputs are the composition stage's `scores.csv` table (one row per kind, variant and
head pair) and, optionally, the heads stage's `heads.csv` (for role labels).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...tables import KINDS, VARIANTS, excess
from . import Caption

KIND_COLORS = {
    "Q": "#1f77b4",
    "K": "#d62728",
    "V": "#2ca02c",
}  # the paper's Q/K/V colouring differs; ours is fixed
VARIANT_TITLES = {
    "true": "corrected (true Frobenius norm)",
    "errata_bcda": "original (B C D A, rotated denominators)",
    "errata_dabc": "original (D A B C, rotated denominators)",
    "errata_bcda_trueden": "original (B C D A, true denominators)",
    "errata_dabc_trueden": "original (D A B C, true denominators)",
}


def composition_heatmap(scores: pd.DataFrame, kind: str, variants: tuple[str, ...] = VARIANTS) -> Figure:
    """Score minus baseline for every (earlier, later) head pair:
    a row per variant, a column per layer pair."""
    sel = scores[scores["kind"] == kind].assign(excess=excess)
    variants = tuple(v for v in variants if v in set(sel["variant"]))
    pairs = sorted(set(zip(sel["src_layer"], sel["dst_layer"], strict=True)))
    fig, axes = plt.subplots(
        len(variants), len(pairs), figsize=(3.8 * len(pairs) + 0.8, 3.2 * len(variants)), squeeze=False
    )
    for row, variant in enumerate(variants):
        for col, (src, dst) in enumerate(pairs):
            ax = axes[row][col]
            block = sel[(sel["variant"] == variant) & (sel["src_layer"] == src) & (sel["dst_layer"] == dst)]
            grid = block.pivot(
                index="dst_head", columns="src_head", values="excess"
            )  # [later head, earlier head]
            finite = np.abs(grid.values[np.isfinite(grid.values)])
            vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
            im = ax.imshow(grid.values, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            # every head labelled up to 8 a side; beyond, every 2nd (3rd, ..): at 12 heads the
            # labels of a 3.8-inch panel would run together
            ax.set_xticks(range(0, grid.shape[1], math.ceil(grid.shape[1] / 8)))
            ax.set_yticks(range(0, grid.shape[0], math.ceil(grid.shape[0] / 8)))
            ax.set_xlabel(f"layer {src} head (writes)")
            ax.set_ylabel(f"layer {dst} head (reads)")
            ax.set_title(VARIANT_TITLES.get(variant, variant), fontsize=9)
            fig.colorbar(im, ax=ax, shrink=0.8, label="score - baseline")
    fig.suptitle(f"{kind}-composition")
    fig.tight_layout()
    return fig


def discoveries_map(scores: pd.DataFrame, variants: tuple[str, str]) -> Figure:
    """Every head reading every earlier head at once, for models with more than one layer pair: a
    row per kind, a column per variant of `variants` (the original, then the corrected); each
    panel a [heads, heads] grid, later head down and earlier head across, both in (layer, head)
    order, coloured by the calibrated z (z_cal) of the pairs that can compose, grey elsewhere,
    with a dot on each discovery and lines between layers. One cell per pair: legible at 12 x 12
    heads, where the heatmaps' panel per layer pair would be 66 columns wide."""
    n_layers = int(max(scores["src_layer"].max(), scores["dst_layer"].max())) + 1
    n_heads = int(max(scores["src_head"].max(), scores["dst_head"].max())) + 1
    N = n_layers * n_heads
    finite = scores["z_cal"].to_numpy(dtype=float)
    finite = np.abs(finite[np.isfinite(finite)])
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    side = min(9.0, 2.2 + 0.045 * N)  # inches a panel: 2.3 at 2 x 2 heads, 8.7 at 12 x 12
    fig, axes = plt.subplots(
        len(KINDS), len(variants), figsize=(side * len(variants) + 1.2, side * len(KINDS)), squeeze=False
    )
    for r, kind in enumerate(KINDS):
        for c, variant in enumerate(variants):
            ax = axes[r][c]
            rows = scores[(scores["kind"] == kind) & (scores["variant"] == variant)]
            grid = np.full((N, N), np.nan)  # [later head, earlier head], (layer, head) order
            reader = rows["dst_layer"].to_numpy() * n_heads + rows["dst_head"].to_numpy()
            writer = rows["src_layer"].to_numpy() * n_heads + rows["src_head"].to_numpy()
            grid[reader, writer] = rows["z_cal"].to_numpy(dtype=float)
            cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#dddddd")
            im = ax.imshow(grid, cmap=cmap, vmin=-vmax, vmax=vmax, interpolation="nearest")
            found = rows[rows["discovery"].astype(bool)]
            ax.scatter(
                found["src_layer"] * n_heads + found["src_head"],
                found["dst_layer"] * n_heads + found["dst_head"],
                s=max(2.0, 60.0 / n_heads),
                color="black",
            )
            for edge in range(n_heads, N, n_heads):  # between layers
                ax.axhline(edge - 0.5, color="white", linewidth=0.8)
                ax.axvline(edge - 0.5, color="white", linewidth=0.8)
            centres = [layer * n_heads + (n_heads - 1) / 2 for layer in range(n_layers)]
            ax.set_xticks(centres, [f"L{layer}" for layer in range(n_layers)], fontsize=7)
            ax.set_yticks(centres, [f"L{layer}" for layer in range(n_layers)], fontsize=7)
            ax.set_xlabel("earlier head (writes)", fontsize=8)
            ax.set_ylabel("later head (reads)", fontsize=8)
            ax.set_title(
                f"{kind}: {VARIANT_TITLES.get(variant, variant)}, {len(found)} discoveries", fontsize=8
            )
            fig.colorbar(im, ax=ax, shrink=0.8, label="calibrated z")
    fig.suptitle("Discoveries over every layer pair (dots: discoveries)")
    fig.tight_layout()
    return fig


def _head_label(layer: int, head: int, roles: pd.DataFrame | None) -> str:
    label = f"{layer}.{head}"
    if roles is not None:
        match = roles[(roles["layer"] == layer) & (roles["head"] == head)]
        role = match["role"].iloc[0] if len(match) and "role" in match else None
        if pd.notna(role) and role != "other":  # an empty cell reads back as NaN: no role to show
            label += f" {str(role).replace('_', '-')}"
    return label


def _diagram_panel(
    ax, edges: pd.DataFrame, n_layers: int, n_heads: int, width: pd.Series, roles: pd.DataFrame | None
) -> None:
    """Heads as dots in columns by layer; an edge per composing pair, coloured by kind,
    `width` (in [0, 1], indexed like `edges`) of the thickest line."""
    for layer in range(n_layers):
        for head in range(n_heads):
            y = n_heads - 1 - head
            ax.plot(layer, y, "o", color="0.2", markersize=6, zorder=3)
            left = layer == 0
            label = _head_label(layer, head, roles)
            ax.text(
                layer + (-0.06 if left else 0.06),
                y,
                label,
                ha="right" if left else "left",
                va="center",
                fontsize=7,
            )
    offsets = {"Q": -0.12, "K": 0.0, "V": 0.12}  # Q, K, V edges of one pair drawn side by side
    for row in edges.itertuples():
        y0, y1 = n_heads - 1 - row.src_head, n_heads - 1 - row.dst_head
        mid = (row.src_layer + row.dst_layer) / 2
        xs = [row.src_layer, mid, row.dst_layer]
        ys = [y0, (y0 + y1) / 2 + offsets[row.kind], y1]
        lw = 0.5 + 4.5 * float(width[row.Index])
        ax.plot(xs, ys, color=KIND_COLORS[row.kind], linewidth=lw, alpha=0.8, zorder=2)
    ax.set_xlim(-0.8, n_layers - 1 + 0.8)
    ax.set_ylim(-0.8, n_heads - 0.2)
    ax.set_xticks(range(n_layers), [f"layer {layer}" for layer in range(n_layers)])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)


def diagram_edges(scores: pd.DataFrame, criterion: str, edge_z: float, edge_threshold: float) -> pd.DataFrame:
    """The pairs the errata diagram draws, with `excess` and `strength` (what sets the width).

    "fdr": the discoveries (`pipeline.circuits.significance`: calibrated against the model's own
    placebo pairs, Benjamini-Hochberg per kind and measure; width: the calibrated z).
    "z": the raw z against the spectrum-preserving null above `edge_z` (uncalibrated: on a
    trained model most pairs can clear it); the same criterion in
    every panel, whatever a variant's scale (width: z). "excess": score - baseline above
    `edge_threshold`, an absolute threshold (width: the excess), which counts scale: the
    errata variants with rotated denominators reach ~30x the corrected score's excess.
    """
    scored = scores.assign(excess=excess)
    if criterion == "fdr":
        return scored[scored["discovery"]].assign(strength=lambda f: f["z_cal"])
    if criterion == "z":
        return scored[scored["z"] > edge_z].assign(strength=lambda f: f["z"])
    if criterion == "excess":
        return scored[scored["excess"] > edge_threshold].assign(strength=lambda f: f["excess"])
    raise ValueError(f"criterion must be 'fdr', 'z' or 'excess', not {criterion!r}")


def errata_diagram(
    scores: pd.DataFrame,
    criterion: str = "fdr",
    edge_z: float = 3.0,
    edge_threshold: float = 0.05,
    roles: pd.DataFrame | None = None,
    variants: tuple[str, ...] = ("errata_bcda_trueden", "true"),
    fdr: float = 0.05,
) -> Figure:
    """The paper's composition diagram, original (errata) and corrected, side by side.

    Edges by `diagram_edges`; colour is the kind, width the strength on one scale for
    all panels; the title says the criterion.
    """
    n_layers = int(max(scores["src_layer"].max(), scores["dst_layer"].max())) + 1
    n_heads = int(max(scores["src_head"].max(), scores["dst_head"].max())) + 1
    edges = diagram_edges(scores[scores["variant"].isin(variants)], criterion, edge_z, edge_threshold)
    top = float(edges["strength"].max()) if len(edges) else 1.0
    width = edges["strength"] / top
    fig, axes = plt.subplots(
        1, len(variants), figsize=(4.6 * len(variants), 0.45 * n_heads + 1.8), squeeze=False
    )
    for ax, variant in zip(axes[0], variants, strict=True):
        mine = edges[edges["variant"] == variant]
        _diagram_panel(ax, mine, n_layers, n_heads, width, roles)
        counts = ", ".join(f"{k} {int((mine['kind'] == k).sum())}" for k in KINDS)
        ax.set_title(f"{VARIANT_TITLES.get(variant, variant)}\nedges: {counts}", fontsize=9)
    handles = [Line2D([], [], color=KIND_COLORS[k], linewidth=3, label=f"{k}-composition") for k in KINDS]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    if criterion == "fdr":
        rule = (
            f"a discovery, FDR q < {fdr:g}\n(Benjamini-Hochberg against the model's own empirical null; "
            f"width: calibrated z, max {top:.1f})"
        )
    elif criterion == "z":
        rule = (
            f"raw z against the spectrum-preserving null > {edge_z:g}, uncalibrated (width: z, max {top:.1f})"
        )
    else:
        rule = f"score - baseline > {edge_threshold:g}, an absolute threshold (width: excess, max {top:.3f})"
    fig.suptitle(f"Head composition. Edge: {rule}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


# what each figure shows, by the stem the figures stage saves it as (the report's captions)
CAPTIONS = {
    "errata_diagram": Caption(
        "errata diagram",
        "The errata diagram: which heads compose, original score beside corrected",
        "The paper's composition diagram drawn twice from this seed's scores: on the left the original "
        "score (the rotated strand of analysis.figures.errata_variant), on the right the corrected one. "
        "Dots are heads, a column per layer, labelled layer.head and role; a line joins an earlier head "
        "to a later one where the pair composes, coloured by kind (Q blue, K red, V green) and as wide "
        "as its strength, on one scale for both panels. Both panels draw a pair by the same rule, named "
        "in the figure's title (analysis.figures.edges; by default a discovery at the configured FDR), "
        "and each panel's title counts its edges per kind. The errata says the original figure shows only "
        "K-composition, from one layer-0 head (claim d).",
    ),
    "discoveries_map": Caption(
        "discoveries map",
        "Which heads compose, over every layer pair at once",
        "Drawn for models of more than two layers. A row per kind, the original score (left) beside "
        "the corrected one (right); in each panel a later head (row) reads an earlier head (column), "
        "heads in layer order, white lines between layers. Colour: the pair's calibrated z (red above "
        "the model's own null, blue below, one scale for every panel); grey: pairs that cannot compose "
        "(a head read by its own or an earlier layer). A dot marks a discovery at the configured FDR.",
    ),
    **{
        f"composition_{kind}": Caption(
            f"{kind}-composition",
            f"{kind}-composition of every head pair, score minus baseline",
            "A row per variant (the corrected score, then the four original ones), a column per pair of "
            "layers; each cell a later head (row) reading from an earlier head (column). Red: above the "
            "random-matrix baseline of its variant, blue: below; each panel has its own symmetric colour "
            "scale, since the variants' scales differ up to about 30 times.",
        )
        for kind in KINDS
    },
}
