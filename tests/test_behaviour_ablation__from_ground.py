"""The path ablation's memory terms (pipeline/behaviour/ablation.py, `path_ablation_terms`): its
chunk and logits worked out by hand for a tiny model, the chunk read from the ablation's own
chunk size, and the keys a refusal would name."""

from __future__ import annotations

from pipeline import memory
from pipeline.behaviour import ablation
from pipeline.config import ModelConfig

# L layers, H heads of d_head dh, d_model D, context T, vocabulary V
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)


def batch(n: int, pos: int, model: ModelConfig = MODEL) -> memory.Batch:
    size = memory.Size("analysis.heads.eval_sequences", n, 64)
    return memory.Batch(size, memory.Shape(model).n_ctx, pos, "the held-out batch", ("n", "pos"))


def logits_and_chunk(model: ModelConfig, n: int, pos: int) -> tuple[memory.Term, memory.Term]:
    *_cache, logits, chunk = ablation.path_ablation_terms(memory.Shape(model), batch(n, pos, model))
    return logits, chunk


def test_the_path_ablations_chunk_and_logits():
    """n = 3 sequences of 20: every source head in one chunk (H of them), every later head's loss
    pass too; float64."""
    n, sources = 3, H
    outputs = sources * n * (2 * T * H * D + H * T * T)  # results, deltas, patterns
    block_call = sources * n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    loss_passes = H * n * T * (4 * V + 2 * D + H * T)
    assert (outputs, block_call, loss_passes) == (12480, 33600, 16320)
    logits, chunk = logits_and_chunk(MODEL, n, T)
    assert chunk.bytes == 8 * (12480 + 33600)
    assert logits.bytes == 8 * 3 * n * T * V


def test_the_path_ablations_chunk_when_the_loss_passes_are_larger():
    """A large vocabulary: the later heads' loss passes outweigh the block call."""
    big = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=1000)
    n = 3
    outputs = H * n * (2 * T * H * D + H * T * T)
    loss_passes = H * n * T * (4 * 1000 + 2 * D + H * T)
    assert (outputs, loss_passes) == (12480, 488640)
    _, chunk = logits_and_chunk(big, n, T)
    assert chunk.bytes == 8 * (12480 + 488640)
    assert [s.key for s in chunk.sizes] == ["analysis.heads.eval_sequences", "model.n_ctx", "model.d_vocab"]


def test_the_later_heads_loss_passes_take_every_head_whose_logits_fit_in_a_chunk():
    """One sequence of one position over a vocabulary of one token: a later head's logits are one
    element, so a chunk of _CHUNK = 2^24 elements holds the loss passes of all 2^23 + 1 heads at
    once (2^24 // (1 x 1 x 1) heads); the source heads' results, 2^23 + 1 elements each, fit one
    at a time (2^24 // (2^23 + 1) = 1)."""
    heads = 2**23 + 1
    m = ModelConfig(n_layers=2, n_heads=heads, d_head=1, d_model=1, n_ctx=1, d_vocab=1)
    outputs = 1 * 1 * (2 * 1 * heads * 1 + heads * 1 * 1)  # one source: result, delta, pattern
    block_call = 1 * 1 * (3 * heads + 2 * heads + 6)
    loss_passes = heads * 1 * 1 * (4 * 1 + 2 * 1 + heads * 1)  # every later head at once
    assert loss_passes > block_call
    _, chunk = logits_and_chunk(m, 1, 1)
    assert chunk.bytes == 8 * (outputs + loss_passes)


def test_the_chunk_term_follows_the_ablations_chunk_size(monkeypatch):
    """A smaller _CHUNK (what a test sets to make the ablation's chunks small) shrinks the
    estimate's chunk alike: one source head a chunk instead of both."""
    _, whole = logits_and_chunk(MODEL, 3, T)
    monkeypatch.setattr(ablation, "_CHUNK", 1)
    assert ablation._sources_per_chunk(3, T, H, D) == ablation._heads_per_loss_chunk(3, T, V) == 1
    _, one = logits_and_chunk(MODEL, 3, T)
    n = 3
    outputs = n * (2 * T * H * D + H * T * T)
    block_call = n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    assert one.bytes == 8 * (outputs + block_call) < whole.bytes
