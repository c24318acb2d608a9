"""Q-, K- and V-composition that survives a change of residual basis. Maths only, no I/O.

Why. Without LayerNorm the residual stream has a GL(d_model) symmetry: W_E -> W_E T,
W_pos -> W_pos T, W_U -> T^-1 W_U and, for every head, W_Q, W_K, W_V -> T^-1 W,
W_O -> W_O T, b_O -> b_O T compute the same function for any invertible T. Then
OV -> T^-1 OV T and QK -> T^-1 QK T^-T, so every Frobenius score of `pipeline.circuits.composition`
changes: ||.|| needs an inner product on the residual stream and the model supplies none.
Here the residual stream is measured in a basis the model itself defines.

The residual stream's token paths. Row vectors, as stored (QK^h = W_Q^h W_K^hT, OV^h =
W_V^h W_O^h). In the virtual-weights picture (every head attends to one earlier position)
the residual stream entering layer l is a sum of paths: a token's embedding, or a head of
an earlier layer applied to a path of its own input. Stack every path's vector for every
token as the rows of M_l, weighted so that M_l^T M_l is their mean square:

    M_0 = E / sqrt(d_vocab)                               shortformer (the default) or rotary positions
    M_0 = [E / sqrt(d_vocab); W_pos / sqrt(n_ctx)]        standard positions
    M_{l+1} = [M_l; M_l OV^c for every head c of layer l]

and G_l = M_l^T M_l [d_model, d_model], computed without M_l (`residual_grams`):

    G_{l+1} = G_l + sum_{c in layer l} OV^cT G_l OV^c.

With shortformer positions, positions enter only queries and keys, never the residual
stream, so the token embeddings alone start it (rotary positions likewise: they turn queries
and keys, and no embedding enters the stream); their positional query and key terms
(W_pos W_Q^h, W_pos W_K^h) read nothing an earlier head could write and are left out, as the
Frobenius scores leave out W_pos. With standard positions each position is a path start
like a token. G_l is the residual stream's second moment for uniformly random tokens (and
positions) with one-hot attention and the cross terms between different paths dropped: a
weights-only stand-in for its covariance on data (`grams=` takes any other G_l, e.g. the
held-out residual covariance at each layer: nothing else changes, and the invariance holds
for any G_l that transforms as G_l -> T^T G_l T). Under T, M_l -> M_l T and G_l -> T^T G_l T.

The frame. R_l [r_l, d_model] with R_l^T R_l = G_l (r_l = rank G_l; `Frame`): coordinates
u = x R_l^+ in which the residual stream at layer l is white. Under T, R_l -> O R_l T with O
orthogonal, so anything orthogonally invariant computed in these coordinates is
GL-invariant. For an earlier head a (layer i) and a later head b (layer j > i):

    OV_f^a = R_i OV^a R_j^+      a reads layer i's residual, writes into layer j's
    QK_f^b = R_j QK^b R_j^T      b's queries and keys both read layer j's residual
    OV_f^b = R_j OV^b R_{j+1}^+

    Q   ||OV_f^a QK_f^b||   / (||OV_f^a|| ||QK_f^b||)
    K   ||OV_f^a QK_f^bT||  / (||OV_f^a|| ||QK_f^b||)
    V   ||OV_f^a OV_f^b||   / (||OV_f^a|| ||OV_f^b||)

the project's true Frobenius scores in the whitened frame, so in [0, 1] (submultiplicativity).
In token terms (M = Q_M R: the orthonormal Q_M drops out of every norm), the Q score is

    ||M_i OV^a QK^b M_j^T|| / (||M_i OV^a M_j^+|| ||M_j QK^b M_j^T||)

a token-space circuit over the residual's paths (for two layers, with shortformer positions:
M_0 ∝ E, M_1 ∝ [E; E OV^c ...], so the numerator holds E OV^a QK^b E^T, a's output of token
x as b's query against key token y, beside the key-side terms E OV^a QK^b (E OV^c)^T);
M_j^+ reads a written vector back as the least-norm combination of the token paths. K and V
likewise. R_j^+ is exact here: every row of R_i OV^a is a path of M_j (M_j contains M_i OV^a),
so it lies in the row space of R_j, where R_j^+ R_j is the identity; the same holds for b's
output in frame j + 1. A score is NaN where its writer or reader is zero up to rounding
(|| || <= scoring.ZERO_RTOL times the bound from its factors), e.g. a reader whose queries read
positions only.

Sizes count, unlike in the Frobenius score. In the frame a reader's sensitivity to a direction
is weighted by how much the residual stream carries there, so where earlier heads write far
more than the embeddings, even random later heads read mostly their outputs: such pairs score
above the baseline and have z > 0. That is composition in the functional sense (the later
head's attention or output is driven by the earlier heads' writes), not an artefact; the
baseline is the score of heads random in the frame, which such a model's heads are not.

Why not the plain token-space circuits with W_U as the writer's denominator (E OV^a U): a
head that writes where W_U does not read (a previous-token head feeding keys) would have no
size, and the ratio is not scale-free: scaling E or U by c scales it by 1/c. Why not whiten
by E^T E alone: the directions heads write into and embeddings leave empty (the planted
model's PREV block) would be infinitely large. G_l counts every path the residual stream carries.

Baseline: the same score of Gaussian factors in frame coordinates (W_V^a [r_i, d_head],
W_O^a [d_head, r_j], W_Q^b, W_K^b [r_j, d_head]; V: W_V^b [r_j, d_head], W_O^b
[d_head, r_{j+1}]), `baseline_samples` draws per distinct (r_i, r_j, r_out) (`scoring.baseline`).
It depends only on those dims (not on the basis), so it is invariant too; when every frame is full
rank (r = d_model) it has the distribution of the Frobenius `true` baseline, and Q, K and V
share their draws.

Null (z): as in `pipeline.circuits.composition`, the writing head's output expressed in a
Haar-randomly rotated basis, here the whitened frame of layer j: OV_f^a -> OV_f^a Q, Q Haar
[r_j, r_j], which leaves both denominators unchanged. With the SVDs OV_f^a = L_a S_a V_a^T and
(b's reading circuit) N_b = U_b S_b R_b^T, V_a, U_b [r_j, k], k = min(d_head, r_j):

    ||OV_f^a Q N_b||^2 = sum_{m,n} s_{a,m}^2 Z_mn^2 s_{b,n}^2,    Z = V_a^T Q U_b  [k, k]

and Z is distributed as the top-left k x k block of a Haar [r_j, r_j] matrix. So the null
needs only each head's singular values in the frame (invariant, and free of any choice of
signs or bases, so the null's samples themselves are unchanged by T, not only their
distribution), and `null_samples` blocks are drawn once per frame size and shared by every
pair. z = (score - null_mean) / null_std (NaN when the score is NaN or null_std is 0).
Deterministic for a seed. Computed in float64.

LayerNorm breaks the symmetry itself (it normalises in the given basis); for a model with
LayerNorm the scores are computed the same way on the folded weights, G_l ignoring the norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import pandas as pd
import torch
from torch import Tensor

from .. import streams
from ..cli import progress_bar
from ..config import CompositionConfig
from ..tables import INVARIANT, KINDS, RAW_SCORES_COLUMNS
from .scoring import (
    PairStats,
    baseline,
    haar_blocks,
    mean_std,
    nan_if_zero,
    raw_scores_table,
)
from .strands import shrink_left, shrink_right
from .weights import POSITIONS, HeadWeights

COLUMNS = [c for c in RAW_SCORES_COLUMNS if c != "variant"]
RANK_RTOL = 1e-10  # eigenvalues of G_l at or below RANK_RTOL * its largest count as zero


# --- the residual stream's second moments and their frames ---------------------------


def _pow2_scaled(W: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(W / 2^e, e) with e per slice over `dims` bringing max|W| into [0.5, 1): exact (0 for zero)."""
    _, e = torch.frexp(W.abs().amax(dim=dims, keepdim=True))
    return W * torch.pow(2.0, -e.to(W.dtype)), e.to(W.dtype)


