"""Channel figure: where each discovered pair composes, its channel table as a small heat map.

Inputs are the composition stage's `channels.csv` (one row per kind and later pair: its top
channel, top share, effective channels, whether the pair and its top channel are discoveries)
and `channels.safetensors` (per kind, [pairs, d_head, d_head]: each pair's normalised shares in
channels.csv's row order of that kind; pipeline/circuits/channels.py) and, to rank the pairs,
its `scores.csv`. Share (i, j) is the part of the pair's squared corrected numerator
||OV^a N^b||^2 that writer channel i (the i-th singular direction of OV^a, strongest first)
carries into reader channel j (the j-th of the reader's circuit for the kind); where singular
values are near-equal their directions form a block, and the file holds the block pair's share
spread evenly over its cells (the split within a block is not defined). A pair's shares are
non-negative and sum to 1, so every panel shares one colour scale, [0, 1]. Each panel outlines
its top channel, the block pair channels.csv names (writer_channel, writer_block directions by
reader_channel, reader_block), whose cells sum to its top share.

Pure apart from `read_shares`: tables and arrays in, a figure (and its facts, for the report's
caption) out. numpy only: the figures stage imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ...errors import UserError
from . import Caption

ORDER = ("K", "Q", "V")  # K first: the composition the errata is about
MAX_PAIRS = 24  # panels at most; beyond, the pairs with the lowest calibrated z are left out
LEADING = 16  # above this d_head, panels show the leading channels (and every top channel)
COLUMNS = 6  # panels per row
PAIR_KEYS = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
MARK = "#d62728"  # the frame of a channel discovery
OUTLINE = "white"  # the outline of each panel's top channel (block pair)


def read_shares(path: str | Path) -> dict[str, np.ndarray]:
    """{kind: [pairs, d_head, d_head]} of `channels.safetensors` (numpy: no torch needed)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        shares = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            str(path), f"not a channels file of the composition stage ({str(e).splitlines()[0][:200]})"
        ) from None
    for kind, table in shares.items():
        if kind not in ORDER:  # a table of no kind would be left out without a word
            raise UserError(f"{path}: {kind}", f"unexpected key: one table per kind ({', '.join(ORDER)})")
        if table.ndim != 3 or table.shape[-1] != table.shape[-2]:
            raise UserError(f"{path}: {kind}", f"shape {list(table.shape)}, expected [pairs, d_head, d_head]")
    return shares


def _flag(column: pd.Series) -> pd.Series:
    """A discovery column as bool: a pair not tested (empty cell) is not a discovery."""
    return column.map(lambda v: v is True or v == 1 or str(v).strip().lower() == "true").astype(bool)


@dataclass(frozen=True)
class Discovered:
    """The pairs to draw, in drawing order, and how many were discovered per kind."""

    shown: pd.DataFrame  # channels.csv's rows, plus `row` (the index into the kind's shares), pair_z_cal
    counts: dict[str, int]  # discovered pairs per kind (ORDER)
    d_head: int  # 0 when nothing is shown
    leading: int  # channels per panel side: d_head, or the leading ones

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def facts(self) -> dict:
        """What the report's caption says (the figures stage writes them beside the figure)."""
        return {
            "discovered": self.counts,
            "shown": len(self.shown),
            "left_out": self.total - len(self.shown),
            "channel_discoveries": int(self.shown["discovery"].sum()) if len(self.shown) else 0,
            "d_head": self.d_head,
            "channels_shown": self.leading,
        }


def discovered(
    channels: pd.DataFrame,
    shares: dict[str, np.ndarray],
    scores: pd.DataFrame | None = None,
    max_pairs: int = MAX_PAIRS,
    leading: int = LEADING,
    source: str = "channels.safetensors",
) -> Discovered:
    """The pairs whose corrected score is a discovery (`pair_discovery`), K, then Q, then V;
    within a kind by the calibrated z of the corrected score (scores.csv's "true" rows; without
    `scores`, in channels.csv's order); the first `max_pairs`. Checks that `shares` holds a
    table for every row of channels.csv, naming `source`, before anything is drawn."""
    frame = channels.reset_index(drop=True)
    frame = frame.assign(
        row=frame.groupby("kind").cumcount(),  # channels.csv's order within a kind = the tensor's
        discovery=_flag(frame["discovery"]),
        pair_discovery=_flag(frame["pair_discovery"]),
    )
    d_heads = set()
    for kind, n in frame["kind"].value_counts().items():
        if kind not in shares or shares[kind].shape[0] != n:
            has = list(shares[kind].shape) if kind in shares else "no table"
            raise UserError(source, f"{kind}: expected {n} pairs (channels.csv's {kind} rows), has {has}")
        d_heads.add(shares[kind].shape[-1])
    if len(d_heads) > 1:
        raise UserError(source, f"the kinds' tables differ in d_head ({sorted(d_heads)})")
    _require_top_channels(frame, shares, source)
    chosen = frame[frame["pair_discovery"] & frame["kind"].isin(ORDER)]
    if scores is not None:  # channels.csv's own z_cal is the top channel's, not the pair's
        true = scores.loc[scores["variant"] == "true", [*PAIR_KEYS, "z_cal"]]
        chosen = chosen.merge(true.rename(columns={"z_cal": "pair_z_cal"}), on=PAIR_KEYS, how="left")
    else:
        chosen = chosen.assign(pair_z_cal=np.nan)
    rank = chosen["kind"].map({k: i for i, k in enumerate(ORDER)})
    # stable: ties (and no scores) keep channels.csv's order
    chosen = chosen.assign(_rank=rank, _z=-chosen["pair_z_cal"].fillna(-np.inf))
    chosen = chosen.sort_values(["_rank", "_z"], kind="stable").drop(columns=["_rank", "_z"])
    counts = {k: int((chosen["kind"] == k).sum()) for k in ORDER}
    shown = chosen.head(max_pairs).reset_index(drop=True)
    d_head = d_heads.pop() if d_heads and len(shown) else 0
    n = d_head
    if d_head > leading:  # the leading channels, widened to every shown pair's top channel
        tops = _reach(shown)
        n = min(d_head, max(leading, int(tops.max()) if len(tops) else 0))
    return Discovered(shown, counts, d_head, n)


