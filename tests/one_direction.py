"""A model whose K edge 0.0 -> 1.0 runs through known channels, and the channels.csv the
composition stage would write for it: the planted input of the channel ablation's and the channel
check's tests (pipeline/behaviour/ablation.py, channel_check.py)."""

from __future__ import annotations

import numpy as np
import oracles
import pandas as pd
import torch
from models import F64, random_model

from pipeline.circuits import weights
from pipeline.config import CompositionConfig
from pipeline.model.transformer import Transformer
from pipeline.tables import CHANNELS_COLUMNS


def one_direction_model(weak: float) -> Transformer:
    """The tiny random model (no LayerNorm) with the edge 0.0 -> 1.0(K) rebuilt so that it runs
    through known channels. With u_0 .. u_3 orthonormal in d_model:

        OV^0.0  = 2 p_0 u_0^T + 2 weak p_1 u_1^T     (W_V orthonormal columns p, times 2; W_O rows
                                                      u_0 and weak u_1): writes along u_0, u_1
        QK^1.0T = W_K W_Q^T, W_K = [4 u_0, 3 u_1, 2 u_2, u_3], W_Q orthonormal times 2: its keys
                  read u_0, u_1 (what 0.0 writes) and u_2, u_3 (what 0.0 never writes)

    so writer channel i = reader channel i = u_i (i = 0, 1), and the top channel (0, 0) holds
    16 / (16 + 9 weak^2) of the pair's squared score (1 for weak = 0: the whole path)."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(100)
    D, d = model.cfg.d_model, model.cfg.d_head
    u = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=F64))[0]  # [d_model, d_model]
    p = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]  # [d_model, d_head]
    q = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]
    W_O = torch.zeros(d, D, dtype=F64)
    W_O[0], W_O[1] = u[:, 0], weak * u[:, 1]
    with torch.no_grad():
        writer, reader = model.blocks[0].attn, model.blocks[1].attn
        writer.W_V[0], writer.W_O[0] = 2 * p, W_O
        reader.W_K[0] = u[:, :4] * torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=F64)
        reader.W_Q[0] = 2 * q
    return model


def channel_table(hw: weights.HeadWeights, discovered: set[tuple[int, int, int, int]]) -> pd.DataFrame:
    """channels.csv's columns for every later pair of every kind: the top channel and its share
    from the weights (`oracles.channel_summary`), the statistics NaN; `discovered` pairs' K rows
    pair_discovery (the Q and V rows never are)."""
    frames = []
    for kind in ("Q", "K", "V"):
        c = oracles.channels(hw, kind)
        table = oracles.channel_summary(c.normalised(), c.s, c.t, CompositionConfig().channel_tolerance)
        pair = list(
            zip(table["src_layer"], table["src_head"], table["dst_layer"], table["dst_head"], strict=True)
        )
        table.insert(0, "kind", kind)
        table["pair_discovery"] = [kind == "K" and p in discovered for p in pair]
        table["discovery"] = False
        frames.append(table)
    table = pd.concat(frames, ignore_index=True)
    for column in CHANNELS_COLUMNS:
        if column not in table:
            table[column] = np.nan
    return table[list(CHANNELS_COLUMNS)]
