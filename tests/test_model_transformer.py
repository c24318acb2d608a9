"""pipeline/model/transformer.py: the attention-only transformer.

The fused forward pass equal to the cached one (values and gradients), causality, per-head input
replacements, shortformer positions, and the attention kernels on CPU and CUDA."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from models import random_model
from refusals import one_line

from pipeline import memory
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import transformer
from pipeline.model.transformer import Transformer, next_token_loss

VARIANTS = list(itertools.product(["standard", "shortformer"], [None, "LN"], [True, False]))


CFG = ModelConfig(
    n_layers=2, n_heads=2, d_head=4, d_model=16, n_ctx=16, d_vocab=24, positional_embedding_type="standard"
)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: which kernel causal_attention picks, seen on a CPU."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.mark.parametrize("pos,norm,bias", VARIANTS)
def test_fast_forward_equals_cached_forward(pos, norm, bias):
    model = random_model(positional_embedding_type=pos, normalization_type=norm, use_bias=bias)
    tokens = torch.randint(
        0, model.cfg.d_vocab, (3, model.cfg.n_ctx), generator=torch.Generator().manual_seed(1)
    )
    logits, cache = model.run_with_cache(tokens)
    assert torch.allclose(model(tokens), logits, atol=1e-10, rtol=0)
    # the cache adds up: the final residual is the first plus every head's result and b_O
    resid = cache.resid_pre[0] + sum(
        r.sum(2) + b.attn.b_O for r, b in zip(cache.result, model.blocks, strict=True)
    )
    assert torch.allclose(model.ln_final(resid) @ model.unembed.W_U + model.unembed.b_U, logits, atol=1e-10)
    for pattern in cache.pattern:  # [batch, head, query, key]: rows sum to 1, nothing from the future
        assert torch.allclose(pattern.sum(-1), torch.ones_like(pattern[..., 0]))
        assert pattern.triu(1).abs().max() == 0


def test_shortformer_keeps_positions_out_of_the_residual_stream():
    model = random_model(positional_embedding_type="shortformer")
    T = model.cfg.n_ctx
    tokens = torch.randint(0, model.cfg.d_vocab, (2, T), generator=torch.Generator().manual_seed(2))
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache.resid_pre[0], model.embed.W_E[tokens])
    assert torch.equal(cache.pos, model.pos_embed.W_pos[:T])
    standard = random_model(positional_embedding_type="standard")
    _, cache = standard.run_with_cache(tokens)
    assert torch.allclose(cache.resid_pre[0], standard.embed.W_E[tokens] + standard.pos_embed.W_pos[:T])


@pytest.mark.parametrize("pos", ["standard", "shortformer"])
def test_causal_future_tokens_do_not_change_earlier_logits(pos):
    model = random_model("layernorm", positional_embedding_type=pos)
    V = model.cfg.d_vocab
    tokens = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(3))
    changed = tokens.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % V
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :7], b[0, :7], atol=1e-12)
    assert not torch.allclose(a[0, 7:], b[0, 7:])


def test_per_head_replacements_equal_shared_ones_when_identical():
    model = random_model("layernorm", positional_embedding_type="shortformer")
    H, D = model.cfg.n_heads, model.cfg.d_model
    block, pos = model.blocks[1], model.pos_embed.W_pos[:12]
    gen = torch.Generator().manual_seed(4)
    resid, other = (torch.randn(2, 12, D, dtype=torch.float64, generator=gen) for _ in range(2))
    clean = block(resid, pos, cache=True)
    # replacing an input by the stream it already reads changes nothing, shared or per head
    for kind in "QKV":
        for stream in (resid, resid[:, :, None].expand(-1, -1, H, -1)):  # [batch, pos, (head,) d_model]
            same = block(resid, pos, replace={kind: stream}, cache=True)
            assert torch.allclose(same.result, clean.result, atol=1e-12)
            assert torch.allclose(same.pattern, clean.pattern, atol=1e-12)
    # a new key input for head 1 alone changes only head 1's pattern; values change no pattern
    per_head = resid[:, :, None].repeat(1, 1, H, 1)
    per_head[:, :, 1] = other
    keyed = block(resid, pos, replace={"K": per_head}, cache=True)
    same = [h for h in range(H) if torch.allclose(keyed.pattern[:, h], clean.pattern[:, h])]
    assert same == [0, 2]  # a head on either side
    valued = block(resid, pos, replace={"V": other}, cache=True)
    assert torch.allclose(valued.pattern, clean.pattern, atol=1e-12)
    assert not torch.allclose(valued.result, clean.result)
    # the block's output adds every head's result and b_O to its input, cached or fused
    assert torch.allclose(clean.resid, resid + clean.result.sum(2) + block.attn.b_O, atol=1e-12)
    assert torch.allclose(block(resid, pos).resid, clean.resid, atol=1e-10)


def test_no_bias_model_keeps_zero_biases_in_its_state_dict():
    model = random_model(use_bias=False)  # buffers, not parameters: perturb_biases leaves them 0
    state = model.state_dict()
    for name in ("blocks.0.attn.b_Q", "blocks.1.attn.b_O", "unembed.b_U"):
        assert name in state and state[name].abs().max() == 0
    assert not any(n.endswith(("b_Q", "b_O", "b_U")) for n, _ in model.named_parameters())


def test_sequence_longer_than_context_is_refused():
    model = random_model(positional_embedding_type="standard")
    with pytest.raises(ValueError) as caught:
        model(torch.zeros(1, model.cfg.n_ctx + 1, dtype=torch.long))
    one_line(caught, "n_ctx", model.cfg.n_ctx + 1)


def test_next_token_loss_is_the_cross_entropy_of_the_following_token():
    logits = torch.zeros(1, 3, 4, dtype=torch.float64)
    logits[0, 0, 2] = 10.0  # predicts token 2 at position 1
    tokens = torch.tensor([[0, 2, 1]])
    loss = next_token_loss(logits, tokens, reduce=False)
    assert loss.shape == (1, 2)
    assert loss[0, 0] < 1e-3 and abs(loss[0, 1].item() - math.log(4)) < 1e-12


@pytest.mark.parametrize("pos,norm", [("shortformer", "LN"), ("standard", None)])
def test_fused_forward_gradients_equal_autograd_through_the_cached_forward(pos, norm, monkeypatch):
    """Training's fused attention (the hand-written kernel, over several chunks of heads and a
    remainder) and autograd through the explicit softmax of the cache give the same gradients
    for every parameter."""
    from pipeline.model.transformer import _CausalAttention

    # 5 heads' scores per chunk: batch 3 x 3 heads = 9 = 5 + 4
    monkeypatch.setattr(_CausalAttention, "CHUNK_BYTES", 5 * 12 * 12 * 8)
    model = random_model(positional_embedding_type=pos, normalization_type=norm)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(5))
    grads = []
    for forward in (model.forward, lambda t: model.run_with_cache(t)[0]):
        model.zero_grad()
        next_token_loss(forward(tokens), tokens).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-10), name


def test_fast_forward_in_float32_at_the_default_size():
    model = random_model(ModelConfig(), dtype=torch.float32)  # the default shape and init, biases random
    tokens = torch.randint(0, 64, (20, 64), generator=torch.Generator().manual_seed(6))
    assert torch.allclose(model(tokens), model.run_with_cache(tokens)[0], atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 7, 4), (1, 8, 33, 16)])
def test_the_cuda_kernel_computes_what_the_cpu_kernel_does(shape):
    """Training's attention on CUDA is torch's scaled_dot_product_attention; on the CPU it is
    `_CausalAttention`. Both, run here on the CPU in float64: equal values and gradients."""
    from pipeline.model.transformer import causal_attention

    gen = torch.Generator().manual_seed(7)
    inputs = [torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    weight = torch.randn(shape[0] * shape[2], shape[1] * shape[3], generator=gen, dtype=torch.float64)
    out, grads = {}, {}
    for kernel in ("manual", "sdpa"):
        z = causal_attention(*inputs, kernel=kernel)  # [batch * pos, head * d_head]
        out[kernel] = z.detach()
        grads[kernel] = torch.autograd.grad((z * weight).sum(), inputs)
    assert out["manual"].shape == (shape[0] * shape[2], shape[1] * shape[3])
    assert torch.allclose(out["manual"], out["sdpa"], atol=1e-12, rtol=0)
    for a, b in zip(grads["manual"], grads["sdpa"], strict=True):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    assert causal_attention(*inputs).equal(causal_attention(*inputs, kernel="manual"))  # the CPU's default


def test_a_model_built_on_meta_draws_nothing_and_imports_no_compiler():
    """`read_checkpoint` builds the model under torch.device("meta") for its names and shapes: no
    draw there (the global generator is where it was), and torch's compiler is not imported (a
    meta draw imports torch._dynamo, about a second of every stage that checks a checkpoint). On
    the CPU the weights are still drawn, Normal(0, 0.8 / sqrt(d_model)), and advance the generator."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from pipeline.config import ModelConfig\n"
        "from pipeline.model.transformer import Transformer\n"
        "torch.manual_seed(0)\n"
        "before = torch.get_rng_state()\n"
        "with torch.device('meta'):\n"
        "    m = Transformer(ModelConfig(d_model=64, d_head=8, n_heads=2, d_vocab=50, n_ctx=10))\n"
        "assert m.blocks[0].attn.W_Q.is_meta and torch.equal(torch.get_rng_state(), before)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

    from pipeline.model.transformer import Transformer

    torch.manual_seed(0)
    before = torch.get_rng_state()
    m = Transformer(ModelConfig(d_model=64, d_head=8, n_heads=2, d_vocab=500, n_ctx=10))
    assert not torch.equal(torch.get_rng_state(), before)
    assert float(m.embed.W_E.detach().std()) == pytest.approx(0.1, rel=0.05)  # 0.8 / sqrt(64), 32,000 draws


