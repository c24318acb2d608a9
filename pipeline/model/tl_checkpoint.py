"""Checkpoints in TransformerLens's format: HookedTransformerConfig-style config.json, and
state dicts checked against our model before it is built from them.

`read_tl_config` accepts the config.json of a TransformerLens `HookedTransformer`
(`cfg.to_dict()`, or the raw config.json of NeelNanda's attn-only models, which spell two
fields `normalization` and `shortformer_pos` and which we translate field for field as
TransformerLens's `convert_neel_model_config` does) and refuses, naming the field, any
setting our model does not compute the same way (MLPs, RMS norm, rotary positions, a
custom attention scale, ...). A repository that ships no config.json (`pipeline.hub.KNOWN`)
gets its sizes from the weights' shapes (`inferred_config`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import io
from ..checkpoint import TL_BUFFERS, load_state
from ..config import LN_EPS, ModelConfig
from ..errors import UserError, within
from .transformer import AttnOnlyTransformer

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


def _off(value: Any, raw: Mapping[str, Any]) -> bool:
    """A feature switched off: False, or null (0 too, as TransformerLens reads it)."""
    return not value


def _uncapped(value: Any, raw: Mapping[str, Any]) -> bool:
    return (value or -1.0) <= 0  # TransformerLens: None or a cap <= 0 is no cap


def _is_sqrt_d_head(scale: Any, raw: Mapping[str, Any]) -> bool:
    """Unset, or sqrt(d_head); a d_head that is not a positive integer is refused later, by name."""
    d_head = raw.get("d_head")
    if scale is None or not (isinstance(d_head, int) and d_head > 0):
        return True
    return abs(float(scale) - math.sqrt(d_head)) < 1e-6


_Reason = str | Callable[[Mapping[str, Any]], str]  # the problem, or how to word it from the config

# HookedTransformerConfig settings our model would compute differently, in the order they are
# checked: (field, the value taken when the field is absent, whether (that value, the whole
# config) is what our model computes, the problem otherwise). One table: each refusal is one
# row, and one case of tests/test_checkpoint.py.
UNSUPPORTED: tuple[tuple[str, Any, Callable[[Any, Mapping[str, Any]], bool], _Reason], ...] = (
    ("attn_only", True, lambda v, raw: v is True, "not an attention-only model (it has MLPs)"),
    ("use_attn_scale", True, lambda v, raw: v is True, "attention scores must be divided by sqrt(d_head)"),
    ("attention_dir", "causal", lambda v, raw: v == "causal", "only causal attention is supported"),
    ("final_rms", False, _off, "RMS norm is not supported"),
    ("use_local_attn", False, _off, "local attention is not supported"),
    ("use_qk_norm", False, _off, "query/key norms are not supported"),
    ("post_embedding_ln", False, _off, "a LayerNorm after the embedding is not supported"),
    ("use_normalization_before_and_after", False, _off, "post-attention norms are not supported"),
    ("scale_attn_by_inverse_layer_idx", False, _off, "per-layer attention scaling is not supported"),
    (
        "n_key_value_heads",
        None,
        lambda v, raw: v in (None, raw.get("n_heads")),
        "grouped-query attention is not supported",
    ),
    ("attn_scores_soft_cap", -1.0, _uncapped, "soft-capped scores are not supported"),
    ("output_logits_soft_cap", -1.0, _uncapped, "soft-capped logits are not supported"),
    ("d_vocab_out", None, lambda v, raw: v in (None, -1, raw.get("d_vocab")), "must equal d_vocab"),
    ("eps", LN_EPS, lambda v, raw: v == LN_EPS, f"LayerNorm eps must be {LN_EPS}"),
    (
        "attn_scale",
        None,
        _is_sqrt_d_head,
        lambda raw: f"must be sqrt(d_head) = {math.sqrt(raw['d_head']):g}",
    ),
)


def _unsupported(raw: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """The first HookedTransformerConfig setting our model would compute differently
    (`UNSUPPORTED`): its field, its value and why."""
    for field, default, computed_the_same, reason in UNSUPPORTED:
        value = raw.get(field, default)
        if not computed_the_same(value, raw):
            return field, value, reason if isinstance(reason, str) else reason(raw)
    return None


def read_tl_config(path: str | Path) -> ModelConfig:
    """A ModelConfig from a HookedTransformerConfig-style config.json (refuses what we cannot run)."""
    return from_tl_config(io.read_json(path), str(path))


def from_tl_config(raw: Any, source: str = "config.json") -> ModelConfig:
    """A ModelConfig from a dict of HookedTransformerConfig fields; `source` names it in errors."""
    if not isinstance(raw, dict):
        raise UserError(source, "must be a JSON object of HookedTransformerConfig fields")
    with within(source):
        return _model_config(dict(raw))


# The fields TransformerLens's `convert_neel_model_config` keeps from NeelNanda's config.json;
# every other setting takes HookedTransformerConfig's default.
NEEL_FIELDS = (
    "d_model", "n_layers", "d_mlp", "d_head", "n_heads", "n_ctx", "d_vocab",
    "act_fn", "attn_only", "final_rms",
)  # fmt: skip


def neel_translated(raw: dict) -> dict:
    """NeelNanda's config.json (`normalization`, `shortformer_pos`) as TransformerLens reads it;
    a HookedTransformerConfig dict unchanged."""
    if "normalization" not in raw and "shortformer_pos" not in raw:
        return raw
    out = {name: raw[name] for name in NEEL_FIELDS if name in raw}
    out["normalization_type"] = (
        raw["normalization"] if "normalization" in raw else raw.get("normalization_type")
    )
    shortformer = raw.get("shortformer_pos", False)
    out["positional_embedding_type"] = "shortformer" if shortformer else "standard"
    return out


def _model_config(raw: dict) -> ModelConfig:
    raw = neel_translated(raw)
    problem = _unsupported(raw)
    if problem:
        key, value, why = problem
        raise UserError(key, why, value)
    optional = ("normalization_type", "positional_embedding_type")
    missing = [name for name in TL_FIELDS if name not in raw and name not in optional]
    if missing:
        raise UserError(missing[0], "missing from config.json")
    fields = {name: raw.get(name) for name in TL_FIELDS}
    fields["positional_embedding_type"] = raw.get("positional_embedding_type", "standard")  # TL's default
    if fields["normalization_type"] == "LNPre":  # LN without weights: LN with w = 1, b = 0
        fields["normalization_type"] = "LN"
    for name in ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab"):
        if not isinstance(fields[name], int) or isinstance(fields[name], bool):
            raise UserError(name, "must be an integer", fields[name])
    cfg = ModelConfig(**fields)
    cfg.validate()
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
    with within(source):
        return _checked_state(state, expected, config_source)


def _is_norm(name: str) -> bool:
    return name.startswith("ln_final.") or ".ln1." in name


def _checked_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], config_source: str
) -> dict[str, torch.Tensor]:
    mlp = sorted(k for k in state if ".mlp." in k)
    if mlp:
        raise UserError(mlp[0], "not an attention-only model (it has MLP weights)")
    lnpre = not any(_is_norm(k) for k in state)  # LayerNorm without weights (TransformerLens's LNPre)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in expected.items():
        if name not in state:
            if lnpre and _is_norm(name):
                out[name] = torch.ones(tensor.shape) if name.endswith(".w") else torch.zeros(tensor.shape)
                continue
            raise UserError(name, "missing from the checkpoint")
        got = state[name]
        if tuple(got.shape) != tuple(tensor.shape):
            shapes = f"shape {list(got.shape)} disagrees with {list(tensor.shape)} from {config_source}"
            raise UserError(name, shapes)
        if not got.is_floating_point():
            raise UserError(name, f"must be floating point, got {got.dtype}")
        if not torch.isfinite(got).all():
            raise UserError(name, "contains NaN or inf")
        out[name] = got
    extra = sorted(set(state) - set(expected) - {k for k in state if k.endswith(TL_BUFFERS)})
    if extra:
        problem = f"unexpected key: not an attention-only model with the shape in {config_source}"
        raise UserError(extra[0], problem)
    return out


def _shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    if name not in state:
        raise UserError(name, "missing from the checkpoint")
    return tuple(state[name].shape)


def inferred_config(state: Mapping[str, torch.Tensor], fields: Mapping[str, Any]) -> dict:
    """HookedTransformerConfig fields of a checkpoint without config.json: the sizes from its
    weights' shapes, what they cannot tell (positions, normalisation) from `fields`."""
    n_heads, d_model, d_head = _shape(state, "blocks.0.attn.W_Q")  # [n_heads, d_model, d_head]
    layers = {int(m[1]) for k in state if (m := re.match(r"blocks\.(\d+)\.attn\.W_Q$", k))}
    sizes = {
        "n_layers": len(layers),
        "n_heads": n_heads,
        "d_head": d_head,
        "d_model": d_model,
        "n_ctx": _shape(state, "pos_embed.W_pos")[0],  # [n_ctx, d_model]
        "d_vocab": _shape(state, "embed.W_E")[0],  # [d_vocab, d_model]
    }
    return {**fields, **sizes}


