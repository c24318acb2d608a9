"""Splits a pair's composition score into channels.

Its squared true numerator is a sum of non-negative shares, one per (writer channel, reader
channel), a channel being a block of singular directions with (near-)equal singular values. Maths
only, no I/O; float64 in, float64 out. The derivation, what is unique and why the blocks:
docs/maths.md, "Channels".

Row vectors, as stored. With the writer's circuit OV^a = sum_i s_i r_i w_i^T (reads r_i, writes
w_i) and the reader's N^b = sum_j t_j k_j m_j^T (reads k_j), N^b the circuit of the kind whose
numerator is ||OV^a N^b|| (`reader_circuit`):

    writer a    OV^a = W_V^a W_O^a      X = W_V^a, Y = W_O^aT
    reader b    Q: QK^b  = W_Q^b W_K^bT   X = W_Q^b, Y = W_K^b    k_j: the queries' input
                K: QK^bT = W_K^b W_Q^bT   X = W_K^b, Y = W_Q^b    k_j: the keys' input
                V: OV^b  = W_V^b W_O^b    X = W_V^b, Y = W_O^bT   k_j: the values' input

    share(i, j) = s_i^2 t_j^2 (w_i . k_j)^2,    sum_{i,j} share(i, j) = ||OV^a N^b||^2   (exact)

Each circuit M = X Y^T is decomposed in the small space (`circuit_svd`: a QR per factor, an SVD of
the [d_head, d_head] core), so no d_model x d_model matrix is formed. Blocks (`spectral_blocks`):
directions i and i + 1 of one circuit share a block when s_i - s_{i+1} <= tol * s_i (both
nonzero; tol = analysis.composition.channel_tolerance), chained; values zero up to rounding form
a block of their own. A channel is writer block A x reader block B, its share the sum over the
pair of blocks (`block_sums`), ||P_A OV^a N^b Q_B||^2; a pair is summarised by its top channel,
top share and effective number of channels 1 / sum p^2 (`summary_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..tables import KINDS
from .scoring import ZERO_RTOL
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
    residual directions that meet the writer's `writes` (module doc)."""
    if kind == "Q":
        return circuit_svd(hw.W_Q, hw.W_K)  # QK^b = W_Q W_K^T: the queries read the residual
    if kind == "K":
        return circuit_svd(hw.W_K, hw.W_Q)  # QK^bT = W_K W_Q^T: the keys read the residual
    if kind == "V":
        return circuit_svd(hw.W_V, hw.W_O.mT)  # OV^b = W_V W_O: the values read the residual
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")


# --- the shares of any pairs ------------------------------------------------------------------


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


def normalised(shares: Tensor) -> Tensor:
    """Each pair's shares divided by their sum (summing to 1); NaN where the sum is 0 or NaN."""
    total = shares.sum((-2, -1), keepdim=True)
    return shares / torch.where(total > 0, total, torch.nan)


# --- blocks of near-equal singular values ---------------------------------------------------


def spectral_blocks(s: Tensor, tol: float) -> Tensor:
    """[.., d] int64: each direction's block, named by the index of its first (strongest)
    direction, for singular values s [.., d] in descending order (module doc): i + 1
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


# --- a pair's table summarised ---------------------------------------------------------------


def top_share(shares: Tensor) -> Tensor:
    """[..]: the largest of each [.., d_head, d_head] table's shares over their sum (NaN for 0 / 0)."""
    return shares.flatten(-2).amax(-1) / shares.sum((-2, -1))


def summary_rows(
    p: Tensor, writer_blocks: Tensor, reader_blocks: Tensor, pairs: tuple[np.ndarray, ...]
) -> pd.DataFrame:
    """channels.csv's columns of the table itself, one row per pair: its top channel (the blocks'
    first directions and sizes), top share and effective channels, from normalised block shares
    p [n, d_head, d_head] of `pairs` (`block_sums`' layout: 0 off the blocks' first directions)
    and their blocks [n, d_head]. A pair whose shares are NaN gets NaN and <NA> channels."""
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
