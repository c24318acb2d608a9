"""Classify every head by where it attends and what it copies.

Two seeded evaluation batches of `analysis.heads.eval_sequences` sequences each:

- the repeated probe `[first, span, span]` (`repeat_length`-token spans of held-out data,
  or of uniformly random tokens for the synthetic source: `pipeline.data.datasets.repeated_probe`):
  the `induction` score, and the causal path ablation (`pipeline.behaviour.ablation`);
- held-out data (the evaluation split the train stage never trained on): where heads
  attend on the model's own distribution, `prev_token`, `current_token`, `first_token`,
  `recent_mass` and `duplicate_token` (definitions in `pipeline.model.patterns`), and the path
  ablation's loss effect and role-free pattern effect on natural text.

Two scores read from the analysis-ready weights (`pipeline.circuits.weights.HeadWeights`):

- `copying` = sum(lambda) / sum(|lambda|) over the eigenvalues of the head's OV circuit in
  token space, W_E W_V W_O W_U [d_vocab, d_vocab] (row vectors: token t's embedding, through
  the head, onto the logits). 1: every eigenvalue positive (the head raises the logit of the
  token it attends to); -1: all negative. Its non-zero eigenvalues are those of the cyclic
  rotation W_O W_U W_E W_V [d_head, d_head] (`strands.eigenvalues`). NaN if all are zero.
- `qk_positivity` (heads in layer >= 1): the paper's induction check. With a the earlier
  head that K-composes most with b (true score, from the composition stage's scores.csv),
  the QK term in token space
  W_E W_Q^b W_K^bT (W_V^a W_O^a)^T W_E^T [d_vocab, d_vocab]: entry (t, s) is how much a query
  holding token t attends to a key to which head a moved token s. Summarised the same way,
  sum(lambda) / sum(|lambda|): 1 for an induction head reading a previous-token head
  (query token t seeks keys whose previous token is t). NaN for layer 0.

Roles: a head takes each role whose score reaches its threshold
(`analysis.heads.thresholds`; flags `is_<role>`). Its primary `role` is previous_token or
induction if it takes one (in that order: `FIRST`), else the role it takes with the
highest score, else "other".
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import memory, streams
from ..circuits import strands
from ..circuits.weights import HeadWeights, power_of_two_scaled
from ..config import DataConfig, HeadsConfig, ModelConfig, RoleThresholds
from ..data import datasets
from ..errors import UserError
from ..model import patterns, tl_checkpoint, transformer
from ..model.transformer import Transformer
from ..tables import ABLATED_ROLES, ABLATION_COLUMNS, PATTERN_SCORES, ROLE_EFFECTS, ROLES, SERVES_LEVEL
from . import ablation, agreement

# The primary role. Some scores nest: a previous-token head also fills the recent window,
# and an induction head attends to the first token where nothing matches (measured on the
# other batch, so the two scores do not compete). Those two roles come first, in this
# order; among the other roles a head takes, the one with the highest score wins (all are
# fractions of attention mass), so a duplicate-token head in repetitive text, which also
# puts mass in the recent window, stays a duplicate-token head.
FIRST = ("previous_token", "induction")
ROLE_SCORE = {
    "previous_token": "prev_token",
    "recent_window": "recent_mass",
    "induction": "induction",
    "duplicate_token": "duplicate_token",
    "current_token": "current_token",
    "first_token": "first_token",
}
# attention scores (finite for any model: tables.PATTERN_SCORES), then the two read from the weights
SCORES = (*PATTERN_SCORES, "copying", "qk_positivity")
FLAGS = tuple(f"is_{role}" for role in ROLE_SCORE)
COLUMNS = ["layer", "head", "role", *SCORES, *FLAGS]
NOT_FINITE = "attention patterns or losses are not finite on the evaluation batches: weights too large"


@dataclass
class HeadsResult:
    table: pd.DataFrame  # heads.csv: COLUMNS, one row per head
    ablation: pd.DataFrame  # ablation.csv: tables.ABLATION_COLUMNS, each effect's mean over the batches
    # one probe sequence: tokens [pos], pattern [layer, head, query_pos, key_pos]
    example: dict[str, Tensor]
    batches: pd.DataFrame  # ablation_batches.csv: "batch" + tables.ABLATION_COLUMNS, every batch
    role_ablation: dict  # summary.json: the loss change when a role's heads are ablated (`role_ablation`)


# --- scores ------------------------------------------------------------------------


def _positivity(eigenvalues: Tensor) -> Tensor:
    """sum(lambda) / sum(|lambda|) over the last dim (complex eigenvalues); NaN when all are zero."""
    total = eigenvalues.sum(-1).real  # complex ones come in conjugate pairs: the sum is real
    size = eigenvalues.abs().sum(-1)
    return torch.where(size > 0, total / size, torch.nan)


def copying(hw: HeadWeights) -> Tensor:
    """[layer, head]: positivity of the eigenvalues of W_E W_V W_O W_U (module doc)."""
    hw = power_of_two_scaled(hw)  # exact: eigenvalue signs and ratios unchanged, nothing overflows
    OV_tokens = strands.Strand((hw.W_E, hw.W_V, hw.W_O, hw.W_U))  # [L, H] x [d_vocab, d_vocab]
    return _positivity(strands.eigenvalues(OV_tokens))


def best_sources(scores: pd.DataFrame, kind: str = "K") -> dict[tuple[int, int], tuple[int, int]]:
    """{(layer, head) of a later head: (layer, head) of the earlier head with the largest true
    `kind` score into it}, from the composition stage's scores.csv (undefined scores skipped)."""
    rows = scores[(scores["kind"] == kind) & (scores["variant"] == "true")].dropna(subset=["score"])
    rows = rows.sort_values(["dst_layer", "dst_head", "src_layer", "src_head"], kind="stable")
    best = rows.loc[rows.groupby(["dst_layer", "dst_head"], sort=True)["score"].idxmax()]
    return {
        (int(r.dst_layer), int(r.dst_head)): (int(r.src_layer), int(r.src_head)) for r in best.itertuples()
    }


