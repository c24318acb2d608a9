"""Q-, K- and V-composition of every earlier head with every later head: the true scores,
the two rotated versions the errata says the paper's library computed, a random-matrix
baseline for each, and a z-score against a spectrum-preserving null. Maths only, no I/O.

Row vectors, as stored (docs/design.md, "Maths conventions"): QK^h = W_Q^h W_K^hT and
OV^h = W_V^h W_O^h. For an earlier head a (layer i) and a later head b (layer j > i):

    Q   ||OV^a QK^b||  / (||OV^a|| ||QK^b||)
    K   ||OV^a QK^bT|| / (||OV^a|| ||QK^b||)
    V   ||OV^a OV^b||  / (||OV^a|| ||OV^b||)

exactly TransformerLens 3.9's `HookedTransformer.all_composition_scores(mode)`.

The paper's order. The paper multiplies column vectors, so each of its matrices is the
transpose of ours (W_Q^paper = W_Q^T, [d_head, d_model]; likewise W_K, W_V; W_O^paper =
W_O^T, [d_model, d_head]). Each score's numerator is the norm of a strand A B C D of
shapes [d_model, d_head] [d_head, d_model] [d_model, d_head] [d_head, d_model]:

    kind  paper order (column vectors)     A       B        C        D         A B C D (ours)
    Q     W_K^bT W_Q^b W_O^a W_V^a         W_K^b   W_Q^bT   W_O^aT   W_V^aT    (OV^a QK^b)^T
    K     W_Q^bT W_K^b W_O^a W_V^a         W_Q^b   W_K^bT   W_O^aT   W_V^aT    (OV^a QK^bT)^T
    V     W_O^b  W_V^b W_O^a W_V^a         W_O^bT  W_V^bT   W_O^aT   W_V^aT    (OV^a OV^b)^T

(a transpose does not change a Frobenius norm). The variants:

    true                  ||A B C D|| / (||A B|| ||C D||)
    errata_bcda           ||B C D A|| / (||B A|| ||D C||)    both rotated strands are d_head x d_head
    errata_dabc           ||D A B C|| / (||B A|| ||D C||)
    errata_bcda_trueden   ||B C D A|| / (||A B|| ||C D||)
    errata_dabc_trueden   ||D A B C|| / (||A B|| ||C D||)

The errata names only the numerators. Whether the library also rotated the two-factor
strands of the denominators is unknown, so both hypotheses are computed: rotated
denominators (`errata_bcda`, `errata_dabc`) and true ones (`*_trueden`); the compare
stage tests the errata's claims under each (docs/maths.md, "The denominators"). (A two-factor
strand has one rotation: B A is both "B C D A"-style and "D A B C"-style.) A denominator
that is zero up to rounding (||B A|| <= scoring.ZERO_RTOL ||A|| ||B||: query and key, or value and
output, on orthogonal subspaces) makes the score NaN: undefined, not an error.

Every pair is computed from two [d_head, d_head] cross products of the pair, Y = B C
(b's B-side read of what a writes) and X = D A (a's value read against b's A side):

    ||A B C D|| = ||R_A Y R_D||  (A = Q R_A, D = R_D Q'^T: `strands.shrink_left/right`)
    ||B C D A|| = ||Y X||        ||D A B C|| = ||X Y||

Baseline: the same score of Gaussian factors A, B, C, D of the same shapes,
`baseline_samples` draws (`scoring.baseline`). The three kinds' strands have identical shapes, so one set of
draws serves all three kinds (one baseline per variant). Scores are scale-free in every
factor, so the Gaussians' variance does not matter. Expected values: about
1/sqrt(d_model) for the true score; about 1/sqrt(d_head) for the errata variants with
rotated denominators (larger than the true baseline: 0.35 vs 0.125 at d_model 64,
d_head 8), and about sqrt(d_head)/d_model with the true denominators (smaller).

Null (z): the writing head a is expressed in a randomly rotated residual basis,
W_O^a -> W_O^a R and W_V^a -> R^T W_V^a with R Haar-random orthogonal [d_model, d_model].
Then OV^a -> R^T OV^a R: every head keeps its own OV and QK spectra (eigenvalues and
singular values) and its norms, so every denominator is unchanged; only how head a's
subspaces sit relative to head b's is random. In paper letters C -> R^T C and D -> D R,
so Y -> B R^T C and X -> D R A. To sample this in the small space, write
[C | D^T] = U [c | d] and [B^T | A] = V [beta | alpha] (QR; U, V [d_model, k] with
orthonormal columns, k = min(d_model, 2 d_head)); then

    B R^T C = beta^T Z^T c,    D R A = d^T Z alpha,    Z = U^T R V  [k, k]

and for fixed U, V and Haar R, Z is distributed as the top-left k x k block of a Haar
matrix. So `null_samples` such blocks are drawn once and used for every pair: each pair's
null samples are exactly distributed as rotating the residual stream for that pair
(pairs share draws, which only correlates different pairs' estimates). The true
numerator needs no product per pair and sample: ||R_A B R^T C R_D||^2 is the inner
product of two small Gram matrices, one of them rotated by Z (`_null_numerators`).
z = (score - null_mean) / null_std (NaN when the score is NaN or null_std is 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from .. import streams
from ..cli import progress_bar
from ..config import CompositionConfig
from ..tables import KINDS, RAW_SCORES_COLUMNS, VARIANTS
from .scoring import (
    PairStats,
    baseline,
    haar_blocks,
    mean_std,
    nan_if_zero,
    raw_scores_table,
)
from .scoring import summarize as summarize  # re-exported: composition.summarize
from .strands import (
    Strand,
    all_pairs_norms,
    gram_vector_length,
    gram_vectors,
    grams_are_cheaper,
    norm,
    shrink_left,
    shrink_right,
)
from .weights import HeadWeights, power_of_two_scaled

COLUMNS = list(RAW_SCORES_COLUMNS)
_BLOCK = (
    2**21
)  # elements per [writers, readers, samples, d_head, d_head] block of the null (16 MB in float64)
_GRAMS = 2**27  # elements of the writers' Gram vectors held at once by `true_scores` (1 GiB in float64)


# --- the factors of each kind, paper letters --------------------------------------


def reader_factors(W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """(A [.., d_model, d_head], B [.., d_head, d_model]) of the later head b for this kind."""
    if kind == "Q":
        return W_K, W_Q.mT
    if kind == "K":
        return W_Q, W_K.mT
    if kind == "V":
        return W_O.mT, W_V.mT
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


def writer_factors(W_V: Tensor, W_O: Tensor) -> tuple[Tensor, Tensor]:
    """(C = W_O^T [.., d_model, d_head], D = W_V^T [.., d_head, d_model]) of the earlier head a."""
    return W_O.mT, W_V.mT


def _side_norms(P: Tensor, Q: Tensor, rotated: bool = True) -> dict[str, Tensor]:
    """||P Q|| and ||Q P|| of one head's two-factor strand; NaN where zero up to rounding.

    ||Q P|| is d_head x d_head and formed directly; ||P Q|| goes through d_head x d_head
    Gram matrices. Both give exactly 0 when the two factors use disjoint coordinates.
    """
    bound = torch.linalg.matrix_norm(P) * torch.linalg.matrix_norm(Q)
    out = {}
    for name, s in (("true", Strand((P, Q))), ("rotated", Strand((Q, P))))[: 2 if rotated else 1]:
        out[name] = nan_if_zero(norm(s), bound)
    return out


# Each variant: (its numerator, its denominators: the true two-factor norms or their rotations).
PARTS = {
    "true": ("true", "true"),
    "errata_bcda": ("bcda", "rotated"),
    "errata_dabc": ("dabc", "rotated"),
    "errata_bcda_trueden": ("bcda", "true"),
    "errata_dabc_trueden": ("dabc", "true"),
}
if tuple(PARTS) != VARIANTS:  # `_ratios` gives the variants in PARTS's order, the tables' order
    raise RuntimeError(f"PARTS names {tuple(PARTS)}, tables.VARIANTS {VARIANTS}")


def _denominators(reader: dict[str, Tensor], writer: dict[str, Tensor], pairs: bool) -> dict[str, Tensor]:
    """||A B|| ||C D|| ("true") and ||B A|| ||D C|| ("rotated"), [Na, Nb] (pairs) or [S] (zipped)."""
    if pairs:
        return {side: writer[side][:, None] * reader[side][None, :] for side in ("true", "rotated")}
    return {side: writer[side] * reader[side] for side in ("true", "rotated")}


def _numerators(Y: Tensor, X: Tensor, R_A: Tensor, R_D: Tensor) -> dict[str, Tensor]:
    """Numerators from the pair's cross products Y = B C and X = D A, [.., d_head, d_head]."""
    return {
        "true": norm(Strand((R_A, Y, R_D))),  # ||A B C D||, A = Q R_A, D = R_D Q'^T
        "bcda": norm(Strand((Y, X))),  # ||B C D A||
        "dabc": norm(Strand((X, Y))),  # ||D A B C||
    }


