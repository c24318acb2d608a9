"""Checkpoints on disk: safetensors state dicts and HookedTransformerConfig-style config.json.

Never unpickles: `.safetensors` is read by safetensors; `.pt`/`.pth` only through
`torch.load(weights_only=True)`, which refuses anything but tensors and containers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pipeline import io
from pipeline.errors import UserError


def save_state(path: str | Path, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> Path:
    """Write a state dict as safetensors, atomically; tensors are made contiguous CPU copies."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in sorted(state.items())}
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return io.write_with(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a state dict and its metadata. `.safetensors`, or `.pt`/`.pth` with weights_only."""
    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "checkpoint not found")
    if path.suffix in (".pt", ".pth", ".bin"):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle refused by weights_only, or a damaged file
            reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(str(path), f"refused: not a plain tensor checkpoint ({reason})") from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = state["state_dict"]
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(str(path), "refused: expected a mapping of names to tensors")
        return dict(state), {}
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(str(path), f"not a readable safetensors file ({str(e).splitlines()[0][:200]})") from None