def _scaled(hw: HeadWeights, positions: str) -> tuple[HeadWeights, Tensor]:
    """`hw` with each head's W_Q, W_K, W_V, W_O, and W_E (with W_pos for standard positions),
    divided by exact powers of two (`weights.power_of_two_scaled`, but W_V and W_O apart: OV's
    size matters here, as it weights its paths in G_l), and log2 of that division of each OV
    [L, H], which `residual_grams` puts back. The scores are scale-free in every one of these
    divisions, so nothing overflows or underflows for weights of any finite size."""
    heads = {name: _pow2_scaled(getattr(hw, name), (-2, -1)) for name in ("W_Q", "W_K", "W_V", "W_O")}
    if positions == "standard":  # one path start as big as the other: a common factor
        both, _ = _pow2_scaled(torch.cat([hw.W_E, hw.W_pos]), (0, 1))
        W_E, W_pos = both[: hw.W_E.shape[0]], both[hw.W_E.shape[0] :]
    else:
        W_E, W_pos = _pow2_scaled(hw.W_E, (0, 1))[0], hw.W_pos
    ov_log2 = (heads["W_V"][1] + heads["W_O"][1]).reshape(hw.n_layers, hw.n_heads)
    return replace(hw, W_E=W_E, W_pos=W_pos, **{n: W for n, (W, _) in heads.items()}), ov_log2


