"""Causal path ablation: does a later head b depend on an earlier head a through its
queries, keys or values?

For each earlier head a (layer i), later head b (layer j > i) and kind (Q, K or V):
replace a's output (its write into the residual stream, before b_O) by its mean over
the evaluation batch at each position, only in the input to b's queries (resp. keys,
values). Every other head, and b's other two inputs, still read a's real output, so
only the one edge a -> b(kind) is cut. On repeated random tokens `[first, span, span]`:

    attn_effect = induction(b) clean - induction(b) ablated    (how much b's prefix matching drops)
    loss_effect = loss ablated - loss clean                    (next-token loss, all positions)

and, on any tokens, what the cut does to head b itself, whatever b's role (`pattern_effect`):

    Q, K: mean over the batch and every query position q of the total variation distance
          0.5 sum_k |pattern_b clean[q, k] - pattern_b ablated[q, k]|      in [0, 1]
    V:    mean over the batch and every position of ||result_b ablated - result_b clean||
          / ||result_b clean||  (b's write into the residual stream, before b_O; 0 / 0 = 0)

The induction score counts only the composition that serves induction; the pattern effect
counts any change of what b attends to (or, through its values, writes). An edge whose writer's
output b cannot read (an orthogonal write, a zero W_O) has pattern effect 0.

V-ablation cannot change b's pattern, so its attn_effect is 0 (written as exactly 0).

On held-out text (`length` None) the loss and pattern effects are measured: attn_effect is NaN.

It runs through the model's one layer path, `Block.forward`, with its `replace`
argument. Fast path (`path_ablation`): head b's pattern and output depend only on b's
own query, key and value inputs, so feeding the ablated stream to *every* head of layer
j at once (at one kind) gives each head b exactly its single-edge result. Several
source heads a are stacked along the batch of one block call. The loss then needs one
pass through the later layers per b (b's new output, every other head's clean one):
all b are batched. The tests check it against one edge cut at a time, through per-head inputs.

One channel of a K edge (`channel_ablation`; the causal check of the channel shares of
pipeline/circuits/channels.py). Writer a's OV circuit writes along orthonormal directions w_i,
reader b's keys read the residual along orthonormal directions k_j (its K circuit's SVD). A
channel is a writer block A x a reader block B (consecutive directions of near-equal singular
values; one direction each when the values are distinct): W_A [d_model, n_A] the block's output
directions, K_B [d_model, n_B] the reader block's key-input directions. Cutting it removes, from
b's key input only, writer block A's mean-ablated contribution to reader block B's read, and
nothing else (row vectors):

    delta          = write_a - mean_batch(write_a)
    key input of b = resid - (delta W_A W_A^T) K_B K_B^T

Its read along K_B loses exactly what a's block A put there beyond its mean (a's write lies in
the span of the w's); its reads along the other k's are unchanged (the k's are orthonormal), and
so is what a's other blocks give block B. The cut depends on the blocks' subspaces alone
(W_A W_A^T and K_B K_B^T are their projectors), so on no choice of basis within a block; with
one direction each it is ((delta . w_i)(w_i . k_j)) k_j. Cutting every block pair at once is the
whole-path K cut, as far as b's keys can tell. Effects as above; W_A orthogonal to K_B changes
nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import pandas as pd
import torch
from torch import Tensor

from .. import memory
from ..cli import progress_bar
from ..model import patterns, transformer
from ..model.transformer import Block, BlockOutput, Cache, Transformer, next_token_loss
from ..tables import ABLATION_COLUMNS, KINDS

# the heads stage adds heldout_loss_effect and takes pattern_effect from the held-out text's run
COLUMNS = [c for c in ABLATION_COLUMNS if c != "heldout_loss_effect"]
# elements of one stacked attention result, or of one batch of logits (128 MB in float64): the
# chunks below and their memory term (`path_ablation_terms`) read it; a test makes it smaller
_CHUNK = 2**24


def _sources_per_chunk(batch: int, pos: int, n_heads: int, d_model: int) -> int:
    """Source heads stacked into one block call: its per-head result [n * batch, pos, head,
    d_model] stays under _CHUNK elements (memory), at least one."""
    return max(1, _CHUNK // (batch * pos * n_heads * d_model))


def _heads_per_loss_chunk(batch: int, pos: int, d_vocab: int) -> int:
    """Destination heads whose loss passes are batched together: their logits [n * batch, pos,
    d_vocab] stay under _CHUNK elements (a 50k vocabulary would otherwise need ~10 GB), at least one."""
    return max(1, _CHUNK // (batch * pos * d_vocab))


def _pattern_effect(
    kind: str, pattern: Tensor, clean_pattern: Tensor, delta: Tensor, clean_result: Tensor
) -> Tensor:
    """`pattern_effect` [n, head] (module doc) of n stacked ablations of layer j: `pattern`
    [n, batch, head, query_pos, key_pos] against `clean_pattern` [batch, head, query_pos, key_pos]
    (Q, K); `delta`, the ablated result minus the clean one [n, batch, pos, head, d_model],
    against `clean_result` [batch, pos, head, d_model] (V)."""
    if kind == "V":
        change = delta.norm(dim=-1)  # [n, batch, pos, head]
        size = clean_result.norm(dim=-1)  # [batch, pos, head]
        return torch.where(change == 0, 0.0, change / size).mean(dim=(1, 2))
    diff = pattern - clean_pattern  # [n, batch, head, query_pos, key_pos]: one buffer, made absolute in place
    return 0.5 * diff.abs_().sum(-1).mean(dim=(1, 3))


def _induction(pattern: Tensor, length: int | None) -> Tensor:
    """Induction score per head [head], or NaN without a repeated batch (`length` None)."""
    if length is None:
        return torch.full(pattern.shape[-3:-2], torch.nan, dtype=pattern.dtype, device=pattern.device)
    return patterns.induction(pattern, length)


def _clean_layer(model: Transformer, cache: Cache, j: int, length: int | None) -> tuple:
    """Layer j's clean state for the ablations into it: (block, its input stream [batch, pos,
    d_model], its heads' induction scores [head], their writes [batch, pos, head, d_model], its
    stream after attention [batch, pos, d_model] (before the block's MLP, if any), the sources
    stacked per block call, the heads per loss pass)."""
    block = model.blocks[j]
    resid = cache.resid_pre[j]
    clean_result = cache.result[j]
    B, T = resid.shape[:2]
    return (
        block, resid, _induction(cache.pattern[j], length), clean_result,
        resid + clean_result.sum(dim=2) + block.attn.b_O,
        _sources_per_chunk(B, T, model.cfg.n_heads, clean_result.shape[-1]),
        _heads_per_loss_chunk(B, T, model.cfg.d_vocab),
    )  # fmt: skip


@torch.no_grad()
def path_ablation(model: Transformer, tokens: Tensor, length: int | None) -> pd.DataFrame:
    """One row per (kind, a, b), b in a later layer than a: COLUMNS (attn_effect, loss_effect,
    pattern_effect). `tokens` [batch, pos]: repeated `[first, span, span]` with `length`-token
    spans, or held-out text (`length` None)."""
    logits, cache = model.run_with_cache(tokens)
    clean_loss = next_token_loss(logits, tokens)
    B, T = tokens.shape
    H = model.cfg.n_heads
    rows = []
    L = model.cfg.n_layers
    bar = progress_bar(H * L * (L - 1) // 2, "path ablation", "source head")  # every (a, later layer)
    for j in range(1, model.cfg.n_layers):
        block, resid, clean_induction, clean_result, resid_mid, step, per_loss = _clean_layer(
            model, cache, j, length
        )
        for i in range(j):
            write = cache.result[i]  # [batch, pos, head, d_model]
            for first in range(0, H, step):
                sources = range(first, min(first + step, H))
                n = len(sources)
                # layer j's input with each source head's write replaced by its per-position mean
                w = write[:, :, first : first + n]  # [batch, pos, n, d_model]
                ablated = resid[:, :, None] - w + w.mean(0, keepdim=True)  # [batch, pos, n, d_model]
                ablated = ablated.permute(2, 0, 1, 3).reshape(n * B, T, -1)  # sources stacked along the batch
                clean = resid.repeat(n, 1, 1)  # [n * batch, pos, d_model]
                for kind in KINDS:
                    # every head of layer j reads the ablated stream at this kind (module doc)
                    out = block(clean, cache.pos, replace={kind: ablated}, cache=True)
                    pattern = out.pattern.view(n, B, H, T, T)
                    delta = out.result.view(n, B, T, H, -1) - clean_result  # [n, batch, pos, head, d_model]
                    # [n, head]: b's pattern (Q, K) or output (V) against the clean pass
                    changed = _pattern_effect(kind, pattern, cache.pattern[j], delta, clean_result)
                    delta = delta.permute(0, 3, 1, 2, 4)  # [n, head, batch, pos, d_model]
                    for s, a in enumerate(sources):
                        attn_effect = clean_induction - _induction(pattern[s], length)  # [head]
                        if kind == "V":  # values cannot move a pattern: 0, not rounding noise
                            attn_effect = torch.where(attn_effect.isnan(), attn_effect, 0.0)
                        # one copy of the batch per b: b's new write, the other heads' clean ones
                        loss_effect = torch.empty(H, dtype=clean_loss.dtype, device=tokens.device)
                        for g in range(0, H, per_loss):
                            heads = slice(g, min(g + per_loss, H))
                            m = heads.stop - heads.start
                            # the block's MLP, if any, reads b's new write too
                            stream = block.finish(resid, resid_mid + delta[s, heads]).reshape(
                                m * B, T, -1
                            )  # [m * batch, pos, d_model]
                            new_logits = model.logits_from(stream, j + 1, cache.pos)
                            loss = next_token_loss(new_logits, tokens.repeat(m, 1), reduce=False)
                            loss_effect[heads] = loss.view(m, -1).mean(-1) - clean_loss
                        # one copy each off a GPU
                        attn, loss, moved = attn_effect.tolist(), loss_effect.tolist(), changed[s].tolist()
                        rows.extend((kind, i, a, j, b, attn[b], loss[b], moved[b]) for b in range(H))
                bar.update(n)
    bar.close()
    frame = pd.DataFrame(rows, columns=COLUMNS)
    order = {kind: n for n, kind in enumerate(KINDS)}
    frame = frame.sort_values(COLUMNS[:5], key=lambda c: c.map(order) if c.name == "kind" else c)
    return frame.reset_index(drop=True)  # KINDS order, then heads


def _require_order(i: int, j: int, n_layers: int) -> None:
    if not 0 <= i < j < n_layers:
        raise ValueError(f"the source layer {i} must come before the destination layer {j}")


# --- one channel of a K edge (module doc) -------------------------------------------------------


class ChannelCut(NamedTuple):
    """Channel (A, B) of the K edge a -> b: writer a's output directions w (writer block A of OV^a)
    and reader b's key-input directions k (reader block B of QK^bT), orthonormal columns [d_model,
    n] in the residual stream's basis, or one unit vector [d_model] (a block of one direction)
    (`pipeline.circuits.channels`: `writer_circuit(hw).writes[.., :, A]`, `reader_circuit(hw,
    "K").reads[.., :, B]`; any orthonormal basis of each block gives the same cut)."""

    src: tuple[int, int]  # a: (layer, head)
    dst: tuple[int, int]  # b: (layer, head), a later layer
    w: Tensor  # [d_model, n_A] or [d_model]
    k: Tensor  # [d_model, n_B] or [d_model]


def _channel_cut(cache: Cache, cut: ChannelCut) -> Tensor:
    """Layer j's residual input less writer block w's mean-ablated contribution to reader block
    k's read: resid - (delta w w^T) k k^T, delta = write_a - mean_batch(write_a)
    [batch, pos, d_model]."""
    (i, a), (j, _) = cut.src, cut.dst
    write = cache.result[i][:, :, a]  # [batch, pos, d_model]
    w, k = (v.to(write).reshape(v.shape[0], -1) for v in (cut.w, cut.k))  # [d_model, n]: a vector, one column
    on_writer = (write - write.mean(0, keepdim=True)) @ w  # [batch, pos, n_A]: delta along the block
    read = on_writer @ (w.mT @ k)  # [batch, pos, n_B]: what reader block B loses
    return cache.resid_pre[j] - read @ k.mT


@torch.no_grad()
def channel_ablation(
    model: Transformer, tokens: Tensor, cuts: Sequence[ChannelCut], length: int | None
) -> pd.DataFrame:
    """One row per cut of `cuts`, in their order: src_layer, src_head, dst_layer, dst_head and the
    effects of cutting that one channel (a block pair) of the K edge a -> b (module doc):
    attn_effect, loss_effect, pattern_effect, as `path_ablation`'s. `tokens` [batch, pos]:
    repeated `[first, span, span]` with `length`-token spans, or held-out text (`length` None:
    attn_effect NaN).

    Exact without LayerNorm (`normalization_type` null, the default models), where the analysis
    weights that give w and k are the model's. With LayerNorm they are folded and centred (w and k
    orthogonal to the all-ones direction, which ln1 removes): the cut is made, as the whole-path
    cut is, on the residual stream before ln1, so reader block B's read loses exactly a's
    block A up to ln1's scale, which the cut changes (every channel's read at a position is
    divided by the new scale). An approximation, the whole-path cut's own.

    Fast path, as `path_ablation`'s: every head of layer j reads the cut stream at K (head b's
    pattern depends only on b's own inputs), the cuts into one layer stacked along the batch of
    one block call, and their loss passes batched."""
    logits, cache = model.run_with_cache(tokens)
    clean_loss = next_token_loss(logits, tokens)
    B, T = tokens.shape
    H = model.cfg.n_heads
    effects: list[tuple[float, float, float]] = [(math.nan,) * 3] * len(cuts)  # each set below
    bar = progress_bar(len(cuts), "channel ablation", "cut")
    for j in sorted({cut.dst[0] for cut in cuts}):
        into = [n for n, cut in enumerate(cuts) if cut.dst[0] == j]  # the cuts into layer j
        for n in into:
            _require_order(cuts[n].src[0], j, model.cfg.n_layers)
        block, resid, clean_induction, clean_result, resid_mid, step, per_loss = _clean_layer(
            model, cache, j, length
        )
        for first in range(0, len(into), step):
            chunk = into[first : first + step]
            m = len(chunk)
            heads = torch.tensor([cuts[n].dst[1] for n in chunk], device=tokens.device)  # [m]: each cut's b
            keys = torch.cat([_channel_cut(cache, cuts[n]) for n in chunk])  # [m * batch, pos, d_model]
            out = block(resid.repeat(m, 1, 1), cache.pos, replace={"K": keys}, cache=True)
            rows = torch.arange(m, device=tokens.device)
            pattern = out.pattern.view(m, B, H, T, T)[rows, :, heads]  # [m, batch, query_pos, key_pos]: b's
            clean = cache.pattern[j][:, heads].transpose(0, 1)  # [m, batch, query_pos, key_pos]
            moved = 0.5 * (pattern - clean).abs().sum(-1).mean(dim=(1, 2))  # [m]
            attn = clean_induction[heads] - torch.stack(
                [_induction(p[:, None], length)[0] for p in pattern]
            )  # [m]
            delta = out.result.view(m, B, T, H, -1)[rows, :, :, heads] - clean_result[:, :, heads].permute(
                2, 0, 1, 3
            )  # [m, batch, pos, d_model]: b's new write less its clean one
            loss = torch.empty(m, dtype=clean_loss.dtype, device=tokens.device)
            for g in range(0, m, per_loss):  # one copy of the batch per cut
                part = slice(g, min(g + per_loss, m))
                size = part.stop - part.start
                # [size * batch, pos, d_model]; the block's MLP, if any, reads b's new write too
                stream = block.finish(resid, resid_mid + delta[part]).reshape(size * B, T, -1)
                new_logits = model.logits_from(stream, j + 1, cache.pos)
                ablated = next_token_loss(new_logits, tokens.repeat(size, 1), reduce=False)
                loss[part] = ablated.view(size, -1).mean(-1) - clean_loss
            values = zip(attn.tolist(), loss.tolist(), moved.tolist(), strict=True)  # one copy each off a GPU
            for n, effect in zip(chunk, values, strict=True):
                effects[n] = effect
            bar.update(m)
    bar.close()
    rows_out = [(*cut.src, *cut.dst, *effect) for cut, effect in zip(cuts, effects, strict=True)]
    return pd.DataFrame(rows_out, columns=COLUMNS[1:])


@torch.no_grad()
def heads_loss_effect(model: Transformer, tokens: Tensor, heads: Sequence[tuple[int, int]]) -> float:
    """Loss with every head of `heads` (layer, head) mean-ablated, minus the clean loss (nats).

    Each head's write into the residual stream is replaced by its per-position mean over the
    batch, for every later reader at once (unlike `path_ablation`, which cuts one edge): whether
    the model's loss depends on that set of heads. Positive: the heads lower the loss on `tokens`.
    """
    return heads_loss_effects(model, tokens, [heads])[0]


@torch.no_grad()
def heads_loss_effects(
    model: Transformer, tokens: Tensor, head_sets: Sequence[Sequence[tuple[int, int]]]
) -> list[float]:
    """`heads_loss_effect` of each set of `head_sets` on the same `tokens`, bit for bit, with the
    clean pass run once for them all: a set's ablated pass starts from the clean block outputs
    below its first ablated layer, which are what it would compute there."""
    if not head_sets or not all(head_sets):
        raise ValueError("no heads to ablate")
    embedded, pos = model.embed_tokens(tokens)
    clean = next_token_loss(model.logits_from(embedded, 0, pos), tokens)
    inputs = [embedded]  # the clean blocks' inputs and outputs, as far as a set needs
    clean_blocks = [model.blocks[0](embedded, pos, cache=True)]
    effects = []
    bar = progress_bar(len(head_sets), "role ablation", "head set")
    for heads in head_sets:
        first = min(layer for layer, _ in heads)
        while len(clean_blocks) <= first:
            inputs.append(clean_blocks[-1].resid)
            clean_blocks.append(model.blocks[len(clean_blocks)](inputs[-1], pos, cache=True))
        resid = _mean_ablated_writes(
            model.blocks[first], inputs[first], clean_blocks[first], [h for l, h in heads if l == first]
        )
        for layer in range(first + 1, len(model.blocks)):
            out = model.blocks[layer](resid, pos, cache=True)
            resid = _mean_ablated_writes(model.blocks[layer], resid, out, [h for l, h in heads if l == layer])
        ablated = next_token_loss(model.logits_from(resid, len(model.blocks), pos), tokens)
        effects.append(float(ablated - clean))
        bar.update()
    bar.close()
    return effects


def _mean_ablated_writes(block: Block, resid: Tensor, out: BlockOutput, heads: Sequence[int]) -> Tensor:
    """The output stream of `block` (its input `resid`, its cached output `out`) with each of
    `heads`' writes replaced by its mean over the batch, before the block's MLP (if any) reads it."""
    mid = out.mid
    for h in sorted(heads):
        write = out.result[:, :, h]  # [batch, pos, d_model]
        mid = mid - write + write.mean(0, keepdim=True)
    return block.finish(resid, mid)


# --- memory: what the path ablation allocates, for pipeline/memory.py's check ---------------


def path_ablation_terms(s: memory.Shape, b: memory.Batch) -> list[memory.Term]:
    """`path_ablation` on batch `b` (float64): its cached pass and the clean logits, kept
    throughout, and one chunk of stacked source heads (`_sources_per_chunk`): the previous block
    call's results, deltas and patterns stay bound while the next call computes its own (scores,
    masked scores, patterns, the einsum's result and its copy, the streams and q, k, v), or while
    the later heads' loss passes run (`_heads_per_loss_chunk`: streams, logits with their copy
    and log-softmax, the fused attention's patterns). The pattern effect's one buffer of pattern
    differences [sources x n, n_heads, pos, pos] lives between a block call and the loss passes,
    beside that call's outputs only, so below the call's own peak (its scores, masked scores and
    patterns): no term of its own."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    H, D, V = m.n_heads, m.d_model, m.d_vocab
    sources = min(H, _sources_per_chunk(n, T, H, D))
    losses = min(H, _heads_per_loss_chunk(n, T, V))
    outputs = sources * n * (2 * T * H * D + H * T * T)  # result, delta, pattern
    block_call = sources * n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    loss_passes = losses * n * T * (4 * V + 2 * D + H * T)
    vocab = loss_passes > block_call
    chunk = memory.Term(
        f"one chunk of the path ablation on {b.where}",
        memory.FLOAT64 * (outputs + max(block_call, loss_passes)),
        (b.n, b.length, s.d_vocab) if vocab else (b.n, b.length, s.n_heads, s.d_model),
    )
    logits = memory.Term(
        f"the logits of {b.where}, [{n_}, {pos_}, d_vocab], with their copy and log-softmax",
        memory.FLOAT64 * 3 * n * T * V,
        (b.n, b.length, s.d_vocab),
    )
    return [*transformer.cache_terms(s, b, memory.FLOAT64), logits, chunk]
