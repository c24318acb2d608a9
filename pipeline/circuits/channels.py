"""Composition resolved into channels: each pair's true score split exactly into non-negative
shares, one per (writer channel, reader channel), a channel being a block of singular directions
with (near-)equal singular values, and what the errata's rotated strand does instead. Maths only,
no I/O; float64 in, float64 out.

Row vectors, as stored (docs/design.md, "Maths conventions"). A head circuit M [d_model, d_model]
is a product X Y^T of two [d_model, d_head] factors; a row vector x of the residual stream
goes to x M. Its SVD, M = sum_i s_i r_i w_i^T (r_i, w_i orthonormal, s descending), says what it
does: it *reads* x along r_i and *writes* s_i (x . r_i) along w_i. The circuits:

    writer a    OV^a = W_V^a W_O^a      X = W_V^a, Y = W_O^aT     reads: values' input; writes: output
    reader b    Q: QK^b  = W_Q^b W_K^bT   X = W_Q^b, Y = W_K^b    reads the residual: the queries' input
                K: QK^bT = W_K^b W_Q^bT   X = W_K^b, Y = W_Q^b    reads the residual: the keys' input
                V: OV^b  = W_V^b W_O^b    X = W_V^b, Y = W_O^bT   reads the residual: the values' input

Orientation. Each kind's numerator is ||OV^a N^b|| with N^b the reader's circuit above
(Q: ||OV^a QK^b||, K: ||OV^a QK^bT||, V: ||OV^a OV^b||), equal to the paper's ||A B C D||
(`composition`'s table: A B C D = (OV^a N^b)^T). With OV^a = sum_i s_i r_i w_i^T (the writer)
and N^b = sum_j t_j k_j m_j^T (the reader; k_j the directions it reads the residual along),

    OV^a N^b = sum_{i,j} s_i t_j (w_i . k_j) r_i m_j^T

and the rank-one matrices r_i m_j^T are orthonormal in the Frobenius inner product (the r_i
are, and so are the m_j), so by Pythagoras

    ||OV^a N^b||^2 = sum_{i,j} s_i^2 t_j^2 (w_i . k_j)^2                       (exact)

So the writer's OUTPUT singular vectors w_i (the right ones of OV^a: the residual directions
it writes) meet the reader's LEFT singular vectors k_j (the residual directions it reads): for
Q the queries' input (left singular vectors of QK^b), for K the keys' input (the right singular
vectors of QK^b, i.e. the left ones of QK^bT), for V the values' input (left singular vectors
of OV^b). Share (i, j) of pair (a, b) is s_i^2 t_j^2 (w_i . k_j)^2; they sum to the squared
true numerator, and sqrt(sum) / (||s|| ||t||) is the true score (||OV^a|| = ||s||, ||N^b|| =
||t||). Directions are indexed by descending singular value (i = 0: the writer's strongest).

Small space. Each circuit's SVD comes from its factors: X = Q_X R_X, Y = Q_Y R_Y (QR, Q's
columns orthonormal, R [r, d_head], r = min(d_model, d_head)), then the core R_X R_Y^T = U S V^T
[r, r]: M = (Q_X U) S (Q_Y V)^T. That is one [d_model, d_head] QR per factor and head, one
d_head x d_head SVD per head; per pair only the cross Gram matrix W_a^T K_b [d_head, d_head]
(one GEMM over d_model). No d_model x d_model matrix is ever formed.

What is unique. The shares are functions of OV^a and N^b alone (through their SVDs), so they
are unchanged by a rotation of the residual stream (every W_Q, W_K, W_V -> R W, W_O -> W_O R^T,
R orthogonal: singular vectors -> R times them, crosses unchanged) and by any invertible change
of a head's d_head basis that keeps its circuits (W_Q -> W_Q G, W_K -> W_K G^-T; W_V -> W_V G,
W_O -> G^-1 W_O). Singular vectors are unique up to sign when the singular values are distinct,
and the shares square the signs away: the per-direction table is then unchanged entry by entry.
Within a set of equal singular values the directions are arbitrary (any orthonormal basis of
their subspace is an SVD), and so is each direction's share: two directions of s = 1, 1 meeting
two of t = 1, 1 come out as two shares of 0.5 or as any cos^2/2, sin^2/2 mix over the four
entries. Nearly equal values are nearly as arbitrary: a change of the weights of the size of
their gap turns the directions within their subspace. Hence the blocks.

Blocks (`spectral_blocks`). A circuit's directions split into blocks of consecutive indices by
the rule: with s_0 >= s_1 >= .. (its singular values) and tol = analysis.composition.
channel_tolerance, directions i and i + 1 are in one block when

    s_i - s_{i+1} <= tol * s_i          (both nonzero)

and blocks chain: a run of such steps is one block, whatever its total span (a block of n
directions has s_min >= (1 - tol)^(n-1) s_max). Values zero up to rounding (s_i <= ZERO_RTOL s_0,
or every value when s_0 = 0) form one block of their own and never join a nonzero one; their
directions carry shares of 0 up to rounding. tol = 0 joins exactly equal values only. A block is
named by its first (strongest) direction and has a size, its number of directions.

A channel is a writer block A x a reader block B; its share is the sum of the per-direction
shares over the pair of blocks (`block_sums`),

    share(A, B) = sum_{i in A, j in B} s_i^2 t_j^2 (w_i . k_j)^2 = ||P_A OV^a N^b Q_B||^2

(P_A = sum_{i in A} r_i r_i^T, Q_B = sum_{j in B} m_j m_j^T: projectors onto the blocks' own
subspaces), and the block shares of a pair still sum to its squared numerator. When the values
within each block are equal (s_A on A, t_B on B) the share is s_A^2 t_B^2 ||W_A^T K_B||^2 (W_A
the block's output directions [d_model, n_A], K_B the reader block's input directions): exactly
invariant under any orthonormal basis of either block's subspace, W_A -> W_A G, K_B -> K_B H.
When they are only near-equal it is near-invariant: for any orthonormal bases of the same
subspaces the share lies between s_min^2 t_min^2 ||W_A^T K_B||^2 and s_max^2 t_max^2
||W_A^T K_B||^2 (min and max over the two blocks), so another basis moves it by at most a factor
(s_max t_max / (s_min t_min))^2 <= (1 - tol)^(-2 (n_A + n_B - 2)); the subspaces themselves are
defined, being separated from the rest of the spectrum by gaps > tol * s. Blocks of one direction
each (distinct values) give the per-direction shares unchanged.

Per pair: the top channel is the block pair of the largest share (the first in order of the
blocks' first directions among equal ones), the top share its fraction of the total, the
effective number of channels 1 / sum p^2 over the block shares p. channels.csv names the top
channel by the blocks' first directions (writer_channel, reader_channel) and sizes (writer_block,
reader_block). channels.safetensors holds, per pair, the block shares spread evenly over their
cells (`spread`: cell (i, j) = share(A, B) / (n_A n_B), A and B the blocks of i and j): a
[d_head, d_head] table over directions that sums to 1, whose cells in a block pair sum to its
share, as invariant as the block shares are; the channel figure draws it. The channel ablation
(pipeline/behaviour/ablation.py) cuts the whole block pair.

The errata's rotation (K only; `rotated_channels`). In paper letters A = W_Q^b, B = W_K^bT,
C = W_O^aT, D = W_V^aT, Y = B C, X = D A, and

    ||B C D A|| = ||Y X|| = ||W_Q^bT OV^a W_K^b||

The reader's two factors land on opposite sides of the writer: the writer's OUTPUT meets the
keys (W_K^b), as in the true score, but its INPUT (what its values read) meets the QUERIES
(W_Q^b). With Gamma_Q = W_Q^b W_Q^bT and Gamma_K = W_K^b W_K^bT (residual-stream Gram matrices),

    ||B C D A||^2 = sum_{i,i'} s_i s_i' (r_i^T Gamma_Q r_i') (w_i^T Gamma_K w_i')

so it does NOT split into non-negative (writer channel, reader channel) shares: writer channels
interfere through the off-diagonal terms, which have either sign (`writer_interaction`, whose
diagonal is >= 0 and whose off-diagonal is not), and there is no reader-channel axis at all,
because QK^b is broken apart: Gamma_Q and Gamma_K change with the reader's d_head basis
(W_Q -> W_Q G, W_K -> W_K G^-T keeps QK^b but not them), and so does ||B C D A||, while no
function of QK^b does. It does split over the reader's *factors*: with W_Q^b = sum_m sigma_m q_m
e_m^T and W_K^b = sum_n kappa_n k_n f_n^T (their own SVDs; e, f orthonormal in d_head),

    ||B C D A||^2 = sum_{m,n} sigma_m^2 kappa_n^2 (q_m^T OV^a k_n)^2              (exact, >= 0)

(query-input direction m x key-input direction n), by the same Pythagoras, but these
channels belong to W_Q^b and W_K^b separately, not to the circuit QK^b.

The errata's reading, "the induction head's query is built from the same subspace that the
previous token head moved data into", as a statistic. Both numerators share the writer's
output read by the keys, M = OV^a W_K^b [d_model, d_head], and differ only in where the query's
gain is taken:

    true^2    = ||OV^a W_K^b W_Q^bT||^2 = <W_Q^bT W_Q^b, M^T M> = ||M||^2 gain_true
    rotated^2 = ||W_Q^bT OV^a W_K^b||^2 = <Gamma_Q,    M M^T> = ||M||^2 alignment gain_rotated

    alignment     = tr(P_Q M M^T) / tr(M M^T)        P_Q the projector onto span(W_Q^b)
    gain_true     = <W_Q^bT W_Q^b, M^T M> / ||M||^2   the query's gain in head space
    gain_rotated  = <Gamma_Q, M M^T> / tr(P_Q M M^T)  the query's gain within its input span

`alignment` is the share of the writer's value-input directions (the residual directions
a reads, the subspace it moves data out of, column space of M M^T <= span W_V^a), each weighted
as the rotated product weights it (by s_i^2 and by how strongly that channel's output reaches
the keys), that lies in the span of the reader's query-input directions: in [0, 1], about
d_head / d_model for random heads, 1 when the writer reads where the reader's queries read.
Both gains lie in [sigma_min^2, sigma_max^2] of W_Q^b (its nonzero singular values) and are
equal when W_Q^b's singular values are; anisotropy = gain_rotated / gain_true. Exactly,

    rotated^2 / true^2 = alignment * anisotropy
    log(errata_bcda_trueden / true) = 1/2 log(alignment) + 1/2 log(anisotropy)

So query alignment never creates excess: alignment <= 1, and the rotated score is the true
score *filtered* by how much of what the writer reads is what the reader's queries read (the
errata: it "very strongly responds to it while filtering out other kinds of composition").
The rotated score's excess over the true one (true denominators) comes only from the query's
anisotropy (at most cond(W_Q^b)^2 in the ratio of squares) and, for `errata_bcda`, from the
rotated denominators ||A B|| ||C D|| / (||B A|| ||D C||), which are each head's own geometry, not
the pair's. (The writer's OUTPUT lying in the query span is not what B C D A weighs: the
writer's output meets only the keys there; output-meets-query is Q-composition's numerator.
D A B C = ||W_V^aT QK^b W_O^aT|| is the mirror image: the writer's factors split around QK^b.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import streams
from ..cli import progress_bar
from ..config import CompositionConfig
from ..tables import CHANNEL_STATISTICS, CHANNELS_COLUMNS, KINDS, SIGNIFICANCE_COLUMNS
from . import significance
from .scoring import PAIR_COLUMNS, ZERO_RTOL, haar_blocks, later_pairs
from .weights import HeadWeights

# --- one circuit's SVD from its factors ------------------------------------------------


@dataclass(frozen=True)
class CircuitSVD:
    """M = reads diag(s) writes^T for a circuit M = X Y^T [.., d_model, d_model]: x M writes
    s_i (x . reads_i) along writes_i. Columns orthonormal (zero columns where d_model < d_head)."""

    reads: Tensor  # [.., d_model, d_head]
    s: Tensor  # [.., d_head], descending
    writes: Tensor  # [.., d_model, d_head]


def circuit_svd(X: Tensor, Y: Tensor) -> CircuitSVD:
    """The SVD of M = X Y^T, X, Y [.., d_model, d_head], in the small space: QR of each factor,
    then the SVD of the [r, r] core R_X R_Y^T (r = min(d_model, d_head)); padded to d_head."""
    d_head = X.shape[-1]
    Q_X, R_X = torch.linalg.qr(X)  # [.., d_model, r], [.., r, d_head]
    Q_Y, R_Y = torch.linalg.qr(Y)
    U, s, Vh = torch.linalg.svd(R_X @ R_Y.mT)  # core [.., r, r]
    reads, writes, pad = Q_X @ U, Q_Y @ Vh.mT, d_head - s.shape[-1]  # [.., d_model, r]
    if pad:  # d_model < d_head: the missing channels have s = 0 (and so share 0)
        reads, writes = (torch.nn.functional.pad(v, (0, pad)) for v in (reads, writes))
        s = torch.nn.functional.pad(s, (0, pad))
    return CircuitSVD(reads, s, writes)


def writer_circuit(hw: HeadWeights) -> CircuitSVD:
    """OV^a = W_V^a W_O^a of every head, [L, H, ..]."""
    return circuit_svd(hw.W_V, hw.W_O.mT)


def reader_circuit(hw: HeadWeights, kind: str) -> CircuitSVD:
    """Every head's circuit N^b with numerator ||OV^a N^b||, [L, H, ..]; its `reads` are the
    residual directions that meet the writer's `writes` (module doc, "Orientation")."""
    if kind == "Q":
        return circuit_svd(hw.W_Q, hw.W_K)  # QK^b = W_Q W_K^T: the queries read the residual
    if kind == "K":
        return circuit_svd(hw.W_K, hw.W_Q)  # QK^bT = W_K W_Q^T: the keys read the residual
    if kind == "V":
        return circuit_svd(hw.W_V, hw.W_O.mT)  # OV^b = W_V W_O: the values read the residual
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


