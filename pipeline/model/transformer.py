"""A transformer of N layers, attention-only or with MLPs, in the paper's notation.

Row-vector convention and TransformerLens's state-dict names, so checkpoints move
both ways (docs/design.md, "Weight formats"). For head h of a layer:

    q = x W_Q^h + b_Q^h        k = y W_K^h + b_K^h        scores = q k^T / sqrt(d_head)
    v = y W_V^h + b_V^h        result^h = pattern^h v W_O^h     out = sum_h result^h + b_O

With `d_mlp` each block then adds an MLP, act(x W_in + b_in) W_out + b_out, reading the
stream after attention (resid_mid), or the block's input beside attention with
`parallel_attn_mlp` (TransformerLens's `TransformerBlock`). Without it the model is
attention-only, as in the paper.

Positional embeddings are `standard` (added to the residual stream), `shortformer`
(added only to the query and key inputs, never to the residual stream, so the
residual stream carries token information only, as in the paper) or `rotary` (no
embedding: each query and key turned by its position, TransformerLens's `apply_rotary`,
as GPT-NeoX and Pythia; the residual stream carries tokens only too). With LayerNorm
(`normalization_type: LN`, pre-LN as TransformerLens: ln1 before attention, ln2 before
the MLP), shortformer positions are added after the norm.

One path through a layer, `Block.forward`, serves training, `run_with_cache` and the
path ablation. Its `replace` argument gives the query, key or value input its own
residual stream, shared by all heads `[batch, pos, d_model]` or per head
`[batch, pos, head, d_model]`: that is what path ablation needs (change only what
reaches one head's keys); the block's MLP then reads what attention wrote, as it would.
With `cache=False` (training) attention runs through a fused
kernel (`causal_attention`: hand-written on the CPU, torch's on CUDA) and no per-head result
is kept.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import memory
from ..config import LN_EPS, ModelConfig
from ..tables import KINDS


def _holder(**params: nn.Parameter) -> nn.Module:
    """A module that only holds named parameters (gives names like `embed.W_E`)."""
    module = nn.Module()
    for name, p in params.items():
        module.register_parameter(name, p)
    return module


class LayerNorm(nn.Module):
    """Centre, divide by the RMS, then scale and shift: TransformerLens's `LN`."""

    def __init__(self, d_model: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:  # [..., d_model]
        x = x - x.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + LN_EPS).sqrt()
        return x / scale * self.w + self.b