def test_the_manual_attention_kernel_makes_its_causal_mask_on_the_inputs_device():
    """On the meta device (standing in for a GPU: shapes, no data), the hand-written kernel runs
    and answers on that device; a mask made on the CPU could not be added to its scores."""
    q, k, v = (torch.empty(2, 3, 5, 4, device="meta") for _ in range(3))
    z = transformer.causal_attention(q, k, v, kernel="manual")
    assert z.device == torch.device("meta") and tuple(z.shape) == (2 * 5, 3 * 4)


def test_causal_attention_takes_the_fused_kernel_on_cuda_and_the_manual_one_on_the_cpu(monkeypatch):
    calls = []
    fused = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return fused(*(torch.Tensor(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)

    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)
    on_cpu = transformer.causal_attention(q, k, v)
    assert calls == []
    on_cuda = transformer.causal_attention(q.as_subclass(_OnCuda), k, v)
    assert calls == [{"is_causal": True}]
    torch.testing.assert_close(torch.Tensor(on_cuda), on_cpu)


def test_a_block_called_without_cache_keeps_no_head_results_and_adds_what_the_cached_path_adds():
    """Block.forward's default is training's path (cache=False): the fused attention, no per-head
    result or pattern kept; its output is the cached path's resid + sum_h result^h + b_O."""
    torch.manual_seed(0)
    block = Transformer(CFG).blocks[0].double()
    resid = torch.randn(2, 5, CFG.d_model, dtype=torch.float64)
    plain = block(resid)
    assert plain.result is None and plain.pattern is None
    cached = block(resid, cache=True)
    assert cached.result.shape == (2, 5, CFG.n_heads, CFG.d_model)
    assert cached.pattern.shape == (2, CFG.n_heads, 5, 5)
    by_heads = resid + cached.result.sum(dim=2) + block.attn.b_O
    torch.testing.assert_close(plain.resid, by_heads, rtol=0, atol=1e-12)
    torch.testing.assert_close(cached.resid, by_heads, rtol=0, atol=1e-12)


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
    """Trainable parameters of `Transformer(m)` by hand (the biases without use_bias are
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
        model = Transformer(cfg)
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
