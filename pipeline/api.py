"""The project's science on one model in a notebook: `attn_circuits.api`.

    from attn_circuits import api
    result = api.composition(model)      # a HookedTransformer, a TransformerBridge, a state dict, a path
    result.scores, result.invariant, result.placebo, result.channels, result.summary
    api.heads(model, tokens).roles       # and .ablation: the path ablation on those tokens

Every call runs the code the stages run, not a copy of it: `composition` is the composition
stage's `circuits.analysis.composition`; `weights_of` folds a checkpoint as the weights stage does
(`circuits.weights.prepare`); `heads`, `roles` and `path_ablation` are the heads stage's
`behaviour.heads` functions on the batches given. So for the same weights, seed and batches the
tables equal the stages' files (tests/test_api.py). The work runs on the model's device (its
parameters'); the tables come back as pandas on the CPU. Settings default to the project's
(`conf/analysis/default.yaml`, the schema's defaults in `pipeline/config.py`); a config section
or keyword arguments override them (`api.composition(model, fdr=0.01)`).

The floor above `behaviour/` (tests/test_layers.py): it reads weights, models and data, and nothing
in the library imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from . import checkpoint, params, streams
from .behaviour import heads as heads_analysis
from .circuits import analysis, weights
from .circuits.analysis import Composition
from .circuits.weights import HeadWeights
from .cli import resolve_device
from .config import AnalysisConfig, CompositionConfig, Config, HeadsConfig, ModelConfig, Section
from .data import datasets
from .errors import UserError
from .model import tl_checkpoint
from .model.transformer import Transformer
from .tables import INVARIANT, PROJECTION, join_measures

__all__ = [
    "Composition",
    "Heads",
    "Weights",
    "composition",
    "heads",
    "path_ablation",
    "roles",
    "weights_of",
]

MODEL_KINDS = (
    "a TransformerLens HookedTransformer (3.x), a TransformerBridge (4.x), our Transformer, "
    "a state dict in TransformerLens names, or a path to a checkpoint or heads.safetensors"
)


@dataclass(frozen=True)
class Weights:
    """One model as the analysis reads it (`weights_of`)."""

    heads: HeadWeights  # analysis-ready (the weights stage's heads.safetensors), float64, on the CPU
    positions: str  # the positional embedding type: "shortformer", "standard" or "rotary"
    config: ModelConfig | None  # None: analysis-ready weights read from a file, no model to run
    state: Mapping[str, Tensor] | None  # the checked checkpoint, on the CPU (forward passes); None likewise
    device: torch.device  # where the analysis runs: the model's
    source: str  # names the model in errors
    steps: tuple[str, ...] = ()  # what the folding did (the weights stage's summary.json "steps")


@dataclass(frozen=True)
class Heads:
    """The heads stage's tables for the batches given (`heads`)."""

    roles: pd.DataFrame  # heads.csv: every head's attention and weight scores, its roles
    ablation: pd.DataFrame  # ablation.csv: every (earlier, later) pair's path ablation, mean over batches
    ablation_batches: pd.DataFrame  # ablation_batches.csv: every batch
    patterns: dict[str, Tensor]  # patterns.safetensors: the first probe's tokens and attention patterns
    summary: dict  # summary.json: role counts, the role ablation, each measure's agreement with the ablation


# --- one model, whatever holds it ----------------------------------------------------------


def _is_instance_of(model: Any, name: str) -> bool:
    """`model` is a TransformerLens class `name` (or a subclass), told without importing TransformerLens."""
    return any(
        c.__name__ == name and c.__module__.split(".")[0] == "transformer_lens" for c in type(model).__mro__
    )


def _device_of(tensors: Sequence[Tensor] | Any) -> torch.device:
    first = next(iter(tensors), None)
    return first.device if isinstance(first, Tensor) else torch.device("cpu")


