"""Head figures: every head's attention pattern titled with its role, copying vs
QK-positivity (the paper's induction-head scatter), and ablation effect vs composition.

Inputs are the heads stage's tables (`heads.csv`, `ablation.csv`, the Spearman
correlations of its `summary.json`), its `patterns.safetensors` (one repeated random
sequence) and the composition stage's `scores.csv`. Pure: tables in, figures out.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ...errors import UserError
from ...tables import KINDS, VARIANTS, excess
from . import Caption

ROLE_COLORS = {
    "previous_token": "#1f77b4",
    "recent_window": "#17becf",
    "induction": "#d62728",
    "duplicate_token": "#9467bd",
    "current_token": "#8c564b",
    "first_token": "#7f7f7f",
    "other": "#bcbd22",
}
EFFECT_LABELS = {
    "heldout_loss_effect": "|loss change|, held-out text",
    "loss_effect": "|loss change|, repeated probe",
    "attn_effect": "|induction score change|",
    "pattern_effect": "pattern change (TV), held-out text;\nV: relative output change",
}
PAIR_KEYS = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]


def read_example(path: str | Path) -> np.ndarray:
    """The pattern [layer, head, query, key] of `patterns.safetensors` (numpy: no torch needed)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        pattern = load_file(str(path))["pattern"]
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        raise UserError(
            str(path), f"not a patterns file of the heads stage ({str(e).splitlines()[0][:200]})"
        ) from None
    if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise UserError(
            str(path), f"pattern has shape {list(pattern.shape)}, expected [layer, head, pos, pos]"
        )
    return pattern


def _is_rho(by_kind: object) -> bool:
    """{kind: {variant: a number or None}}: one effect's Spearman correlations."""
    return isinstance(by_kind, dict) and all(
        isinstance(by_variant, dict)
        and all(v is None or isinstance(v, int | float) for v in by_variant.values())
        for by_variant in by_kind.values()
    )


def spearman_of(summary: object, source: str = "summary.json") -> dict[str, dict]:
    """{effect: {kind: {variant: rho or None}}} of the heads stage's summary.json (loaded), so
    that a partial or hand-edited one is refused naming it, not met halfway through a figure."""
    agreement = summary.get("agreement", {}) if isinstance(summary, dict) else None
    if not isinstance(agreement, dict) or not all(
        isinstance(entry, dict) and _is_rho(entry.get("spearman", {})) for entry in agreement.values()
    ):
        problem = "expected {effect: {spearman: {kind: {variant: a number or null}}}} (the heads stage's)"
        raise UserError(f"{source}: agreement", problem)
    return {effect: entry.get("spearman", {}) for effect, entry in agreement.items()}


def _role(heads: pd.DataFrame, layer: int, head: int) -> str:
    match = heads.loc[(heads["layer"] == layer) & (heads["head"] == head), "role"]
    return str(match.iloc[0]) if len(match) else "?"


