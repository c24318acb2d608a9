"""Reading one seed's outputs for the comparison, with one-line errors naming the file."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import io
from ..errors import UserError
from ..tables import (
    ABLATED_ROLES,
    CHANNELS_COLUMNS,
    CURVE_COLUMNS,
    INVARIANT_COLUMNS,
    OTHER_MEASURES,
    ROLE_STATISTICS,
    SCORES_COLUMNS,
    STEPS_COLUMNS,
    join_measures,
    read_csv,
)

HEADS_COLUMNS = ("layer", "head", "role")
TRAIN_METRICS = ("eval_loss", "induction", "prev_token")  # final values, from metrics.json


@dataclass
class SeedInputs:
    """What one seed's stages wrote, as read from disk."""

    seed: int
    scores: pd.DataFrame  # composition scores.csv, then invariant.csv and projection.csv as those variants
    placebo: pd.DataFrame  # composition placebo.csv: the pairs that cannot compose, every measure
    heads: pd.DataFrame  # heads.csv: layer, head, role, scores
    agreement: dict  # heads summary.json "agreement": {effect: {"spearman": ..., "top_source": ...}}
    role_ablation: dict  # heads summary.json "role_ablation": {role: {heads, heldout_loss_effect, ...}}
    metrics: dict  # train metrics.json
    curve: pd.DataFrame  # train curve.tsv
    steps: pd.DataFrame  # dynamics steps.tsv: one row per checkpoint
    channels: pd.DataFrame  # composition channels.csv: each later pair's top channel, its share and test
    channel_ablation: dict  # heads summary.json "channel_ablation" ({} when the heads stage had no channels)
    calibration: dict | None = None  # the calibrate stage's calibration.json (None: not calibrated)


CALIBRATION_KEYS = (
    "families",
    "placebo",
    "non_composing",
    "detection_limits",
    "power",
    "channels",
    "claim_e",
)


def read_seed(
    seed: int, train: Path, composition: Path, heads: Path, dynamics: Path, calibration: Path | None = None
) -> SeedInputs:
    """Read seed `seed`'s files from the stages' output directories (`<dir>/seed<N>/`)."""
    sub = f"seed{seed}"
    summary_path = heads / sub / "summary.json"
    summary = io.read_json(summary_path)
    agreement = summary.get("agreement") if isinstance(summary, dict) else None
    if not isinstance(agreement, dict):
        raise UserError(f"{summary_path}: agreement", "missing: expected {effect: {spearman, top_source}}")
    role_ablation = summary.get("role_ablation")
    if not isinstance(role_ablation, dict) or not all(
        isinstance(role_ablation.get(role), dict) and effect in role_ablation[role]
        for role in ABLATED_ROLES
        for effect in ROLE_STATISTICS
    ):
        problem = (
            f"missing: expected {{role: {{{', '.join(ROLE_STATISTICS)}}}}} for {', '.join(ABLATED_ROLES)}"
        )
        raise UserError(f"{summary_path}: role_ablation", problem)
    metrics_path = train / sub / "metrics.json"
    metrics = io.read_json(metrics_path)
    for key in TRAIN_METRICS:
        if not isinstance(metrics, dict) or key not in metrics:
            raise UserError(f"{metrics_path}: {key}", "missing")
        io.require_number(metrics[key], f"{metrics_path}: {key}")
    return SeedInputs(
        seed=seed,
        scores=join_measures(
            read_csv(composition / sub / "scores.csv", SCORES_COLUMNS, empty_ok=False),
            {
                m: read_csv(composition / sub / f"{m}.csv", INVARIANT_COLUMNS, empty_ok=False)
                for m in OTHER_MEASURES
            },
        ),
        placebo=read_csv(composition / sub / "placebo.csv", SCORES_COLUMNS, empty_ok=False),
        heads=read_csv(heads / sub / "heads.csv", HEADS_COLUMNS, empty_ok=False),
        agreement=agreement,
        role_ablation=role_ablation,
        metrics=metrics,
        curve=read_csv(train / sub / "curve.tsv", CURVE_COLUMNS, sep="\t", empty_ok=False),
        steps=read_csv(dynamics / sub / "steps.tsv", STEPS_COLUMNS, sep="\t", empty_ok=False),
        channels=read_csv(composition / sub / "channels.csv", CHANNELS_COLUMNS, empty_ok=False),
        channel_ablation=_channel_ablation(summary, summary_path),
        calibration=None if calibration is None else _calibration(calibration / sub / "calibration.json"),
    )


def _calibration(path: Path) -> dict:
    """The calibrate stage's calibration.json, with every part compare reads."""
    found = io.read_json(path)
    missing = [k for k in CALIBRATION_KEYS if not isinstance(found, dict) or k not in found]
    if missing:
        raise UserError(
            str(path), f"missing {', '.join(missing)}: not the calibrate stage's calibration.json"
        )
    return found


def _channel_ablation(summary: dict, path: Path) -> dict:
    """heads summary.json's "channel_ablation" ({} when absent: a heads stage run without channels)."""
    entry = summary.get("channel_ablation", {})
    if not isinstance(entry, dict) or (entry and not isinstance(entry.get("pairs"), list)):
        raise UserError(f"{path}: channel_ablation", "expected {pairs: [...], median_causal_share}")
    return entry


def stale_seed_dirs(parents: Iterable[Path], seeds: Sequence[int]) -> list[Path]:
    """`seed<N>` directories under `parents` whose N is not in `seeds` (left by a longer list).

    They never enter the comparison; they do enter DVC's hash of the parent directories,
    which the compare stage depends on, so removing them reruns it once.
    """
    stale = []
    for parent in parents:
        for child in sorted(Path(parent).glob("seed*")):
            m = re.fullmatch(r"seed(\d+)", child.name)
            if m and child.is_dir() and int(m.group(1)) not in seeds:
                stale.append(child)
    return stale
