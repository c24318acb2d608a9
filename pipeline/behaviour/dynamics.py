"""Composition through training: at every checkpoint train saved, the analysis the final
model gets, on the same footing.

At each checkpoint (train's checkpoints/, `pipeline.checkpoint.read_index`):

- the analysis-ready weights, exactly as the weights stage prepares them
  (`weights.prepare`), then every composition score with its baseline, raw z and
  significance, as the composition stage computes them (`significance.measured`: five
  variants and the invariant measure, calibrated against that checkpoint's own placebo
  pairs), from the same seed: at the final checkpoint the rows equal the composition stage's;
- the attention scores of every head (`heads.pattern_scores`) on the heads stage's two
  batches (the repeated probe and held-out text, drawn from the same seed), and the
  held-out loss.

The top induction <- previous-token pair is chosen once, at the last checkpoint: the
later head (layer >= 1) with the highest induction score, and the earlier head with the
highest previous-token score in a layer before it. steps.tsv follows its K-composition raw
z and BH q under every measure through training (`pipeline.behaviour.phases` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import checkpoint
from ..circuits import significance, weights
from ..config import Config
from ..data import datasets
from ..errors import UserError
from ..model import tl_checkpoint
from ..model.transformer import next_token_loss
from ..tables import (
    DYNAMICS_COLUMNS,
    DYNAMICS_HEADS_COLUMNS,
    MEASURES,
    PATTERN_SCORES,
    STEPS_COLUMNS,
    excess,
)
from . import heads, phases

PAIR_KIND = "K"  # an induction head's keys read what the previous-token head wrote


@dataclass
class DynamicsResult:
    composition: pd.DataFrame  # DYNAMICS_COLUMNS: every checkpoint, kind, measure and pair
    heads: pd.DataFrame  # DYNAMICS_HEADS_COLUMNS: every checkpoint and head
    steps: pd.DataFrame  # STEPS_COLUMNS: one row per checkpoint
    pair: dict  # the top induction <- previous-token pair: {"src": [layer, head], "dst": [...]}


def scores_at(
    hw: weights.HeadWeights, cfg: Config, seed: int, positions: str, device: str | None = None
) -> pd.DataFrame:
    """Every composition score of one set of weights: scores.csv's rows, then invariant.csv's as
    variant `invariant` (SCORES_COLUMNS), as the composition stage computes and calibrates them
    (`device`: where the products run, `analysis.device` resolved)."""
    return significance.measured(hw, cfg.analysis.composition, seed, positions, device)[0]


@torch.no_grad()
def heads_at(model, repeated: Tensor, heldout: Tensor, cfg: Config) -> tuple[pd.DataFrame, float]:
    """Every head's attention scores (layer, head, PATTERN_SCORES) and the held-out loss."""
    h = cfg.analysis.heads
    values, _ = heads.pattern_scores(model, repeated, heldout, h.repeat_length, h.window_length)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
    for name in PATTERN_SCORES:
        table[name] = values[name].to(torch.float64).reshape(-1).numpy()
    loss = next_token_loss(model(heldout), heldout).item()
    return table, loss


def top_pair(final_heads: pd.DataFrame) -> dict:
    """The best induction head of layers >= 1 and the best previous-token head before it
    (ties: the first in head order), from the last checkpoint's head scores."""
    later = final_heads[final_heads["layer"] >= 1]
    if later.empty:
        raise UserError("model.n_layers", "the dynamics stage needs at least 2 layers", 1)
    dst = later.loc[later["induction"].idxmax()]
    earlier = final_heads[final_heads["layer"] < dst["layer"]]
    src = earlier.loc[earlier["prev_token"].idxmax()]
    return {"src": [int(src["layer"]), int(src["head"])], "dst": [int(dst["layer"]), int(dst["head"])]}


