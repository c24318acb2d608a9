"""Hand-made channel tables in the composition stage's format (channels.csv and
channels.safetensors, pipeline/circuits/channels.py) for the figure and report tests; numpy only.

Every later pair of every kind gets a table: a planted pair one share of 1 at its channel
(top_share 1, one effective channel), every other pair equal shares 1 / d_head^2 (top channel
(0, 0), d_head^2 effective channels). A planted channel is (writer i, reader j) of one direction
each, or (i, j, n_i, n_j): a block pair of n_i x n_j directions from (i, j), its share 1 spread
evenly over its cells, as the composition stage writes a block.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.tables import CHANNEL_STATISTICS, CHANNELS_COLUMNS, KINDS

Pair = tuple[str, int, int, int, int]  # kind, src_layer, src_head, dst_layer, dst_head


def later_pairs(n_layers: int, n_heads: int) -> list[tuple[int, int, int, int]]:
    """pipeline.circuits.scoring.later_pairs' order, without torch."""
    return [
        (i, h, j, g)
        for i in range(n_layers)
        for h in range(n_heads)
        for j in range(n_layers)
        for g in range(n_heads)
        if j > i
    ]


def tables(
    planted: Mapping[Pair, tuple[int, int]],
    pair_discovery: Collection[Pair],
    channel_discovery: Collection[Pair] = (),
    n_layers: int = 2,
    n_heads: int = 3,
    d_head: int = 4,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """(channels.csv's frame, {kind: [pairs, d_head, d_head] float32}); `planted`: pair ->
    its one channel (writer i, reader j), or block pair (i, j, n_i, n_j)."""
    rows, shares = [], {}
    for kind in KINDS:
        tabs = []
        for i, h, j, g in later_pairs(n_layers, n_heads):
            pair = (kind, i, h, j, g)
            table = np.full((d_head, d_head), 1 / d_head**2)
            top, size, share, effective = (0, 0), (1, 1), table.max(), d_head**2
            if pair in planted:
                a, b, *blocks = planted[pair]
                size = tuple(blocks) or (1, 1)
                table = np.zeros((d_head, d_head))
                table[a : a + size[0], b : b + size[1]] = 1.0 / (size[0] * size[1])
                top, share, effective = (a, b), 1.0, 1.0
            tabs.append(table)
            found = pair in channel_discovery
            rows.append({
                "kind": kind, "src_layer": i, "src_head": h, "dst_layer": j, "dst_head": g,
                "writer_channel": top[0], "reader_channel": top[1], "writer_block": size[0],
                "reader_block": size[1], "top_share": share,
                "effective_channels": float(effective), "null_mean": 0.1, "null_std": 0.05,
                "z": 9.0 if found else 0.0, "z_cal": 9.0 if found else 0.0, "p": 0.001 if found else 0.5,
                "q": 0.01 if found else 0.5, "discovery": found, "pair_discovery": pair in pair_discovery,
                **{c: (0.5 if kind == "K" else np.nan) for c in CHANNEL_STATISTICS},
            })  # fmt: skip
        shares[kind] = np.stack(tabs).astype(np.float32)
    frame = pd.DataFrame(rows)[list(CHANNELS_COLUMNS)]
    blocks = ("writer_channel", "reader_channel", "writer_block", "reader_block")
    return frame.astype(dict.fromkeys(blocks, "Int64")), shares


def write(directory: Path, frame: pd.DataFrame, shares: Mapping[str, np.ndarray]) -> tuple[Path, Path]:
    """channels.csv and channels.safetensors in `directory`, as the composition stage writes them."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    csv, st = directory / "channels.csv", directory / "channels.safetensors"
    frame.to_csv(csv, index=False)
    save_file({k: np.ascontiguousarray(v) for k, v in shares.items()}, str(st))
    return csv, st