def weights_of(model: Any, model_config: Any = None, device: str | torch.device | None = None) -> Weights:
    """`model` read as the analysis reads it: analysis-ready weights, folded as the weights stage
    folds them (`weights.prepare`), and the checked checkpoint (for roles and the path ablation).

    `model`: a HookedTransformer (3.x; its `cfg`), a TransformerBridge (4.x, converted by
    `tl_checkpoint.bridge_state_dict`), an `Transformer`, a state dict in TransformerLens
    names, a path (a checkpoint with `config.json` beside it or given as `model_config`, the
    weights stage's `heads.safetensors`, or a folder holding either), or a `Weights`.
    `model_config` (state dicts and paths): HookedTransformerConfig fields (a dict, a config.json
    path) or a `ModelConfig`; without one a state dict's sizes come from its shapes, LayerNorm
    from its keys, and positions are "standard", TransformerLens's default (as for a weights
    file without a config: `weights.positions_of`). `device`: where the analysis runs; default
    the model's (its parameters', a state dict's tensors'; a file's: the CPU)."""
    if isinstance(model, Weights):
        _no_config(model_config, "Weights")
        loaded = model
    elif _is_instance_of(model, "TransformerBridge"):
        loaded = _from_bridge(model, model_config)
    elif _is_instance_of(model, "HookedTransformer") or isinstance(model, Transformer):
        _no_config(model_config, type(model).__name__)
        cfg = model.cfg if isinstance(model, Transformer) else model.cfg.to_dict()
        source = type(model).__name__
        loaded = _from_state(model.state_dict(), cfg, source, _device_of(model.parameters()))
    elif isinstance(model, (str, Path)):
        loaded = _from_path(Path(model), model_config)
    elif isinstance(model, Mapping):
        if not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in model.items()):
            raise UserError("state dict", "must map names (TransformerLens's) to tensors")
        loaded = _from_state(model, model_config, "state dict", _device_of(model.values()))
    else:
        raise UserError("model", f"expected {MODEL_KINDS}", type(model).__name__)
    if device is None:
        return loaded
    return replace(loaded, device=resolve_device(device, "device"))  # the stages' check of a device


def _no_config(model_config: Any, what: str) -> None:
    if model_config is not None:
        article = "an" if what[:1] in "AEIOU" else "a"  # an Transformer, a Weights
        raise UserError("model_config", f"{article} {what} carries its own config: leave model_config out")


def _from_bridge(bridge: Any, model_config: Any) -> Weights:
    """A TransformerBridge (TransformerLens 4.x) as a HookedTransformer-named state dict and
    config (`tl_checkpoint.bridge_state_dict`, which reads the bridge without importing TransformerLens)."""
    _no_config(model_config, "TransformerBridge")
    state, config = tl_checkpoint.bridge_state_dict(bridge)
    return _from_state(state, config, "TransformerBridge", _device_of(bridge.parameters()))


def _model_config(model_config: Any, state: Mapping[str, Tensor], source: str) -> ModelConfig:
    """The ModelConfig of a state dict: `model_config` (module `weights_of`), or from its shapes."""
    if isinstance(model_config, ModelConfig):
        return model_config
    if isinstance(model_config, (str, Path)):
        return tl_checkpoint.read_tl_config(model_config)
    if model_config is not None and not isinstance(model_config, Mapping):
        problem = "expected HookedTransformerConfig fields (a dict or a config.json path) or a ModelConfig"
        raise UserError("model_config", problem, type(model_config).__name__)
    given = dict(model_config or {})
    if all(name in given for name in ("n_layers", "d_model", "n_heads", "d_head", "n_ctx", "d_vocab")):
        return tl_checkpoint.from_tl_config(given, "model_config")
    norm = any(re.match(r"blocks\.\d+\.ln1\.w$", k) for k in state)
    fields_ = {"normalization_type": "LN" if norm else None, "positional_embedding_type": "standard"}
    with_sizes = tl_checkpoint.inferred_config(state, {**fields_, **given})
    return tl_checkpoint.from_tl_config(with_sizes, f"the shapes in the {source}")


