"""Test oracles the pipeline does not call: every pair's channel table at once, dense over
[L, H, L, H, d_head, d_head], against which the stage's per-pair computation
(pipeline/circuits/channels.py, channel_null.py) is checked."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from pipeline.circuits.channels import (
    block_sums,
    normalised,
    reader_circuit,
    spectral_blocks,
    summary_rows,
    writer_circuit,
)
from pipeline.circuits.scoring import ZERO_RTOL, later_pairs
from pipeline.circuits.weights import HeadWeights


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
    """The shares of every later pair for one kind, computed in the small space
    (pipeline/circuits/channels.py).

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
    return summary_rows(block_sums(p, writer_blocks, reader_blocks), writer_blocks, reader_blocks, pairs)
