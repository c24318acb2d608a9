"""What the two composition measures share: the Frobenius scores (`pipeline.circuits.composition`) and
the scores in the whitened residual frame (`pipeline.circuits.invariant`) score the same pairs of heads,
against a Gaussian baseline and a Haar-rotated-writer null, into the same raw-scores table.
Written once here, so that the two tables enumerate their pairs, draw their baselines, compute z
and summarise alike. Maths and tables only, no I/O.

Pairs: `later_pairs` (the writer's layer is earlier than the reader's: they can compose) and
`placebo_pairs` (the same layer or a later one: they cannot), each sorted.

Baseline: `baseline`, the score of chains of four Gaussian factors of the measure's shapes.
Null: `haar_blocks`, top-left blocks of Haar-random orthogonal matrices, the writer's residual
basis rotated at random (each measure's module doc says how it uses them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..tables import KINDS, MEASURES, VARIANTS

ZERO_RTOL = 1e-8  # a strand with ||A B|| <= ZERO_RTOL ||A|| ||B|| counts as zero
LABELS = ("kind", "variant")  # a raw-scores table's columns that name the measure of a row
PAIR_COLUMNS = ("src_layer", "src_head", "dst_layer", "dst_head")


def nan_if_zero(n: Tensor, bound: Tensor) -> Tensor:
    """n, NaN where it is zero up to rounding (n <= ZERO_RTOL * bound, `bound` the product of its
    factors' norms): a score with such a denominator is undefined, not an error."""
    return torch.where(n > ZERO_RTOL * bound, n, torch.nan)


# --- the pairs scored ------------------------------------------------------------------


def _pairs(n_layers: int, n_heads: int, keep: Callable[..., np.ndarray]) -> tuple[np.ndarray, ...]:
    """(src_layer, src_head, dst_layer, dst_head) of every pair of heads with keep(i, h, j, g), sorted."""
    i, h, j, g = (
        x.ravel() for x in np.meshgrid(*(np.arange(n) for n in (n_layers, n_heads) * 2), indexing="ij")
    )
    mask = keep(i, h, j, g)
    return i[mask], h[mask], j[mask], g[mask]


def later_pairs(n_layers: int, n_heads: int) -> tuple[np.ndarray, ...]:
    """(src_layer, src_head, dst_layer, dst_head) of every pair with dst_layer > src_layer, sorted:
    the rows of scores.csv (and invariant.csv) within one kind."""
    return _pairs(n_layers, n_heads, lambda i, h, j, g: j > i)


def placebo_pairs(n_layers: int, n_heads: int) -> tuple[np.ndarray, ...]:
    """(src_layer, src_head, dst_layer, dst_head) of every pair that cannot compose, sorted: a head
    of the same layer (not itself) or of an earlier one reads what the writer never gave it. They
    share the model's residual stream with the later pairs, so the null of `pipeline.circuits.significance`
    is estimated from them (placebo.csv)."""
    return _pairs(n_layers, n_heads, lambda i, h, j, g: (j < i) | ((j == i) & (g != h)))


# --- random draws: the baseline and the null ----------------------------------------------


def haar_blocks(n: int, d_model: int, k: int, gen: torch.Generator) -> Tensor:
    """n top-left [k, k] blocks of Haar-random orthogonal [d_model, d_model] matrices."""
    G = torch.randn(n, d_model, k, generator=gen, dtype=torch.float64)
    Q, R = torch.linalg.qr(G)  # [n, d_model, k]
    # QR with a positive diagonal in R makes Q the first k columns of a Haar matrix
    Q = Q * torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0)[:, None, :]
    return Q[:, :k, :]


