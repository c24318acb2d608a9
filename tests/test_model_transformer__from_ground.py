"""The model's memory terms (pipeline/model/transformer.py, `weight_terms`, `cache_terms`,
`forward_terms`): the weights' terms count every tensor of the state dict, and each term's bytes
and keys, worked out by hand for a tiny model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipeline import memory
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import transformer
from pipeline.model.transformer import AttnOnlyTransformer

SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)
SHAPES = {
    "small": SMALL,
    "layernorm": replace(SMALL, normalization_type="LN"),
    "no-bias": replace(SMALL, use_bias=False),
    "standard-positions-three-layers": replace(SMALL, positional_embedding_type="standard", n_layers=3),
    "paper": ModelConfig(n_heads=12, d_head=64, d_model=768, n_ctx=64, d_vocab=1024),
}
# L layers, H heads of d_head dh, d_model D, context T, vocabulary V
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)


def parameter_count(m: ModelConfig) -> int:
    """Trainable parameters of `AttnOnlyTransformer(m)` by hand (the biases without use_bias are
    buffers, not parameters): the oracle of the weights' terms."""
    ln = m.normalization_type == "LN"
    heads = 4 * m.n_heads * m.d_model * m.d_head + (3 * m.n_heads * m.d_head + m.d_model) * m.use_bias
    embeddings = 2 * m.d_vocab * m.d_model + m.d_vocab * m.use_bias
    layers = m.n_layers * (heads + 2 * m.d_model * ln) + 2 * m.d_model * ln
    return embeddings + m.n_ctx * m.d_model + layers


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_weights_terms_count_the_models_tensors(shape):
    cfg = SHAPES[shape]
    with torch.device("meta"):  # shapes only: nothing allocated
        model = AttnOnlyTransformer(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    # the weights' terms count every tensor of the state dict, buffers (biases without bias) too
    terms = transformer.weight_terms(memory.Shape(cfg), 1, "elements")
    assert sum(t.bytes for t in terms) == sum(t.numel() for t in model.state_dict().values())
    assert sum(t.bytes for t in terms) == parameter_count(replace(cfg, use_bias=True))


def test_the_weights_terms_and_the_key_a_refusal_names():
    """4 bytes a parameter and buffer (biases counted without use_bias too): W_E and W_U, 2 V D, and
    b_U, V; W_pos, T D; per layer W_Q, W_K, W_V, W_O, 4 H D dh, and b_Q, b_K, b_V, b_O,
    3 H dh + D. The attention weights are the largest term and grow with n_layers, n_heads, d_head
    and d_model; n_layers is the one furthest above its default (2 of 2, the others below theirs)."""
    embeddings, positions = 2 * V * D + V, T * D
    layers = L * (4 * H * D * dh + 3 * H * dh + D)
    assert (embeddings, positions, layers) == (528, 320, 1104)
    terms = transformer.weight_terms(memory.Shape(MODEL), 4, "float32")
    assert [t.bytes for t in terms] == [4 * 528, 4 * 320, 4 * 1104]
    assert [[(s.key, s.value) for s in t.sizes] for t in terms] == [
        [("model.d_vocab", V), ("model.d_model", D)],
        [("model.n_ctx", T), ("model.d_model", D)],
        [("model.n_layers", L), ("model.n_heads", H), ("model.d_head", dh), ("model.d_model", D)],
    ]
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate("the weights", tuple(terms)), available=1000)
    assert caught.value.where == "model.n_layers" and caught.value.value == 2
    assert memory.human(4 * (528 + 320 + 1104)) in str(caught.value)


def test_a_checkpoints_shape_is_keyed_by_its_file():
    terms = transformer.weight_terms(memory.Shape(MODEL, "c/config.json"), 4, "float32")
    assert [s.key for s in terms[0].sizes] == ["c/config.json: d_vocab", "c/config.json: d_model"]


def batch(n: int, pos: int) -> memory.Batch:
    size = memory.Size("analysis.heads.eval_sequences", n, 64)
    return memory.Batch(size, memory.Shape(MODEL).n_ctx, pos, "the held-out batch", ("n", "pos"))


def test_one_layers_scores_and_the_logits_beside_the_cache():
    n = 3
    scores, logits = transformer.forward_terms(memory.Shape(MODEL), batch(n, T), memory.FLOAT64)
    # scores and masked scores [n, H, T, T], and q, k, v [n, T, H, dh]
    assert scores.bytes == 8 * n * (2 * H * T * T + 3 * T * H * dh)
    assert logits.bytes == 8 * 2 * n * T * V
    assert [s.key for s in logits.sizes] == ["analysis.heads.eval_sequences", "model.n_ctx", "model.d_vocab"]


def test_the_cache_holds_every_layers_patterns_and_head_results():
    """[n, H, T, T] patterns and [n, T, H + 1, D] results (the heads and the residual stream) per
    layer, in the dtype asked for."""
    n = 3
    patterns, results = transformer.cache_terms(memory.Shape(MODEL), batch(n, T), memory.FLOAT32)
    assert patterns.bytes == 4 * L * n * H * T * T
    assert results.bytes == 4 * L * n * T * (H + 1) * D
    assert [s.key for s in patterns.sizes] == [
        "analysis.heads.eval_sequences",
        "model.n_heads",
        "model.n_ctx",
    ]
