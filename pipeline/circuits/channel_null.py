"""The channel null: whether a pair composes mainly through one channel, tested.

Decided as a whole-pair discovery is (pipeline/circuits/significance.py), and channels.csv's rows.
Maths only, no I/O.

The statistic is the top channel's share of the pair's corrected score (pipeline/circuits/
channels.py: the top block pair's). How large it is by chance depends on the two heads' spectra,
so its raw z is taken against the pair's own null, the reader rotated by a Haar-random R of the
residual stream: the crosses w_i . k_j become W^T R K, distributed as the top-left d_head x d_head
block of a Haar matrix, so one set of draws serves every pair and kind (`channel_blocks`,
`top_share_null`; each draw's shares summed over the pair's blocks, which the rotation keeps):

    z = (ln top_share - mean_R ln top_share) / sd_R ln top_share

on the log scale, as the top share is a maximum whose null is skewed to the right. Then the
placebo pairs' z give each kind's centre, scale and tail (`significance.calibrate`), and
Benjamini-Hochberg runs over the kind's pairs whose whole corrected score is a discovery
(`measured_channels`); the placebo pairs are all tested, leave one block out. The reasons and
the numbers behind the log: docs/maths.md, "Channels".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import streams
from ..cli import progress_bar
from ..config import CompositionConfig
from ..tables import CHANNEL_STATISTICS, CHANNELS_COLUMNS, KINDS, SIGNIFICANCE_COLUMNS
from . import significance
from .channels import (
    block_sums,
    normalised,
    pair_shares,
    reader_circuit,
    spectral_blocks,
    spread,
    summary_rows,
    top_share,
    writer_circuit,
)
from .rotated import rotation_statistics
from .scoring import PAIR_COLUMNS, ZERO_RTOL, haar_blocks, later_pairs
from .weights import HeadWeights

_NULL_CHUNK = 2**22  # elements of one [pairs, draws, d_head, d_head] block of the channel null


def channel_blocks(n: int, d_model: int, d_head: int, gen: torch.Generator) -> Tensor:
    """n draws [n, d_head, d_head] of the crosses W^T R K under a Haar rotation R (module doc):
    top-left blocks of Haar matrices, zero-padded where d_model < d_head (those channels have
    s = 0 anyway)."""
    k = min(d_model, d_head)
    blocks = haar_blocks(n, d_model, k, gen)  # [n, k, k]
    return torch.nn.functional.pad(blocks, (0, d_head - k, 0, d_head - k))


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
            frame = summary_rows(p.cpu(), writer_blocks.cpu(), reader_blocks.cpu(), pairs)
            top, mean, sd = (x.cpu().numpy() for x in (top_share(p).log(), null_mean, null_sd))
            with np.errstate(invalid="ignore", divide="ignore"):
                z = np.where(sd > 0, (top - mean) / sd, np.nan)
            stats = {c: np.nan for c in CHANNEL_STATISTICS}
            if kind == "K" and not placebo:
                stats = {c: v.cpu().numpy() for c, v in rotation_statistics(hw, index).items()}
            parts.append(frame.assign(kind=kind, null_mean=mean, null_std=sd, z=z, **stats))
            bar.update()
    return pd.concat(parts, ignore_index=True), tables


def measured_channels(
    hw: HeadWeights, scores: pd.DataFrame, cfg: CompositionConfig, seed: int, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Tensor]]:
    """(channels.csv, the placebo pairs' rows, each kind's normalised shares [n_pairs, d_head,
    d_head] on the CPU in float32): every later pair's channel table summarised and its channel
    discovery at `cfg.fdr` (module doc), channels blocked at `cfg.channel_tolerance`.
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
    untrained and surrogate checks (the calibrate stage); channels blocked at `tol`."""
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
