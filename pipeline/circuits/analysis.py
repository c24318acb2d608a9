"""The composition stage's science in one call: every table and the summary it writes, computed
from one model's analysis-ready weights. `stages/composition.py` writes what `composition`
returns; the Python API (`pipeline/api.py`, `attn_circuits.api`) returns it as it is, so a
notebook's tables are the stage's, not a copy of its code.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from torch import Tensor

from ..config import CompositionConfig
from ..tables import INVARIANT, PROJECTION, split_measures
from . import channel_null, scoring, significance
from .weights import HeadWeights


@dataclass(frozen=True)
class Composition:
    """One model's composition, as the composition stage writes it (tables on the CPU)."""

    scores: pd.DataFrame  # scores.csv: every later pair, kind and variant, calibrated
    invariant: pd.DataFrame  # invariant.csv: the basis-invariant measure, calibrated
    projection: pd.DataFrame  # projection.csv: the projection kernel of the heads' subspaces, calibrated
    placebo: pd.DataFrame  # placebo.csv: every measure for the pairs that cannot compose
    channels: pd.DataFrame  # channels.csv: each later pair's top channel and its discovery
    channels_placebo: pd.DataFrame  # channels_placebo.csv: the same for the placebo pairs
    shares: dict[str, Tensor]  # channels.safetensors: per kind, [pairs, d_head, d_head] float32
    summary: dict  # summary.json (JSON-ready)


def composition(
    hw: HeadWeights, cfg: CompositionConfig, seed: int, positions: str, device: str | None = None
) -> Composition:
    """Every measure of every pair of `hw` calibrated at `cfg.fdr` (`significance.measured`), split
    into the scores, invariant and projection tables, their channels (`channel_null.measured_channels`)
    and the summary: discoveries, detection limits, the placebo families per block and the
    channels'. `positions`: the model's positional embedding type (the invariant measure reads
    it); `device`: where the products run (`analysis.device`); `seed`: the baselines' and nulls'
    draws."""
    measured, placebo = significance.measured(hw, cfg, seed, positions, device)
    scores, others = split_measures(measured)
    split, split_placebo, shares = channel_null.measured_channels(hw, scores, cfg, seed, device)
    summary = {
        "fdr": cfg.fdr,
        **scoring.summarize(measured, placebo),
        # the raw z a lone composing pair needs, per kind and measure (from the placebo pairs alone)
        "detection_limits": significance.detection_limits(measured, placebo, cfg.fdr),
        "placebo_families": significance.family_summary(placebo),
        "channels": channel_null.channels_summary(split, split_placebo),
    }
    return Composition(
        scores, others[INVARIANT], others[PROJECTION], placebo, split, split_placebo, shares, summary
    )