# --- the shares of every pair ------------------------------------------------------------


@dataclass(frozen=True)
class Channels:
    """One kind's shares of every pair and the singular values they were built from."""

    shares: Tensor  # [L, H, L, H, d_head, d_head]: s_i^2 t_j^2 (w_i . k_j)^2; NaN unless dst > src layer
    s: Tensor  # [L, H, d_head]: the writers' singular values (OV^a)
    t: Tensor  # [L, H, d_head]: the readers' singular values (N^b of this kind)

    def scores(self) -> Tensor:
        """The true scores [L, H, L, H]: sqrt(sum of shares) / (||OV^a|| ||N^b||)."""
        den = torch.linalg.vector_norm(self.s, dim=-1)[:, :, None, None] * torch.linalg.vector_norm(
            self.t, dim=-1
        )  # [L, H, L, H]
        return self.shares.sum((-2, -1)).sqrt() / den

    def normalised(self) -> Tensor:
        """`normalised(shares)`, and NaN also where the score is zero up to rounding
        (<= scoring.ZERO_RTOL): its shares are then rounding, not channels."""
        zero = self.scores() <= ZERO_RTOL
        return normalised(self.shares).masked_fill(zero[..., None, None], torch.nan)


def channels(hw: HeadWeights, kind: str) -> Channels:
    """The shares of every later pair for one kind, computed in the small space (module doc).

    Not rescaled: the shares carry the weights' units (their sum is the squared numerator,
    a product of eight weight matrices' entries), in the dtype of `hw` (use float64). The table
    holds (L H d_head)^2 numbers: 85M (680 MB in float64) at GPT-2-small sizes."""
    L, H, d = hw.n_layers, hw.n_heads, hw.d_head
    writer, reader = writer_circuit(hw), reader_circuit(hw, kind)
    shares = torch.full((L, H, L, H, d, d), torch.nan, dtype=hw.W_Q.dtype)
    for i in range(L - 1):
        # the writers of layer i against every reader of layers i+1.. : one GEMM over d_model
        cross = torch.einsum("ani,lbnj->albij", writer.writes[i], reader.reads[i + 1 :])  # [H, L', H, d, d]
        weighted = writer.s[i][:, None, None, :, None] * cross * reader.s[i + 1 :][None, :, :, None, :]
        shares[i, :, i + 1 :] = weighted.square()
    return Channels(shares, writer.s, reader.s)


