"""A causal check per channel: does a discovered K pair compose, as the model runs,
through the one channel the weights say carries it?

The composition stage splits each pair's corrected score into channel shares
(pipeline/circuits/channels.py; channels.csv names each pair's top channel, a writer block x a
reader block of near-equal singular values, by each block's first direction writer_channel,
reader_channel and its size writer_block, reader_block, and its share `top_share` of the squared
score). Here, for every K row of channels.csv whose whole pair is a discovery (`pair_discovery`),
that channel alone is cut from b's keys (`ablation.channel_ablation`: writer a's mean-ablated
block taken out of b's key read along the reader block, the rest of the path kept; the whole
block pair, so the cut depends on no choice of directions within a block), on each of the heads
stage's evaluation batches (`heads.evaluation_batches`: probe b with held-out batch b), beside
the whole-path K cut of the same pair on the same batch (the heads stage's ablation_batches.csv
rows):

    causal_share = channel pattern_effect / path pattern_effect      per held-out batch

The pattern effect (how far the cut moves b's attention pattern, total variation, on held-out
text) is role-free, so it is the effect compared; the others (attn_effect, loss_effect on the
probe; heldout_loss_effect) are written beside it. `top_share` is what the weights say the
channel carries; `causal_share` is what cutting it does of what cutting the whole path does. It
is not bounded by 1 or by 0 in general: a softmax does not add effects over channels, and
channels can cancel. A path effect of exactly 0 gives NaN.

channel_ablation.csv (`COLUMNS`): one row per discovered pair and batch. summary.json
"channel_ablation" (`summarize`): per pair the top channel and its share, the mean path and channel pattern
effects and the causal share's mean over batches with a two-sided 95% t interval over them
(the batch-to-batch noise), and over the pairs the median causal share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from torch import Tensor

from ..circuits import channels
from ..circuits.weights import HeadWeights
from ..config import HeadsConfig
from ..data import datasets
from ..errors import UserError
from ..model.transformer import Transformer
from ..tables import ABLATION_COLUMNS
from . import ablation, heads

PAIR = ("src_layer", "src_head", "dst_layer", "dst_head")
EFFECTS = ABLATION_COLUMNS[5:]  # attn_effect, loss_effect, heldout_loss_effect, pattern_effect
CHANNEL = ("writer_channel", "reader_channel", "writer_block", "reader_block")  # channels.csv's top channel
COLUMNS = (
    "batch", "kind", *PAIR, *CHANNEL, "top_share",
    *(f"channel_{e}" for e in EFFECTS), *(f"path_{e}" for e in EFFECTS), "causal_share",
)  # fmt: skip
CONFIDENCE = 0.95  # the causal share's t interval over batches


def discovered(table: pd.DataFrame) -> pd.DataFrame:
    """channels.csv's K rows whose whole pair is a discovery (`pair_discovery`) and whose top
    channel is defined (a score of 0 up to rounding has none), in its order; channels as ints."""
    rows = table[(table["kind"] == "K") & table["pair_discovery"].eq(True)]
    rows = rows.dropna(subset=list(CHANNEL))
    return rows.astype(dict.fromkeys(CHANNEL, "int64")).reset_index(drop=True)


def cuts(hw: HeadWeights, pairs: pd.DataFrame, source: str = "channels") -> list[ablation.ChannelCut]:
    """Each row's top channel as a cut: w = writer a's output directions writer_channel ..
    writer_channel + writer_block - 1, k = reader b's key-input directions reader_channel ..
    reader_channel + reader_block - 1, from the analysis weights `hw` (module doc); `source` names
    the table in errors."""
    L, H, d = hw.n_layers, hw.n_heads, hw.d_head
    for r in pairs.itertuples():
        if not (0 <= r.src_layer < r.dst_layer < L and 0 <= r.src_head < H and 0 <= r.dst_head < H):
            raise UserError(source, f"pair {r.src_layer}.{r.src_head} -> {r.dst_layer}.{r.dst_head} "
                            f"is not a later pair of {L} layers x {H} heads")  # fmt: skip
        if not (0 <= r.writer_channel < d and 0 <= r.reader_channel < d):
            raise UserError(source, f"channel ({r.writer_channel}, {r.reader_channel}) out of d_head = {d}")
        if not (1 <= r.writer_block <= d - r.writer_channel and 1 <= r.reader_block <= d - r.reader_channel):
            raise UserError(
                source,
                f"block sizes ({r.writer_block}, {r.reader_block}) from channel ({r.writer_channel}, "
                f"{r.reader_channel}) do not fit d_head = {d}",
            )
    writes = channels.writer_circuit(hw).writes  # [L, H, d_model, d_head]
    reads = channels.reader_circuit(hw, "K").reads  # [L, H, d_model, d_head]
    return [
        ablation.ChannelCut(
            (r.src_layer, r.src_head),
            (r.dst_layer, r.dst_head),
            writes[r.src_layer, r.src_head, :, r.writer_channel : r.writer_channel + r.writer_block],
            reads[r.dst_layer, r.dst_head, :, r.reader_channel : r.reader_channel + r.reader_block],
        )  # [d_model, n_A], [d_model, n_B]: the blocks' directions
        for r in pairs.itertuples()
    ]


def analyse(
    model: Transformer,
    hw: HeadWeights,
    table: pd.DataFrame,
    dataset: datasets.Dataset,
    cfg: HeadsConfig,
    seed: int,
    whole: pd.DataFrame,
    device: str | None = None,
    source: str = "channels",
) -> pd.DataFrame:
    """channel_ablation.csv (`COLUMNS`) on the heads stage's batches (`heads.analyse`'s, of the
    same `dataset`, `cfg` and `seed`); `table`: channels.csv, `whole`: the heads stage's
    ablation_batches.csv (`HeadsResult.batches`)."""
    probes, heldout = heads.evaluation_batches(dataset, cfg, model.cfg.d_vocab, seed)
    return check_batches(model, hw, table, probes, heldout, cfg.repeat_length, whole, device, source)


def check_batches(
    model: Transformer,
    hw: HeadWeights,
    table: pd.DataFrame,
    repeated: Sequence[Tensor],
    heldout: Sequence[Tensor],
    length: int,
    whole: pd.DataFrame,
    device: str | None = None,
    source: str = "channels",
) -> pd.DataFrame:
    """`analyse` on given batches: probe b (`repeated`, `length`-token spans) with held-out batch
    b, `whole` holding the whole-path cuts' effects of those batches ("batch" +
    tables.ABLATION_COLUMNS)."""
    if len(repeated) != len(heldout):
        raise ValueError(f"{len(repeated)} probe batches but {len(heldout)} held-out ones")
    missing = [c for c in ("batch", "kind", *PAIR, *EFFECTS) if c not in whole.columns]
    if missing:  # e.g. ablation.csv (the mean over batches) given for ablation_batches.csv
        raise ValueError(f"`whole` has no column {', '.join(missing)}: it holds each batch's whole-path cuts")
    pairs = discovered(table)
    chosen = cuts(hw, pairs, source)
    model = model.to(device)  # in place; a no-op on the CPU
    per_batch = []
    for b, (probe, text) in enumerate(zip(repeated, heldout, strict=True)):
        on_probe = ablation.channel_ablation(model, probe.to(device), chosen, length)
        on_text = ablation.channel_ablation(model, text.to(device), chosen, None)  # same rows, same order
        per_batch.append(
            pairs[["kind", *PAIR, *CHANNEL, "top_share"]].assign(
                batch=b,
                channel_attn_effect=on_probe["attn_effect"].to_numpy(),
                channel_loss_effect=on_probe["loss_effect"].to_numpy(),
                channel_heldout_loss_effect=on_text["loss_effect"].to_numpy(),
                channel_pattern_effect=on_text["pattern_effect"].to_numpy(),
            )
        )
    frame = pd.concat(per_batch, ignore_index=True) if per_batch else pd.DataFrame(columns=COLUMNS[:-5])
    path = whole[whole["kind"] == "K"].rename(columns={e: f"path_{e}" for e in EFFECTS})
    frame = frame.merge(path, on=["batch", "kind", *PAIR], how="left", validate="one_to_one")
    if frame[[f"path_{e}" for e in EFFECTS]].isna().all(axis=1).any():
        raise ValueError("a discovered pair or batch has no whole-path cut in `whole`")
    path_effect = frame["path_pattern_effect"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = frame["channel_pattern_effect"].to_numpy(dtype=float) / path_effect
    frame["causal_share"] = np.where(path_effect == 0, np.nan, share)
    return frame[list(COLUMNS)]


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _t_interval(x: np.ndarray) -> tuple[float, float]:
    """The mean's two-sided CONFIDENCE t interval over `x` (NaN with fewer than two values)."""
    from scipy.stats import t as student_t  # here: imported only when a check is summarised

    n = len(x)
    if n < 2:
        return math.nan, math.nan
    half = float(student_t.ppf((1 + CONFIDENCE) / 2, n - 1)) * float(np.std(x, ddof=1)) / math.sqrt(n)
    return float(np.mean(x)) - half, float(np.mean(x)) + half


