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

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
from torch import Tensor

from ..checkpoint import TL_BUFFERS, load_state, save_state
from ..config import ModelConfig
from ..errors import UserError, within

HEAD_MATRICES = ("W_Q", "W_K", "W_V", "W_O")
HEAD_BIASES = ("b_Q", "b_K", "b_V")
# positional embedding types (HookedTransformerConfig names)
POSITIONS = ("shortformer", "standard", "rotary")


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

    def to(self, *args, **kwargs) -> HeadWeights:
        """Every matrix `.to(*args, **kwargs)`: a dtype, a device, or both."""
        return HeadWeights(**{f.name: getattr(self, f.name).to(*args, **kwargs) for f in fields(self)})

    def state_dict(self) -> dict[str, Tensor]:
        """TransformerLens names, one entry per layer for the head matrices."""
        out = {
            "embed.W_E": self.W_E,
            "pos_embed.W_pos": self.W_pos,
            "unembed.W_U": self.W_U,
            "unembed.b_U": self.b_U,
        }
        for layer in range(self.n_layers):
            for name in HEAD_MATRICES + HEAD_BIASES + ("b_O",):
                out[f"blocks.{layer}.attn.{name}"] = getattr(self, name)[layer]
        return out


def from_state_dict(
    state: Mapping[str, Tensor], source: str = "weights", dtype: torch.dtype = torch.float64
) -> HeadWeights:
    """Stack a TransformerLens-named state dict into `HeadWeights`, checking every tensor's
    name, rank and shape (against the head count and sizes of blocks.0.attn.W_Q and the
    vocabulary of embed.W_E) before stacking; `source` names the file in errors."""
    with within(source):
        return _stacked(state, dtype)


# A checkpoint file with LayerNorm parameters is refused by `load`, not folded there: folding needs
# what a bare state dict does not say (whether positions enter after ln1, shortformer, and so are neither
# scaled nor centred; `prepare`), and one place that folds keeps every stage's scores equal to
# the pipeline's. Read unfolded, its scores would be TransformerLens's unprocessed ones, not the
# model's (ln1.w scales each residual direction before W_Q, W_K, W_V read it).
LAYERNORM = re.compile(r"(blocks\.\d+\.ln\d|ln_final)\.(w|b)$")
FOLD_FIRST = (
    "LayerNorm weights not folded in: python -m stages.weights --model CHECKPOINT --config "
    "CONFIG.json --out DIR folds them, then analyse DIR/heads.safetensors"
)