def channel_shares(hw: HeadWeights, kind: str) -> Tensor:
    """[L, H, L, H, d_head, d_head]: share (i, j) of pair (a, b) is s_i^2 t_j^2 (w_i . k_j)^2,
    writer channel i x reader channel j; they sum to the squared true numerator ||OV^a N^b||^2.
    NaN for the pairs that are not later pairs (dst layer <= src layer)."""
    return channels(hw, kind).shares


def normalised(shares: Tensor) -> Tensor:
    """Each pair's shares divided by their sum (summing to 1); NaN where the sum is 0 or NaN."""
    total = shares.sum((-2, -1), keepdim=True)
    return shares / torch.where(total > 0, total, torch.nan)


# --- blocks of near-equal singular values (module doc, "Blocks") -------------------------------


def spectral_blocks(s: Tensor, tol: float) -> Tensor:
    """[.., d] int64: each direction's block, named by the index of its first (strongest)
    direction, for singular values s [.., d] in descending order (module doc, "Blocks"): i + 1
    joins i's block when s_i - s_{i+1} <= tol s_i, both nonzero; the values zero up to rounding
    (<= ZERO_RTOL s_0) form one block of their own."""
    first = torch.arange(s.shape[-1], device=s.device)
    # zero by the circuit's own scale: the small-space SVD gives a rank-deficient circuit values of
    # rounding size, whose relative steps would split them into blocks at random
    zero = s <= ZERO_RTOL * s[..., :1]  # [.., d]: a suffix (s descending)
    near = s[..., :-1] - s[..., 1:] <= tol * s[..., :-1]  # [.., d - 1]: step i -> i + 1
    joined = torch.where(zero[..., 1:], zero[..., :-1], near)  # a zero value joins zeros only
    starts = torch.cat([torch.ones_like(zero[..., :1]), ~joined], -1)  # [.., d]
    return torch.where(starts, first, 0).cummax(-1).values  # the last start at or before each i


