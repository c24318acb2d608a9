"""Does a composition score predict the causal ablation? Two measures per kind and variant,
between the heads stage's `ablation.csv` and the composition stage's `scores.csv` (and
`invariant.csv`, as variant `invariant`, where given).
Torch-free: the heads stage writes them to its summary.json, the compare stage reads them.

- `spearman`: the rank correlation over every (earlier, later) head pair between |effect|
  and the score. On models where a few edges matter and the rest are ~0, it is decided
  by how the near-zero edges happen to be ordered.
- `top_source`: the edges that matter. For each later head b whose strongest ablation
  effect reaches `min_effect`, is the earlier head with the largest |effect| on b also
  the earlier head with the largest score into b? Counted over those heads b.

The effects (`EFFECTS`) are the loss change on the repeated probe, on held-out text, and
the change in b's induction score on the probe (not defined for V: values cannot move a
pattern).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.tables import INVARIANT, KINDS, VARIANTS

EFFECTS = ("heldout_loss_effect", "loss_effect", "attn_effect")
PAIR = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
DST = ["dst_layer", "dst_head"]


def measures(scores: pd.DataFrame) -> tuple[str, ...]:
    """The five variants, and the invariant measure where `scores` has its rows."""
    return (*VARIANTS, INVARIANT) if (scores["variant"] == INVARIANT).any() else VARIANTS


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def spearman(effects: pd.DataFrame, scores: pd.DataFrame, effect: str) -> dict[str, dict[str, float | None]]:
    """{kind: {variant: rho}} between |effect| and the score, over the pairs where both are
    defined; None where undefined (fewer than 3 pairs, or a constant effect or score). Ties
    get average ranks (as scipy.stats.spearmanr; pandas computes it without scipy)."""
    merged = effects.merge(scores, on=PAIR, how="inner")
    out: dict[str, dict[str, float | None]] = {}
    for kind in KINDS:
        for variant in measures(scores):
            rows = merged[(merged["kind"] == kind) & (merged["variant"] == variant)]
            x, y = rows[effect].abs().to_numpy(float), rows["score"].to_numpy(float)
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            rho = math.nan
            if len(x) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
                rho = pd.Series(x).corr(pd.Series(y), method="spearman")
            out.setdefault(kind, {})[variant] = _finite(rho)
    return out


def _top(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per later head: the earlier head (src_layer, src_head) with the largest `column`
    (NaN skipped; ties: the first in head order), and that value."""
    rows = rows.dropna(subset=[column]).sort_values([*DST, "src_layer", "src_head"], kind="stable")
    best = rows.loc[rows.groupby(DST, sort=True)[column].idxmax()]
    return best.set_index(DST)[["src_layer", "src_head", column]]


def top_source(
    effects: pd.DataFrame, scores: pd.DataFrame, effect: str, min_effect: float
) -> dict[str, dict[str, dict[str, int]]]:
    """{kind: {variant: {"match": m, "heads": n}}}: of the n later heads whose largest |effect|
    reaches `min_effect`, m have that edge's earlier head as their top-scoring source."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for kind in KINDS:
        cut = effects[effects["kind"] == kind].assign(size=lambda f: f[effect].abs())
        causal = _top(cut, "size")
        causal = causal[causal["size"] >= min_effect]
        for variant in measures(scores):
            ranked = _top(scores[(scores["kind"] == kind) & (scores["variant"] == variant)], "score")
            both = causal.merge(ranked, left_index=True, right_index=True, suffixes=("_causal", ""))
            match = (both["src_layer_causal"] == both["src_layer"]) & (
                both["src_head_causal"] == both["src_head"]
            )
            out.setdefault(kind, {})[variant] = {"match": int(match.sum()), "heads": int(len(causal))}
    return out


def summarize(effects: pd.DataFrame, scores: pd.DataFrame, min_effect: float) -> dict:
    """{effect: {"spearman": ..., "top_source": ...}} for every effect in EFFECTS."""
    return {
        effect: {
            "spearman": spearman(effects, scores, effect),
            "top_source": top_source(effects, scores, effect, min_effect),
        }
        for effect in EFFECTS
    }
