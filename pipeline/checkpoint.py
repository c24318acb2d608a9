"""Checkpoints on disk: safetensors state dicts and HookedTransformerConfig-style config.json.

Never unpickles: `.safetensors` is read by safetensors; `.pt`/`.pth` only through
`torch.load(weights_only=True)`, which refuses anything but tensors and containers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pipeline import io
from pipeline.config import ModelConfig
from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.model import AttnOnlyTransformer


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


# HookedTransformerConfig fields we write beside a checkpoint (and read back).
TL_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab", "positional_embedding_type", "normalization_type")


def tl_config(model: ModelConfig) -> dict:
    """config.json for a checkpoint: HookedTransformerConfig field names and values."""
    out = {name: getattr(model, name) for name in TL_FIELDS}
    out.update(attn_only=True, act_fn=None, d_vocab_out=model.d_vocab, use_attn_scale=True)
    return out


def read_tl_config(path: str | Path) -> ModelConfig:
    """A ModelConfig from a HookedTransformerConfig-style config.json."""
    raw = io.read_json(path)
    if not isinstance(raw, dict):
        raise UserError(str(path), "must be a JSON object of HookedTransformerConfig fields")
    if raw.get("attn_only") is False:
        raise UserError(f"{path}: attn_only", "not an attention-only model (has MLPs)", False)
    missing = [name for name in TL_FIELDS if name not in raw and name != "normalization_type"]
    if missing:
        raise UserError(f"{path}: {missing[0]}", "missing from config.json")
    cfg = ModelConfig(**{name: raw.get(name) for name in TL_FIELDS})
    try:
        cfg.validate("")
    except UserError as e:
        raise UserError(f"{path}: {e.where.lstrip('.')}", e.problem, e.value) from None
    return cfg


def load_model(model_path: str | Path, config_path: str | Path) -> "AttnOnlyTransformer":
    """Our model with a checkpoint's weights; names and shapes checked against config.json."""
    from pipeline.model import AttnOnlyTransformer

    cfg = read_tl_config(config_path)
    state, _ = load_state(model_path)
    model = AttnOnlyTransformer(cfg)
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name not in state:
            raise UserError(f"{model_path}: {name}", "missing from the checkpoint")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise UserError(
                f"{model_path}: {name}",
                f"shape {list(state[name].shape)} disagrees with {list(tensor.shape)} from {config_path}",
            )
    extra = sorted(set(state) - set(expected) - {k for k in state if k.endswith((".mask", ".IGNORE"))})
    if extra:
        raise UserError(f"{model_path}: {extra[0]}", "unexpected key: not an attention-only model with this config")
    model.load_state_dict({name: state[name].to(tensor.dtype) for name, tensor in expected.items()})
    return model