def mean_std(x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Mean and sample sd (n - 1) over `dim`; one sample has sd 0 (nothing spreads), not NaN."""
    return x.mean(dim), x.std(dim, correction=1 if x.shape[dim] > 1 else 0)


def baseline(
    scores: Callable[[Tensor, Tensor, Tensor, Tensor], Mapping[str, Tensor]],
    dims: tuple[int, int, int, int],
    d_head: int,
    samples: int,
    gen: torch.Generator,
) -> dict[str, tuple[float, float]]:
    """Per measure of `scores`: (mean, sd) of its score of `samples` chains of four Gaussian factors,
    [S, n_0, d_head], [S, d_head, n_1], [S, n_2, d_head], [S, d_head, n_3] (n = dims), drawn from
    `gen` in that order; `scores` maps the four to each measure's scores [S].

    Why Gaussian factors: every score is scale-free in each factor, so their variance does not
    matter, and a Gaussian factor prefers no direction: the baseline is what heads of these shapes
    score by chance. The Frobenius scores draw A, B, C, D (n = d_model each), the invariant ones
    V, O, X, Y in frame coordinates (n = r_in, r_mid, r_mid, r_out).
    """
    factors = [
        torch.randn(samples, *shape, generator=gen, dtype=torch.float64)
        for shape in ((dims[0], d_head), (d_head, dims[1]), (dims[2], d_head), (d_head, dims[3]))
    ]
    out = {}
    for measure, s in scores(*factors).items():
        mean, std = mean_std(s, 0)
        out[measure] = (float(mean), float(std))
    return out


# --- the raw-scores table and its summary ---------------------------------------------------


@dataclass(frozen=True)
class PairStats:
    """One measure of one kind, [src_layer, src_head, dst_layer, dst_head] (NaN where not scored):
    the score, the null's mean and sd, and the baseline's mean and sd (per pair, or one for all)."""

    score: Tensor
    null_mean: Tensor
    null_std: Tensor
    baseline_mean: Tensor | float
    baseline_std: Tensor | float


def raw_scores_table(
    measures: Mapping[tuple[str, ...], PairStats], columns: Sequence[str], placebo: bool = False
) -> pd.DataFrame:
    """The rows of a raw-scores table: per measure, in the order of `measures`, one row per pair
    (`later_pairs`; placebo: `placebo_pairs`) with score, baseline_mean, baseline_std and
    z = (score - null_mean) / null_std (NaN when the score is NaN or null_std is 0).

    `columns`: the table's (tables.RAW_SCORES_COLUMNS, or less variant); each key of `measures`
    gives the values of its LABELS columns, in that order (kind, or kind and variant).
    """
    labels = [c for c in columns if c in LABELS]
    n_layers, n_heads = next(iter(measures.values())).score.shape[:2]
    i, h, j, g = (placebo_pairs if placebo else later_pairs)(n_layers, n_heads)
    n = len(i)

    def at_pairs(x: Tensor | float) -> np.ndarray:
        return x.numpy()[i, h, j, g] if isinstance(x, Tensor) else np.full(n, x)

    parts = []
    for key, m in measures.items():
        score, null_mean, null_std = at_pairs(m.score), at_pairs(m.null_mean), at_pairs(m.null_std)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(null_std > 0, (score - null_mean) / null_std, np.nan)
        parts.append(pd.DataFrame({
            **{label: [value] * n for label, value in zip(labels, key, strict=True)},
            "src_layer": i, "src_head": h, "dst_layer": j, "dst_head": g,
            "score": score, "baseline_mean": at_pairs(m.baseline_mean),
            "baseline_std": at_pairs(m.baseline_std), "z": z,
        }))  # fmt: skip
    frame = pd.concat(parts, ignore_index=True)
    return frame[list(columns)].astype({c: "int64" for c in PAIR_COLUMNS})


def pair_label(row: pd.Series) -> str:
    """'L0H3->L1H5': TransformerLens-style head names."""
    return f"L{int(row['src_layer'])}H{int(row['src_head'])}->L{int(row['dst_layer'])}H{int(row['dst_head'])}"


def summarize(scores: pd.DataFrame, placebo: pd.DataFrame | None = None) -> dict:
    """Per kind and measure (the variants, and "invariant" where the table has it): pairs,
    undefined (NaN) scores, max score and its pair, pairs with raw z > 3, and, for calibrated
    tables, discoveries; with `placebo`, its pairs and (false) discoveries.

    JSON-serialisable: NaN becomes None.
    """
    out: dict = {}
    for kind in KINDS:
        for v in (m for m in MEASURES if m in set(scores["variant"]) or m in VARIANTS):
            rows = scores[(scores["kind"] == kind) & (scores["variant"] == v)]
            defined = rows[rows["score"].notna()]
            best = defined.loc[defined["score"].idxmax()] if len(defined) else None
            entry = out.setdefault(kind, {})[v] = {
                "n_pairs": int(len(rows)),
                "n_undefined": int(len(rows) - len(defined)),
                "max_score": None if best is None else float(best["score"]),
                "max_pair": None if best is None else pair_label(best),
                "n_z_above_3": int((rows["z"] > 3).sum()),  # the raw z; NaN > 3 is False
            }  # fmt: skip
            if "discovery" in rows:
                entry["n_discoveries"] = int(rows["discovery"].sum())
            if placebo is not None:
                mine = placebo[(placebo["kind"] == kind) & (placebo["variant"] == v)]
                entry["placebo_pairs"] = int(mine["z"].notna().sum())
                entry["placebo_discoveries"] = int(mine["discovery"].sum())
    return out


# --- surrogates: the alignment between layers broken -----------------------------------------


def surrogate(hw, gen: torch.Generator):
    """`hw` (`weights.HeadWeights`) with every layer after the first re-expressed in its own
    Haar-random orthonormal basis of the residual stream: layer l reads x R_l and writes back
    through R_l^T (W_Q, W_K, W_V -> R_l W, W_O -> W_O R_l^T, b_O -> b_O R_l^T), so each layer
    keeps its own QK and OV circuits up to that rotation (R_l QK R_l^T: spectra, norms, how its
    heads sit relative to each other) and only how it sits relative to the layers before it,
    and to the embeddings, is random. What no composition looks like in this model's own heads:
    the calibration's surrogate null (tests/test_circuits_significance.py, the calibrate stage)."""
    from dataclasses import replace

    L, D = hw.n_layers, hw.d_model
    R = haar_blocks(max(L - 1, 0), D, D, gen).to(hw.W_Q.dtype)  # [L - 1, d_model, d_model]
    R = torch.cat([torch.eye(D, dtype=hw.W_Q.dtype)[None], R])  # layer 0 as it is
    rotated_in = {
        name: torch.einsum("lde,lhef->lhdf", R, getattr(hw, name)) for name in ("W_Q", "W_K", "W_V")
    }
    W_O = torch.einsum("lhfe,lde->lhfd", hw.W_O, R)  # W_O R^T: [l, head, d_head, d_model]
    b_O = torch.einsum("le,lde->ld", hw.b_O, R)
    return replace(hw, W_O=W_O, b_O=b_O, **rotated_in)