def qk_positivity(hw: HeadWeights, sources: dict[tuple[int, int], tuple[int, int]]) -> Tensor:
    """[layer, head] positivity of the K-composition QK term in token space of each later head
    with its source (`best_sources`; module doc). NaN for layer 0 and heads without a source."""
    hw = power_of_two_scaled(hw)  # exact: eigenvalue signs and ratios unchanged, nothing overflows
    out = torch.full((hw.n_layers, hw.n_heads), torch.nan, dtype=hw.W_Q.dtype)
    for (j, b), (i, a) in sources.items():
        term = strands.Strand(
            (hw.W_E, hw.W_Q[j, b], hw.W_K[j, b].mT, hw.W_O[i, a].mT, hw.W_V[i, a].mT, hw.W_E.mT)
        )  # [d_vocab, d_vocab]: query token x token head a moved into the key
        out[j, b] = _positivity(strands.eigenvalues(term))
    return out


def pattern_scores(
    model: Transformer, repeated: Tensor, heldout: Tensor, length: int, k: int
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each attention score [layer, head] (induction on `repeated`, the rest on `heldout`),
    and the first repeated sequence with its patterns (tokens [pos], pattern [layer, head, q, k])."""
    _, rep = model.run_with_cache(repeated)
    _, held = model.run_with_cache(heldout)
    scores: dict[str, list[Tensor]] = {name: [] for name in PATTERN_SCORES}
    for p_rep, p_held in zip(rep.pattern, held.pattern, strict=True):  # [batch, head, query_pos, key_pos]
        scores["prev_token"].append(patterns.prev_token(p_held))
        scores["current_token"].append(patterns.current_token(p_held))
        scores["first_token"].append(patterns.first_token(p_held))
        scores["recent_mass"].append(patterns.recent_mass(p_held, k))
        scores["duplicate_token"].append(patterns.duplicate_token(p_held, heldout))
        scores["induction"].append(patterns.induction(p_rep, length))
    example = {
        "tokens": repeated[0].cpu().clone(),
        "pattern": torch.stack([p[0] for p in rep.pattern]).cpu().contiguous(),
    }
    return {name: torch.stack(v).cpu() for name, v in scores.items()}, example


def classify(table: pd.DataFrame, thresholds: RoleThresholds) -> pd.DataFrame:
    """`table` with `role` and the `is_<role>` flags set from its scores (NaN takes no role)."""
    table = table.copy()
    taken = pd.DataFrame(index=table.index)  # [head, role]: the role's score where taken, else NaN
    for name, score in ROLE_SCORE.items():
        flag = table[score].ge(getattr(thresholds, name)).fillna(False).astype(bool)
        table[f"is_{name}"] = flag
        taken[name] = table[score].where(flag)
    rest = taken.drop(columns=list(FIRST))
    role = rest.fillna(-1.0).idxmax(axis=1).where(rest.notna().any(axis=1), "other")  # ties: ROLES order
    for name in reversed(FIRST):
        role = role.mask(taken[name].notna(), name)
    table["role"] = role
    return table[COLUMNS]


def require_lengths_fit(n_ctx: int, cfg: HeadsConfig) -> None:
    """The probe and the recent window fit in the model's context: the checkpoint's n_ctx
    (config.json), not necessarily params.yaml's model.n_ctx."""
    cfg.require_fits(n_ctx, "the model's n_ctx")


def require_shape_fits(shape: ModelConfig, cfg: HeadsConfig, data_config: DataConfig, source: str) -> None:
    """Refuse, naming the key, a checkpoint of shape `shape` (its config.json, `source`) that the
    analysis cannot run on: the probe or the recent window longer than its context, or the
    analysis's buffers (`memory_estimate`) larger than the memory available. Called with the
    shape alone, before the checkpoint is read whole or the data is loaded."""
    require_lengths_fit(shape.n_ctx, cfg)
    estimate = memory_estimate(shape, cfg, data_config, source)
    memory.require_fits(estimate, memory.available_bytes())


def memory_estimate(model: ModelConfig, h: HeadsConfig, data: DataConfig, source: str) -> memory.Estimate:
    """The heads analysis on a checkpoint of shape `model` (its config.json, `source`), on the
    CPU in float64, from each allocating module's terms:

    - every parameter 3 x 8 bytes: the model and the head weights in float64, and the copy
      power_of_two_scaled makes (the checkpoint's float32 tensors are freed by then);
    - the largest of: `pattern_scores` (the caches of the probe [eval_sequences,
      1 + 2 repeat_length] and of the held-out batch [eval_sequences, n_ctx], both kept, and
      what computing either needs beside them) and the path ablation of either batch;
    - the synthetic data generated up front.
    """
    s, F64 = memory.Shape(model, source), memory.FLOAT64
    E = memory.size("analysis.heads.eval_sequences", h.eval_sequences)
    probe = memory.Batch(
        E,
        memory.size("analysis.heads.repeat_length", h.repeat_length),
        1 + 2 * h.repeat_length,
        "the probe",
        ("eval_sequences", "1 + 2 repeat_length"),
    )
    held = memory.Batch(
        memory.Size(E.key, datasets.eval_count(data, h.eval_sequences), E.reference),
        s.n_ctx,
        model.n_ctx,
        "the held-out batch",
        ("eval_sequences", "n_ctx"),
    )
    scores = [
        *transformer.cache_terms(s, probe, F64),
        *transformer.cache_terms(s, held, F64),
        *memory.larger(transformer.forward_terms(s, probe, F64), transformer.forward_terms(s, held, F64)),
    ]
    terms = [
        *transformer.weight_terms(s, 3 * F64, "the model and the head weights in float64, and a copy"),
        *memory.larger(scores, ablation.path_ablation_terms(s, probe), ablation.path_ablation_terms(s, held)),
        *datasets.synthetic_terms(s, data),
    ]
    return memory.Estimate("the model, its weights and the largest analysis buffers", tuple(terms))


def load_model(
    model_path: str | Path, config_path: str | Path, cfg: HeadsConfig, data_config: DataConfig
) -> Transformer:
    """The checkpoint as the analysis runs it (float64), once its shape from config.json is known to
    fit (`require_shape_fits`: nothing large is read or allocated before)."""
    shape = tl_checkpoint.read_tl_config(config_path)
    require_shape_fits(shape, cfg, data_config, str(config_path))
    return tl_checkpoint.load_model(model_path, config_path, dtype=torch.float64)


@torch.no_grad()
def analyse(
    model: Transformer,
    hw: HeadWeights,
    dataset: datasets.Dataset,
    cfg: HeadsConfig,
    seed: int,
    scores: pd.DataFrame,
    sources: tuple[str, str] = ("model", "weights"),
    device: str | None = None,
) -> HeadsResult:
    """Scores, roles and the path ablation of every head: `cfg.ablation_batches` probes (batches
    0, 1, ... of run `seed`'s probe stream), and as many disjoint batches of the held-out windows of
    `dataset` (loaded with that many times `eval_sequences`); `scores` is the composition stage's
    scores.csv, `sources` name the model and the weights in errors."""
    require_lengths_fit(model.cfg.n_ctx, cfg)
    probes, heldout = evaluation_batches(dataset, cfg, model.cfg.d_vocab, seed)
    return analyse_batches(model, hw, probes, heldout, cfg, scores, sources, seed, device)


def evaluation_batches(
    dataset: datasets.Dataset, cfg: HeadsConfig, d_vocab: int, seed: int
) -> tuple[list[Tensor], list[Tensor]]:
    """`analyse`'s batches: (probes, held-out batches), batch b of each a pair; the same for the
    same arguments (the channel check reads them again: `pipeline.behaviour.channel_check`)."""
    n = cfg.eval_sequences
    # as many batches as the held-out windows give (all of them when loaded with ablation_batches x n)
    heldout = [
        dataset.eval[b * n : (b + 1) * n] for b in range(cfg.ablation_batches) if len(dataset.eval) > b * n
    ]
    probes = [
        datasets.repeated_probe(dataset, n, cfg.repeat_length, d_vocab, seed, batch=b)
        for b in range(len(heldout))
    ]
    return probes, heldout


@torch.no_grad()
def analyse_batches(
    model: Transformer,
    hw: HeadWeights,
    repeated: Tensor | Sequence[Tensor],
    heldout: Tensor | Sequence[Tensor],
    cfg: HeadsConfig,
    scores: pd.DataFrame,
    sources: tuple[str, str] = ("model", "weights"),
    seed: int = 0,
    device: str | None = None,
) -> HeadsResult:
    """`analyse` on given batches: `repeated` [batch, 1 + 2 repeat_length], `heldout` [batch, pos],
    or lists of them: the head scores read the first of each, the path ablation every pair of
    them (probe b with held-out batch b), so that its noise can be measured. `seed`: the run's,
    whose "placebo_sets" stream draws the role ablation's placebo sets. `device`
    (`analysis.device`): where the forward passes run (the model is moved there); the results
    come back to the CPU."""
    repeated = [x.to(device) for x in ([repeated] if isinstance(repeated, Tensor) else repeated)]
    heldout = [x.to(device) for x in ([heldout] if isinstance(heldout, Tensor) else heldout)]
    model = model.to(device)  # in place; a no-op on the CPU
    if len(repeated) != len(heldout):
        raise ValueError(f"{len(repeated)} probe batches but {len(heldout)} held-out ones")
    table, example = head_table(model, hw, repeated[0], heldout[0], cfg, scores, sources)
    effects, batches = ablation_tables(model, repeated, heldout, cfg, sources[0])
    ablated = role_ablation(model, table, repeated, heldout, cfg, seed)
    return HeadsResult(table, effects, example, batches, ablated)


@torch.no_grad()
def head_table(
    model: Transformer,
    hw: HeadWeights,
    repeated: Tensor,
    heldout: Tensor,
    cfg: HeadsConfig,
    scores: pd.DataFrame,
    sources: tuple[str, str] = ("model", "weights"),
) -> tuple[pd.DataFrame, dict[str, Tensor]]:
    """heads.csv (`COLUMNS`: every head's scores and roles) from one probe batch `repeated` and one
    held-out batch `heldout` on the model's device, and the first probe sequence with its patterns;
    `scores`: the composition stage's scores.csv (qk_positivity's sources)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if (L, H) != (hw.n_layers, hw.n_heads):
        problem = (
            f"has {hw.n_layers} layers x {hw.n_heads} heads, but {sources[0]} has {L} layers x {H} heads"
        )
        raise UserError(sources[1], problem)
    values, example = pattern_scores(model, repeated, heldout, cfg.repeat_length, cfg.window_length)
    values["copying"] = copying(hw)
    values["qk_positivity"] = qk_positivity(hw, best_sources(scores))
    layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
    for name in SCORES:
        table[name] = values[name].to(torch.float64).reshape(-1).numpy()
    # finite weights can still overflow a forward pass; a NaN here would silently take no role
    patterned = table[["prev_token", "current_token", "first_token", "recent_mass", "induction"]]
    if not np.isfinite(patterned.to_numpy()).all():
        raise UserError(sources[0], NOT_FINITE)
    return classify(table, cfg.thresholds), example


@torch.no_grad()
def ablation_tables(
    model: Transformer,
    repeated: Sequence[Tensor],
    heldout: Sequence[Tensor],
    cfg: HeadsConfig,
    source: str = "model",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The path ablation of every (earlier, later) head pair on each pair of batches (probe b,
    held-out batch b; `pipeline.behaviour.ablation`): (ablation.csv, each effect's mean over the
    batches; ablation_batches.csv, every batch). Batches on the model's device."""
    per_batch = []
    for b, (probe, text) in enumerate(zip(repeated, heldout, strict=True)):
        on_probe = ablation.path_ablation(model, probe, cfg.repeat_length)
        on_text = ablation.path_ablation(model, text, None)  # same rows, same order
        per_batch.append(
            on_probe.assign(
                heldout_loss_effect=on_text["loss_effect"].to_numpy(),
                pattern_effect=on_text["pattern_effect"].to_numpy(),  # the role-free effect: held-out text
                batch=b,
            )
        )
    batches = pd.concat(per_batch, ignore_index=True)[["batch", *ABLATION_COLUMNS]]
    pair = list(ABLATION_COLUMNS[:5])
    effects = batches.groupby(pair, sort=False)[list(ABLATION_COLUMNS[5:])].mean().reset_index()
    measured = effects[["attn_effect", "loss_effect", "heldout_loss_effect", "pattern_effect"]]
    if not np.isfinite(measured.to_numpy()).all():  # as head_table's: a NaN would take no edge
        raise UserError(source, NOT_FINITE)
    return effects, batches


def role_ablation(
    model: Transformer,
    table: pd.DataFrame,
    repeated: Sequence[Tensor],
    heldout: Sequence[Tensor],
    cfg: HeadsConfig,
    seed: int,
) -> dict:
    """Whether the circuit serves natural text: per role of `ABLATED_ROLES`, the loss change when
    all its heads are mean-ablated at once (`ablation.heads_loss_effects`), on each held-out batch
    and each probe, and the means. Positive on held-out text: the heads lower the model's loss on
    text it never trained on. No heads of the role: the effects are null.

    Ablating almost any set of trained heads raises the loss, so the sign says nothing by itself
    (docs/training.md measures it). The role's held-out effect is ranked among those of placebo
    sets (`_placebo_sets`): as many heads of each layer as the role has there, drawn from all of
    that layer's heads. The null is that the role's heads are any heads of their layers; under it
    the role's set and the others are exchangeable, so ranking it among every such set is an
    exact permutation test, in both directions: `placebo_p` = (1 + sets at or above the role) /
    (1 + sets), `placebo_p_lower` = (1 + sets at or below) / (1 + sets) (does the role matter
    more, or less, than other heads?). Every set is enumerated when there are at most
    `cfg.placebo_sets` others (`placebo_exact`), else that many are drawn uniformly.
    `serves_heldout`: the effect reaches `cfg.min_effect` and `placebo_p` <= SERVES_LEVEL, which
    a layer of few heads cannot reach: one head of 8 has p >= 1/8. Null when the role holds every
    head of its layers.
    """
    rng = np.random.default_rng(streams.seed_of(seed, "placebo_sets"))
    out = {}
    for role, first_layer in ABLATED_ROLES.items():
        rows = table[(table["role"] == role) & (table["layer"] >= first_layer)]
        heads = list(zip(rows["layer"].tolist(), rows["head"].tolist(), strict=True))
        sets, exact = _placebo_sets(heads, model.cfg.n_heads, cfg.placebo_sets, rng)
        effects: dict[str, list[float]] = {effect: [] for effect in ROLE_EFFECTS}
        placebo: list[list[float]] = []  # per held-out batch, each set's effect
        for probe, text in zip(repeated, heldout, strict=True) if heads else ():
            mine, *theirs = ablation.heads_loss_effects(model, text, [heads, *(sets or [])])
            effects["heldout_loss_effect"].append(mine)
            placebo.append(theirs)
            effects["probe_loss_effect"].append(ablation.heads_loss_effect(model, probe, heads))
        out[role] = {
            "heads": [f"{l}.{h}" for l, h in heads],
            **{k: _finite(float(np.mean(v))) if v else None for k, v in effects.items()},
            "batches": effects,
            **_placebo(sets, placebo, effects, cfg, exact),
        }
    return out


def _placebo_sets(
    heads: list[tuple[int, int]], n_heads: int, n: int, rng: np.random.Generator
) -> tuple[list[list[tuple[int, int]]] | None, bool]:
    """(sets, exact): the sets a role's effect is ranked among (`role_ablation`), as many heads of
    each layer as `heads` has there, from all `n_heads` heads of that layer. Every such set but the
    role's own when there are at most `n` of them (exact: the permutation test), else `n` distinct
    sets other than the role's drawn uniformly without replacement; each sorted. (None, False)
    when there are no heads, or no other set."""
    if not heads:
        return None, False
    per_layer = sorted(Counter(layer for layer, _ in heads).items())  # [(layer, heads there)]
    mine = sorted(heads)
    if math.prod(math.comb(n_heads, k) for _, k in per_layer) - 1 > n:
        drawn: dict[tuple, None] = {}
        while len(drawn) < n:  # rejection: at least 2 sets exist per draw kept, so this ends
            s = sorted((l, int(h)) for l, k in per_layer for h in rng.choice(n_heads, k, replace=False))
            if s != mine:
                drawn.setdefault(tuple(s))
        return [list(s) for s in drawn], False
    choices = [  # per layer, every choice of its k heads
        [[(layer, h) for h in hs] for hs in itertools.combinations(range(n_heads), k)]
        for layer, k in per_layer
    ]
    every = [sorted(itertools.chain(*parts)) for parts in itertools.product(*choices)]
    others = [s for s in every if s != mine]
    return (others, True) if others else (None, False)


def _placebo(
    sets: list[list[tuple[int, int]]] | None,
    placebo: list[list[float]],
    effects: dict[str, list[float]],
    cfg: HeadsConfig,
    exact: bool,
) -> dict:
    """The role's held-out effect against the sets' (`role_ablation`); `placebo`: per batch, each
    set's effect; `exact`: the sets are every other set."""
    if sets is None:
        return {
            "placebo_sets": None,
            "placebo_exact": None,
            "placebo_heldout_loss_effects": None,
            "placebo_p": None,
            "placebo_p_lower": None,
            "serves_heldout": None,
        }
    theirs = [float(np.mean([batch[i] for batch in placebo])) for i in range(len(sets))]
    mine = float(np.mean(effects["heldout_loss_effect"]))
    p = (1 + sum(x >= mine for x in theirs)) / (1 + len(theirs))
    return {
        "placebo_sets": [[f"{l}.{h}" for l, h in s] for s in sets],
        "placebo_exact": exact,
        "placebo_heldout_loss_effects": theirs,
        "placebo_p": p,
        "placebo_p_lower": (1 + sum(x <= mine for x in theirs)) / (1 + len(theirs)),
        "serves_heldout": bool(mine >= cfg.min_effect and p <= SERVES_LEVEL),
    }


# --- summary -----------------------------------------------------------------------


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def summarize(result: HeadsResult, scores: pd.DataFrame, min_effect: float) -> dict:
    """Role counts, the heads of each role, the best scores, and how well each composition
    variant predicts the ablation (`pipeline.behaviour.agreement`; `scores`: the composition stage's
    scores.csv): per effect, the Spearman correlation, the top-source matches, each score's PR-AUC
    and ROC-AUC on the causal edges and the role-only ranker's beside them (the pattern effect's
    at several thresholds too)."""
    table = result.table
    label = [f"{l}.{h}" for l, h in zip(table["layer"], table["head"], strict=True)]
    return {
        "n_heads": len(table),
        "roles": {role: int((table["role"] == role).sum()) for role in ROLES},
        "heads_by_role": {
            role: [x for x, r in zip(label, table["role"], strict=True) if r == role] for role in ROLES
        },
        "max": {name: _finite(table[name].max()) for name in SCORES},
        "min_effect": min_effect,
        "role_ablation": result.role_ablation,
        "agreement": agreement.summarize(result.ablation, scores, min_effect, result.batches, table),
    }