def block_sizes(blocks: Tensor) -> Tensor:
    """[.., d]: the size of each direction's block (`spectral_blocks`' labels [.., d])."""
    return (blocks[..., :, None] == blocks[..., None, :]).sum(-1)


def _indicator(blocks: Tensor, dtype: torch.dtype) -> Tensor:
    """[.., d (direction), d (block)]: 1 where the direction lies in the block named by that index."""
    return (blocks[..., :, None] == torch.arange(blocks.shape[-1], device=blocks.device)).to(dtype)


def block_sums(table: Tensor, writer_blocks: Tensor, reader_blocks: Tensor) -> Tensor:
    """table [n, .., d, d] summed over block pairs: entry (a, b) holds the sum over writer block a
    x reader block b (blocks named by their first direction; `writer_blocks`, `reader_blocks`
    [n, d] label each of the n tables' directions), every other entry 0. A pair whose blocks all
    have one direction keeps its table bit for bit (and the table itself is returned when none
    has a larger block)."""
    d = table.shape[-1]
    first = torch.arange(d, device=table.device)
    merged = (writer_blocks != first).any(-1) | (reader_blocks != first).any(-1)  # [n]
    if not bool(merged.any()):
        return table
    k, middle = int(merged.sum()), (1,) * (table.ndim - 3)  # the draws of the null, if any, broadcast
    E_w = _indicator(writer_blocks[merged], table.dtype).view(k, *middle, d, d)  # [k, .., d, d]
    E_r = _indicator(reader_blocks[merged], table.dtype).view(k, *middle, d, d)
    out = table.clone()
    out[merged] = E_w.mT @ table[merged] @ E_r  # exact 0 / 1 weights: sums, and zeros off the starts
    return out


def spread(table: Tensor, writer_blocks: Tensor, reader_blocks: Tensor) -> Tensor:
    """[n, d, d]: block sums (`block_sums`' layout) spread evenly over each block pair's cells:
    cell (i, j) = table[A, B] / (n_A n_B), A and B the blocks of writer direction i and reader
    direction j. Blocks of one direction each: the table unchanged."""
    n, d = table.shape[0], table.shape[-1]
    rows = table.gather(-2, writer_blocks[:, :, None].expand(n, d, d))  # [n, i, d]: row A(i)
    cells = rows.gather(-1, reader_blocks[:, None, :].expand(n, d, d))  # [n, i, j]: entry (A(i), B(j))
    sizes = block_sizes(writer_blocks)[:, :, None] * block_sizes(reader_blocks)[:, None, :]
    return cells / sizes.to(table.dtype)


