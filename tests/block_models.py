"""Models whose K edge 0.0 -> 1.0 is built around known blocks of (near-)equal singular values, turned
within them or not, and the channel rows of their weights: for the tests of channels that are
defined per block (pipeline/circuits/channels.py, channel_null.py, pipeline/behaviour/channel_check.py)."""

from __future__ import annotations

import math

import pandas as pd
import torch
from models import F64, random_model

from pipeline.circuits import channel_null
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig
from pipeline.model.transformer import Transformer

TOL = CompositionConfig().channel_tolerance


PAIR = ["src_layer", "src_head", "dst_layer", "dst_head"]


NAMED = ["writer_channel", "reader_channel", "writer_block", "reader_block"]


def turn(d: int, first: int, angle: float) -> torch.Tensor:
    """[d, d]: the identity with a plane rotation by `angle` in directions first, first + 1."""
    G = torch.eye(d, dtype=F64)
    c, s = math.cos(angle), math.sin(angle)
    G[first : first + 2, first : first + 2] = torch.tensor([[c, -s], [s, c]], dtype=F64)
    return G


def block_model(s: tuple[float, ...], writer_turn: torch.Tensor, reader_turn: torch.Tensor) -> Transformer:
    """The tiny random model with the K edge 0.0 -> 1.0 rebuilt around known blocks. With p, q
    orthonormal [d_model, d_head] and u_0 .. u_3 orthonormal in d_model:

        OV^0.0  = p G diag(s) G^T U^T      W_V = p G diag(s), W_O = G^T U^T   (G: writer_turn)
        QK^1.0T = W_K W_Q^T                W_K = K diag(4, 3, 3, 1) H, W_Q = 2 q H (H: reader_turn)

    K = [(u_0 + u_1)/sqrt 2, u_2, u_3, (u_0 - u_1)/sqrt 2]: the keys' strongest direction reads
    the writer's first two output directions half and half. Head 0.0's b_V and 1.0's b_Q, b_K
    turn with G and H. s_0 = s_1 (exactly or within the
    tolerance): writer block {0, 1}; t = 4, 3, 3, 1: reader block {1, 2}. H keeps QK^1.0 whatever
    it is (a change of head basis); G keeps OV^0.0 when s_0 = s_1 and turns its directions within
    the block otherwise. Top channel: writer block {0, 1} x reader direction 0."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(100)
    D, d = model.cfg.d_model, model.cfg.d_head
    u = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=F64))[0]  # [d_model, d_model]
    p = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]  # [d_model, d_head]
    q = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]
    root = 2**-0.5
    K = torch.stack([root * (u[:, 0] + u[:, 1]), u[:, 2], u[:, 3], root * (u[:, 0] - u[:, 1])], 1)
    with torch.no_grad():
        writer, reader = model.blocks[0].attn, model.blocks[1].attn
        writer.W_V[0] = p @ writer_turn @ torch.diag(torch.tensor(s, dtype=F64))
        writer.W_O[0] = writer_turn.mT @ u[:, :d].mT
        reader.W_K[0] = K @ torch.diag(torch.tensor([4.0, 3.0, 3.0, 1.0], dtype=F64)) @ reader_turn
        reader.W_Q[0] = 2 * q @ reader_turn
        # the biases in head space turn with their heads' bases: b_V W_O and q . k stay the model's
        writer.b_V[0] = writer.b_V[0] @ writer_turn
        reader.b_Q[0], reader.b_K[0] = reader.b_Q[0] @ reader_turn, reader.b_K[0] @ reader_turn
    return model


def heads_of(model: Transformer) -> HeadWeights:
    return from_state_dict(model.state_dict())  # no LayerNorm: the model's own weights


def rows_and_tables(hw: HeadWeights) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    rotations = channel_null.channel_blocks(64, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    return channel_null.channel_rows(hw, rotations, TOL)


def the_pair(rows: pd.DataFrame) -> pd.Series:
    k = rows[rows["kind"] == "K"].set_index(PAIR)
    return k.loc[(0, 0, 1, 0)]


EXACT = (2.0, 2.0, 1.0, 0.5)
