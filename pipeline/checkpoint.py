"""Checkpoints on disk: safetensors state dicts and HookedTransformerConfig-style config.json.

Never unpickles: `.safetensors` is read by safetensors; `.pt`/`.pth` only through
`torch.load(weights_only=True)`, which refuses anything but tensors and containers.

`read_tl_config` accepts the config.json of a TransformerLens `HookedTransformer`
(`cfg.to_dict()`, or the raw config.json of TransformerLens's own attn-only models,
which spell two fields `normalization` and `shortformer_pos`) and refuses, naming the
field, any setting our model does not compute the same way (MLPs, RMS norm, rotary
positions, a custom attention scale, ...).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from pipeline import io
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import LN_EPS, AttnOnlyTransformer

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# Buffers a HookedTransformer keeps in its state dict: the causal mask and a constant.
TL_BUFFERS = (".mask", ".IGNORE")


def save_state(
    path: str | Path, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write a state dict as safetensors, atomically; tensors are made contiguous CPU copies.

    The same tensors and metadata always give the same bytes: safetensors writes the
    metadata in hash-map order (it varies from call to call with two keys or more), so
    the header is rewritten with sorted keys.
    """
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in sorted(state.items())}
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return io.write_bytes(path, _sorted_header(save(tensors, metadata=meta)))


def _sorted_header(raw: bytes) -> bytes:
    """safetensors bytes with the JSON header's keys (and metadata keys) sorted, same length."""
    n = int.from_bytes(raw[:8], "little")  # header length; the header is JSON padded with spaces
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | dict(sorted(header.items()))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(text) <= n, "a re-ordered header cannot be longer"
    return raw[:8] + text + b" " * (n - len(text)) + raw[8 + n :]


def load_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a state dict and its metadata. `.safetensors`, or `.pt`/`.pth` with weights_only."""
    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "checkpoint not found")
    if path.suffix in TORCH_SUFFIXES:
        try:
            with (
                warnings.catch_warnings()
            ):  # e.g. "Detected pickle protocol 4": the refusal below says it all
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle refused by weights_only, or a damaged file
            raise UserError(
                str(path), f"refused: not a plain tensor checkpoint ({_refusal_reason(e)})"
            ) from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = state["state_dict"]
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(str(path), "refused: expected a mapping of names to tensors")
        return dict(state), {}
    if path.suffix != ".safetensors":
        raise UserError(
            str(path), f"unknown checkpoint format {path.suffix!r}: use .safetensors, .pt or .pth"
        )
    try:
        with safe_open(str(path), framework="pt") as f:  # one read: metadata and tensors
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            str(path), f"not a readable safetensors file ({str(e).splitlines()[0][:200]})"
        ) from None


def _refusal_reason(e: Exception) -> str:
    """Why torch's weights-only unpickler refused a file, in a few words.

    Its message advises re-running with weights_only=False, which would run the file's
    code: we keep only the line naming what the pickle asked for."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # it may hold terminal colour codes
    found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if found:
        return f"it would call or build {found.group(1)}: loading it could run code; save plain tensors or safetensors"
    lines = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in text.splitlines()]
    lines = [
        line
        for line in lines
        if line and "weights_only" not in line and not line.startswith("Weights only load failed")
    ]
    return (lines[0].split(". ")[0] if lines else type(e).__name__)[:200]  # the first sentence


# HookedTransformerConfig fields we write beside a checkpoint (and read back).
TL_FIELDS = (
    "n_layers",
    "d_model",
    "n_heads",
    "d_head",
    "n_ctx",
    "d_vocab",
    "positional_embedding_type",
    "normalization_type",
)


def tl_config(model: ModelConfig) -> dict:
    """config.json for a checkpoint: HookedTransformerConfig field names and values."""
    out: dict[str, Any] = {name: getattr(model, name) for name in TL_FIELDS}
    out.update(attn_only=True, act_fn=None, d_vocab_out=model.d_vocab, use_attn_scale=True, eps=LN_EPS)
    return out