def summarize(frame: pd.DataFrame) -> dict:
    """summary.json's "channel_ablation" from channel_ablation.csv (`frame`): per pair, in the
    table's order, its top channel (first directions and block sizes), the top share, the mean
    channel and path pattern effects over the batches, and the causal share: its per-batch
    values, their mean and the mean's t interval (`CONFIDENCE`, n - 1 degrees of freedom over the
    batches with a finite share; null below two); over the pairs, the median of the pairs' mean
    causal shares (null without one)."""
    out = []
    for (i, a, j, b), rows in frame.groupby(list(PAIR), sort=False):
        shares = rows["causal_share"].to_numpy(dtype=float)
        finite = shares[np.isfinite(shares)]
        lo, hi = _t_interval(finite)
        first = rows.iloc[0]
        out.append({
            "src": f"{i}.{a}", "dst": f"{j}.{b}",
            **{c: int(first[c]) for c in CHANNEL},
            "top_share": _finite(first["top_share"]),
            "path_pattern_effect": _finite(rows["path_pattern_effect"].mean()),
            "channel_pattern_effect": _finite(rows["channel_pattern_effect"].mean()),
            "causal_share": _finite(finite.mean()) if len(finite) else None,
            "causal_share_lo": _finite(lo), "causal_share_hi": _finite(hi),
            "causal_share_batches": [_finite(x) for x in shares],
        })  # fmt: skip
    means = [p["causal_share"] for p in out if p["causal_share"] is not None]
    return {
        "effect": "pattern_effect",
        "interval": f"two-sided {CONFIDENCE:.0%} t interval of the mean causal share over batches",
        "n_pairs": len(out),
        "median_causal_share": float(np.median(means)) if means else None,
        "pairs": out,
    }