def channel_summary(shares: Tensor, s: Tensor, t: Tensor, tol: float) -> pd.DataFrame:
    """One row per later pair (scoring.later_pairs' order): its top channel, the writer block x
    reader block of the largest share (writer_channel, reader_channel: the blocks' first
    directions; writer_block, reader_block: their sizes), that channel's share of the total
    (top_share) and the effective number of channels 1 / sum(p^2), p the normalised block shares
    (1 for one channel, n for n equal ones). `shares`: raw or normalised per-direction shares
    [L, H, L, H, d_head, d_head]; `s`, `t` [L, H, d_head]: the writers' and readers' singular
    values (`Channels.s`, `.t`), blocked at `tol` (`spectral_blocks`). A pair whose shares are NaN
    (or all zero) gets NaN and <NA> channels (pass `Channels.normalised()` to treat a score that
    is zero up to rounding so)."""
    pairs = later_pairs(shares.shape[0], shares.shape[1])
    i, h, j, g = pairs
    writer_blocks, reader_blocks = spectral_blocks(s.cpu()[i, h], tol), spectral_blocks(t.cpu()[j, g], tol)
    p = normalised(shares.cpu())[i, h, j, g]  # [pairs, d_head, d_head]
    return _summary_rows(block_sums(p, writer_blocks, reader_blocks), writer_blocks, reader_blocks, pairs)


# --- the errata's rotation, one K pair ------------------------------------------------------


@dataclass(frozen=True)
class Rotated:
    """B C D A of one K pair against the true A B C D (module doc, "The errata's rotation")."""

    true_sq: Tensor  # [..]: ||A B C D||^2 = ||OV^a W_K^b W_Q^bT||^2
    rotated_sq: Tensor  # [..]: ||B C D A||^2 = ||W_Q^bT OV^a W_K^b||^2
    shares: Tensor  # [.., d_head, d_head]: sigma_m^2 kappa_n^2 (q_m . OV^a k_n)^2, sum rotated_sq
    writer_interaction: Tensor  # [.., d_head, d_head]: signed (writer channel i, i'), sum rotated_sq
    alignment: Tensor  # [..]: tr(P_Q M M^T) / tr(M M^T), M = OV^a W_K^b, in [0, 1]
    gain_true: Tensor  # [..]: <W_Q^T W_Q, M^T M> / ||M||^2
    gain_rotated: Tensor  # [..]: <W_Q W_Q^T, M M^T> / tr(P_Q M M^T)

    @property
    def anisotropy(self) -> Tensor:
        """gain_rotated / gain_true: rotated_sq / true_sq = alignment * anisotropy."""
        return self.gain_rotated / self.gain_true


def rotated_channels(W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor) -> Rotated:
    """The errata's B C D A for the K-composition of writer a (W_V [.., d_model, d_head],
    W_O [.., d_head, d_model]) into reader b (W_Q, W_K [.., d_model, d_head]), in the small
    space: the writer's SVD, each reader factor's own SVD, and d_head x d_head crosses.
    P_Q projects onto W_Q's singular directions with sigma > scoring.ZERO_RTOL sigma_max (its
    span). When what the writer reads misses that span, alignment is 0 and gain_rotated a ratio
    of roundings (anisotropy with it); when M = OV^a W_K^b = 0 (the writer's output never reaches
    the keys) alignment and both gains are 0 / 0."""
    writer = circuit_svd(W_V, W_O.mT)  # OV^a = R diag(s) W^T: reads R, writes W
    eye = torch.eye(W_Q.shape[-1], dtype=W_Q.dtype)
    query = circuit_svd(W_Q, eye)  # W_Q = q diag(sigma) e^T  (q: reads, e: writes)
    key = circuit_svd(W_K, eye)  # W_K = k diag(kappa) f^T
    s = writer.s[..., :, None]  # [.., d_head (i), 1]
    q_R = query.reads.mT @ writer.reads  # q_m . r_i  [.., d_head (m), d_head (i)]
    W_k = writer.writes.mT @ key.reads  # w_i . k_n  [.., d_head (i), d_head (n)]
    shares = (query.s[..., :, None] * (q_R @ (s * W_k)) * key.s[..., None, :]).square()  # [.., m, n]
    # M = OV^a W_K = R M_R with M_R = diag(s) W^T W_K [.., d_head (i), d_head]: R only rotates
    M_R = s * (writer.writes.mT @ W_K)
    in_span = (query.s > ZERO_RTOL * query.s[..., :1]).to(W_Q.dtype)[..., :, None]  # [.., m, 1]
    trace_M = M_R.square().sum((-2, -1))  # tr(M M^T) = ||M||^2
    trace_PM = ((in_span * q_R) @ M_R).square().sum((-2, -1))  # tr(P_Q M M^T), P_Q = q q^T on the span
    true_sq = (M_R @ query.writes * query.s[..., None, :]).square().sum((-2, -1))  # W_Q^T W_Q = e S^2 e^T
    rotated_sq = shares.sum((-2, -1))
    gram_Q = q_R.mT @ (query.s[..., :, None].square() * q_R)  # R^T Gamma_Q R  [.., i, i']
    gram_K = W_k @ (key.s[..., :, None].square() * W_k.mT)  # W^T Gamma_K W  [.., i, i']
    return Rotated(
        true_sq=true_sq,
        rotated_sq=rotated_sq,
        shares=shares,
        writer_interaction=s * s.mT * gram_Q * gram_K,
        alignment=trace_PM / trace_M,
        gain_true=true_sq / trace_M,
        gain_rotated=rotated_sq / trace_PM,
    )