def _unsupported(raw: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """The first HookedTransformerConfig setting our model would compute differently."""
    d_head = raw.get("d_head")
    checks: list[tuple[str, Any, bool, str]] = [
        (
            "attn_only",
            raw.get("attn_only", True),
            raw.get("attn_only", True) is True,
            "not an attention-only model (it has MLPs)",
        ),
        (
            "use_attn_scale",
            raw.get("use_attn_scale", True),
            raw.get("use_attn_scale", True) is True,
            "attention scores must be divided by sqrt(d_head)",
        ),
        (
            "attention_dir",
            raw.get("attention_dir", "causal"),
            raw.get("attention_dir", "causal") == "causal",
            "only causal attention is supported",
        ),
        (
            "final_rms",
            raw.get("final_rms", False),
            not raw.get("final_rms", False),
            "RMS norm is not supported",
        ),
        (
            "use_local_attn",
            raw.get("use_local_attn", False),
            not raw.get("use_local_attn", False),
            "local attention is not supported",
        ),
        (
            "use_qk_norm",
            raw.get("use_qk_norm", False),
            not raw.get("use_qk_norm", False),
            "query/key norms are not supported",
        ),
        (
            "post_embedding_ln",
            raw.get("post_embedding_ln", False),
            not raw.get("post_embedding_ln", False),
            "a LayerNorm after the embedding is not supported",
        ),
        (
            "use_normalization_before_and_after",
            raw.get("use_normalization_before_and_after", False),
            not raw.get("use_normalization_before_and_after", False),
            "post-attention norms are not supported",
        ),
        (
            "scale_attn_by_inverse_layer_idx",
            raw.get("scale_attn_by_inverse_layer_idx", False),
            not raw.get("scale_attn_by_inverse_layer_idx", False),
            "per-layer attention scaling is not supported",
        ),
        (
            "n_key_value_heads",
            raw.get("n_key_value_heads"),
            raw.get("n_key_value_heads") in (None, raw.get("n_heads")),
            "grouped-query attention is not supported",
        ),
        (
            "attn_scores_soft_cap",
            raw.get("attn_scores_soft_cap", -1.0),
            (raw.get("attn_scores_soft_cap") or -1.0) <= 0,
            "soft-capped scores are not supported",
        ),
        (
            "output_logits_soft_cap",
            raw.get("output_logits_soft_cap", -1.0),
            (raw.get("output_logits_soft_cap") or -1.0) <= 0,
            "soft-capped logits are not supported",
        ),
        (
            "d_vocab_out",
            raw.get("d_vocab_out"),
            raw.get("d_vocab_out") in (None, -1, raw.get("d_vocab")),
            "must equal d_vocab",
        ),
        ("eps", raw.get("eps", LN_EPS), raw.get("eps", LN_EPS) == LN_EPS, f"LayerNorm eps must be {LN_EPS}"),
    ]
    if raw.get("attn_scale") is not None and isinstance(d_head, int) and d_head > 0:
        scale = raw["attn_scale"]
        checks.append(
            (
                "attn_scale",
                scale,
                abs(float(scale) - math.sqrt(d_head)) < 1e-6,
                f"must be sqrt(d_head) = {math.sqrt(d_head):g}",
            )
        )
    for key, value, ok, problem in checks:
        if not ok:
            return key, value, problem
    return None


def read_tl_config(path: str | Path) -> ModelConfig:
    """A ModelConfig from a HookedTransformerConfig-style config.json (refuses what we cannot run)."""
    return from_tl_config(io.read_json(path), str(path))


def from_tl_config(raw: Any, source: str = "config.json") -> ModelConfig:
    """A ModelConfig from a dict of HookedTransformerConfig fields; `source` names it in errors."""
    if not isinstance(raw, dict):
        raise UserError(source, "must be a JSON object of HookedTransformerConfig fields")
    raw = dict(raw)
    # TransformerLens's own attn-only checkpoints spell two fields differently.
    if "normalization_type" not in raw and "normalization" in raw:
        raw["normalization_type"] = raw["normalization"]
    if "positional_embedding_type" not in raw and "shortformer_pos" in raw:
        raw["positional_embedding_type"] = "shortformer" if raw["shortformer_pos"] else "standard"
    problem = _unsupported(raw)
    if problem:
        key, value, why = problem
        raise UserError(f"{source}: {key}", why, value)
    missing = [
        name
        for name in TL_FIELDS
        if name not in raw and name not in ("normalization_type", "positional_embedding_type")
    ]
    if missing:
        raise UserError(f"{source}: {missing[0]}", "missing from config.json")
    fields = {name: raw.get(name) for name in TL_FIELDS}
    fields["positional_embedding_type"] = raw.get("positional_embedding_type", "standard")  # TL's default
    if fields["normalization_type"] == "LNPre":  # LN without weights: LN with w = 1, b = 0
        fields["normalization_type"] = "LN"
    for name in ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab"):
        if not isinstance(fields[name], int) or isinstance(fields[name], bool):
            raise UserError(f"{source}: {name}", "must be an integer", fields[name])
    cfg = ModelConfig(**fields)
    try:
        cfg.validate()
    except UserError as e:
        raise UserError(f"{source}: {e.where}", e.problem, e.value) from None
    return cfg


def check_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], source: str, config_source: str
) -> dict[str, torch.Tensor]:
    """Names and shapes of a checkpoint against our model's: the state dict to load, or a one-line refusal.

    Only shapes are read from `expected` (it may live on the meta device); tensors keep
    their own floating dtype and must be finite. TransformerLens's buffers (`*.mask`,
    `*.IGNORE`) are dropped; a checkpoint with no LayerNorm weights at all
    (TransformerLens's LNPre) gets the identity (w = 1, b = 0).
    """
    mlp = sorted(k for k in state if ".mlp." in k)
    if mlp:
        raise UserError(f"{source}: {mlp[0]}", "not an attention-only model (it has MLP weights)")
    is_norm = lambda name: name.startswith("ln_final.") or ".ln1." in name  # noqa: E731
    lnpre = not any(is_norm(k) for k in state)  # LayerNorm without weights (TransformerLens's LNPre)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in expected.items():
        if name not in state:
            if lnpre and is_norm(name):
                out[name] = torch.ones(tensor.shape) if name.endswith(".w") else torch.zeros(tensor.shape)
                continue
            raise UserError(f"{source}: {name}", "missing from the checkpoint")
        got = state[name]
        if tuple(got.shape) != tuple(tensor.shape):
            raise UserError(
                f"{source}: {name}",
                f"shape {list(got.shape)} disagrees with {list(tensor.shape)} from {config_source}",
            )
        if not got.is_floating_point():
            raise UserError(f"{source}: {name}", f"must be floating point, got {got.dtype}")
        if not torch.isfinite(got).all():
            raise UserError(f"{source}: {name}", "contains NaN or inf")
        out[name] = got
    extra = sorted(set(state) - set(expected) - {k for k in state if k.endswith(TL_BUFFERS)})
    if extra:
        raise UserError(
            f"{source}: {extra[0]}",
            f"unexpected key: not an attention-only model with the shape in {config_source}",
        )
    return out


def read_checkpoint(
    model_path: str | Path, config_path: str | Path
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """config.json and the checkpoint's state dict, checked against it (`check_state`)."""
    cfg = read_tl_config(config_path)
    state, _ = load_state(model_path)
    with torch.device("meta"):  # only the expected names and shapes: allocates nothing
        expected = AttnOnlyTransformer(cfg).state_dict()
    return cfg, check_state(state, expected, str(model_path), str(config_path))


def load_model(
    model_path: str | Path, config_path: str | Path, dtype: torch.dtype = torch.float32
) -> AttnOnlyTransformer:
    """Our model with a checkpoint's weights, in `dtype`; names and shapes checked against config.json."""
    cfg, state = read_checkpoint(model_path, config_path)
    model = AttnOnlyTransformer(cfg).to(dtype)  # float64 weights reach a float64 analysis unrounded
    model.load_state_dict(state)
    return model