def _from_state(state: Mapping[str, Tensor], model_config: Any, source: str, device: torch.device) -> Weights:
    """Checked as the weights stage checks a checkpoint (`tl_checkpoint.check_state`, against our
    model's names and shapes), then folded as it folds one (`weights.prepare`)."""
    if tl_checkpoint.is_bridge_state(state):  # a TransformerBridge's state dict: its names renamed
        if model_config is None:  # [n_heads * d_head, d_model] cannot say n_heads
            raise UserError(source, "a TransformerBridge state dict needs its model_config (n_heads)")
        cfg = _model_config(model_config, state, source)
        state = tl_checkpoint.from_bridge_state(state, cfg, "model_config")
    else:
        cfg = _model_config(model_config, state, source)
    with torch.device("meta"):  # only the expected names and shapes: allocates nothing
        expected = Transformer(cfg).state_dict()
    cpu = {k: v.detach().to("cpu") for k, v in state.items()}
    return _prepared(cfg, tl_checkpoint.check_state(cpu, expected, source, "its config"), source, device)


def _prepared(cfg: ModelConfig, state: Mapping[str, Tensor], source: str, device: torch.device) -> Weights:
    hw, steps = weights.prepare(state, cfg, source=source)
    return Weights(hw, cfg.positional_embedding_type, cfg, state, device, source, tuple(steps))


def _from_path(path: Path, model_config: Any) -> Weights:
    """A file as the stages read it: a checkpoint and its config.json as the weights stage
    (`tl_checkpoint.read_checkpoint`), analysis-ready weights as the composition stage
    (`weights.load`, `weights.positions_of`)."""
    if path.is_dir():
        inside = [
            path / name for name in ("heads.safetensors", "model.safetensors") if (path / name).is_file()
        ]
        if not inside:
            raise UserError(str(path), "holds neither heads.safetensors nor model.safetensors")
        path = inside[0]
    if model_config is None and (path.parent / "config.json").is_file():
        model_config = path.parent / "config.json"
    cpu = torch.device("cpu")
    if model_config is None:  # analysis-ready (or a checkpoint without LayerNorm, read as it is)
        hw, metadata = weights.load(path)
        return Weights(hw, weights.positions_of(metadata, str(path)), None, None, cpu, str(path))
    if isinstance(model_config, (str, Path)):
        cfg, state = tl_checkpoint.read_checkpoint(path, model_config)
        return _prepared(cfg, state, str(path), cpu)
    return _from_state(checkpoint.load_state(path)[0], model_config, str(path), cpu)


# --- settings ------------------------------------------------------------------------------

S = TypeVar("S", bound=Section)


def _settings(kind: type[S], key: str, config: Any, overrides: Mapping[str, Any]) -> S:
    """`analysis.<key>` from `config` (that section, the AnalysisConfig or whole Config holding it,
    or None: the project's defaults), with `overrides` (its field names) applied, then checked."""
    if isinstance(config, Config):
        config = config.analysis
    if isinstance(config, AnalysisConfig):
        config = getattr(config, key)
    if config is None:
        config = kind()
    if not isinstance(config, kind):
        problem = f"expected a {kind.__name__}, an AnalysisConfig or a Config"
        raise UserError("config", problem, type(config).__name__)
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise UserError(
            f"analysis.{key}.{unknown[0]}", f"unknown setting (one of {', '.join(sorted(names))})"
        )
    # merged as params.yaml is (its types, then its values); a numpy scalar as the number it holds
    plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in overrides.items()}
    return params.merged(config, plain, f"analysis.{key}")


def _seed(seed: Any) -> int:
    """`seed` checked as params.yaml's `seeds` are (an integer, >= 0), naming the argument."""
    try:
        params.merged(Config, {"seeds": [seed.item() if isinstance(seed, np.generic) else seed]})
    except UserError as e:
        raise UserError("seed", e.problem, seed) from None
    return int(seed)


# --- composition ---------------------------------------------------------------------------


def composition(
    model: Any,
    seed: int = 0,
    config: CompositionConfig | AnalysisConfig | Config | None = None,
    device: str | torch.device | None = None,
    **settings: Any,
) -> Composition:
    """Every (earlier, later) head pair's Q-, K- and V-composition under every measure (the five
    variants, scores; the basis-invariant measure, invariant), each with its raw z and calibrated
    discovery; the placebo pairs (pairs that cannot compose), the channel tables and the summary:
    the composition stage's files for `seed` (`circuits.analysis.composition`). `settings`:
    `baseline_samples`, `null_samples`, `fdr`, `channel_tolerance` (`CompositionConfig`)."""
    seed = _seed(seed)
    cfg = _settings(CompositionConfig, "composition", config, settings)
    w = weights_of(model, device=device)
    return analysis.composition(w.heads, cfg, seed, w.positions, str(w.device))


