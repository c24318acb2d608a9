"""The one builder of random models for the tests: named shapes, one way of drawing weights.

    random_model()                                  "tiny", seed 0, float64, every parameter random
    random_model("three_layers", seed=3)            a middle layer (paths through layer 1 into 2)
    random_model("layernorm", positional_embedding_type="standard")   any ModelConfig field
    random_model(cfg, dtype=torch.float32, perturb_biases=False)      a config's fresh init

How values are drawn, under `torch.manual_seed(seed)`:
- every W_* matrix (W_E, W_pos, W_Q, W_K, W_V, W_O, W_U) ~ Normal(0, init_range), drawn in
  `dtype` (the model's own `reset_parameters`; float64 values are not float32 values cast);
- with `perturb_biases` (the default) every other parameter, the biases b_Q, b_K, b_V, b_O,
  b_U and the LayerNorm weights and biases, gets Normal(0, bias_std) added to its initial
  value (0 for biases and LN biases, 1 for LN weights): non-zero biases and LayerNorm
  parameters, so every path of the model is exercised. (`use_bias=False`: the biases are
  buffers, not parameters, and stay exactly 0.)

`init_range` None takes the shape's (`SHAPES[...].init_range`; a ModelConfig without one: the
model's default 0.8 / sqrt(d_model), TransformerLens's); `bias_std` None takes the weights'
std. In float32 with `perturb_biases=False` the model is exactly `torch.manual_seed(seed);
Transformer(cfg)`, the initialisation training starts from.

Hand-built models with known answers are tests/planted.py's; TransformerLens's own random
HookedTransformer is tests/tl_oracle.py's.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from hypothesis import strategies as st

from pipeline.circuits.weights import HeadWeights
from pipeline.config import ModelConfig
from pipeline.model.transformer import Transformer

_TINY = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="shortformer", normalization_type=None, use_bias=True, init_range=0.5,
)  # fmt: skip

SHAPES: dict[str, ModelConfig] = {
    # two layers of three heads, d_model 16 (n_heads x d_head = 12 < 16), shortformer, no LayerNorm,
    # biases on; weights of std 0.5, not the default 0.8 / sqrt(16) = 0.2: attention far from
    # uniform, so ablating a head moves the loss
    "tiny": _TINY,
    # a middle layer: edges into layer 1 also pass through layer 2 on their way to the logits,
    # and layer-2 heads have two earlier layers to read
    "three_layers": replace(_TINY, n_layers=3),
    # tiny with pre-LN LayerNorm before every block and the unembedding
    "layernorm": replace(_TINY, normalization_type="LN"),
}


def random_model(
    shape: str | ModelConfig = "tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    init_range: float | None = None,
    perturb_biases: bool = True,
    bias_std: float | None = None,
    **overrides,
) -> Transformer:
    """A random model of `shape` (a name in SHAPES, or a ModelConfig) with `overrides` (any
    ModelConfig field), in `dtype`, in eval mode; see the module doc for how values are drawn."""
    cfg = SHAPES[shape] if isinstance(shape, str) else shape
    cfg = replace(cfg, **overrides)
    if init_range is not None:
        cfg = replace(cfg, init_range=init_range)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    if model.unembed.W_U.dtype != dtype:
        model = model.to(dtype)
        model.reset_parameters()  # drawn again in dtype, not rounded to float32
    std = cfg.init_range or 0.8 / cfg.d_model**0.5  # as Transformer.reset_parameters
    if perturb_biases:
        with torch.no_grad():
            for p in model.weight_matrices()[1]:  # biases and LayerNorm parameters
                p.add_(torch.randn_like(p) * (std if bias_std is None else bias_std))
    return model.eval()


F64 = torch.float64


def head_weights(W_Q, W_K, W_V, W_O) -> HeadWeights:
    """HeadWeights of these head matrices [layer, head, ...] (float64), every bias, embedding and
    unembedding zero: what the composition maths reads, and nothing else."""
    L, H, D, d = W_Q.shape
    z = lambda *s: torch.zeros(*s, dtype=F64)  # noqa: E731
    return HeadWeights(
        W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=z(L, H, d), b_K=z(L, H, d), b_V=z(L, H, d), b_O=z(L, D),
        W_E=z(5, D), W_pos=z(4, D), W_U=z(D, 5), b_U=z(5),
    )  # fmt: skip


@st.composite
def random_models(draw, n_ctx: int) -> Transformer:
    """A random attention-only model in float64 of any small shape and context `n_ctx`, every
    parameter (biases and LayerNorm too) drawn at one std from 0.05 to 3; one head may be dead
    (W_V = 0: OV = 0). A hypothesis strategy, for the property tests of scores and head roles."""
    n_heads, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = dict(
        n_layers=draw(st.integers(2, 3)), n_heads=n_heads, d_head=d_head,
        d_model=draw(st.integers(n_heads * d_head, 12)), n_ctx=n_ctx, d_vocab=draw(st.integers(2, 12)),
        positional_embedding_type=draw(st.sampled_from(["standard", "shortformer"])),
        normalization_type=draw(st.sampled_from([None, "LN"])),
    )  # fmt: skip
    seed, std = draw(st.integers(0, 2**31 - 1)), draw(st.floats(0.05, 3.0))
    model = random_model(seed=seed, init_range=std, bias_std=std, **shape)
    if draw(st.booleans()):
        layer, head = draw(st.integers(0, model.cfg.n_layers - 1)), draw(st.integers(0, n_heads - 1))
        with torch.no_grad():
            model.blocks[layer].attn.W_V[head] = 0.0
    return model