# --- calibrated channel discoveries ------------------------------------------------------
#
# "This pair composes mainly through one channel", decided like a whole-pair discovery
# (pipeline/circuits/significance.py). The statistic is the top channel's share of the pair's
# corrected score (the top block pair's, module doc "Blocks"). How large it is by chance depends
# on the two heads' spectra (a writer with one dominant singular value gives a large top share
# whatever it meets), so its raw z is taken against the pair's own null: the reader rotated by a
# Haar-random R of the residual stream, which
# keeps both circuits and moves only how their channels meet. The crosses w_i . k_j then become
# W^T R K, distributed as the top-left d_head x d_head block of a Haar matrix (W, K with
# orthonormal columns), so one set of draws serves every pair and kind (`top_share_null`; each
# draw's shares summed over the pair's blocks, which the rotation keeps):
#
#     z = (ln top_share - mean_R ln top_share) / sd_R ln top_share
#
# on the log scale: the top share is a maximum, and its null is skewed to the right (skewness
# 1.3-1.8 over untrained models' pairs; 0.4-0.6 after the log), a tail the placebo pairs' exponential
# fit underrates: with the share itself, 3 of 9 untrained (seed, kind) families of the text shape
# had a discovery, none with its log.
#
# Then the placebo pairs' z (pairs that cannot compose) give each kind's centre, scale and tail,
# and Benjamini-Hochberg runs over the kind's pairs whose whole corrected score is a discovery:
# a pair that does not compose has no channel discoveries, and is not counted in the family
# (`measured_channels`). The placebo pairs are tested the same way, leave one block out, every
# one of them (not only the discovered: none are), so their discoveries are false ones.