# --- heads: roles and the path ablation on given tokens -------------------------------------


def _token_batches(tokens: Any, name: str, cfg: ModelConfig, width: int | None = None) -> list[Tensor]:
    """`tokens` ([batch, pos] ids, torch or numpy, or a list of such batches) as CPU int64 tensors,
    each checked against the model: ids in its vocabulary, at most n_ctx positions."""
    batches = isinstance(tokens, (list, tuple)) and all(isinstance(t, (Tensor, np.ndarray)) for t in tokens)
    items = list(tokens) if batches else [tokens]  # a nested list of ids is one batch
    if not items:
        raise UserError(name, "no batches")
    out = []
    for i, item in enumerate(items):
        where = name if len(items) == 1 else f"{name}[{i}]"
        t = torch.as_tensor(np.asarray(item.cpu() if isinstance(item, Tensor) else item))
        if t.ndim == 1:
            t = t[None]  # one sequence
        if t.ndim != 2 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise UserError(where, "expected integer token ids [batch, pos]", f"{t.dtype} {list(t.shape)}")
        if not 2 <= t.shape[1] <= cfg.n_ctx:
            raise UserError(where, f"{t.shape[1]} positions: expected 2 to n_ctx = {cfg.n_ctx}")
        if width is not None and t.shape[1] != width:
            raise UserError(where, f"{t.shape[1]} positions: the probe is [first, span, span], {width}")
        if t.numel() and not (0 <= int(t.min()) and int(t.max()) < cfg.d_vocab):
            problem = f"token ids must be in [0, d_vocab = {cfg.d_vocab})"
            raise UserError(where, problem, f"{int(t.min())}..{int(t.max())}")
        out.append(t.to(torch.int64))
    return out


def _batches(
    w: Weights, tokens: Any, probe: Any, h: HeadsConfig, seed: int
) -> tuple[list[Tensor], list[Tensor]]:
    """(probes, held-out batches), batch b of each a pair, as the heads stage's `evaluation_batches`.
    Without `probe`, probe b is [first, span, span] of spans of the given tokens (the stage's rule for
    text: `datasets.repeated_heldout_spans`), drawn from run `seed`'s probe stream, batch b."""
    assert w.config is not None
    heads_analysis.require_lengths_fit(w.config.n_ctx, h)
    heldout = _token_batches(tokens, "tokens", w.config)
    if probe is None:
        stream = torch.cat([t.reshape(-1) for t in heldout]).numpy()  # the held-out text, end to end
        draws = [
            torch.Generator().manual_seed(streams.seed_of(seed, "probe", b)) for b in range(len(heldout))
        ]
        probes = [
            datasets.repeated_heldout_spans(stream, len(t), h.repeat_length, gen)
            for t, gen in zip(heldout, draws, strict=True)
        ]
    else:
        probes = _token_batches(probe, "probe", w.config, width=1 + 2 * h.repeat_length)
    if len(probes) != len(heldout):
        raise UserError("probe", f"{len(probes)} batches for {len(heldout)} batches of tokens")
    return probes, heldout


def _runnable(model: Any, device: Any, what: str) -> tuple[Weights, Transformer]:
    """The model's weights and our model built from its checked checkpoint, in float64 (as the
    heads stage's `load_model`), on the analysis's device."""
    w = weights_of(model, device=device)
    if w.state is None or w.config is None:
        problem = f"{what} needs the model's checkpoint and config.json, not analysis-ready weights"
        raise UserError(w.source, problem)
    built = tl_checkpoint.build_model(w.config, w.state, dtype=torch.float64).to(w.device).eval()
    return w, built


