"""The projection kernel: how far the subspace a writer writes into and the subspace a reader
reads from overlap, whatever the singular values inside them (Yamagiwa et al. 2026; the head
affinity TransformerLens 4.x computes in `tools/analysis/projection_kernel.py`). Maths only,
no I/O; one more measure beside the Frobenius scores, scored, baselined and tested as they are.

Row vectors, as stored. For an earlier head a and a later head b:

    U_a   [d_model, r_a]   an orthonormal basis of the rows of W_O^a: the directions a writes into
    U_b   [d_model, r_b]   an orthonormal basis of the columns of the reader's input weights:
                           Q: W_Q^b (its queries), K: W_K^b (its keys), V: W_V^b (its values)

    score = ||U_a^T U_b||^2 / sqrt(r_a r_b)          in [0, 1]

||U_a^T U_b||^2 is the sum of the squared cosines of the principal angles between the two
subspaces, unchanged by any change of basis within either; divided by sqrt(r_a r_b) it is the
cosine between the two projectors, TransformerLens's `normalized`. r is a head's numerical rank
(singular values above `RTOL` times its largest, TransformerLens's default tolerance for float64
at these shapes); a head of rank 0 has no subspace, and its scores are NaN.

Baseline and null. A Haar rotation R of the writer's residual basis (the null of every measure
of this project) carries U_a to R U_a, a uniformly random r_a-dimensional subspace whatever U_a
was, so the null is exact and needs no draws: for independent uniform subspaces of dimensions
r_a and r_b in d dimensions

    E ||U_a^T U_b||^2   = r_a r_b / d
    Var ||U_a^T U_b||^2 = 2 r_a r_b (d - r_a) (d - r_b) / (d^2 (d - 1) (d + 2))

(TransformerLens's `random_projection_kernel_moments` for r_a = r_b). The baseline, the score of
random heads of these shapes, is the same distribution: null and baseline coincide, and
z = (score - mean) / sd.

What it does not see: how strongly a head writes or reads along each direction. Two heads whose
subspaces overlap through a direction one of them barely uses score as if they composed; the
Frobenius score weighs every direction by its singular values. Both go through the same null and
the same causal comparison (claim c), which says which predicts which head reads which.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from ..tables import INVARIANT_COLUMNS, KINDS
from .scoring import PairStats, raw_scores_table
from .weights import HeadWeights

PROJECTION = "projection"  # the measure's name in the joined tables (tables.MEASURES)
COLUMNS = list(INVARIANT_COLUMNS[: INVARIANT_COLUMNS.index("z") + 1])  # one measure: no variant column


def rtol(d_model: int, d_head: int) -> float:
    """The relative tolerance of a head's numerical rank: TransformerLens's default for float64,
    the larger dimension times float64's epsilon."""
    return max(d_model, d_head) * torch.finfo(torch.float64).eps


def subspaces(W: Tensor) -> tuple[Tensor, Tensor]:
    """(U [.., d_model, d_head], rank [..]): for weights W [.., d_model, d_head], an orthonormal basis
    of their column space in the first `rank` columns of U, the rest zero."""
    U, s, _ = torch.linalg.svd(W.to(torch.float64), full_matrices=False)  # [.., d_model, d_head]
    kept = s > rtol(*W.shape[-2:]) * s[..., :1]  # [.., d_head], its leading entries
    return U * kept[..., None, :], kept.sum(-1)


def reader_weights(hw: HeadWeights, kind: str) -> Tensor:
    """[L, H, d_model, d_head]: the weights through which a later head reads the residual stream
    for this kind (its queries, keys or values)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return {"Q": hw.W_Q, "K": hw.W_K, "V": hw.W_V}[kind]


def moments(r_a: Tensor, r_b: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """(mean, sd) of ||U_a^T U_b||^2 / sqrt(r_a r_b) for uniformly random subspaces of dimensions
    r_a, r_b in d dimensions (module doc); NaN where a rank is 0."""
    r_a, r_b = r_a.to(torch.float64), r_b.to(torch.float64)
    norm = torch.sqrt(r_a * r_b)
    mean = r_a * r_b / d
    var = 2 * r_a * r_b * (d - r_a) * (d - r_b) / (d**2 * (d - 1) * (d + 2))
    positive = torch.where(norm > 0, norm, torch.nan)
    return mean / positive, var.sqrt() / positive


def projection_scores(hw: HeadWeights, placebo: bool = False) -> pd.DataFrame:
    """One row per (kind, earlier head, later head), in that order (KINDS; pairs sorted), the
    columns of invariant.csv: score (module doc), baseline_mean and baseline_std (random
    subspaces of the heads' ranks), z against the rotated-writer null (the same distribution).
    placebo: the pairs that cannot compose (`scoring.placebo_pairs`) instead of the later ones.
    Deterministic, no draws."""
    L, H, d = hw.n_layers, hw.n_heads, hw.d_model
    U_out, r_out = subspaces(hw.W_O.mT)  # [L, H, d_model, d_head]: W_O^T's columns are W_O's rows
    measures = {}
    for kind in KINDS:
        U_in, r_in = subspaces(reader_weights(hw, kind))
        # ||U_a^T U_b||^2 of every pair, one writer layer at a time: [H, L, H, d_head, d_head] at once
        kernel = torch.stack(
            [torch.einsum("adi,bgdj->abgij", U_out[i], U_in).square().sum((-2, -1)) for i in range(L)]
        )  # [L, H, L, H]
        r_a, r_b = r_out[:, :, None, None], r_in[None, None]  # [L, H, 1, 1], [1, 1, L, H]
        mean, sd = moments(r_a.expand(L, H, L, H), r_b.expand(L, H, L, H), d)
        norm = torch.sqrt(r_a * r_b).to(torch.float64)
        score = kernel / torch.where(norm > 0, norm, math.nan)
        measures[(kind,)] = PairStats(score, mean, sd, mean, sd)
    return raw_scores_table(measures, COLUMNS, placebo)