def pair_shares(writer: CircuitSVD, reader: CircuitSVD, pairs: tuple[Tensor, ...]) -> Tensor:
    """[n, d_head, d_head]: the shares s_i^2 t_j^2 (w_i . k_j)^2 of n pairs (src_layer, src_head,
    dst_layer, dst_head: four index arrays), any pairs, later or not."""
    i, h, j, g = (torch.as_tensor(x) for x in pairs)
    out = torch.empty(len(i), *writer.s.shape[-1:] * 2, dtype=writer.s.dtype, device=writer.s.device)
    step = max(1, _CROSS_CHUNK // (writer.writes.shape[-2] * writer.writes.shape[-1]))
    for a in range(0, len(i), step):
        at = slice(a, a + step)
        cross = writer.writes[i[at], h[at]].mT @ reader.reads[j[at], g[at]]  # [n, d_head (i), d_head (j)]
        out[at] = (writer.s[i[at], h[at]][:, :, None] * cross * reader.s[j[at], g[at]][:, None, :]).square()
    return out


_CROSS_CHUNK = 2**24  # elements of the gathered singular vectors held at once (128 MB in float64)
_NULL_CHUNK = 2**22  # elements of one [pairs, draws, d_head, d_head] block of the channel null


def channel_blocks(n: int, d_model: int, d_head: int, gen: torch.Generator) -> Tensor:
    """n draws [n, d_head, d_head] of the crosses W^T R K under a Haar rotation R (module comment
    above): top-left blocks of Haar matrices, zero-padded where d_model < d_head (those channels
    have s = 0 anyway)."""
    k = min(d_model, d_head)
    blocks = haar_blocks(n, d_model, k, gen)  # [n, k, k]
    return torch.nn.functional.pad(blocks, (0, d_head - k, 0, d_head - k))


def top_share(shares: Tensor) -> Tensor:
    """[..]: the largest of each [.., d_head, d_head] table's shares over their sum (NaN for 0 / 0)."""
    return shares.flatten(-2).amax(-1) / shares.sum((-2, -1))


def top_share_null(s: Tensor, t: Tensor, rotations: Tensor, tol: float) -> tuple[Tensor, Tensor]:
    """(mean, sd) [n] of the log top share of n pairs (writer singular values s [n, d_head], reader's
    t [n, d_head]) over the rotation draws `rotations` [draws, d_head, d_head] (`channel_blocks`),
    each draw's shares summed over the pair's blocks at `tol` as the pair's own are (a rotation
    keeps both spectra, so the blocks too)."""
    n, draws, d = s.shape[0], rotations.shape[0], s.shape[-1]
    writer_blocks, reader_blocks = spectral_blocks(s, tol), spectral_blocks(t, tol)  # [n, d]
    mean = torch.empty(n, dtype=s.dtype, device=s.device)
    sd = torch.empty_like(mean)
    step = max(1, _NULL_CHUNK // (draws * d * d))
    for a in range(0, n, step):
        at = slice(a, a + step)
        shares = (s[at, None, :, None] * rotations * t[at, None, None, :]).square()  # [m, draws, d, d]
        tops = top_share(block_sums(shares, writer_blocks[at], reader_blocks[at])).log()  # [m, draws]
        mean[at], sd[at] = tops.mean(-1), tops.std(-1)
    return mean, sd


def rotation_statistics(hw: HeadWeights, pairs: tuple[Tensor, ...]) -> dict[str, Tensor]:
    """K pairs' errata statistics [n] (module doc, "The errata's reading"): alignment and
    anisotropy (rotated^2 / true^2 = alignment x anisotropy, `rotated_channels`), the share of the
    writer's output (its channels weighted by s_i^2) inside the span of the reader's query input,
    output_query_share, and its chance value under a rotation of the writer, query_chance =
    rank(W_Q^b) / d_model."""
    i, h, j, g = (torch.as_tensor(x) for x in pairs)
    W_Q, W_K, W_V, W_O = hw.W_Q[j, g], hw.W_K[j, g], hw.W_V[i, h], hw.W_O[i, h]  # [n, d_model, d_head]..
    rotated = rotated_channels(W_Q, W_K, W_V, W_O)
    writer = circuit_svd(W_V, W_O.mT)
    query = circuit_svd(W_Q, torch.eye(hw.d_head, dtype=W_Q.dtype, device=W_Q.device))
    in_span = query.s > ZERO_RTOL * query.s[..., :1]  # [n, d_head]: W_Q's span
    q_w = (query.reads.mT @ writer.writes).square() * in_span[..., :, None]  # (q_m . w_i)^2 [n, m, i]
    s2 = writer.s.square()
    return {
        "alignment": rotated.alignment,
        "anisotropy": rotated.anisotropy,
        "output_query_share": (q_w.sum(-2) * s2).sum(-1) / s2.sum(-1),
        "query_chance": in_span.sum(-1).to(W_Q.dtype) / hw.d_model,
    }


def channel_rows(
    hw: HeadWeights, rotations: Tensor, tol: float, placebo: bool = False
) -> tuple[pd.DataFrame, dict[str, Tensor]]:
    """Uncalibrated channels.csv rows of every kind (KINDS order; pairs in `scoring.later_pairs`
    order, or `placebo_pairs'`), channels blocked at `tol`, the null over the Haar draws
    `rotations` (`channel_blocks`); and each kind's normalised block shares spread over their cells
    (`spread`) [n_pairs, d_head, d_head]."""
    from .scoring import placebo_pairs  # the pair lists live with the scores

    pairs = (placebo_pairs if placebo else later_pairs)(hw.n_layers, hw.n_heads)
    index = tuple(torch.as_tensor(x) for x in pairs)
    writer = writer_circuit(hw)
    parts, tables = [], {}
    with progress_bar(len(KINDS), f"channels{' placebo' if placebo else ''} null", "kind") as bar:
        for kind in KINDS:
            reader = reader_circuit(hw, kind)
            shares = pair_shares(writer, reader, index)  # [n, d_head, d_head]
            i, h, j, g = index
            s, t = writer.s[i, h], reader.s[j, g]  # [n, d_head]
            null_mean, null_sd = top_share_null(s, t, rotations, tol)
            norms = torch.linalg.vector_norm(s, dim=-1) * torch.linalg.vector_norm(t, dim=-1)
            scores = shares.sum((-2, -1)).sqrt() / norms  # the true scores [n]
            p = normalised(shares).masked_fill((scores <= ZERO_RTOL)[:, None, None], torch.nan)
            writer_blocks, reader_blocks = spectral_blocks(s, tol), spectral_blocks(t, tol)
            p = block_sums(p, writer_blocks, reader_blocks)  # [n, d_head, d_head], at the blocks' starts
            tables[kind] = spread(p, writer_blocks, reader_blocks)
            frame = _summary_rows(p.cpu(), writer_blocks.cpu(), reader_blocks.cpu(), pairs)
            top, mean, sd = (x.cpu().numpy() for x in (top_share(p).log(), null_mean, null_sd))
            with np.errstate(invalid="ignore", divide="ignore"):
                z = np.where(sd > 0, (top - mean) / sd, np.nan)
            stats = {c: np.nan for c in CHANNEL_STATISTICS}
            if kind == "K" and not placebo:
                stats = {c: v.cpu().numpy() for c, v in rotation_statistics(hw, index).items()}
            parts.append(frame.assign(kind=kind, null_mean=mean, null_std=sd, z=z, **stats))
            bar.update()
    return pd.concat(parts, ignore_index=True), tables


def _summary_rows(
    p: Tensor, writer_blocks: Tensor, reader_blocks: Tensor, pairs: tuple[np.ndarray, ...]
) -> pd.DataFrame:
    """`channel_summary`'s columns from normalised block shares p [n, d_head, d_head] of `pairs`
    (`block_sums`' layout: 0 off the blocks' first directions), their blocks [n, d_head]."""
    i, h, j, g = pairs
    d = p.shape[-1]
    flat = p.reshape(len(i), d * d)  # [pairs, d_head^2]
    defined = ~flat.isnan().any(-1)
    top_share_, top = flat.nan_to_num(-1.0).max(-1)  # first of equal maxima
    writer, reader = top // d, top % d  # the top block pair's first directions [pairs]
    writer_size = block_sizes(writer_blocks).gather(-1, writer[:, None])[:, 0]  # [pairs]
    reader_size = block_sizes(reader_blocks).gather(-1, reader[:, None])[:, 0]

    def channel(index: Tensor) -> pd.arrays.IntegerArray:
        out = pd.array(index.numpy(), dtype="Int64")
        out[~defined.numpy()] = pd.NA
        return out

    return pd.DataFrame(
        {
            "src_layer": i, "src_head": h, "dst_layer": j, "dst_head": g,
            "writer_channel": channel(writer), "reader_channel": channel(reader),
            "writer_block": channel(writer_size), "reader_block": channel(reader_size),
            "top_share": top_share_.where(defined, torch.nan).numpy(),
            "effective_channels": (1 / flat.square().sum(-1)).numpy(),
        }
    )  # fmt: skip


def measured_channels(
    hw: HeadWeights, scores: pd.DataFrame, cfg: CompositionConfig, seed: int, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Tensor]]:
    """(channels.csv, the placebo pairs' rows, each kind's normalised shares [n_pairs, d_head,
    d_head] on the CPU in float32): every later pair's channel table summarised and its channel
    discovery at `cfg.fdr` (module comment above), channels blocked at `cfg.channel_tolerance`.
    `scores`: the composition stage's calibrated scores (its variant "true" rows give
    pair_discovery); `cfg.null_samples` rotation draws."""
    hw = hw.to(torch.float64).to(device)
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "channels.null"))
    rotations = channel_blocks(cfg.null_samples, hw.d_model, hw.d_head, gen).to(device)
    later, tables = channel_rows(hw, rotations, cfg.channel_tolerance)
    placebo, _ = channel_rows(hw, rotations, cfg.channel_tolerance, placebo=True)
    true = scores[scores["variant"] == "true"].set_index(["kind", *PAIR_COLUMNS])["discovery"]
    keys = pd.MultiIndex.from_frame(later[["kind", *PAIR_COLUMNS]])
    later["pair_discovery"] = true.reindex(keys).to_numpy(dtype=bool, na_value=False)
    later, placebo = calibrate_channels(later, placebo, cfg.fdr, later["pair_discovery"].to_numpy())
    order = list(CHANNELS_COLUMNS)
    return later[order], placebo[order], {k: v.to("cpu", torch.float32) for k, v in tables.items()}