def _require_top_channels(frame: pd.DataFrame, shares: dict[str, np.ndarray], source: str) -> None:
    """Each row's top channel (a writer block x a reader block, from writer_channel and
    reader_channel, writer_block and reader_block directions long) lies within its table and
    its cells sum to top_share: tables of another model, or another run, of as many pairs would
    otherwise be drawn under channels.csv's titles. A row without a top channel (a zero
    circuit) is skipped."""
    for kind, rows in frame.groupby("kind", sort=False):
        table = shares[kind]
        d = table.shape[-1]
        rows = rows.dropna(subset=["writer_channel", "reader_channel", "writer_block", "reader_block"])
        for row in rows.itertuples(index=False):
            w0, r0 = int(row.writer_channel), int(row.reader_channel)
            w1, r1 = w0 + int(row.writer_block), r0 + int(row.reader_block)
            inside = 0 <= w0 < w1 <= d and 0 <= r0 < r1 <= d
            held = float(table[row.row, w0:w1, r0:r1].sum()) if inside else np.nan
            if inside and np.isclose(held, row.top_share, rtol=1e-5, atol=1e-7):
                continue
            pair = f"{kind} L{int(row.src_layer)}H{int(row.src_head)}"
            pair += f" -> L{int(row.dst_layer)}H{int(row.dst_head)}"
            top = f"channels.csv's top channel ({_span(w0, w1 - w0)}, {_span(r0, r1 - r0)})"
            found = f"lies outside its tables' d_head = {d}" if not inside else (
                f"holds {held:.4g} there, not channels.csv's top_share {row.top_share:.4g}"
            )  # fmt: skip
            raise UserError(source, f"{pair}: {top} {found}: not the channel tables of channels.csv's model")


def _reach(rows: pd.DataFrame) -> pd.Series:
    """Per row with a top channel: the directions it spans on its longer side, first + block size
    (the end of the block, exclusive)."""
    defined = rows.dropna(subset=["writer_channel", "reader_channel", "writer_block", "reader_block"])
    ends = (
        defined["writer_channel"] + defined["writer_block"],
        defined["reader_channel"] + defined["reader_block"],
    )
    return pd.concat(ends, axis=1).max(axis=1).astype(int)


def _span(first, size) -> str:
    """A block's directions as a panel title names them: "3" for one, "3-4" for two."""
    first, size = int(first), int(size)
    return f"{first}" if size == 1 else f"{first}-{first + size - 1}"


def _pair_title(row, d_head: int, n: int, in_view: float) -> str:
    star = "★ " if row.discovery else ""
    a, b = f"L{int(row.src_layer)}H{int(row.src_head)}", f"L{int(row.dst_layer)}H{int(row.dst_head)}"
    pair = f"{star}{row.kind} {a} -> {b}"
    top = (
        f"top {row.top_share:.2f} at ({_span(row.writer_channel, row.writer_block)}, "
        f"{_span(row.reader_channel, row.reader_block)})"
        if pd.notna(row.top_share) and pd.notna(row.writer_channel)
        else "top –"
    )
    lines = [pair, f"{top}, eff. {row.effective_channels:.1f}"]
    if n < d_head:
        lines.append(f"in view: {in_view:.0%}")
    return "\n".join(lines)