class Attention(nn.Module):
    """The heads of one layer: only their weights (`Block.forward` runs them)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rotary = cfg.positional_embedding_type == "rotary"
        self.rotary_dim, self.rotary_base = cfg.rotated_dims, cfg.rotary_base
        self.adjacent_pairs = cfg.rotary_adjacent_pairs
        H, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(H, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(H, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(H, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(H, d_head, d_model))
        biases = {"b_Q": (H, d_head), "b_K": (H, d_head), "b_V": (H, d_head), "b_O": (d_model,)}
        for name, shape in biases.items():
            if cfg.use_bias:
                self.register_parameter(name, nn.Parameter(torch.zeros(shape)))
            else:  # kept as zero buffers so the state dict has TransformerLens's keys
                self.register_buffer(name, torch.zeros(shape))

    def project(self, x: Tensor, kind: str) -> Tensor:
        """x W + b of every head, `[batch, head, pos, d_head]`: x is the kind's input,
        `[batch, pos, d_model]` (one matmul for all heads) or `[batch, pos, head, d_model]`."""
        W, b = (
            getattr(self, f"W_{kind}"),
            getattr(self, f"b_{kind}"),
        )  # [head, d_model, d_head], [head, d_head]
        if x.ndim == 3:
            H, d_model, d_head = W.shape
            flat = W.transpose(0, 1).reshape(d_model, H * d_head)  # [d_model, head * d_head]
            out = torch.addmm(b.reshape(-1), x.reshape(-1, d_model), flat)  # [batch * pos, head * d_head]
            return out.view(*x.shape[:2], H, d_head).transpose(1, 2)
        return (torch.einsum("bphm,hmd->bphd", x, W) + b).transpose(1, 2)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Rotary positions: queries q and keys k `[batch, head, pos, d_head]` with their first
        rotary_dim dimensions turned, pair by pair, by position / base^(2i / rotary_dim) (pairs
        (i, i + rotary_dim / 2), or adjacent ones); the waves computed once for both, in float32,
        float64 for a float64 model, as TransformerLens's `calculate_sin_cos_rotary`."""
        T, d = q.shape[-2], self.rotary_dim
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        freq = self.rotary_base ** (torch.arange(d // 2, dtype=wide, device=q.device) / (d / 2))
        freq = freq.repeat_interleave(2) if self.adjacent_pairs else freq.repeat(2)  # [rotary_dim]
        angles = torch.arange(T, dtype=wide, device=q.device)[:, None] / freq  # [pos, rotary_dim]
        sin, cos = angles.sin().to(q.dtype), angles.cos().to(q.dtype)

        def turn(x: Tensor) -> Tensor:
            turned, kept = x[..., :d], x[..., d:]
            if self.adjacent_pairs:  # (x0, x1) -> (-x1, x0) for each adjacent pair
                flip = torch.stack([-turned[..., 1::2], turned[..., ::2]], dim=-1).flatten(-2)
            else:  # (x_i, x_{i + d/2}) -> (-x_{i + d/2}, x_i)
                flip = torch.cat([-turned[..., d // 2 :], turned[..., : d // 2]], dim=-1)
            return torch.cat([turned * cos + flip * sin, kept], dim=-1)

        return turn(q), turn(k)


# TransformerLens's activations by `act_fn` name; gelu_new is GPT-2's tanh approximation
ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class MLP(nn.Module):
    """act(x W_in + b_in) W_out + b_out, TransformerLens's names and shapes."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.d_mlp is not None
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        for name, size in (("b_in", cfg.d_mlp), ("b_out", cfg.d_model)):
            if cfg.use_bias:
                self.register_parameter(name, nn.Parameter(torch.zeros(size)))
            else:  # zero buffers, so the state dict has TransformerLens's keys
                self.register_buffer(name, torch.zeros(size))
        self.act = ACTIVATIONS[cfg.act_fn]

    def forward(self, x: Tensor) -> Tensor:  # [..., d_model]
        return self.act(x @ self.W_in + self.b_in) @ self.W_out + self.b_out


class BlockOutput(NamedTuple):
    resid: Tensor  # [batch, pos, d_model]  the residual stream after the layer
    result: Tensor | None  # [batch, pos, head, d_model]  each head's write, before b_O (cache only)
    pattern: Tensor | None  # [batch, head, query_pos, key_pos]  (cache only)
    mid: Tensor | None = None  # [batch, pos, d_model]  after attention, before the MLP (cache only)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        ln = cfg.normalization_type == "LN"
        self.ln1 = LayerNorm(cfg.d_model) if ln else nn.Identity()
        self.attn = Attention(cfg)
        if not cfg.attn_only:
            self.ln2 = LayerNorm(cfg.d_model) if ln else nn.Identity()
            self.mlp = MLP(cfg)
        self.parallel = cfg.parallel_attn_mlp

    def finish(self, resid: Tensor, mid: Tensor) -> Tensor:
        """The block's output from its input `resid` and the stream after attention `mid` (both
        [.., pos, d_model]): mid plus the MLP's output, the MLP reading mid (or, parallel, resid);
        attention-only: mid itself."""
        if not hasattr(self, "mlp"):
            return mid
        return mid + self.mlp(self.ln2(resid if self.parallel else mid))

    def forward(
        self,
        resid: Tensor,
        pos: Tensor | None = None,
        replace: dict[str, Tensor] | None = None,
        cache: bool = False,
    ) -> BlockOutput:
        """resid + sum_h result^h + b_O for a residual stream `resid` `[batch, pos, d_model]`.

        pos: the positional embeddings `[pos, d_model]` of a shortformer model, added to
        the query and key inputs after ln1 (None: standard positions, already in resid).
        replace: {"Q" | "K" | "V": a residual stream that input reads instead of `resid`},
        `[batch, pos, d_model]` for every head or `[batch, pos, head, d_model]` per head.
        cache: also return each head's result and pattern (explicit softmax); otherwise
        attention runs fused (`causal_attention`), as in training.
        """
        a = self.attn
        B, T, d_model = resid.shape
        x = self.ln1(resid)
        x_qk = x if pos is None else x + pos  # shortformer: positions only in queries and keys
        q, k, v = (
            a.project(self._input(replace[kind], pos, kind) if replace and kind in replace else clean, kind)
            for kind, clean in zip(KINDS, (x_qk, x_qk, x), strict=True)
        )  # each [batch, head, pos, d_head]
        if a.rotary:
            q, k = a.rotate(q, k)
        d_head = q.shape[-1]
        if not cache:
            z = causal_attention(q, k, v)  # [batch * pos, head * d_head]
            out = torch.addmm(a.b_O, z, a.W_O.reshape(-1, d_model))  # [batch * pos, d_model]
            return BlockOutput(self.finish(resid, resid + out.view(B, T, d_model)), None, None)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)  # [batch, head, query_pos, key_pos]
        future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
        pattern = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        z = pattern @ v  # [batch, head, pos, d_head]
        result = torch.einsum("bhqd,hdm->bqhm", z, a.W_O)  # [batch, pos, head, d_model]
        mid = resid + result.sum(dim=2) + a.b_O
        return BlockOutput(self.finish(resid, mid), result, pattern, mid)

    def _input(self, stream: Tensor, pos: Tensor | None, kind: str) -> Tensor:
        """A replacement residual stream as the `kind` input: ln1, then positions for Q and K."""
        x = self.ln1(stream)
        if pos is None or kind == "V":
            return x
        return x + (pos if x.ndim == 3 else pos[:, None])  # per head: [batch, pos, head, d_model]


class Cache(NamedTuple):
    """Activations of one forward pass, per layer."""

    resid_pre: list[Tensor]  # [batch, pos, d_model]
    result: list[Tensor]  # [batch, pos, head, d_model]
    pattern: list[Tensor]  # [batch, head, query_pos, key_pos]
    pos: Tensor | None  # shortformer: [pos, d_model] added to queries and keys


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = _holder(W_E=nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model)))
        if cfg.positional_embedding_type != "rotary":  # rotary positions have no embedding
            self.pos_embed = _holder(W_pos=nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model)))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = LayerNorm(cfg.d_model) if cfg.normalization_type == "LN" else nn.Identity()
        self.unembed = nn.Module()
        self.unembed.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        b_U = torch.zeros(cfg.d_vocab)
        if cfg.use_bias:
            self.unembed.b_U = nn.Parameter(b_U)
        else:
            self.unembed.register_buffer("b_U", b_U)
        self.reset_parameters()

    def weight_matrices(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(every W_*, the rest: biases and LayerNorm), in named_parameters order."""
        matrices, rest = [], []
        for name, p in self.named_parameters():
            (matrices if name.rsplit(".", 1)[-1].startswith("W_") else rest).append(p)
        return matrices, rest

    def reset_parameters(self) -> None:
        """Normal(0, init_range) for every W_*, as TransformerLens's GPT-2 init."""
        std = self.cfg.init_range or 0.8 / math.sqrt(self.cfg.d_model)
        for p in self.weight_matrices()[0]:
            # a meta tensor (a model built under torch.device("meta") for its names and shapes)
            # holds no values to draw, and drawing there imports torch's compiler (torch._dynamo:
            # about a second of every stage that checks a checkpoint); nothing is drawn either way
            if not p.is_meta:
                nn.init.normal_(p, std=std)

    @property
    def shortformer(self) -> bool:
        """Positions enter only the queries' and keys' inputs, never the residual stream."""
        return self.cfg.positional_embedding_type == "shortformer"

    def embed_tokens(self, tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """The residual stream's start `[batch, pos, d_model]` (token embeddings, plus the
        positions unless shortformer) and what each block adds to its queries and keys
        (shortformer: the positional embeddings `[pos, d_model]`; else None: rotary positions
        turn the queries and keys inside each block)."""
        T = tokens.shape[1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds n_ctx = {self.cfg.n_ctx}")
        resid = self.embed.W_E[tokens]  # [batch, pos, d_model]
        if self.cfg.positional_embedding_type == "rotary":
            return resid, None
        W_pos = self.pos_embed.W_pos[:T]  # [pos, d_model]
        return (resid, W_pos) if self.shortformer else (resid + W_pos, None)

    def logits_from(self, resid: Tensor, layer: int = 0, pos: Tensor | None = None) -> Tensor:
        """Logits `[batch, pos, d_vocab]` from the residual stream `resid` entering block `layer`
        (`n_layers`: the final stream): the remaining blocks, then the unembedding."""
        for block in self.blocks[layer:]:
            resid = block(resid, pos).resid
        return self.ln_final(resid) @ self.unembed.W_U + self.unembed.b_U

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits `[batch, pos, d_vocab]` (training: fused attention, no activations kept)."""
        resid, pos = self.embed_tokens(tokens)
        return self.logits_from(resid, 0, pos)

    def run_with_cache(self, tokens: Tensor) -> tuple[Tensor, Cache]:
        """Logits `[batch, pos, d_vocab]` and the activations of every layer."""
        resid, pos = self.embed_tokens(tokens)
        cache = Cache([], [], [], pos)
        for block in self.blocks:
            cache.resid_pre.append(resid)
            resid, result, pattern, _ = block(resid, pos, cache=True)
            cache.result.append(result)
            cache.pattern.append(pattern)
        return self.logits_from(resid, len(self.blocks)), cache


def causal_attention(q: Tensor, k: Tensor, v: Tensor, kernel: str | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + causal mask) v for q, k, v `[batch, head, pos, d_head]`,
    laid out `[batch * pos, head * d_head]` for W_O: training's fused attention (no pattern kept).

    `kernel` (default: by device): "sdpa", torch's `scaled_dot_product_attention` (flash or
    memory-efficient kernels on CUDA, where the hand-written one leaves most of the chip idle),
    or "manual", `_CausalAttention` (measured faster than "sdpa" on the CPU: docs/benchmarks.md).
    Both compute the same function; tests/test_model_transformer.py checks values and gradients against each
    other on the CPU."""
    B, H, T, d_head = q.shape
    if (kernel or ("sdpa" if q.is_cuda else "manual")) == "sdpa":
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [batch, head, pos, d_head]
        return z.transpose(1, 2).reshape(B * T, H * d_head)
    causal = torch.full((T, T), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    flat = (t.reshape(B * H, T, d_head) for t in (q, k, v))  # [batch * head, pos, d_head]
    z = _CausalAttention.apply(*flat, causal, 1 / math.sqrt(d_head))  # [batch * head, pos, d_head]
    return z.view(B, H, T, d_head).transpose(1, 2).reshape(B * T, H * d_head)


class _CausalAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v for training (`Block.forward` without cache), laid out
    for CPU speed: `scaled_dot_product_attention` in its place makes a training step 14-23%
    slower on these shapes (docs/benchmarks.md), so it stays:

    - every batched matmul's output is [pos, pos] or [d_head, pos]: with d_head much
      smaller than pos, BLAS runs a matmul whose output is [pos, d_head] ~3x slower;
    - the [n, pos, pos] scores are made, normalised and used a chunk of heads at a time,
      each chunk's ~1 MB staying in cache between the steps;
    - the scale goes on q (small), not on the scores.

    Softmax and its backward run in place through the private ops `torch._softmax` and
    `aten._softmax_backward_data` (public softmax has no `out=`); tests/test_model_transformer.py checks
    logits and gradients against the plain `run_with_cache` path, so a torch change shows.
    """

    CHUNK_BYTES = 1 << 20

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float
    ) -> Tensor:  # q, k, v: [n, pos, d_head]
        N, T, d = q.shape
        q_scaled = q * scale
        pattern = q.new_empty(N, T, T)  # [n, query, key]
        z_T = q.new_empty(N, d, T)  # [n, d_head, query] = (pattern v)^T
        step = max(1, _CausalAttention.CHUNK_BYTES // (T * T * q.element_size()))
        for i in range(0, N, step):
            c = slice(i, i + step)
            p = pattern[c]
            torch.baddbmm(mask.expand(p.shape[0], T, T), q_scaled[c], k[c].transpose(1, 2), out=p)
            torch._softmax(p, -1, False, out=p)
            torch.bmm(v[c].transpose(1, 2), p.transpose(1, 2), out=z_T[c])
        ctx.save_for_backward(q_scaled, k, v, pattern)
        ctx.scale, ctx.step = scale, step
        return z_T.transpose(1, 2)  # [n, query, d_head]

    @staticmethod
    def backward(ctx, grad_z: Tensor):  # [n, query, d_head]
        q_scaled, k, v, pattern = ctx.saved_tensors
        N, T, d = q_scaled.shape
        grad_q_T, grad_k_T, grad_v_T = (q_scaled.new_empty(N, d, T) for _ in range(3))  # [n, d_head, pos]
        for i in range(0, N, ctx.step):
            c = slice(i, i + ctx.step)
            p = pattern[c]
            grad_scores = torch.bmm(grad_z[c], v[c].transpose(1, 2))  # [n, query, key]: first d pattern
            torch.bmm(grad_z[c].transpose(1, 2), p, out=grad_v_T[c])
            torch.ops.aten._softmax_backward_data.out(grad_scores, p, -1, p.dtype, grad_input=grad_scores)
            torch.bmm(k[c].transpose(1, 2), grad_scores.transpose(1, 2), out=grad_q_T[c])
            torch.bmm(q_scaled[c].transpose(1, 2), grad_scores, out=grad_k_T[c])
        grad_q_T.mul_(ctx.scale)
        return grad_q_T.transpose(1, 2), grad_k_T.transpose(1, 2), grad_v_T.transpose(1, 2), None, None


def next_token_loss(logits: Tensor, tokens: Tensor, reduce: bool = True) -> Tensor:
    """Cross-entropy of predicting tokens[:, 1:] from logits[:, :-1]; per position if not `reduce`."""
    B, T, V = logits.shape
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1), reduction="none")
    loss = loss.view(B, T - 1)  # [batch, pos - 1]
    return loss.mean() if reduce else loss


# --- memory: what the model allocates, for pipeline/memory.py's check -----------------------


def _parameter_groups(m: ModelConfig) -> dict[str, int]:
    """Elements of the embeddings, the positional embedding and the layers of `Transformer(m)`."""
    ln = m.normalization_type == "LN"
    heads = 4 * m.n_heads * m.d_model * m.d_head + (3 * m.n_heads * m.d_head + m.d_model) * m.use_bias
    mlp = 0
    if not m.attn_only:  # W_in, W_out, b_in, b_out, ln2
        mlp = 2 * m.d_model * m.d_mlp + (m.d_mlp + m.d_model) * m.use_bias + 2 * m.d_model * ln
    return {
        "embeddings": 2 * m.d_vocab * m.d_model + m.d_vocab * m.use_bias,  # W_E, W_U, b_U
        "positions": 0 if m.positional_embedding_type == "rotary" else m.n_ctx * m.d_model,  # W_pos
        # heads, ln1, the MLP and ln2; ln_final
        "layers": m.n_layers * (heads + 2 * m.d_model * ln + mlp) + 2 * m.d_model * ln,
    }


def weight_terms(s: memory.Shape, per_parameter: int, what: str) -> list[memory.Term]:
    """`per_parameter` bytes for every parameter and buffer (biases without use_bias too: they
    are buffers then, still in the state dict)."""
    full = _parameter_groups(dataclasses.replace(s.m, use_bias=True))
    return [
        memory.Term(
            f"the embeddings W_E, W_U ({what})", per_parameter * full["embeddings"], (s.d_vocab, s.d_model)
        ),
        memory.Term(
            f"the positional embedding W_pos ({what})",
            per_parameter * full["positions"],
            (s.n_ctx, s.d_model),
        ),
        memory.Term(
            f"the attention{'' if s.m.attn_only else ' and MLP'} weights ({what})",
            per_parameter * full["layers"],
            (s.n_layers, s.n_heads, s.d_head, s.d_model),
        ),
    ]


def cache_terms(s: memory.Shape, b: memory.Batch, dtype: int) -> list[memory.Term]:
    """`run_with_cache`'s cache on batch `b`: every layer's pattern, head results and residual stream."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    return [
        memory.Term(
            f"the attention patterns of {b.where}, [{n_}, n_heads, {pos_}, {pos_}] {memory.DTYPES[dtype]} "
            "per layer",
            dtype * m.n_layers * n * m.n_heads * T * T,
            (b.n, s.n_heads, b.length),
        ),
        memory.Term(
            f"the cached head results of {b.where}, [{n_}, {pos_}, n_heads, d_model] per layer",
            dtype * m.n_layers * n * T * (m.n_heads + 1) * m.d_model,
            (b.n, b.length, s.d_model),
        ),
    ]


def forward_terms(s: memory.Shape, b: memory.Batch, dtype: int) -> list[memory.Term]:
    """Beside the cache while `run_with_cache` runs: one layer's scores and masked scores and
    its queries, keys and values, or its MLP's pre- and post-activations (the larger); then the
    logits (the matmul's output and the bias added)."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    attention = 2 * m.n_heads * T * T + 3 * T * m.n_heads * m.d_head
    mlp = 0 if m.attn_only else 2 * T * m.d_mlp
    return [
        memory.Term(
            f"one layer's attention scores on {b.where}"
            if attention >= mlp
            else f"one layer's MLP activations on {b.where}",
            dtype * n * max(attention, mlp),
            (b.n, s.n_heads, b.length),
        ),
        memory.Term(
            f"the logits of {b.where}, [{n_}, {pos_}, d_vocab]",
            dtype * 2 * n * T * m.d_vocab,
            (b.n, b.length, s.d_vocab),
        ),
    ]