def calibrate_channels(
    later: pd.DataFrame, placebo: pd.DataFrame, fdr: float, tested: np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(later, placebo) `channel_rows` with SIGNIFICANCE_COLUMNS: the `tested` rows of `later`
    (a bool mask; the stage's: the whole-pair discoveries) against their kind's placebo null, BH
    over them per kind; the rest untested (NaN p, no discovery). The placebo rows all tested,
    each block against the others' null (`significance.calibrate`). Also pair_discovery = False
    on the placebo rows (they cannot compose)."""
    # significance's families are (kind, variant): the channel statistic is one more measure
    done, placebo = significance.calibrate(
        later[tested].assign(variant="channel"), placebo.assign(variant="channel"), fdr
    )
    later = later.join(done[list(SIGNIFICANCE_COLUMNS)])
    later["discovery"] = later["discovery"].astype("boolean").fillna(False).astype(bool)
    return later, placebo.drop(columns="variant").assign(pair_discovery=False)


def every_pair_tested(hw: HeadWeights, fdr: float, seed: int, draws: int, tol: float) -> pd.DataFrame:
    """channels.csv's later rows with every pair's channel statistic tested, not only the whole-pair
    discoveries' (pair_discovery left False): the channel null's calibration on its own, for the
    untrained and surrogate checks (tests/test_significance.py, the calibrate stage); channels
    blocked at `tol`."""
    hw = hw.to(torch.float64)
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "channels.null"))
    rotations = channel_blocks(draws, hw.d_model, hw.d_head, gen)
    later, _ = channel_rows(hw, rotations, tol)
    placebo, _ = channel_rows(hw, rotations, tol, placebo=True)
    later["pair_discovery"] = False
    return calibrate_channels(later, placebo, fdr, np.ones(len(later), dtype=bool))[0]


def channels_summary(later: pd.DataFrame, placebo: pd.DataFrame) -> dict:
    """summary.json's "channels": per kind, the pairs tested (whole-pair discoveries), their channel
    discoveries, and the tested pairs' median top share and effective channels; and the placebo
    pairs' families with a (false) channel discovery per block (`significance.family_summary`).
    JSON-ready."""
    out: dict = {"kinds": {}}
    for kind in KINDS:
        mine = later[(later["kind"] == kind) & later["pair_discovery"]]
        medians = mine[["top_share", "effective_channels"]].median()
        out["kinds"][kind] = {
            "tested": len(mine),
            "discoveries": int(mine["discovery"].sum()),
            **{f"median_{c}": (float(v) if np.isfinite(v) else None) for c, v in medians.items()},
        }
    out["placebo_families"] = significance.family_summary(placebo.assign(variant="channel"))
    return out