def channel_maps(picked: Discovered, shares: dict[str, np.ndarray]) -> Figure:
    """A grid of heat maps, one per pair of `picked` (`discovered`): writer channel (rows) x
    reader channel (columns), the normalised shares on one colour scale [0, 1] with one colour
    bar; each panel titled with the pair, its top channel, top share and effective channels, the
    top channel's block pair outlined, a star and a red frame when its top channel is a
    discovery. No pair: a figure that says so."""
    shown, d, n = picked.shown, picked.d_head, picked.leading
    if not len(shown):
        fig, ax = plt.subplots(figsize=(6, 1.6))
        ax.axis("off")
        ax.text(
            0.5, 0.5, "No discovered pair: no pair's corrected score is a discovery,\n"
            "so there is no channel table to show.", ha="center", va="center", fontsize=10,
        )  # fmt: skip
        fig.suptitle("Composition channels of the discovered pairs", fontsize=10)
        return fig
    cols = min(COLUMNS, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(max(2.3 * cols + 1.0, 7.5), 2.5 * rows + 1.4),
        squeeze=False,
        layout="constrained",
    )  # at least 7.5 in wide: the title's lines fit
    # one scale for every panel, [0, 1], square-root: a trained pair's table is mostly near 0,
    # and a linear scale would show only its top channel
    norm = PowerNorm(0.5, vmin=0.0, vmax=1.0)
    view = "" if n == d else f" (leading {n} of {d})"
    step = max(1, -(-n // 8))  # at most about 8 ticks a side
    for ax, row in zip(axes.flat, shown.itertuples(), strict=False):
        table = np.asarray(shares[row.kind][row.row], dtype=np.float64)  # [writer i, reader j]
        im = ax.imshow(table[:n, :n], cmap="viridis", norm=norm, interpolation="nearest")
        ax.set_xticks(range(0, n, step))
        ax.set_yticks(range(0, n, step))
        ax.tick_params(labelsize=6, length=2)
        in_view = float(np.nansum(table[:n, :n]))
        ax.set_title(_pair_title(row, d, n, in_view), fontsize=7)
        if pd.notna(row.writer_channel):  # the top channel: its block pair's cells, [writer, reader]
            corner = (int(row.reader_channel) - 0.5, int(row.writer_channel) - 0.5)
            ax.add_patch(
                Rectangle(
                    corner, int(row.reader_block), int(row.writer_block), fill=False, ec=OUTLINE, lw=1.0
                )
            )
        if row.discovery:
            for spine in ax.spines.values():
                spine.set_color(MARK)
                spine.set_linewidth(2.0)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax in axes.flat[max(0, len(shown) - cols) : len(shown)]:  # no panel below them
        ax.set_xlabel(f"reader channel j{view}", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"writer channel i{view}", fontsize=7)
    bar = fig.colorbar(im, ax=axes, shrink=0.6)
    bar.set_label("share (square-root scale)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    counts = ", ".join(f"{k} {picked.counts[k]}" for k in ORDER)
    left = picked.total - len(shown)
    note = f"; {left} left out (the lowest calibrated z)" if left else ""
    fig.suptitle(
        f"Composition channels of the discovered pairs: {len(shown)} of {picked.total} shown "
        f"({counts}){note}\nshare (i, j): writer channel i into reader channel j, channels by "
        "descending singular value\nnear-equal singular values form a block, its share spread evenly "
        "over its cells; white outline: the top channel\n★ red frame: a channel discovery (the pair "
        "composes mainly through its top channel)",
        fontsize=9,
    )
    return fig


# what the figure shows, by the stem the figures stage saves it as (the report's captions): its
# text is `caption`'s, from the counts the stage writes beside it (channels.json)
CAPTIONS = {
    "channels": Caption(
        "channels",
        "Channel tables: where each discovered pair composes",
        "Each discovered pair's corrected score split into writer channel x reader channel shares.",
    ),
}


def caption(facts: dict) -> str:
    """The figure's caption, from the counts the figures stage wrote beside it (`Discovered.facts`)."""
    found = facts["discovered"]
    total = sum(found.values())
    if not total:
        return "No pair's corrected score is a discovery in this seed, so there is no channel table to show."
    counts = ", ".join(f"{k} {found[k]}" for k in ("K", "Q", "V") if k in found)
    left = facts["left_out"]
    shown = f"all {total}" if not left else f"{facts['shown']} of the {total}"
    leftover = f"; the {left} with the lowest calibrated z are left out" if left else ""
    d, n = facts["d_head"], facts["channels_shown"]
    view = f" (all {d})" if n == d else f" (the leading {n} of {d}, widened to every panel's top channel)"
    return (
        f"{shown[0].upper()}{shown[1:]} pairs whose corrected score is a discovery "
        f"({counts}){leftover}, one heat map each. Rows: the writer's channels i, the singular directions "
        "of its OV circuit; columns: the reader's channels j, the singular directions along which its "
        "query (Q), key (K) or value (V) input reads the residual stream; both strongest first"
        f"{view}. Share (i, j) is the fraction of the pair's squared corrected numerator "
        "||OV^a N^b||^2 carried by writer channel i into reader channel j, s_i^2 t_j^2 (w_i . k_j)^2 "
        "over its sum: the shares are non-negative and sum to 1, so every panel has one colour scale, "
        "0 to 1. Directions whose singular values are near-equal (each within "
        "analysis.composition.channel_tolerance of the one before) form a block, where the split between "
        "directions is not defined: a channel is then the block, its share spread evenly over its cells. "
        "Each panel names its top channel (i, j; a range of directions for a block), outlines its cells, "
        "and gives its share and its effective number of channels "
        "(1 / sum of squared shares: 1 when one channel carries it all). A star and a red frame: a "
        f"channel discovery ({facts['channel_discoveries']} shown), a pair that composes mainly through "
        "its top channel (its top share against a randomly rotated reader, FDR-controlled)."
    )