def residual_grams(hw: HeadWeights, positions: str = "shortformer") -> list[Tensor]:
    """G_0 .. G_L [d_model, d_model], each up to a positive factor of its own (an exact power of
    two: weights of any size): the mean square of the token paths entering each layer (G_L:
    after the last layer). Module doc; G_l -> T^T G_l T under the symmetry. No score depends
    on the factors (scaling G_l scales R_l, which cancels in every ratio)."""
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, not {positions!r}")
    hw, ov_log2 = _scaled(hw.to(torch.float64), positions)
    E = hw.W_E
    G = E.mT @ E / E.shape[0]
    if positions == "standard":  # each position starts a path too (positions and tokens uniform)
        G = G + hw.W_pos.mT @ hw.W_pos / hw.W_pos.shape[0]
    G = _pow2_scaled(G, (0, 1))[0]
    grams = [G]
    for l in range(hw.n_layers):
        # G_{l+1} = G_l + sum_c OV^cT G_l OV^c with OV^c = 2^e_c OV'^c, divided by 4^s,
        # s = max(0, e_c): every coefficient <= 1, so a negligible term can only underflow to 0
        s = ov_log2[l].max().clamp_min(0)
        weight = torch.pow(4.0, ov_log2[l] - s)  # [H]
        VGV = hw.W_V[l].mT @ G @ hw.W_V[l]  # [H, d_head, d_head]: G_l seen through each value map
        G = G * torch.pow(4.0, -s) + torch.einsum("h,hdm,hde,hen->mn", weight, hw.W_O[l], VGV, hw.W_O[l])
        G = _pow2_scaled((G + G.mT) / 2, (0, 1))[0]  # symmetric to the last bit, for eigh
        grams.append(G)
    return grams


@dataclass(frozen=True)
class Frame:
    """Whitened coordinates of one layer's residual stream: R [r, d_model] with R^T R = G and
    R_pinv [d_model, r] with R R_pinv = I_r (r = rank G). x in the row space of G has
    coordinates x R_pinv; a map reading the stream, W [d_model, n], reads them through R W."""

    R: Tensor
    R_pinv: Tensor

    @staticmethod
    def of(G: Tensor) -> Frame:
        lam, vec = torch.linalg.eigh(G)  # ascending
        top = lam.max() if lam.numel() else lam.new_zeros(())
        keep = lam > RANK_RTOL * top if top > 0 else torch.zeros_like(lam, dtype=torch.bool)
        root, vec = lam[keep].sqrt(), vec[:, keep]
        return Frame(R=root[:, None] * vec.mT, R_pinv=vec / root)

    @property
    def rank(self) -> int:
        return self.R.shape[0]


def frames(grams: Sequence[Tensor]) -> list[Frame]:
    return [Frame.of(G) for G in grams]


# --- each head in the frames ---------------------------------------------------------


def _padded_svdvals(M: Tensor, k: int) -> Tensor:
    """Singular values [.., k] of M, zero-padded (or cut: the rest are zero) to k."""
    s = torch.linalg.svdvals(M)
    if s.shape[-1] >= k:
        return s[..., :k]
    return torch.cat([s, s.new_zeros(*s.shape[:-1], k - s.shape[-1])], -1)


@dataclass(frozen=True)
class _Side:
    """Heads of one layer as writers (OV_f^a) or readers (QK_f^b, QK_f^bT, OV_f^b), factored.

    A writer is P [H, p, r_j] = (R_i W_V^a folded) W_O^a R_j^+, equal to OV_f^a up to an
    orthogonal factor on the left. A reader is X [H, r_j, d_head] times T [H, d_head, q], equal
    to its circuit up to an orthogonal factor on the right (T = Y folded, `shrink_right`).
    """

    norm: Tensor  # [H] (NaN: zero up to rounding)
    sv: Tensor  # [H, k] singular values, k = min(d_head, r_j)
    P: Tensor | None = None  # writers
    X: Tensor | None = None  # readers
    T: Tensor | None = None  # readers