def read_checkpoint(
    model_path: str | Path, config: str | Path | Mapping[str, Any]
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """config.json (or the known fields of a repository without one) and the checkpoint's state
    dict, checked against it (`check_state`)."""
    state, _ = load_state(model_path)
    if isinstance(config, Mapping):
        source = f"the shapes in {model_path}"
        with within(str(model_path)):
            cfg = from_tl_config(inferred_config(state, config), source)
    else:
        cfg, source = read_tl_config(config), str(config)
    with torch.device("meta"):  # only the expected names and shapes: allocates nothing
        expected = AttnOnlyTransformer(cfg).state_dict()
    return cfg, check_state(state, expected, str(model_path), source)


def load_model(
    model_path: str | Path, config: str | Path | Mapping[str, Any], dtype: torch.dtype = torch.float32
) -> AttnOnlyTransformer:
    """Our model with a checkpoint's weights, in `dtype`; names and shapes checked against config.json."""
    return build_model(*read_checkpoint(model_path, config), dtype=dtype)


def build_model(
    cfg: ModelConfig, state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32
) -> AttnOnlyTransformer:
    """Our model with a checked state dict (`read_checkpoint`'s) loaded, in `dtype`."""
    model = AttnOnlyTransformer(cfg).to(dtype)  # float64 weights reach a float64 analysis unrounded
    model.load_state_dict(state)
    return model