def attention_patterns(pattern: np.ndarray, heads: pd.DataFrame, repeat_length: int | None = None) -> Figure:
    """One panel per head (rows: layers): its attention pattern [query, key] on one sequence
    `[first, span, span]`, titled `layer.head role`. With `repeat_length`, a dotted line marks
    the induction targets (key = query - repeat_length + 1 in the second copy)."""
    L, H, T, _ = pattern.shape
    fig, axes = plt.subplots(L, H, figsize=(1.9 * H, 2.1 * L + 0.4), squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(pattern[layer, head], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            if repeat_length:
                q = np.arange(repeat_length + 1, T)
                ax.plot(q - repeat_length + 1, q, ":", color="#d62728", lw=0.8)
            role = _role(heads, layer, head)
            ax.set_title(
                f"{layer}.{head} {role.replace('_', ' ')}", fontsize=8, color=ROLE_COLORS.get(role, "black")
            )
            ax.set_xticks([])
            ax.set_yticks([])
        axes[layer][0].set_ylabel(f"layer {layer}\nquery", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("key", fontsize=8)
    fig.suptitle("Attention on one repeated random sequence")
    fig.tight_layout()
    return fig


def copying_vs_qk(heads: pd.DataFrame) -> Figure:
    """Heads of layer >= 1: copying (OV eigenvalue positivity) against the positivity of their
    K-composition QK term with the best-composing earlier head. Induction heads sit top right."""
    later = heads[heads["layer"] >= 1]
    defined = np.isfinite(later["copying"].to_numpy(float)) & np.isfinite(
        later["qk_positivity"].to_numpy(float)
    )
    shown, undefined = later[defined], later[~defined]
    fig, ax = plt.subplots(figsize=(5.2, 4.8))
    ax.axhline(0, color="0.8", lw=0.8)
    ax.axvline(0, color="0.8", lw=0.8)
    for role, group in shown.groupby("role", sort=True):
        color, label = ROLE_COLORS.get(str(role), "black"), str(role).replace("_", " ")
        ax.scatter(group["copying"], group["qk_positivity"], s=36, color=color, label=label)
    for row in shown.itertuples():
        ax.annotate(
            f"{row.layer}.{row.head}",
            (row.copying, row.qk_positivity),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    if len(undefined):  # an OV or QK term with no non-zero eigenvalue: say so rather than drop it silently
        names = ", ".join(f"{r.layer}.{r.head}" for r in undefined.itertuples())
        ax.text(
            0.99,
            0.01,
            f"undefined (not shown): {names}",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
        )
    ax.set_xlim(-1.05, 1.05)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("copying: sum(λ) / sum(|λ|) of W_E OV W_U")
    ax.set_ylabel("QK positivity: K-composition term in token space")
    ax.set_title("Copying vs positive QK (layer ≥ 1 heads)")
    if len(shown):
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def ablation_vs_composition(
    effects: pd.DataFrame,
    scores: pd.DataFrame,
    effect: str = "loss_effect",
    rho: dict | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> Figure:
    """|effect| of each path ablation against the pair's composition score minus baseline: a row
    per kind, a column per variant, Spearman rho (from the heads summary) in each title."""
    merged = effects.merge(scores, on=PAIR_KEYS, how="inner")
    label = EFFECT_LABELS.get(effect, f"|{effect}|")
    fig, axes = plt.subplots(
        len(kinds), len(VARIANTS), figsize=(3.4 * len(VARIANTS), 2.9 * len(kinds)), squeeze=False
    )
    for r, kind in enumerate(kinds):
        for c, variant in enumerate(VARIANTS):
            ax = axes[r][c]
            rows = merged[(merged["kind"] == kind) & (merged["variant"] == variant)]
            ax.scatter(excess(rows), rows[effect].abs(), s=12, color="#444444")
            if not rows["score"].notna().any():  # e.g. rotated strands that vanish: NaN scores
                ax.text(
                    0.5,
                    0.5,
                    "no defined scores",
                    transform=ax.transAxes,
                    ha="center",
                    va="center",
                    fontsize=8,
                )
            value = (rho or {}).get(kind, {}).get(variant)
            shown = "undefined" if value is None else f"{value:.2f}"
            ax.set_title(f"{kind} {variant}: Spearman ρ = {shown}", fontsize=8)
            if r == len(kinds) - 1:
                ax.set_xlabel("composition score - baseline", fontsize=8)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            # matplotlib's default of up to ten ticks packs -0.150-0.125-0.100 into one string on a
            # 3.4-inch panel; four on x (five on y, where labels stack) leave an em between them
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    fig.suptitle(f"Path ablation vs composition ({effect.replace('_', ' ')})")
    fig.tight_layout()
    return fig


_ABLATION = (
    "Each dot is a head pair: across, its composition score minus its random-matrix baseline; up, how "
    "much mean-ablating the earlier head's output in the later head's {input} alone changes {effect}. "
    "A row per kind, a column per variant (the corrected score, then the four original ones); each "
    "panel's title gives Spearman's rho between the two over its pairs (the raw effect, each head's "
    "scale included). A score that predicts the ablation puts its dots on a rising line."
)
# what each figure shows, by the stem the figures stage saves it as (the report's captions)
CAPTIONS = {
    "attention_patterns": Caption(
        "attention patterns",
        "Every head's attention on one repeated random sequence",
        "A panel per head, a row per layer, titled layer.head and its role; query positions down, key "
        "positions across, darker blue for more attention. The sequence is a first token, a random span "
        "and the span again; the dotted red line marks the induction targets (the token after the "
        "earlier copy of the current one), where an induction head's attention sits.",
    ),
    "copying_vs_qk": Caption(
        "copying vs QK",
        "Copying against positive QK, every head of layer 1 and later",
        "Across: copying, sum(lambda) / sum(|lambda|) of the head's OV circuit in token space (1: it "
        "copies the tokens it attends to). Up: the same positivity of the QK term of its K-composition "
        "with its best-composing earlier head. Induction heads sit top right, as in the paper's figure; "
        "colours are roles.",
    ),
    "ablation_pattern": Caption(
        "ablation: pattern",
        "Path ablation against composition: the later head's attention pattern",
        _ABLATION.format(
            input="query, key or value input",
            effect="the later head's attention pattern on held-out text (total variation; for V, the "
            "relative change of its output). Claim (c) reads the K row, with each head's scale removed",
        ),
    ),
    "ablation_attn": Caption(
        "ablation: induction score",
        "Path ablation against composition: the later head's induction score",
        _ABLATION.format(
            input="query or key input", effect="its induction score on the repeated probe (Q and K only)"
        ),
    ),
    "ablation_loss": Caption(
        "ablation: probe loss",
        "Path ablation against composition: the loss on the repeated probe",
        _ABLATION.format(input="query, key or value input", effect="the model's loss on the repeated probe"),
    ),
    "ablation_heldout_loss": Caption(
        "ablation: held-out loss",
        "Path ablation against composition: the loss on held-out text",
        _ABLATION.format(input="query, key or value input", effect="the model's loss on held-out text"),
    ),
}
