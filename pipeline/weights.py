"""Analysis-ready head weights: every layer's heads stacked, in float64.

`heads.safetensors` stores them under TransformerLens's state-dict names
(`blocks.{l}.attn.W_Q` `[n_heads, d_model, d_head]`, ...), so any attention-only
checkpoint in that format can be analysed directly; `HeadWeights` stacks layers:

    W_Q, W_K, W_V  [n_layers, n_heads, d_model, d_head]
    W_O            [n_layers, n_heads, d_head, d_model]
    b_Q, b_K, b_V  [n_layers, n_heads, d_head]          b_O [n_layers, d_model]
    W_E [d_vocab, d_model]   W_pos [n_ctx, d_model]   W_U [d_model, d_vocab]   b_U [d_vocab]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor

from pipeline.checkpoint import load_state, save_state
from pipeline.config import ModelConfig
from pipeline.errors import UserError

HEAD_MATRICES = ("W_Q", "W_K", "W_V", "W_O")
HEAD_BIASES = ("b_Q", "b_K", "b_V")


@dataclass(frozen=True)
class HeadWeights:
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor
    b_K: Tensor
    b_V: Tensor
    b_O: Tensor
    W_E: Tensor
    W_pos: Tensor
    W_U: Tensor
    b_U: Tensor

    @property
    def n_layers(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[2]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[3]

    def to(self, dtype: torch.dtype) -> "HeadWeights":
        return HeadWeights(**{f.name: getattr(self, f.name).to(dtype) for f in fields(self)})

    def state_dict(self) -> dict[str, Tensor]:
        """TransformerLens names, one entry per layer for the head matrices."""
        out = {"embed.W_E": self.W_E, "pos_embed.W_pos": self.W_pos, "unembed.W_U": self.W_U, "unembed.b_U": self.b_U}
        for layer in range(self.n_layers):
            for name in HEAD_MATRICES + HEAD_BIASES + ("b_O",):
                out[f"blocks.{layer}.attn.{name}"] = getattr(self, name)[layer]
        return out


def from_state_dict(state: Mapping[str, Tensor], source: str = "weights", dtype: torch.dtype = torch.float64) -> HeadWeights:
    """Stack a TransformerLens-named state dict into `HeadWeights`, checking names and shapes."""
    layers = sorted({int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    if not layers:
        raise UserError(source, "no attention blocks (expected keys like blocks.0.attn.W_Q)")
    if layers != list(range(len(layers))):
        raise UserError(source, f"layers are not numbered 0..n-1: {layers}")

    def get(key: str) -> Tensor:
        if key not in state:
            raise UserError(f"{source}: {key}", "missing from the weights file")
        t = state[key].to(dtype)
        if not torch.isfinite(t).all():
            raise UserError(f"{source}: {key}", "contains NaN or inf")
        return t

    stacked = {name: torch.stack([get(f"blocks.{l}.attn.{name}") for l in layers]) for name in HEAD_MATRICES}
    L, H, D, d = stacked["W_Q"].shape
    zeros = {"b_O": torch.zeros(L, D, dtype=dtype)}
    for name in HEAD_BIASES:
        key0 = f"blocks.0.attn.{name}"
        stacked[name] = torch.stack([get(f"blocks.{l}.attn.{name}") for l in layers]) if key0 in state else torch.zeros(L, H, d, dtype=dtype)
    stacked["b_O"] = torch.stack([get(f"blocks.{l}.attn.b_O") for l in layers]) if "blocks.0.attn.b_O" in state else zeros["b_O"]
    W_E, W_pos, W_U = get("embed.W_E"), get("pos_embed.W_pos"), get("unembed.W_U")
    b_U = get("unembed.b_U") if "unembed.b_U" in state else torch.zeros(W_U.shape[1], dtype=dtype)
    hw = HeadWeights(W_E=W_E, W_pos=W_pos, W_U=W_U, b_U=b_U, **stacked)
    expected = {
        "W_Q": (L, H, D, d), "W_K": (L, H, D, d), "W_V": (L, H, D, d), "W_O": (L, H, d, D),
        "b_Q": (L, H, d), "b_K": (L, H, d), "b_V": (L, H, d), "b_O": (L, D),
        "W_E": (W_E.shape[0], D), "W_pos": (W_pos.shape[0], D), "W_U": (D, W_E.shape[0]), "b_U": (W_E.shape[0],),
    }
    for name, shape in expected.items():
        got = tuple(getattr(hw, name).shape)
        if got != shape:
            raise UserError(f"{source}: {name}", f"shape {list(got)} disagrees with {list(shape)} implied by W_Q and W_E")
    return hw


def save(path: str | Path, hw: HeadWeights, metadata: Mapping[str, str] | None = None) -> Path:
    return save_state(path, hw.state_dict(), metadata)


def load(path: str | Path, dtype: torch.dtype = torch.float64) -> tuple[HeadWeights, dict[str, str]]:
    """Read `heads.safetensors` (or any attention-only TransformerLens-named checkpoint)."""
    state, metadata = load_state(path)
    return from_state_dict(state, source=str(path), dtype=dtype), metadata


def prepare(state: Mapping[str, Tensor], model: ModelConfig, source: str = "checkpoint") -> tuple[HeadWeights, list[str]]:
    """Analysis-ready weights from a checkpoint, and the list of processing steps applied."""
    steps: list[str] = ["stacked heads per layer in float64"]
    hw = from_state_dict(state, source=source)
    return hw, steps