def _writers(V: Tensor, O: Tensor, k: int) -> _Side:
    """V = R_i W_V^a [H, r_i, d_head], O = W_O^a R_j^+ [H, d_head, r_j]."""
    P = shrink_left(V) @ O  # rows of V W_O only: those lie in frame j's row space, so P is exact
    n = torch.linalg.matrix_norm(P)
    bound = torch.linalg.matrix_norm(V) * torch.linalg.matrix_norm(O)
    return _Side(norm=nan_if_zero(n, bound), sv=_padded_svdvals(P, k), P=P)


def _readers(X: Tensor, Y: Tensor, k: int) -> _Side:
    """X [H, r_j, d_head] reads frame j; Y [H, d_head, r_out] is the other side (the key read
    R_j W_K^b transposed, or the output W_O^b R_{j+1}^+)."""
    T = shrink_right(Y)  # [H, d_head, q]: Y Y^T = T T^T
    small = shrink_left(X) @ T  # same norm and singular values as X Y
    n = torch.linalg.matrix_norm(small)
    bound = torch.linalg.matrix_norm(X) * torch.linalg.matrix_norm(Y)
    return _Side(norm=nan_if_zero(n, bound), sv=_padded_svdvals(small, k), X=X, T=T)


def _reader_factors(hw: HeadWeights, fr: Sequence[Frame], j: int, kind: str) -> tuple[Tensor, Tensor]:
    """(X [H, r_j, d_head], Y [H, d_head, r_out]) of layer j's heads with X Y = its circuit in the frames."""
    R = fr[j].R
    if kind == "Q":  # QK_f = (R_j W_Q)(R_j W_K)^T
        return R @ hw.W_Q[j], (R @ hw.W_K[j]).mT
    if kind == "K":  # QK_f^T
        return R @ hw.W_K[j], (R @ hw.W_Q[j]).mT
    if kind == "V":  # OV_f = (R_j W_V)(W_O R_{j+1}^+)
        return R @ hw.W_V[j], hw.W_O[j] @ fr[j + 1].R_pinv
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


def _pair_scores(w: _Side, r: _Side) -> Tensor:
    """[Na, Nb]: ||P_a X_b T_b|| / (||P_a|| ||X_b T_b||); every cross product P_a X_b in one GEMM."""
    C = torch.einsum("apr,brd->abpd", w.P, r.X)  # P_a X_b
    num = torch.linalg.matrix_norm(torch.einsum("abpd,bdq->abpq", C, r.T))
    return num / (w.norm[:, None] * r.norm[None, :])


def _null(w: _Side, r: _Side, Z2: Tensor) -> tuple[Tensor, Tensor]:
    """(null_mean, null_std) [Na, Nb] over the sampled squared Haar blocks Z2 [S, k, k] (module doc)."""
    sq = torch.einsum("am,smn,bn->abs", w.sv.square(), Z2, r.sv.square())
    scores = sq.clamp_min(0).sqrt() / (w.norm[:, None, None] * r.norm[None, :, None])
    return mean_std(scores, -1)


def _chain_scores(V: Tensor, O: Tensor, X: Tensor, Y: Tensor) -> dict[str, Tensor]:
    """{INVARIANT: the score of writer V O and reader X Y}, frame coordinates, zipped over a
    leading [S]: the baseline's Gaussian factors (`scoring.baseline`)."""
    k = min(V.shape[-1], X.shape[-2])  # min(d_head, r_mid)
    w, r = _writers(V, O, k), _readers(X, Y, k)
    C = w.P @ X
    return {INVARIANT: torch.linalg.matrix_norm(C @ r.T) / (w.norm * r.norm)}


# --- all pairs ---------------------------------------------------------------------


