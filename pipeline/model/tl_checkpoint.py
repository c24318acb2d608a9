"""Checkpoints in TransformerLens's format: HookedTransformerConfig-style config.json, and
state dicts checked against our model before it is built from them.

`read_tl_config` accepts the config.json of a TransformerLens `HookedTransformer`
(`cfg.to_dict()`, or the raw config.json of NeelNanda's attn-only models, which spell two
fields `normalization` and `shortformer_pos` and which we translate field for field as
TransformerLens's `convert_neel_model_config` does) and refuses, naming the field, any
setting our model does not compute the same way (a gated MLP or another activation, RMS
norm, scaled rotary positions, a custom attention scale, ...). A repository that ships no config.json
(`pipeline.hub.KNOWN`) gets its sizes from the weights' shapes (`inferred_config`).

TransformerLens 4.x replaced `HookedTransformer` by `TransformerBridge`; its attention-only
models are the native architecture (`TransformerBridge.boot_native`), whose config is a
`TransformerBridgeConfig` (HookedTransformerConfig's field names, plus `architecture`) and whose
state dict names the `nn.Linear` layers (`blocks.0.attn.q.weight` `[n_heads * d_head, d_model]`).
`bridge_state_dict` reads a live bridge, and `read_checkpoint` reads a bridge's files, through
one name mapping (`BRIDGE_NAMES`); `bridge_checkpoint` writes ours in that form, except for
shortformer positions, which 4.x cannot represent (docs/public-models.md, "TransformerLens 4.x").
Nothing here imports transformer_lens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import io
from ..checkpoint import TL_BUFFERS, load_state, save_state
from ..config import ACTIVATIONS, LN_EPS, ModelConfig
from ..errors import UserError, within
from .transformer import Transformer

# TransformerLens 4.x's own architecture (TransformerBridge.boot_native): the one that can be attention-only.
NATIVE = "TransformerLensNative"

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
# and of a model with MLPs (an attention-only model's config.json has act_fn null and no others),
# and of one with rotary positions
MLP_FIELDS = ("d_mlp", "act_fn", "parallel_attn_mlp")
ROTARY_FIELDS = ("rotary_dim", "rotary_base", "rotary_adjacent_pairs")


def tl_config(model: ModelConfig) -> dict:
    """config.json for a checkpoint: HookedTransformerConfig field names and values."""
    out: dict[str, Any] = {name: getattr(model, name) for name in TL_FIELDS}
    out.update(attn_only=model.attn_only, act_fn=None)
    if not model.attn_only:
        out.update({name: getattr(model, name) for name in MLP_FIELDS})
    if model.positional_embedding_type == "rotary":
        out.update({name: getattr(model, name) for name in ROTARY_FIELDS}, rotary_dim=model.rotated_dims)
    out.update(d_vocab_out=model.d_vocab, use_attn_scale=True, eps=LN_EPS)
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


def _attn_only(raw: Mapping[str, Any]) -> bool:
    """`attn_only` as given; absent, whether d_mlp is (HookedTransformerConfig's own default, false,
    would give a config that names no d_mlp MLPs of 4 d_model, which its weights would not have)."""
    return bool(raw.get("attn_only", raw.get("d_mlp") is None))


_Reason = str | Callable[[Mapping[str, Any]], str]  # the problem, or how to word it from the config

# HookedTransformerConfig settings our model would compute differently, in the order they are
# checked: (field, the value taken when the field is absent, whether (that value, the whole
# config) is what our model computes, the problem otherwise). One table: each refusal is one
# row, and one case of tests/test_checkpoint.py.
UNSUPPORTED: tuple[tuple[str, Any, Callable[[Any, Mapping[str, Any]], bool], _Reason], ...] = (
    (
        "model_type",
        None,
        lambda v, raw: v is None,
        "a Hugging Face transformers config.json (save_pretrained): only HookedTransformerConfig or "
        "TransformerBridgeConfig fields are read",
    ),
    (
        "d_mlp",
        None,
        lambda v, raw: _attn_only(raw) or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "a model with MLPs (attn_only false) needs d_mlp, a positive integer",
    ),
    (
        "act_fn",
        None,
        lambda v, raw: _attn_only(raw) or v in ACTIVATIONS,
        f"the MLP's activation must be one of {', '.join(ACTIVATIONS)}",
    ),
    ("gated_mlp", False, _off, "gated MLPs are not supported"),
    (
        "rotary_dim",
        None,
        lambda v, raw: raw.get("positional_embedding_type") != "rotary"
        or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
        "rotary positions need rotary_dim, a positive integer",
    ),
    ("use_NTK_by_parts_rope", False, _off, "NTK-by-parts rotary scaling is not supported"),
    ("use_yarn_rope", False, _off, "YaRN rotary scaling is not supported"),
    ("use_dynamic_ntk_rope", False, _off, "dynamic NTK rotary scaling is not supported"),
    ("rotary_scaling_factor", 1.0, lambda v, raw: v in (None, 1, 1.0), "rotary scaling is not supported"),
    ("use_logn_attn", False, _off, "log-n attention scaling is not supported"),
    (
        "architecture",
        None,
        lambda v, raw: v in (None, NATIVE),
        f"a TransformerBridge of a Hugging Face architecture: only {NATIVE} (boot_native) is read",
    ),
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


def bridge_translated(raw: dict) -> dict:
    """A TransformerBridgeConfig dict (it has `architecture`) in HookedTransformerConfig's
    meanings; any other dict unchanged.

    Two things differ in the native architecture (TransformerLens 4.3): an absent
    normalization_type is "LN" (our reader's absent is None), and the scores are divided by
    `attn_scale` when `use_attn_scale and attn_scale > 0`, else by sqrt(d_head), even when
    use_attn_scale is false, where HookedTransformer divides by 1
    (model_bridge/sources/native/model.py, `NativeAttention.__init__`)."""
    if "architecture" not in raw or raw.get("architecture") not in (None, NATIVE):
        return raw  # a HookedTransformerConfig, or a bridge of another architecture (refused by name)
    out = {"normalization_type": "LN", **raw}
    scale = raw.get("attn_scale", -1.0)
    native_scale = raw.get("use_attn_scale", True) and isinstance(scale, int | float) and scale > 0
    out.update(use_attn_scale=True, attn_scale=scale if native_scale else None)
    return out


def _model_config(raw: dict) -> ModelConfig:
    raw = bridge_translated(neel_translated(raw))
    problem = _unsupported(raw)
    if problem:
        key, value, why = problem
        raise UserError(key, why, value)
    optional = ("normalization_type", "positional_embedding_type")
    missing = [name for name in TL_FIELDS if name not in raw and name not in optional]
    if missing:
        raise UserError(missing[0], "missing from config.json")
    fields = {name: raw.get(name) for name in TL_FIELDS}
    if not _attn_only(raw):  # d_mlp and act_fn checked above (UNSUPPORTED)
        fields.update(d_mlp=raw["d_mlp"], act_fn=raw["act_fn"])
        fields["parallel_attn_mlp"] = bool(raw.get("parallel_attn_mlp", False))
    if fields["positional_embedding_type"] == "rotary":  # rotary_dim checked above; TL's defaults
        fields.update(rotary_dim=raw["rotary_dim"], rotary_base=raw.get("rotary_base", 10000))
        fields["rotary_adjacent_pairs"] = bool(raw.get("rotary_adjacent_pairs", False))
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
    return name.startswith("ln_final.") or ".ln1." in name or ".ln2." in name


def _checked_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], config_source: str
) -> dict[str, torch.Tensor]:
    mlp = sorted(k for k in state if ".mlp." in k)
    if mlp and not any(".mlp." in k for k in expected):
        raise UserError(mlp[0], f"MLP weights, where {config_source} says the model is attention-only")
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
        problem = f"unexpected key: not a weight of the model in {config_source}"
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
    dict, checked against it (`check_state`); a TransformerBridge's state dict is renamed to
    HookedTransformer's names first (`from_bridge_state`)."""
    state, _ = load_state(model_path)
    if isinstance(config, Mapping):
        source = f"the shapes in {model_path}"
        if is_bridge_state(state):  # [n_heads * d_head, d_model] cannot say n_heads
            problem = (
                "a TransformerBridge state dict: n_heads cannot be read from its shapes (needs config.json)"
            )
            raise UserError(str(model_path), problem)
        with within(str(model_path)):
            cfg = from_tl_config(inferred_config(state, config), source)
    else:
        cfg, source = read_tl_config(config), str(config)
        if is_bridge_state(state):
            with within(str(model_path)):
                state = from_bridge_state(state, cfg, source)
    with torch.device("meta"):  # only the expected names and shapes: allocates nothing
        expected = Transformer(cfg).state_dict()
    return cfg, check_state(state, expected, str(model_path), source)


def load_model(
    model_path: str | Path, config: str | Path | Mapping[str, Any], dtype: torch.dtype = torch.float32
) -> Transformer:
    """Our model with a checkpoint's weights, in `dtype`; names and shapes checked against config.json."""
    return build_model(*read_checkpoint(model_path, config), dtype=dtype)


def build_model(
    cfg: ModelConfig, state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32
) -> Transformer:
    """Our model with a checked state dict (`read_checkpoint`'s) loaded, in `dtype`."""
    model = Transformer(cfg).to(dtype)  # float64 weights reach a float64 analysis unrounded
    model.load_state_dict(state)
    return model


# --- TransformerLens 4.x: TransformerBridge (native architecture) ------------------------------

# The state dict of `TransformerBridge.boot_native(cfg)` (TransformerLens 4.3: its `state_dict()`,
# and the keys `utilities/tl_checkpoint_conversion.py`'s `convert_tl_checkpoint` writes) against
# ours, per layer l: (the bridge's name, ours). Attention weights are nn.Linear's [out, in],
# heads concatenated head-major: q.weight [n_heads * d_head, d_model], o.weight
# [d_model, n_heads * d_head]; unembed.weight is [d_vocab, d_model].
BRIDGE_NAMES = (
    ("embed.weight", "embed.W_E"),
    ("pos_embed.weight", "pos_embed.W_pos"),
    *((f"blocks.{{l}}.attn.{x.lower()}.weight", f"blocks.{{l}}.attn.W_{x}") for x in "QKVO"),
    *((f"blocks.{{l}}.attn.{x.lower()}.bias", f"blocks.{{l}}.attn.b_{x}") for x in "QKVO"),
    ("blocks.{l}.ln1.weight", "blocks.{l}.ln1.w"),
    ("blocks.{l}.ln1.bias", "blocks.{l}.ln1.b"),
    ("ln_final.weight", "ln_final.w"),
    ("ln_final.bias", "ln_final.b"),
    ("unembed.weight", "unembed.W_U"),
    ("unembed.bias", "unembed.b_U"),
)
_FROM_BRIDGE = {re.compile(re.escape(b).replace(r"\{l\}", r"(\d+)") + "$"): ours for b, ours in BRIDGE_NAMES}


def is_bridge_state(state: Mapping[str, torch.Tensor]) -> bool:
    """A TransformerBridge's state dict (`embed.weight`), not a HookedTransformer's (`embed.W_E`)."""
    return "embed.weight" in state and "embed.W_E" not in state


def _from_bridge_tensor(
    ours: str, t: torch.Tensor, cfg: ModelConfig, bridge: str, source: str
) -> torch.Tensor:
    """One bridge tensor in our layout (`ours` names it); refuses a shape that does not split into
    cfg's heads, which a reshape alone would not notice (any factoring of n_heads * d_head fits)."""
    H, d = cfg.n_heads, cfg.d_head
    kind = ours.rsplit(".", 1)[-1]
    if kind in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
        # o.weight is [d_model, heads * d_head]; q, k, v weights and biases [heads * d_head, ...]
        head_dim = 1 if kind == "W_O" else 0
        if t.ndim != (1 if kind.startswith("b_") else 2) or t.shape[head_dim] != H * d:
            heads = f"n_heads x d_head = {H} x {d} from {source}"
            raise UserError(bridge, f"shape {list(t.shape)} disagrees with {heads}")
    if kind in ("W_Q", "W_K", "W_V"):
        return t.reshape(H, d, -1).transpose(1, 2)  # [heads * d_head, d_model] -> [heads, d_model, d_head]
    if kind == "W_O":
        return t.T.reshape(H, d, -1)  # [d_model, heads * d_head] -> [heads, d_head, d_model]
    if kind in ("b_Q", "b_K", "b_V"):
        return t.reshape(H, d)  # [heads * d_head] -> [heads, d_head]
    if kind == "W_U":
        return t.T  # nn.Linear's [d_vocab, d_model] -> [d_model, d_vocab]
    return t


def from_bridge_state(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, source: str = "config.json"
) -> dict[str, torch.Tensor]:
    """A TransformerBridge (native) state dict under HookedTransformer's names and shapes
    (`BRIDGE_NAMES`); an MLP or an unknown key is refused by name. Tensors are views of `state`'s."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if ".mlp." in name or ".ln2." in name:
            raise UserError(name, BRIDGE_MLP)
        for pattern, ours in _FROM_BRIDGE.items():
            if m := pattern.match(name):
                target = ours.replace("{l}", m[1]) if m.groups() else ours
                out[target] = _from_bridge_tensor(target, t, cfg, name, source)
                break
        else:
            raise UserError(
                name, "unexpected key: not a TransformerBridge state dict of an attention-only model"
            )
    return out


BRIDGE_MLP = (
    "a TransformerBridge with MLPs is not read (only attention-only native bridges are); load the "
    "model as a TransformerLens 3.9 HookedTransformer, or its checkpoint, instead"
)


BRIDGE_ROTARY = (
    "a TransformerBridge with rotary positions is not read (a HookedTransformer with them is): load "
    "the model in TransformerLens 3.9 instead"
)


def bridge_state_dict(bridge: Any) -> tuple[dict[str, torch.Tensor], dict]:
    """A TransformerLens 4.x `TransformerBridge`'s weights under HookedTransformer's names
    (`from_bridge_state`, checked against our model: `check_state`) and its config as
    HookedTransformerConfig fields (`tl_config`'s, as our config.json; LNPre is read as LN with
    w = 1, b = 0), or a one-line refusal naming the field our model would compute differently (a
    bridge with MLPs, a Hugging Face architecture, RMS norm, rotary positions, ...). The tensors
    share the bridge's storage.

    Reads `bridge.cfg.to_dict()` and `bridge.state_dict()` only: transformer_lens is not imported."""
    raw = dict(bridge.cfg.to_dict())
    if not _attn_only(raw):
        raise UserError("bridge.cfg: attn_only", BRIDGE_MLP, raw.get("attn_only"))
    if raw.get("positional_embedding_type") == "rotary":
        raise UserError("bridge.cfg: positional_embedding_type", BRIDGE_ROTARY, "rotary")
    cfg = from_tl_config(bridge_translated(raw), "bridge.cfg")
    with within("bridge.state_dict()"):
        state = from_bridge_state(bridge.state_dict(), cfg, "bridge.cfg")
    with torch.device("meta"):
        expected = Transformer(cfg).state_dict()
    return check_state(state, expected, "bridge.state_dict()", "bridge.cfg"), tl_config(cfg)


SHORTFORMER_4X = (
    "shortformer positions (added to the queries' and keys' inputs only) have no TransformerLens 4.x "
    "form: its native model adds positions to the residual stream (standard) or rotates queries "
    "and keys (rotary); load the HookedTransformer checkpoint in TransformerLens 3.9 instead"
)


def bridge_checkpoint(
    model: ModelConfig, state: Mapping[str, torch.Tensor]
) -> tuple[dict, dict[str, torch.Tensor]]:
    """Our checkpoint as TransformerLens 4.x loads it: a TransformerBridgeConfig dict for
    `TransformerBridge.boot_native(config)`, and the state dict its `load_state_dict(...,
    strict=True)` takes (contiguous tensors, `BRIDGE_NAMES`). Shortformer positions are refused."""
    if model.positional_embedding_type == "shortformer":
        raise UserError("positional_embedding_type", SHORTFORMER_4X, model.positional_embedding_type)
    if model.positional_embedding_type == "rotary":
        raise UserError("positional_embedding_type", BRIDGE_ROTARY, model.positional_embedding_type)
    H, d = model.n_heads, model.d_head
    to_bridge = {ours: b for b, ours in BRIDGE_NAMES}
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith(TL_BUFFERS):
            continue
        generic = re.sub(r"^blocks\.\d+\.", "blocks.{l}.", name)
        if generic not in to_bridge:
            raise UserError(name, "has no TransformerBridge (native, attention-only) counterpart")
        target = to_bridge[generic].replace("{l}", name.split(".")[1]) if generic != name else to_bridge[name]
        kind = name.rsplit(".", 1)[-1]
        if kind in ("W_Q", "W_K", "W_V"):
            t = t.transpose(1, 2).reshape(H * d, -1)  # [heads, d_model, d_head] -> [heads * d_head, d_model]
        elif kind == "W_O":
            t = t.reshape(H * d, -1).T  # [heads, d_head, d_model] -> [d_model, heads * d_head]
        elif kind in ("b_Q", "b_K", "b_V"):
            t = t.reshape(H * d)
        elif kind == "W_U":
            t = t.T
        out[target] = t.detach().contiguous()
    return {**tl_config(model), "architecture": NATIVE}, out


def write_bridge_checkpoint(
    directory: str | Path, model: ModelConfig, state: Mapping[str, torch.Tensor]
) -> Path:
    """config.json and model.safetensors in TransformerLens 4.x's form (`bridge_checkpoint`), written
    whole into `directory` or not at all: a new folder, or one already in use, where only those two
    files are added or replaced (`io.atomic_files`). In 4.x: `bridge =
    TransformerBridge.boot_native(config)`, then
    `bridge.load_state_dict(safetensors.torch.load_file(".../model.safetensors"))`."""
    config, bridge_state = bridge_checkpoint(model, state)
    with io.atomic_files(directory) as tmp:
        save_state(tmp / "model.safetensors", bridge_state, {"format": "TransformerBridge"})
        io.write_json(tmp / "config.json", config)
    return Path(directory)