def _ratios(nums: dict[str, Tensor], dens: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every variant's score from the numerators and denominators (PARTS); `dens` broadcast."""
    return {v: nums[num] / dens[den] for v, (num, den) in PARTS.items()}


# --- fast path: the true scores only -----------------------------------------------


def true_scores(hw: HeadWeights, kinds: str = "QKV", method: str = "auto") -> dict[str, Tensor]:
    """The true scores of each kind in `kinds`, [src_layer, src_head, dst_layer, dst_head],
    NaN unless dst_layer > src_layer; in the dtype of `hw`.

    Same values as TransformerLens's `all_composition_scores(kind)` (which puts 0 where we
    put NaN). The two `strands.all_pairs_norms` routes, done by hand so that work is shared:
    with Gram matrices (the cheaper route once d_head^2 > d_model / 2), every writer's packed
    OV Gram matrix is formed once for all kinds, and each reader layer j, all kinds at once,
    is dotted only with the writers of layers < j. method: "auto", "grams" or "factors".
    """
    if method not in ("auto", "grams", "factors"):
        raise ValueError(f"method must be 'auto', 'grams' or 'factors', not {method!r}")
    hw = power_of_two_scaled(hw)  # exact; no overflow or underflow for any finite weights
    L, H, d_model, d_head = hw.n_layers, hw.n_heads, hw.d_model, hw.d_head
    OV = Strand((hw.W_V, hw.W_O))  # [L, H] x [d_model, d_model]
    ov_norm = _side_norms(hw.W_V, hw.W_O, rotated=False)["true"]  # [L, H]
    readers = {}  # kind -> (OV^a's right neighbour (A B)^T: QK^b, QK^bT or OV^b; its norms)
    for kind in kinds:
        A, B = reader_factors(hw.W_Q, hw.W_K, hw.W_V, hw.W_O, kind)
        readers[kind] = (Strand((A, B)).T, _side_norms(A, B, rotated=False)["true"])
    n_writers, n_pairs = (L - 1) * H, H * H * L * (L - 1) // 2
    use_grams = method == "grams" or (
        method == "auto"
        and grams_are_cheaper(
            n_writers, len(kinds) * n_writers, len(kinds) * n_pairs, d_head, d_model, d_head
        )
    )
    out = {kind: torch.full((L, H, L, H), torch.nan, dtype=hw.W_Q.dtype) for kind in kinds}
    if not use_grams:
        for j in range(1, L):
            writers = Strand(tuple(f[:j] for f in OV.factors))  # batch [j, H]
            nums = [
                all_pairs_norms(writers, Strand(tuple(f[j] for f in right.factors)), method="factors")
                for right, _ in readers.values()
            ]
            for kind, num in zip(readers, nums, strict=True):
                out[kind][:j, :, j] = num / (ov_norm[:j, :, None] * readers[kind][1][j])
        return out
    # The writers' Gram vectors, N ~ d_model^2 / 2 each, in blocks of layers that fit _GRAMS
    # elements (one block up to GPT-2-small sizes; 1,200 heads at d_model 1600 would need 12 GB
    # at once); each block meets every later reader layer, whose grams are formed per block.
    N = gram_vector_length(d_model)
    per_block = max(1, _GRAMS // (H * N))  # writer layers per block
    reader_grams = hw.W_Q.new_empty(len(readers) * H, N)  # every kind's readers of one layer, reused
    for i0 in range(0, L - 1, per_block):
        i1 = min(i0 + per_block, L - 1)
        writer_grams = gram_vectors(Strand(tuple(f[i0:i1] for f in OV.factors)), "left")  # [i1 - i0, H, N]
        for j in range(i0 + 1, L):
            for k, (right, _) in enumerate(readers.values()):
                gram_vectors(
                    Strand(tuple(f[j] for f in right.factors)), "right", out=reader_grams[k * H : (k + 1) * H]
                )
            w = slice(i0, min(j, i1))  # the block's writers below layer j
            nums = writer_grams[: w.stop - i0] @ reader_grams.T  # [writers, H, kinds x H]
            nums = nums.clamp_min(0).sqrt().split(H, dim=-1)
            for kind, num in zip(readers, nums, strict=True):
                out[kind][w, :, j] = num / (ov_norm[w, :, None] * readers[kind][1][j])
        del writer_grams
    return out


# --- all variants, baselines and nulls ---------------------------------------------


def _frame(M: Tensor) -> Tensor:
    """Coordinates [.., k, 2 d_head] of M [.., d_model, 2 d_head] in an orthonormal basis U
    of its columns (M = U coords); upper triangular."""
    return torch.linalg.qr(M, mode="r").R


def _chain_scores(A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> dict[str, Tensor]:
    """Every variant's score of the strand A B C D, zipped over a leading [S]: the baseline's
    Gaussian factors (`scoring.baseline`)."""
    nums = _numerators(B @ C, D @ A, shrink_left(A), shrink_right(D))  # each [S]
    dens = _denominators(_side_norms(A, B), _side_norms(C, D), pairs=False)
    return _ratios(nums, dens)


@dataclass(frozen=True)
class _Writers:
    """The earlier heads of one layer (C = W_O^T, D = W_V^T), with everything the null needs
    that does not depend on the later head. Coordinates as in the module doc: torch's QR
    gives an upper-triangular R, so [C | D^T] = U [c | d] has c = [c1; 0] with c1 [d_head, d_head],
    and only the top-left block Z11 = Z[:d_head, :d_head] of each Z ever meets c."""

    C: Tensor  # [Na, d_model, d_head]
    D: Tensor  # [Na, d_head, d_model]
    norms: dict[str, Tensor]  # ||C D||, ||D C||  [Na]
    R_D: Tensor  # D = R_D Q^T  [Na, d_head, d_head]
    c1: Tensor  # [Na, d_head, d_head]
    d_Z: Tensor  # d^T Z  [Na, S, d_head, k]
    gram_Z: Tensor  # Z11^T (c1 R_D)(c1 R_D)^T Z11  [Na, S, d_head, d_head]

    @staticmethod
    def of(C: Tensor, D: Tensor, Z: Tensor) -> _Writers:
        d_head = C.shape[-1]
        coords = _frame(torch.cat([C, D.mT], -1))  # [C | D^T] = U [c | d]  [Na, k, 2 d_head]
        c1, d = coords[..., :d_head, :d_head], coords[..., d_head:]
        R_D = shrink_right(D)
        Z11 = Z[:, :d_head, :d_head]  # [S, d_head, d_head]
        c1_R_D = c1 @ R_D
        gram = c1_R_D @ c1_R_D.mT  # [Na, d_head, d_head]
        gram_Z = torch.einsum("ski,nkl,slj->nsij", Z11, gram, Z11)
        d_Z = torch.einsum("nki,skl->nsil", d, Z)
        return _Writers(C, D, _side_norms(C, D), R_D, c1, d_Z, gram_Z)


@dataclass(frozen=True)
class _Readers:
    """A block of later heads (paper letters A, B for one kind);
    [B^T | A] = V [beta | alpha], beta = [beta1; 0]."""

    A: Tensor  # [Nb, d_model, d_head]
    B: Tensor  # [Nb, d_head, d_model]
    norms: dict[str, Tensor]  # ||A B||, ||B A||  [Nb]
    R_A: Tensor  # A = Q R_A  [Nb, d_head, d_head]
    alpha: Tensor  # [Nb, k, d_head]
    beta1_Zt: Tensor  # beta1^T Z11^T  [Nb, S, d_head, d_head]
    gram: Tensor  # (R_A beta1^T)^T (R_A beta1^T)  [Nb, d_head, d_head]

    @staticmethod
    def of(A: Tensor, B: Tensor, Z: Tensor) -> _Readers:
        d_head = A.shape[-1]
        coords = _frame(torch.cat([B.mT, A], -1))  # [Nb, k, 2 d_head]
        beta1, alpha = coords[..., :d_head, :d_head], coords[..., d_head:]
        R_A = shrink_left(A)
        R_A_beta1t = R_A @ beta1.mT
        beta1_Zt = torch.einsum("nki,slk->nsil", beta1, Z[:, :d_head, :d_head])
        return _Readers(A, B, _side_norms(A, B), R_A, alpha, beta1_Zt, R_A_beta1t.mT @ R_A_beta1t)


def _null_numerators(w: _Writers, r: _Readers) -> dict[str, Tensor]:
    """Numerators with the writer rotated by each sampled Z, [Na, Nb, S] (module doc).

    true:   ||R_A B R^T C R_D||^2 = <(R_A beta1^T)^T (R_A beta1^T), Z11^T (c1 R_D)(c1 R_D)^T Z11>,
            small rotated Gram matrices, so the pair costs d_head^2 per sample;
    errata: the rotated cross products Y = B R^T C = beta1^T Z11^T c1 and X = D R A = d^T Z alpha.
    """
    true_sq = torch.einsum("asij,bij->abs", w.gram_Z, r.gram)  # one GEMM
    Y = torch.einsum("bsil,alj->absij", r.beta1_Zt, w.c1)  # B R^T C  [Na, Nb, S, d_head, d_head]
    X = torch.einsum("asil,blj->absij", w.d_Z, r.alpha)  # D R A  [Na, Nb, S, d_head, d_head]
    return {
        "true": true_sq.clamp_min(0).sqrt(),
        "bcda": norm(Strand((Y, X))),
        "dabc": norm(Strand((X, Y))),
    }


def _pair_block(w: _Writers, r: _Readers) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """Writers [Na] x readers [Nb] -> per variant (score, null_mean, null_std), each [Na, Nb]."""
    dens = _denominators(r.norms, w.norms, pairs=True)  # [Na, Nb]
    # the scores: cross products of every writer with every reader, one GEMM each
    Y = torch.einsum("bin,anj->abij", r.B, w.C)  # B_b C_a  [Na, Nb, d_head, d_head]
    X = torch.einsum("ain,bnj->abij", w.D, r.A)  # D_a A_b  [Na, Nb, d_head, d_head]
    nums = _numerators(Y, X, r.R_A[None], w.R_D[:, None])
    null = _null_numerators(w, r)  # [Na, Nb, S]; rotation leaves every denominator unchanged
    scores = _ratios(nums, dens)
    nulls = _ratios(null, {side: den[..., None] for side, den in dens.items()})
    return {v: (scores[v], *mean_std(nulls[v], -1)) for v in VARIANTS}


def _reader_blocks(L: int, H: int, d_head: int, S: int, placebo: bool) -> list[tuple[int, int, int, int]]:
    """(writer layer i, first reader layer, last reader layer + 1, reader heads per block) of
    `_kind_tensors`' loop: the later layers, or (placebo) the writer's own layer and earlier ones;
    blocks of `step` reader heads bound the null's memory."""
    step = max(1, _BLOCK // (H * S * d_head * d_head))
    return [(i, *((0, i + 1) if placebo else (i + 1, L)), step) for i in range(L if placebo else L - 1)]


def _kind_tensors(
    hw: HeadWeights, kind: str, Z: Tensor, placebo: bool = False, bar=None
) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """Per variant: (score, null_mean, null_std), each [L, H, L, H], NaN unless dst_layer > src_layer
    (placebo: NaN unless dst_layer <= src_layer, the pairs that cannot compose; `scoring.placebo_pairs`).
    `bar`: a `pipeline.cli.Progress`, updated once per block of reader heads."""
    L, H, d_head, S = hw.n_layers, hw.n_heads, hw.d_head, Z.shape[0]
    A, B = reader_factors(hw.W_Q, hw.W_K, hw.W_V, hw.W_O, kind)
    C, D = writer_factors(hw.W_V, hw.W_O)
    out = {
        v: tuple(torch.full((L, H, L, H), torch.nan, dtype=torch.float64) for _ in range(3)) for v in VARIANTS
    }
    for i, first, last, step in _reader_blocks(L, H, d_head, S, placebo):
        writers = _Writers.of(C[i], D[i], Z)
        A_later = A[first:last].reshape(-1, *A.shape[-2:])  # [(last - first) H, d_model, d_head]
        B_later = B[first:last].reshape(-1, *B.shape[-2:])
        for start in range(0, A_later.shape[0], step):
            A_b, B_b = A_later[start : start + step], B_later[start : start + step]
            block = _pair_block(writers, _Readers.of(A_b, B_b, Z))
            columns = slice(first * H + start, first * H + start + A_b.shape[0])  # reader heads, flat
            for v in VARIANTS:
                for target, values in zip(out[v], block[v], strict=True):
                    # written in place: keeping small per-block results alive between the
                    # large temporaries fragments the heap (glibc) and inflates memory
                    target[i].view(H, L * H)[:, columns] = values.cpu()  # a no-op on the CPU
            if bar is not None:
                bar.update()
    return out


def composition_scores(
    hw: HeadWeights, cfg: CompositionConfig, seed: int, placebo: bool = False, device: str | None = None
) -> pd.DataFrame:
    """One row per (kind, variant, earlier head, later head), in that order (KINDS, VARIANTS).

    Columns: kind, variant, src_layer, src_head, dst_layer, dst_head, score,
    baseline_mean, baseline_std (random factors of the same shapes), z (against the
    rotated-writer null). Deterministic for a seed. Computed in float64. placebo: the same
    columns for the pairs that cannot compose (`scoring.placebo_pairs`) instead of the later ones.
    `device` (`analysis.device`): where the scores and the null's products run; the draws and
    the baselines stay on the CPU, so only rounding differs between devices.
    """
    hw = power_of_two_scaled(hw.to(torch.float64))  # exact; no overflow or underflow for any finite weights
    d_model, d_head = hw.d_model, hw.d_head
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "composition.baseline"))
    base = baseline(_chain_scores, (d_model,) * 4, d_head, cfg.baseline_samples, gen)
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "composition.null"))
    Z = haar_blocks(cfg.null_samples, d_model, min(d_model, 2 * d_head), gen)
    hw, Z = hw.to(device), Z.to(device)  # no copies on the CPU
    blocks = _reader_blocks(hw.n_layers, hw.n_heads, d_head, cfg.null_samples, placebo)
    total = len(KINDS) * sum(-(-(last - first) * hw.n_heads // step) for _, first, last, step in blocks)
    measures = {}
    with progress_bar(total, f"composition{' placebo' if placebo else ''} null", "block") as bar:
        for kind in KINDS:
            tensors = _kind_tensors(hw, kind, Z, placebo, bar)
            for v in VARIANTS:
                measures[kind, v] = PairStats(*tensors[v], *base[v])
    return raw_scores_table(measures, COLUMNS, placebo)
