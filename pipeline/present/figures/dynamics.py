"""Composition through training, one seed: the dynamics stage's steps.tsv against tokens.

Top: the best induction and previous-token scores, and the held-out loss (right axis).
Bottom: the K-composition significance of the top induction <- previous-token pair under
every measure, -log10 of its BH q at each checkpoint, with the discovery line at the FDR
(analysis.composition.fdr; `pipeline.circuits.significance`). A vertical line marks the
induction phase change (the first checkpoint at which induction reaches 0.5:
`pipeline.behaviour.phases`) on both.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ... import io
from ...behaviour import phases
from ...errors import UserError
from ...tables import INDUCTION_THRESHOLD, MEASURES
from . import Caption

MEASURE_STYLE = {  # the two denominator hypotheses share a z, so they share a colour
    "true": ("corrected (true)", "black", "-"),
    "errata_bcda": ("original, B C D A", "#1f77b4", "-"),
    "errata_dabc": ("original, D A B C", "#ff7f0e", "-"),
    "errata_bcda_trueden": ("B C D A, true den.", "#1f77b4", ":"),
    "errata_dabc_trueden": ("D A B C, true den.", "#ff7f0e", ":"),
    "invariant": ("basis-invariant", "#2ca02c", "--"),
    "projection": ("projection kernel", "#8c564b", "-."),
}


def dynamics_figure(steps: pd.DataFrame, pair: dict | None, fdr: float) -> Figure:
    """Induction, previous-token and loss (top) and the pair's K -log10 q per measure (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.2), sharex=True)
    x = steps["tokens"]
    top.plot(x, steps["induction"], color="#d62728", marker=".", label="best induction score")
    top.plot(x, steps["prev_token"], color="#9467bd", marker=".", label="best previous-token score")
    top.axhline(INDUCTION_THRESHOLD, color="0.7", lw=0.8, ls=":")
    top.set_ylabel("attention score")
    top.set_ylim(-0.02, 1.02)
    loss = top.twinx()
    loss.plot(x, steps["eval_loss"], color="0.35", lw=1, ls="--", label="held-out loss")
    loss.set_ylabel("held-out loss")
    lines = top.get_legend_handles_labels()
    more = loss.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, frameon=False, loc="center right")
    for m in MEASURES:
        label, color, style = MEASURE_STYLE[m]
        bottom.plot(x, -np.log10(steps[f"q_{m}"]), color=color, ls=style, lw=1.3, marker=".", label=label)
    bottom.axhline(-math.log10(fdr), color="0.6", lw=1, ls="--")
    bottom.set_ylabel(f"K-composition -log10 q (discovery above the line, FDR {fdr:g})", fontsize=8)
    bottom.set_xlabel("tokens seen")
    bottom.legend(fontsize=7, frameon=False, ncol=2)
    phase = phases.phase_step(steps)
    if not math.isnan(phase):
        at = steps.loc[steps["step"] == phase, "tokens"].iloc[0]
        for ax in (top, bottom):
            ax.axvline(at, color="#d62728", lw=0.8, alpha=0.7)
        top.annotate(
            f"induction >= {INDUCTION_THRESHOLD} (step {int(phase)})",
            (at, 1.0), fontsize=7, color="#d62728", ha="left", va="top", xytext=(3, 0),
            textcoords="offset points",
        )  # fmt: skip
    if pair:
        (i, a), (j, b) = pair["src"], pair["dst"]
        bottom.set_title(f"K-composition of L{j}H{b} (induction) <- L{i}H{a} (previous token)", fontsize=9)
    top.set_title("Composition through training", fontsize=10)
    fig.tight_layout()
    return fig


def read_summary(path: str) -> tuple[dict, float]:
    """The pair followed and the FDR from the dynamics stage's summary.json."""
    summary = io.read_json(path)
    pair = summary.get("pair") if isinstance(summary, dict) else None
    ok = isinstance(pair, dict) and all(
        isinstance(pair.get(k), list) and len(pair[k]) == 2 and all(isinstance(v, int) for v in pair[k])
        for k in ("src", "dst")
    )
    if not ok:
        raise UserError(
            f"{path}: pair", "missing or malformed: expected {src: [layer, head], dst: [layer, head]}"
        )
    fdr = summary.get("fdr")
    if not isinstance(fdr, (int, float)) or isinstance(fdr, bool):
        raise UserError(f"{path}: fdr", "missing: expected a number", fdr)
    return pair, float(fdr)


# what each figure shows, by the stem the figures stage saves it as (the report's captions)
CAPTIONS = {
    "dynamics": Caption(
        "through training",
        "Composition through training",
        "Top: the best induction and previous-token scores and the held-out loss (right axis) at each "
        "checkpoint. Bottom: the K-composition of the top induction <- previous-token pair under every "
        "measure, -log10 of its Benjamini-Hochberg q, with the discovery line at the FDR. The vertical "
        "line marks the induction phase change (induction first reaches 0.5); claim (t) compares the "
        "steps from which each measure's curve stays above the line.",
    ),
}
