"""The direct, one-edge-at-a-time cuts that `pipeline.behaviour.ablation`'s batched ablations are
checked against: only head b's input of one kind reads the cut stream (per-head inputs to its
layer), every other head and b's other inputs read the clean one. Written out from the formulas of
ablation.py's module docstring, sharing none of its helpers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pipeline.behaviour.ablation import ChannelCut
from pipeline.model import patterns
from pipeline.model.transformer import Cache, Transformer, next_token_loss


def _one_head_reads(
    model: Transformer,
    tokens: Tensor,
    cache: Cache,
    clean_logits: Tensor,
    dst: tuple[int, int],
    kind: str,
    stream: Tensor,
    length: int | None,
) -> tuple[float, float, float]:
    """(attn_effect, loss_effect, pattern_effect) when head b = `dst` alone reads `stream`
    [batch, pos, d_model] at its `kind` input."""
    j, b = dst
    per_head = cache.resid_pre[j][:, :, None].repeat(
        1, 1, model.cfg.n_heads, 1
    )  # [batch, pos, head, d_model]
    per_head[:, :, b] = stream
    out = model.blocks[j](cache.resid_pre[j], cache.pos, replace={kind: per_head}, cache=True)
    loss = next_token_loss(model.logits_from(out.resid, j + 1, cache.pos), tokens)
    if length is None:
        attn_effect = math.nan
    else:
        attn_effect = float(
            patterns.induction(cache.pattern[j], length)[b] - patterns.induction(out.pattern, length)[b]
        )
    if kind == "V":  # b's write [batch, pos, d_model]: its relative change per position, 0 / 0 = 0
        clean, cut = cache.result[j][:, :, b], out.result[:, :, b]
        change, size = (cut - clean).norm(dim=-1), clean.norm(dim=-1)
        pattern_effect = torch.where(change == 0, 0.0, change / size).mean()
    else:  # b's attention rows [batch, query_pos, key_pos]: total variation per row, then the mean
        clean, cut = cache.pattern[j][:, b], out.pattern[:, b]
        pattern_effect = 0.5 * (cut - clean).abs().sum(-1).mean()
    return attn_effect, float(loss - next_token_loss(clean_logits, tokens)), float(pattern_effect)


@torch.no_grad()
def ablate_path(
    model: Transformer,
    tokens: Tensor,
    src: tuple[int, int],
    dst: tuple[int, int],
    kind: str,
    length: int | None,
) -> tuple[float, float, float]:
    """`path_ablation`'s row for the edge a = `src` -> b = `dst` (`kind`): a's write replaced by its
    per-position batch mean in b's `kind` input alone."""
    (i, a), (j, _) = src, dst
    logits, cache = model.run_with_cache(tokens)
    write = cache.result[i][:, :, a]  # [batch, pos, d_model]
    stream = cache.resid_pre[j] - write + write.mean(0, keepdim=True)
    return _one_head_reads(model, tokens, cache, logits, dst, kind, stream, length)


@torch.no_grad()
def ablate_channel(
    model: Transformer, tokens: Tensor, cut: ChannelCut, length: int | None
) -> tuple[float, float, float]:
    """`channel_ablation`'s row for one cut: b's key input is resid - (delta W W^T) K K^T, delta =
    a's write less its batch mean, W and K the cut's directions as columns [d_model, n]."""
    (i, a), (j, _) = cut.src, cut.dst
    logits, cache = model.run_with_cache(tokens)
    write = cache.result[i][:, :, a]  # [batch, pos, d_model]
    delta = write - write.mean(0, keepdim=True)
    W = cut.w.to(write).reshape(cut.w.shape[0], -1)  # [d_model, n_A]
    K = cut.k.to(write).reshape(cut.k.shape[0], -1)  # [d_model, n_B]
    stream = cache.resid_pre[j] - delta @ (W @ W.mT) @ (K @ K.mT)
    return _one_head_reads(model, tokens, cache, logits, cut.dst, "K", stream, length)