def invariant_scores(
    hw: HeadWeights,
    cfg: CompositionConfig,
    seed: int,
    positions: str = "shortformer",
    grams: Sequence[Tensor] | None = None,
    placebo: bool = False,
    device: str | None = None,
) -> pd.DataFrame:
    """One row per (kind, earlier head, later head), in that order (KINDS; pairs sorted).

    Columns: kind, src_layer, src_head, dst_layer, dst_head, score, baseline_mean,
    baseline_std (Gaussian heads in the frames), z (against the rotated-writer null in the
    frame). Unchanged by the residual stream's GL(d_model) symmetry, baseline and z too.
    `grams`: G_0 .. G_L to whiten by instead of `residual_grams(hw, positions)`.
    Deterministic for a seed. placebo: the pairs that cannot compose instead
    (`scoring.placebo_pairs`), the writer's output read in the reader's frame. `device`
    (`analysis.device`): where the pair scores and the null's products run; the frames, draws and
    baselines stay on the CPU.
    """
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, not {positions!r}")
    L, H, d_head = hw.n_layers, hw.n_heads, hw.d_head
    if grams is None:
        grams = residual_grams(hw, positions)
    else:
        grams = [_pow2_scaled(g.to(torch.float64), (0, 1))[0] for g in grams]
    hw = _scaled(hw.to(torch.float64), positions)[0]  # scale-free in each: exact, and nothing overflows
    if len(grams) != L + 1:
        raise ValueError(f"grams: expected {L + 1} matrices (G_0 .. G_L), got {len(grams)}")
    fr = frames(grams)
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "invariant.baseline"))
    S = cfg.baseline_samples

    # (writer layer, reader layer) of the pairs scored: later readers, or (placebo) the same and earlier
    layer_pairs = [(i, j) for j in range(L) for i in (range(j, L) if placebo else range(j))]
    # baselines, then the null's blocks (each from its stream), in a fixed order: deterministic for a seed
    baselines: dict[tuple[int, int, int], tuple[float, float]] = {}
    for i, j in sorted(layer_pairs):
        for kind in KINDS:
            key = (fr[i].rank, fr[j].rank, fr[j + 1 if kind == "V" else j].rank)
            if key not in baselines and min(key) > 0:
                # writer V O: [r_in, d_head] [d_head, r_mid]; reader X Y: [r_mid, d_head] [d_head, r_out]
                r_in, r_mid, r_out = key
                dims = (r_in, r_mid, r_mid, r_out)
                baselines[key] = baseline(_chain_scores, dims, d_head, S, gen)[INVARIANT]
    blocks: dict[int, Tensor] = {}
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "invariant.null"))
    for j in sorted({j for _, j in layer_pairs}):
        r = fr[j].rank
        if r not in blocks and r > 0:
            blocks[r] = haar_blocks(cfg.null_samples, r, min(d_head, r), gen).square().to(device)  # [S, k, k]

    nan = lambda: torch.full((L, H, L, H), torch.nan, dtype=torch.float64)  # noqa: E731
    out = {kind: {f.name: nan() for f in fields(PairStats)} for kind in KINDS}
    writers_of = {j: [i for i, jj in layer_pairs if jj == j] for j in sorted({j for _, j in layer_pairs})}
    desc = f"invariant{' placebo' if placebo else ''} null"
    with progress_bar(len(KINDS) * len(layer_pairs), desc, "layer pair") as bar:
        for j, writer_layers in writers_of.items():
            k = min(d_head, fr[j].rank)
            for kind in KINDS:
                r_out = fr[j + 1 if kind == "V" else j].rank
                if fr[j].rank == 0 or r_out == 0:
                    bar.update(len(writer_layers))
                    continue
                readers = _readers(*(x.to(device) for x in _reader_factors(hw, fr, j, kind)), k)
                for i in writer_layers:
                    if fr[i].rank > 0:
                        W_V, W_O = (fr[i].R @ hw.W_V[i]).to(device), (hw.W_O[i] @ fr[j].R_pinv).to(device)
                        writers = _writers(W_V, W_O, k)
                        t = out[kind]
                        t["score"][i, :, j] = _pair_scores(
                            writers, readers
                        ).cpu()  # .cpu(): a no-op on the CPU
                        null_mean, null_std = _null(writers, readers, blocks[fr[j].rank])
                        t["null_mean"][i, :, j], t["null_std"][i, :, j] = null_mean.cpu(), null_std.cpu()
                        base = baselines[(fr[i].rank, fr[j].rank, r_out)]
                        t["baseline_mean"][i, :, j], t["baseline_std"][i, :, j] = base
                    bar.update()

    return raw_scores_table({(kind,): PairStats(**out[kind]) for kind in KINDS}, COLUMNS, placebo)
