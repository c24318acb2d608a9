"""A two-layer (any-layer) attention-only transformer, in the paper's notation.

Row-vector convention and TransformerLens's state-dict names, so checkpoints move
both ways (DESIGN.md, "Weight formats"). For head h of a layer:

    q = x W_Q^h + b_Q^h        k = y W_K^h + b_K^h        scores = q k^T / sqrt(d_head)
    v = y W_V^h + b_V^h        result^h = pattern^h v W_O^h     out = sum_h result^h + b_O

Positional embeddings are `standard` (added to the residual stream) or `shortformer`
(added only to the query and key inputs, never to the residual stream, so the
residual stream carries token information only, as in the paper). With LayerNorm
(`normalization_type: LN`, pre-LN as TransformerLens), shortformer positions are
added after the norm.

Attention takes separate query, key and value inputs, each either shared by all
heads `[batch, pos, d_model]` or per head `[batch, pos, head, d_model]`: that is
what path ablation needs (change only what reaches one head's keys).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.config import ModelConfig

LN_EPS = 1e-5  # TransformerLens's default


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


class AttentionOutput(NamedTuple):
    result: Tensor  # [batch, pos, head, d_model]  each head's write, before b_O
    pattern: Tensor  # [batch, head, query_pos, key_pos]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, D, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.d_head = d
        self.W_Q = nn.Parameter(torch.empty(H, D, d))
        self.W_K = nn.Parameter(torch.empty(H, D, d))
        self.W_V = nn.Parameter(torch.empty(H, D, d))
        self.W_O = nn.Parameter(torch.empty(H, d, D))
        biases = {"b_Q": (H, d), "b_K": (H, d), "b_V": (H, d), "b_O": (D,)}
        for name, shape in biases.items():
            if cfg.use_bias:
                self.register_parameter(name, nn.Parameter(torch.zeros(shape)))
            else:  # kept as zero buffers so the state dict has TransformerLens's keys
                self.register_buffer(name, torch.zeros(shape))

    @staticmethod
    def _project(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """x W + b per head: x is [batch, pos, d_model] or [batch, pos, head, d_model]."""
        if x.ndim == 3:
            return torch.einsum("bpm,hmd->bphd", x, W) + b
        return torch.einsum("bphm,hmd->bphd", x, W) + b

    def forward(self, q_in: Tensor, k_in: Tensor, v_in: Tensor) -> AttentionOutput:
        q = self._project(q_in, self.W_Q, self.b_Q)  # [batch, pos, head, d_head]
        k = self._project(k_in, self.W_K, self.b_K)
        v = self._project(v_in, self.W_V, self.b_V)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.d_head)
        n = scores.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
        pattern = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)  # [batch, pos, head, d_head]
        result = torch.einsum("bqhd,hdm->bqhm", z, self.W_O)  # [batch, pos, head, d_model]
        return AttentionOutput(result, pattern)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = LayerNorm(cfg.d_model) if cfg.normalization_type == "LN" else nn.Identity()
        self.attn = Attention(cfg)

    def attn_inputs(self, resid: Tensor, pos: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Query, key and value inputs from a residual stream; `pos` is given for shortformer."""
        x = self.ln1(resid)
        qk = x if pos is None else x + pos  # shortformer: positions enter after the norm
        return qk, qk, x


class Cache(NamedTuple):
    """Activations of one forward pass, per layer."""

    resid_pre: list[Tensor]  # [batch, pos, d_model]
    result: list[Tensor]  # [batch, pos, head, d_model]
    pattern: list[Tensor]  # [batch, head, query_pos, key_pos]
    pos: Tensor | None  # shortformer: [pos, d_model] added to queries and keys


class AttnOnlyTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = _holder(W_E=nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model)))
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
        named = list(self.named_parameters())
        is_matrix = [name.rsplit(".", 1)[-1].startswith("W_") for name, _ in named]
        return [p for (_, p), m in zip(named, is_matrix) if m], [
            p for (_, p), m in zip(named, is_matrix) if not m
        ]

    def reset_parameters(self) -> None:
        """Normal(0, init_range) for every W_*, as TransformerLens's GPT-2 init."""
        std = self.cfg.init_range or 0.8 / math.sqrt(self.cfg.d_model)
        for p in self.weight_matrices()[0]:
            nn.init.normal_(p, std=std)

    @property
    def shortformer(self) -> bool:
        """Positions enter only the queries' and keys' inputs, never the residual stream."""
        return self.cfg.positional_embedding_type == "shortformer"

    def _embed(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The residual stream's start `[batch, pos, d_model]` (token embeddings, plus the
        positions unless shortformer) and the positional embeddings `[pos, d_model]`."""
        T = tokens.shape[1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence length {T} exceeds n_ctx = {self.cfg.n_ctx}")
        W_pos = self.pos_embed.W_pos[:T]  # [pos, d_model]
        resid = self.embed.W_E[tokens]  # [batch, pos, d_model]
        return (resid if self.shortformer else resid + W_pos), W_pos

    def logits_from(self, resid: Tensor) -> Tensor:
        """Logits `[..., d_vocab]` from the final residual stream `[..., d_model]`."""
        return self.ln_final(resid) @ self.unembed.W_U + self.unembed.b_U

    def run_with_cache(self, tokens: Tensor) -> tuple[Tensor, Cache]:
        """Logits `[batch, pos, d_vocab]` and the activations of every layer."""
        resid, W_pos = self._embed(tokens)
        pos = W_pos if self.shortformer else None
        cache = Cache([], [], [], pos)
        for block in self.blocks:
            cache.resid_pre.append(resid)
            out = block.attn(*block.attn_inputs(resid, pos))
            cache.result.append(out.result)
            cache.pattern.append(out.pattern)
            resid = resid + out.result.sum(dim=2) + block.attn.b_O
        return self.logits_from(resid), cache

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits `[batch, pos, d_vocab]`: the same function as `run_with_cache`, computed
        for training speed (one fused QKV matmul per layer, no per-head results kept)."""
        B, T = tokens.shape
        H, d = self.cfg.n_heads, self.cfg.d_head
        resid, W_pos = self._embed(tokens)
        causal = torch.full((T, T), float("-inf"), device=tokens.device, dtype=resid.dtype).triu(1)
        for block in self.blocks:
            a = block.attn
            x = block.ln1(resid).reshape(B * T, -1)  # [batch * pos, d_model]
            W_QKV = (
                torch.cat([a.W_Q, a.W_K, a.W_V]).transpose(0, 1).reshape(x.shape[1], 3 * H * d)
            )  # [d_model, 3 * head * d_head]
            b_QKV = torch.cat([a.b_Q, a.b_K, a.b_V]).reshape(3 * H * d)
            qkv = (
                torch.addmm(b_QKV, x, W_QKV).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
            )  # [3, batch, head, pos, d_head]
            if self.shortformer:  # (x + pos) W = x W + pos W: positions only in queries and keys
                pos_qk = (
                    (W_pos @ W_QKV[:, : 2 * H * d]).view(T, 2, H, d).permute(1, 2, 0, 3)
                )  # [2, head, pos, d_head]
                qkv = qkv + torch.cat([pos_qk, torch.zeros_like(pos_qk[:1])])[:, None]
            q, k, v = qkv.reshape(3, B * H, T, d).unbind(0)  # each [batch * head, pos, d_head]
            z = _CausalAttention.apply(q, k, v, causal, 1 / math.sqrt(d))  # [batch * head, pos, d_head]
            z = z.view(B, H, T, d).transpose(1, 2).reshape(B * T, H * d)  # [batch * pos, head * d_head]
            out = torch.addmm(a.b_O, z, a.W_O.reshape(H * d, -1))  # [batch * pos, d_model]
            resid = resid + out.view(B, T, -1)
        return self.logits_from(resid)


class _CausalAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) v for training, laid out for CPU speed (~25% faster
    than autograd's own, measured):

    - every batched matmul's output is [pos, pos] or [d_head, pos]: with d_head much
      smaller than pos, BLAS runs a matmul whose output is [pos, d_head] ~3x slower;
    - the [n, pos, pos] scores are made, normalised and used a chunk of heads at a time,
      each chunk's ~1 MB staying in cache between the steps;
    - the scale goes on q (small), not on the scores.

    Softmax and its backward run in place through the private ops `torch._softmax` and
    `aten._softmax_backward_data` (public softmax has no `out=`); tests/test_model.py checks
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
