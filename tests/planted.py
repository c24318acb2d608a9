"""A hand-built two-layer attention-only model whose heads do known things exactly.

Weights are set by TransformerLens state-dict names. The residual stream (d_model 96)
is orthogonal blocks of 16 coordinates, one-hot within each block:

    TOK  token t (W_E)          POS  position i (W_pos; shortformer: queries and keys only)
    PREV the previous token     OUT  a token to predict (read by W_U)     JUNK read by nothing

    0.0  previous-token head:  query pos i -> key pos i-1; moves the key's token into PREV
    0.1  first-token head:     every query -> key pos 0;   moves the key's token into JUNK
    0.2  duplicate-token head: query token t -> earlier keys holding t (score c [same token]
                               - c [same position]); moves the key's token into JUNK
    1.0  induction head:       query token t -> keys whose PREV holds t (K-composes with 0.0);
                               moves the key's token into OUT: predicts it (copying +1)
    1.1  current-token head:   query pos i -> key pos i; writes minus its token into OUT (copying -1)
    1.2  recent-window head:   query pos i -> keys i-1 .. i-4 equally; moves the key's token into JUNK

So the only non-zero composition is 0.0 -> 1.0 through keys; every other pair's Q, K and V
composition is exactly 0, and every head has a known role (none is "other").
Token 0 is the first token of every sequence; spans use tokens 1..15.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import torch

from pipeline.behaviour import heads
from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig, HeadsConfig, ModelConfig
from pipeline.model.transformer import Transformer

V = 16  # d_vocab
N_CTX = 16
N_HEADS = 3
D_HEAD = 32
TOK, POS, PREV, OUT, JUNK = (slice(16 * n, 16 * (n + 1)) for n in range(5))
D_MODEL = 96
QK_SCALE = 10.0 * D_HEAD**0.5  # a matching key's score is 10 above the rest: all but ~e^-10 of the attention
WINDOW = 4
UNEMBED_SCALE = 20.0

CONFIG = ModelConfig(
    n_layers=2, n_heads=N_HEADS, d_head=D_HEAD, d_model=D_MODEL, n_ctx=N_CTX, d_vocab=V,
    positional_embedding_type="shortformer", normalization_type=None, use_bias=True,
)  # fmt: skip


def _block(rows: slice, cols: slice, matrix: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float64)
    out[rows, cols] = matrix
    return out


def state_dict() -> dict[str, torch.Tensor]:
    """TransformerLens names and shapes; float64."""
    eye = torch.eye(16, dtype=torch.float64)
    shift = torch.diag(torch.ones(15, dtype=torch.float64), 1)  # pos j -> head dim j + 1
    window = sum(
        torch.linalg.matrix_power(shift, o) for o in range(1, WINDOW + 1)
    )  # pos j -> dims j+1 .. j+4
    to_first = torch.zeros(16, 16, dtype=torch.float64)
    to_first[:, 0] = 1.0  # every pos -> head dim 0
    first_key = torch.zeros(16, 16, dtype=torch.float64)
    first_key[0, 0] = 1.0  # only pos 0 -> head dim 0
    D, d = (D_MODEL, D_HEAD), (D_HEAD, D_MODEL)
    c = QK_SCALE
    H = slice(0, 16)  # the head dims most heads use
    heads = {  # (layer, head): W_Q, W_K, W_V, W_O
        (0, 0): (_block(POS, H, c * eye, D), _block(POS, H, shift, D),
                 _block(TOK, H, eye, D), _block(H, PREV, eye, d)),
        (0, 1): (_block(POS, H, c * to_first, D), _block(POS, H, first_key, D),
                 _block(TOK, H, eye, D), _block(H, JUNK, eye, d)),
        (0, 2): (_block(TOK, H, c * eye, D) + _block(POS, slice(16, 32), c * eye, D),
                 _block(TOK, H, eye, D) - _block(POS, slice(16, 32), eye, D),
                 _block(TOK, H, eye, D), _block(H, JUNK, eye, d)),
        (1, 0): (_block(TOK, H, c * eye, D), _block(PREV, H, eye, D),
                 _block(TOK, H, eye, D), _block(H, OUT, eye, d)),
        (1, 1): (_block(POS, H, c * eye, D), _block(POS, H, eye, D),
                 _block(TOK, H, eye, D), _block(H, OUT, -eye, d)),
        (1, 2): (_block(POS, H, c * eye, D), _block(POS, H, window, D),
                 _block(TOK, H, eye, D), _block(H, JUNK, eye, d)),
    }  # fmt: skip
    state = {
        "embed.W_E": _block(slice(0, V), TOK, eye, (V, D_MODEL)),
        "pos_embed.W_pos": _block(slice(0, N_CTX), POS, eye, (N_CTX, D_MODEL)),
        "unembed.W_U": _block(OUT, slice(0, V), UNEMBED_SCALE * eye, (D_MODEL, V)),
        "unembed.b_U": torch.zeros(V, dtype=torch.float64),
    }
    for layer in range(2):
        for name, k in zip(("W_Q", "W_K", "W_V", "W_O"), range(4), strict=True):
            state[f"blocks.{layer}.attn.{name}"] = torch.stack([heads[layer, h][k] for h in range(N_HEADS)])
        for name in ("b_Q", "b_K", "b_V"):
            state[f"blocks.{layer}.attn.{name}"] = torch.zeros(N_HEADS, D_HEAD, dtype=torch.float64)
        state[f"blocks.{layer}.attn.b_O"] = torch.zeros(D_MODEL, dtype=torch.float64)
    return state


def model() -> Transformer:
    m = Transformer(CONFIG).to(torch.float64)
    m.load_state_dict(state_dict())
    return m.eval()


def wide_model(extra: int) -> Transformer:
    """The planted model with `extra` more heads in each layer (heads 3 .. 2 + extra) whose weights
    are all zero: they write exactly nothing, so ablating one changes no loss."""
    wide = {}
    for name, tensor in state_dict().items():
        if name.endswith(("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")):  # [head, ...]
            tensor = torch.cat([tensor, torch.zeros(extra, *tensor.shape[1:], dtype=tensor.dtype)])
        wide[name] = tensor
    m = Transformer(dataclasses.replace(CONFIG, n_heads=N_HEADS + extra)).to(torch.float64)
    m.load_state_dict(wide)
    return m.eval()


def repeated(n: int, length: int, seed: int) -> torch.Tensor:
    """[n, 1 + 2 length]: token 0, then `length` distinct tokens from 1..V-1, twice."""
    gen = torch.Generator().manual_seed(seed)
    spans = torch.stack([torch.randperm(V - 1, generator=gen)[:length] + 1 for _ in range(n)])
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), spans, spans], dim=1)


def random_tokens(n: int, length: int, seed: int) -> torch.Tensor:
    """[n, length]: token 0, then uniform tokens from 1..V-1 (repeats happen)."""
    gen = torch.Generator().manual_seed(seed)
    rest = torch.randint(1, V, (n, length - 1), generator=gen)
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), rest], dim=1)


def plant_key_reading(hw, src_head: int, dst_head: int, strength: float):
    """`hw` (`weights.HeadWeights` of a two-layer model) with K-composition of layer-0 head
    `src_head` into layer-1 head `dst_head` planted at `strength`, two rank-2 terms, each of norm
    `strength` times the matrix it is added to: b's keys read a's two strongest output directions
    into b's two strongest query directions (the true score's strand A B C D), and a's values
    read what b's queries read (the cross term X = D A that the errata's rotated strands multiply
    by, so that both rotations see the pair too). Every other weight as it was."""
    from dataclasses import replace

    U_O, _, out = torch.linalg.svd(
        hw.W_O[0, src_head], full_matrices=False
    )  # [d_head, d_head], [.., d_model]
    U_Q, _, query = torch.linalg.svd(
        hw.W_Q[1, dst_head], full_matrices=False
    )  # [d_model, d_head], [d_head, ..]
    W_K, W_V = hw.W_K.clone(), hw.W_V.clone()
    keys = out[:2].T @ query[:2]  # [d_model, d_head], rank 2, Frobenius norm sqrt(2)
    W_K[1, dst_head] += keys * (strength * hw.W_K[1, dst_head].norm() / 2**0.5)
    values = U_Q[:, :2] @ U_O[:, :2].T  # [d_model, d_head]: b's query inputs into a's strongest value dims
    W_V[0, src_head] += values * (strength * hw.W_V[0, src_head].norm() / 2**0.5)
    return replace(hw, W_K=W_K, W_V=W_V)


def plant_key_channel(hw, src_head: int, dst_head: int, strength: float):
    """`hw` (two layers) with layer-1 head `dst_head`'s keys turned to read, through their strongest
    channel, layer-0 head `src_head`'s strongest output channel: W_K -> G W_K, G the rotation of the
    residual stream in the plane of the keys' top input direction k_0 and the writer's top output
    direction w_0 that moves k_0 by the angle arcsin(`strength`) towards w_0 (strength 1: k_0 is
    the part of w_0 orthogonal to it; 0: nothing). Every head keeps its circuits' spectra and
    norms (G is orthogonal): only how the pair's channels meet changes, in one channel
    (channel_null.py's null, a Haar rotation of the reader, keeps exactly the same)."""
    from dataclasses import replace

    from pipeline.circuits import channels

    w_0 = channels.writer_circuit(hw).writes[0, src_head, :, 0]  # [d_model]
    k_0 = channels.reader_circuit(hw, "K").reads[1, dst_head, :, 0]
    u = w_0 - (w_0 @ k_0) * k_0
    u = u / u.norm()  # [d_model], orthogonal to k_0
    sin = strength
    cos = (1 - sin**2) ** 0.5
    # G = I + (cos - 1)(k k^T + u u^T) + sin (u k^T - k u^T): k_0 -> cos k_0 + sin u (row vectors: x G^T)
    outer = lambda a, b: a[:, None] * b[None, :]  # noqa: E731
    G = (torch.eye(hw.d_model, dtype=hw.W_K.dtype) + (cos - 1) * (outer(k_0, k_0) + outer(u, u))
         + sin * (outer(u, k_0) - outer(k_0, u)))  # fmt: skip
    W_K = hw.W_K.clone()
    W_K[1, dst_head] = G @ W_K[1, dst_head]  # the keys read x G: their input directions move by G
    return replace(hw, W_K=W_K)


# --- the heads analysis of the planted model (test_behaviour_heads, the head figures' tests) ---

LENGTH = 7  # the repeated probe's span
HEADS = HeadsConfig(eval_sequences=32, repeat_length=LENGTH, window_length=WINDOW)
ROLES = {
    (0, 0): "previous_token", (0, 1): "first_token", (0, 2): "duplicate_token",
    (1, 0): "induction", (1, 1): "current_token", (1, 2): "recent_window",
}  # fmt: skip


def scores_of(hw: weights.HeadWeights) -> pd.DataFrame:
    """The composition scores of `hw` on a small null (8 baseline, 4 null draws, seed 0)."""
    return composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)


def analysed(scores: pd.DataFrame) -> heads.HeadsResult:
    """The heads analysis of the planted model on 32 repeated and 32 random sequences, `scores` its
    composition."""
    hw = weights.from_state_dict(state_dict())
    probe, heldout = repeated(32, LENGTH, 0), random_tokens(32, N_CTX, 1)
    return heads.analyse_batches(model(), hw, probe, heldout, HEADS, scores)