def steps_table(
    comp: pd.DataFrame, head_scores: pd.DataFrame, losses: pd.DataFrame, pair: dict
) -> pd.DataFrame:
    """One row per checkpoint: held-out loss, best induction and previous-token scores (as
    train's curve.tsv: induction over layers >= 1, previous-token over layers before the
    last), and the pair's K raw z and BH q under every measure (`z_<measure>`, `q_<measure>`)."""
    L = int(head_scores["layer"].max()) + 1
    late = head_scores[head_scores["layer"] >= min(1, L - 1)]
    early = head_scores[head_scores["layer"] <= max(0, L - 2)]
    out = losses.set_index("step")
    out["induction"] = late.groupby("step")["induction"].max()
    out["prev_token"] = early.groupby("step")["prev_token"].max()
    (i, a), (j, b) = pair["src"], pair["dst"]
    rows = comp[
        (comp["kind"] == PAIR_KIND)
        & (comp["src_layer"] == i) & (comp["src_head"] == a)
        & (comp["dst_layer"] == j) & (comp["dst_head"] == b)
    ]  # fmt: skip
    for column in ("z", "q"):
        values = rows.pivot(index="step", columns="variant", values=column)
        for m in MEASURES:
            out[f"{column}_{m}"] = values[m]
    return out.reset_index()[list(STEPS_COLUMNS)]


def analyse(
    checkpoints: Sequence[dict],
    directory: str | Path,
    config_path: str | Path,
    repeated: Tensor,
    heldout: Tensor,
    cfg: Config,
    seed: int,
    progress=None,
    device: str | None = None,
) -> DynamicsResult:
    """The analysis at every checkpoint of `checkpoints` (read_index's entries, files under
    `directory`; config.json at `config_path`); `repeated` and `heldout` are the heads
    stage's batches. `progress`: wraps the checkpoint loop (a tqdm bar, or a line per
    checkpoint: `pipeline.cli.with_progress`), or None."""
    comps, head_tables, losses = [], [], []
    loop = progress(checkpoints) if progress else checkpoints
    for entry in loop:
        path = Path(directory) / entry["file"]
        model_cfg, state = tl_checkpoint.read_checkpoint(path, config_path)  # names, shapes, finite
        hw, _ = weights.prepare(state, model_cfg, source=str(path))
        keys = {"step": entry["step"], "tokens": entry["tokens"]}
        comp = scores_at(hw, cfg, seed, model_cfg.positional_embedding_type, device)
        comps.append(comp.assign(**keys, excess=excess(comp)))
        model = tl_checkpoint.build_model(model_cfg, state, dtype=torch.float64)
        table, loss = heads_at(model, repeated, heldout, cfg)
        if not np.isfinite(table[list(PATTERN_SCORES)].to_numpy()).all() or not np.isfinite(loss):
            raise UserError(str(path), "attention patterns or the loss are not finite: weights too large")
        head_tables.append(table.assign(**keys))
        losses.append({**keys, "eval_loss": loss})
    comp = pd.concat(comps, ignore_index=True)[list(DYNAMICS_COLUMNS)]
    head_scores = pd.concat(head_tables, ignore_index=True)[list(DYNAMICS_HEADS_COLUMNS)]
    pair = top_pair(head_scores[head_scores["step"] == checkpoints[-1]["step"]])
    steps = steps_table(comp, head_scores, pd.DataFrame(losses), pair)
    return DynamicsResult(comp, head_scores, steps, pair)


def run(
    directory: str | Path,
    config_path: str | Path,
    cfg: Config,
    seed: int,
    tokenized: str | Path | None = None,
    progress=None,
    device: str | None = None,
) -> DynamicsResult:
    """`analyse` on train's checkpoints/ (`directory`, its index.json) and config.json at
    `config_path`, with the heads stage's batches drawn from `seed` (`tokenized`: the tokenizer
    stage's output, data.source = text). The shape is checked first, as the heads stage checks it
    (`heads.require_shape_fits`: the lengths, and memory for one checkpoint's analysis), before
    any checkpoint or data is read whole. `device`: where the composition products run."""
    h = cfg.analysis.heads
    entries = checkpoint.read_index(directory)
    shape = tl_checkpoint.read_tl_config(config_path)
    heads.require_shape_fits(shape, h, cfg.data, str(config_path))
    dataset = datasets.load(cfg.data, shape, seed, h.eval_sequences, tokenized, need_train=False)
    repeated = datasets.repeated_probe(dataset, h.eval_sequences, h.repeat_length, shape.d_vocab, seed)
    return analyse(entries, directory, config_path, repeated, dataset.eval, cfg, seed, progress, device)


def summarize(result: DynamicsResult, fdr: float) -> dict:
    """summary.json: the checkpoint count, the pair followed, the phase step and each measure's
    clear step and lag (`phases.summary`; fdr: analysis.composition.fdr)."""
    return {"checkpoints": len(result.steps), "pair": result.pair, **phases.summary(result.steps, fdr)}