def _stacked(state: Mapping[str, Tensor], dtype: torch.dtype) -> HeadWeights:
    layers = sorted({int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    if not layers:
        raise UserError("blocks", "none (expected keys like blocks.0.attn.W_Q)")
    if layers != list(range(len(layers))):
        raise UserError("blocks", f"layers are not numbered 0..n-1: {layers}")

    def get(key: str, shape: tuple[int, ...] | None = None, implied: str = "") -> Tensor:
        if key not in state:
            raise UserError(key, "missing from the weights file")
        t = state[key]
        if shape is not None and tuple(t.shape) != shape:
            raise UserError(key, f"shape {list(t.shape)} disagrees with {list(shape)} implied by {implied}")
        t = t.to(dtype)
        if not torch.isfinite(t).all():
            raise UserError(key, "contains NaN or inf")
        return t

    first = get("blocks.0.attn.W_Q")
    if first.ndim != 3:
        raise UserError(
            "blocks.0.attn.W_Q", f"shape {list(first.shape)}: expected [n_heads, d_model, d_head]"
        )
    H, D, d = first.shape
    W_E = get("embed.W_E")
    if W_E.ndim != 2 or W_E.shape[1] != D:
        raise UserError("embed.W_E", f"shape {list(W_E.shape)}: expected [d_vocab, d_model = {D}]")
    V, by = W_E.shape[0], "blocks.0.attn.W_Q and embed.W_E"
    shapes = {"W_Q": (H, D, d), "W_K": (H, D, d), "W_V": (H, D, d), "W_O": (H, d, D),
              "b_Q": (H, d), "b_K": (H, d), "b_V": (H, d), "b_O": (D,)}  # fmt: skip

    def per_layer(name: str) -> Tensor:
        """[n_layers, ...]; a missing bias (all layers) is zero."""
        if name not in HEAD_MATRICES and f"blocks.0.attn.{name}" not in state:
            return torch.zeros(len(layers), *shapes[name], dtype=dtype)
        return torch.stack([get(f"blocks.{l}.attn.{name}", shapes[name], by) for l in layers])

    W_pos = get("pos_embed.W_pos")
    if W_pos.ndim != 2 or W_pos.shape[1] != D:
        raise UserError("pos_embed.W_pos", f"shape {list(W_pos.shape)}: expected [n_ctx, d_model = {D}]")
    b_U = get("unembed.b_U", (V,), by) if "unembed.b_U" in state else torch.zeros(V, dtype=dtype)
    return HeadWeights(
        W_E=W_E, W_pos=W_pos, W_U=get("unembed.W_U", (D, V), by), b_U=b_U,
        **{name: per_layer(name) for name in shapes},
    )  # fmt: skip


def power_of_two_scaled(hw: HeadWeights) -> HeadWeights:
    """`hw` with W_Q, W_K, W_V and W_O of each head, and W_E and W_U, divided by a power of
    two that brings their largest |entry| into [0.5, 1); biases and W_pos unchanged.

    Composition scores, copying and QK positivity are scale-free in each of these matrices
    (each appears once in a numerator and once in a denominator, or scales every eigenvalue
    alike), and dividing by a power of two is exact: the scores are unchanged, but their
    products of four to six factors cannot overflow or underflow float64 (giving
    inf, 0 or NaN) for weights of any finite size.
    """

    def scaled(W: Tensor, dims: tuple[int, ...]) -> Tensor:
        _, exponent = torch.frexp(W.abs().amax(dim=dims, keepdim=True))  # max|W| = m 2^e, m in [0.5, 1)
        return W * torch.pow(2.0, -exponent.to(W.dtype))  # a zero matrix has e = 0: unchanged

    heads = {name: scaled(getattr(hw, name), (-2, -1)) for name in HEAD_MATRICES}  # per layer and head
    return replace(hw, W_E=scaled(hw.W_E, (0, 1)), W_U=scaled(hw.W_U, (0, 1)), **heads)


def save(
    path: str | Path,
    hw: HeadWeights,
    metadata: Mapping[str, str] | None = None,
    extra: Mapping[str, Tensor] | None = None,
) -> Path:
    """Write `heads.safetensors`: the stacked weights under TransformerLens names, plus `extra` tensors."""
    return save_state(path, {**hw.state_dict(), **(extra or {})}, metadata)


def load(path: str | Path, dtype: torch.dtype = torch.float64) -> tuple[HeadWeights, dict[str, str]]:
    """Read `heads.safetensors` (or any attention-only TransformerLens-named checkpoint without
    LayerNorm; one with it is refused in one line naming the weights stage, which folds it:
    `LAYERNORM`)."""
    state, metadata = load_state(path)
    unfolded = sorted(k for k in state if LAYERNORM.match(k))
    if unfolded:  # `from_state_dict` reads the head matrices of any state dict as they are
        raise UserError(f"{path}: {unfolded[0]}", FOLD_FIRST)
    # what `from_state_dict` does not read would be analysed as if absent: an MLP's weights (a whole
    # model's checkpoint, which the weights stage reads), or a key of another naming; the weights
    # stage's positional terms and TransformerLens's buffers are known
    unknown = sorted(k for k in state if not KNOWN_KEY.match(k) and not k.endswith(TL_BUFFERS))
    if unknown:
        mlp = ".mlp." in unknown[0] or ".ln2." in unknown[0]
        problem = MLP_FIRST if mlp else UNKNOWN_KEY
        raise UserError(f"{path}: {unknown[0]}", problem)
    with within(str(path)):
        _check_positional_terms(state)
    return from_state_dict(state, source=str(path), dtype=dtype), metadata


# Every key an attention-only weights file in TransformerLens's names may hold: the stacked
# weights (`HeadWeights.state_dict`) and the shortformer + LayerNorm positional terms (`positional_terms`)
KNOWN_KEY = re.compile(
    r"(embed\.W_E|pos_embed\.W_pos|unembed\.(W_U|b_U)|blocks\.\d+\.attn\.(W_[QKVO]|b_[QKVO]|pos_[QK]))$"
)
MLP_FIRST = (
    "a checkpoint of a model with MLPs, not a weights file: python -m stages.weights --model "
    "CHECKPOINT --config CONFIG.json --out DIR writes its heads, then analyse DIR/heads.safetensors"
)
UNKNOWN_KEY = (
    "unexpected key: not a weight of an attention-only model in TransformerLens's names "
    "(embed.W_E, blocks.{l}.attn.W_Q, ...)"
)


def _check_positional_terms(state: Mapping[str, Tensor]) -> None:
    """`blocks.{l}.attn.pos_Q` and `pos_K` [n_heads, n_ctx, d_head], beside W_Q and W_pos: the
    shapes of the model they were computed from."""
    for key, t in state.items():
        if found := re.fullmatch(r"blocks\.(\d+)\.attn\.pos_[QK]", key):
            W_Q, W_pos = state.get(f"blocks.{found[1]}.attn.W_Q"), state.get("pos_embed.W_pos")
            if W_Q is None or W_pos is None or W_Q.ndim != 3 or W_pos.ndim != 2:
                continue  # `from_state_dict` names what is missing or malformed
            expected = [W_Q.shape[0], W_pos.shape[0], W_Q.shape[2]]
            if list(t.shape) != expected:
                implied = "[n_heads, n_ctx, d_head] of W_Q and W_pos"
                raise UserError(key, f"shape {list(t.shape)} disagrees with {expected} ({implied})")


def positions_of(metadata: Mapping[str, str], source: str = "weights") -> str:
    """The positional embedding type recorded in a weights file's `config` metadata
    (HookedTransformerConfig names, as the weights stage writes it); "standard", TransformerLens's
    default, for a checkpoint without one. The invariant scores need it: shortformer positions
    never enter the residual stream (`invariant.residual_grams`)."""
    if "config" not in metadata:
        return "standard"
    try:
        config = json.loads(metadata["config"])
    except json.JSONDecodeError:
        raise UserError(source, "its config metadata is not JSON") from None
    value = config.get("positional_embedding_type", "standard") if isinstance(config, dict) else None
    if value not in POSITIONS:
        raise UserError(f"{source}: config.positional_embedding_type", f"expected one of {POSITIONS}", value)
    return value


# --- analysis-ready weights ----------------------------------------------------------
#
# With LayerNorm, x -> ((x - mean x) / rms) * w + b feeds every head's W_Q, W_K, W_V and
# the unembedding. As TransformerLens's `fold_ln` does, w and b move into the weights
# that read the normalised stream (W' = diag(w) W, b' = b W + b_old), which then read a
# centred input, so their component along the all-ones direction of d_model does
# nothing and is removed ("centre reading weights"). Everything written into the
# residual stream (W_E, standard W_pos, W_O, b_O) is then centred too, since LayerNorm
# subtracts the mean anyway. Without LayerNorm none of this is valid (nothing removes
# the mean) and none of it is done.
#
# Two steps are valid for every model: value biases fold into the output bias
# (attention rows sum to 1, so b_V W_O is a constant per head), and W_U, b_U are
# centred over the vocabulary (softmax ignores a constant added to every logit).
#
# Shortformer with LayerNorm: positions are added after ln1 and are not scaled by its
# w, so q = x_hat (diag(w) W_Q) + (b W_Q + b_Q) + W_pos W_Q. Folding w into W_Q is
# exact for the residual-stream path (what composition reads) but W_pos W_Q_folded is
# not the model's positional term. The exact positional query and key terms,
# W_pos W_Q^h and W_pos W_K^h, are stored per layer as `blocks.{l}.attn.pos_Q` and
# `pos_K` [n_heads, n_ctx, d_head]; W_pos itself is kept as trained (not centred: it
# never passes through a LayerNorm).


def _mean_out(t: Tensor, dim: int) -> Tensor:
    return t - t.mean(dim, keepdim=True)


def prepare(
    state: Mapping[str, Tensor], model: ModelConfig, source: str = "checkpoint"
) -> tuple[HeadWeights, list[str]]:
    """Analysis-ready weights from a checkpoint, and the list of processing steps applied.

    Use `positional_terms` for the extra tensors a shortformer + LayerNorm model needs.
    """
    steps: list[str] = ["stacked heads per layer in float64"]
    sd = {
        k: v.detach().to(torch.float64) for k, v in state.items() if not k.endswith(TL_BUFFERS)
    }  # a raw HookedTransformer state dict has them
    L = model.n_layers
    ln = model.normalization_type == "LN"
    shortformer = model.positional_embedding_type == "shortformer"
    if model.positional_embedding_type == "rotary":
        # no embedding enters the residual stream: W_pos zero; Q and K read W_Q and W_K unturned,
        # the circuits at relative offset 0
        sd["pos_embed.W_pos"] = torch.zeros(model.n_ctx, model.d_model, dtype=torch.float64)
        steps.append(
            "rotary positions: no positional embedding (W_pos zero); the Q and K scores read W_Q and "
            "W_K unturned, the query-key circuits at relative offset 0, as TransformerLens's "
            "all_composition_scores"
        )
    if ln:
        for l in range(L):
            w, b = sd.pop(f"blocks.{l}.ln1.w"), sd.pop(f"blocks.{l}.ln1.b")
            for X in ("Q", "K", "V"):
                W = sd[f"blocks.{l}.attn.W_{X}"]  # [head, d_model, d_head]
                sd[f"blocks.{l}.attn.b_{X}"] = sd[f"blocks.{l}.attn.b_{X}"] + torch.einsum("m,hmd->hd", b, W)
                sd[f"blocks.{l}.attn.W_{X}"] = _mean_out(W * w[None, :, None], dim=1)
        w, b = sd.pop("ln_final.w"), sd.pop("ln_final.b")
        sd["unembed.b_U"] = sd["unembed.b_U"] + b @ sd["unembed.W_U"]
        sd["unembed.W_U"] = _mean_out(sd["unembed.W_U"] * w[:, None], dim=0)
        steps.append(
            "folded LayerNorm: ln1.w into W_Q, W_K, W_V and ln1.b into b_Q, b_K, b_V per layer; "
            "ln_final.w into W_U and ln_final.b into b_U; reading weights centred over d_model"
        )
        sd["embed.W_E"] = _mean_out(sd["embed.W_E"], dim=-1)
        written = "W_E, W_O, b_O"
        if model.positional_embedding_type == "standard":
            sd["pos_embed.W_pos"] = _mean_out(sd["pos_embed.W_pos"], dim=-1)
            written = "W_E, W_pos, W_O, b_O"
        for l in range(L):
            sd[f"blocks.{l}.attn.W_O"] = _mean_out(sd[f"blocks.{l}.attn.W_O"], dim=-1)
            sd[f"blocks.{l}.attn.b_O"] = _mean_out(sd[f"blocks.{l}.attn.b_O"], dim=-1)
        steps.append(f"centred writing weights over d_model ({written})")
        if shortformer:
            steps.append(
                "shortformer + LayerNorm: positions enter after ln1, unscaled by ln1.w, "
                "so W_pos W_Q (folded) is not the model's positional term; "
                "exact terms W_pos W_Q^h, W_pos W_K^h stored as "
                "blocks.{l}.attn.pos_Q, pos_K; W_pos kept as trained (never normalised, not centred)"
            )
    else:
        steps.append("no LayerNorm: nothing to fold; writing weights not centred (nothing removes the mean)")
    sd["unembed.W_U"] = _mean_out(sd["unembed.W_U"], dim=-1)
    sd["unembed.b_U"] = _mean_out(sd["unembed.b_U"], dim=-1)
    steps.append("centred W_U and b_U over the vocabulary (softmax is unchanged)")
    for l in range(L):
        b_V, W_O = sd[f"blocks.{l}.attn.b_V"], sd[f"blocks.{l}.attn.W_O"]
        sd[f"blocks.{l}.attn.b_O"] = sd[f"blocks.{l}.attn.b_O"] + torch.einsum("hd,hdm->m", b_V, W_O)
        sd[f"blocks.{l}.attn.b_V"] = torch.zeros_like(b_V)
    steps.append("folded value biases into b_O (b_O += sum_h b_V^h W_O^h; b_V = 0)")
    if not model.attn_only:
        steps.append(
            f"MLPs (d_mlp {model.d_mlp}) left out: the scores are of the direct path from head to head "
            "(an MLP between them is not in it), as TransformerLens's all_composition_scores"
        )
    return from_state_dict(sd, source=source), steps


def positional_terms(state: Mapping[str, Tensor], model: ModelConfig) -> dict[str, Tensor]:
    """Shortformer + LayerNorm only: the exact positional query and key terms per layer,
    `blocks.{l}.attn.pos_Q` = W_pos W_Q^h `[n_heads, n_ctx, d_head]` (unfolded W_Q), and `pos_K`."""
    if not (model.normalization_type == "LN" and model.positional_embedding_type == "shortformer"):
        return {}
    W_pos = state["pos_embed.W_pos"].detach().to(torch.float64)  # [n_ctx, d_model]
    out = {}
    for l in range(model.n_layers):
        for X in ("Q", "K"):
            W = state[f"blocks.{l}.attn.W_{X}"].detach().to(torch.float64)  # [head, d_model, d_head]
            out[f"blocks.{l}.attn.pos_{X}"] = torch.einsum("pm,hmd->hpd", W_pos, W)
    return out