def _scores(w: Weights, given: Composition | None, seed: int, config: Any) -> Composition:
    """The composition a roles table reads (qk_positivity's sources): `given`, or computed."""
    if given is not None:
        return given
    whole = config if isinstance(config, (AnalysisConfig, Config)) else None  # else a HeadsConfig
    cfg = _settings(CompositionConfig, "composition", whole, {})
    return analysis.composition(w.heads, cfg, seed, w.positions, str(w.device))


def _heads_inputs(
    model: Any, tokens: Any, seed: int, probe: Any, config: Any, device: Any, settings: dict, what: str
) -> tuple[HeadsConfig, Weights, Transformer, list[Tensor], list[Tensor]]:
    """What `heads`, `roles` and `path_ablation` each start from: the heads settings, the weights,
    our model built from them, and the (probe, held-out) batches."""
    _seed(seed)
    h = _settings(HeadsConfig, "heads", config, settings)
    w, built = _runnable(model, device, what)
    probes, heldout = _batches(w, tokens, probe, h, seed)
    return h, w, built, probes, heldout


def heads(
    model: Any,
    tokens: Any,
    seed: int = 0,
    probe: Any = None,
    composition: Composition | None = None,
    config: HeadsConfig | AnalysisConfig | Config | None = None,
    device: str | torch.device | None = None,
    **settings: Any,
) -> Heads:
    """The heads stage on `tokens` (held-out text: [batch, pos] ids, or a list of disjoint batches,
    one path ablation per batch): every head's scores and roles, the path ablation of every pair
    (its mean and every batch), the role ablation and the agreement of every composition measure
    with the ablation (`behaviour.heads.analyse_batches`, `summarize`). `probe`: the repeated
    probes [first, span, span], one per batch (default: spans of `tokens`, run `seed`'s probe
    stream); `composition`: this model's (`composition`; computed with `seed` if not given);
    `seed`: the probe and the role ablation's placebo sets. `settings`: `HeadsConfig` fields."""
    h, w, built, probes, heldout = _heads_inputs(
        model, tokens, seed, probe, config, device, settings, "heads"
    )
    found = _scores(w, composition, seed, config)
    result = heads_analysis.analyse_batches(
        built, w.heads, probes, heldout, h, found.scores, (w.source, w.source), seed, str(w.device)
    )
    measured = join_measures(found.scores, {INVARIANT: found.invariant, PROJECTION: found.projection})
    summary = heads_analysis.summarize(result, measured, h.min_effect)
    return Heads(result.table, result.ablation, result.batches, result.example, summary)


def roles(
    model: Any,
    tokens: Any,
    seed: int = 0,
    probe: Any = None,
    composition: Composition | None = None,
    config: HeadsConfig | AnalysisConfig | Config | None = None,
    device: str | torch.device | None = None,
    **settings: Any,
) -> pd.DataFrame:
    """heads.csv alone (no ablation): every head's attention scores on the first batch of `tokens`
    and its probe, its copying and QK positivity from the weights, its roles
    (`behaviour.heads.head_table`). Arguments as `heads`'."""
    h, w, built, probes, heldout = _heads_inputs(
        model, tokens, seed, probe, config, device, settings, "roles"
    )
    found = _scores(w, composition, seed, config)
    first = (probes[0].to(w.device), heldout[0].to(w.device))
    return heads_analysis.head_table(built, w.heads, *first, h, found.scores, (w.source, w.source))[0]


def path_ablation(
    model: Any,
    tokens: Any,
    seed: int = 0,
    probe: Any = None,
    config: HeadsConfig | AnalysisConfig | Config | None = None,
    device: str | torch.device | None = None,
    every_batch: bool = False,
    **settings: Any,
) -> pd.DataFrame:
    """ablation.csv alone: every (earlier, later) head pair's path ablation, each effect's mean over
    the batches of `tokens` (`every_batch`: ablation_batches.csv, every batch;
    `behaviour.heads.ablation_tables`). Arguments as `heads`'."""
    h, w, built, probes, heldout = _heads_inputs(
        model, tokens, seed, probe, config, device, settings, "path_ablation"
    )
    on = [t.to(w.device) for t in probes], [t.to(w.device) for t in heldout]
    effects, batches = heads_analysis.ablation_tables(built, *on, h, w.source)
    return batches if every_batch else effects
