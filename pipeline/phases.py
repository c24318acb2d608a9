"""When things happen in training, read from the dynamics stage's steps.tsv (one row per
checkpoint): the induction phase change, and the first checkpoint at which a measure's
K-composition of the top induction <- previous-token pair clears its null.

Torch-free: the dynamics, figures and compare stages all read it, and the last two import
no model code.

- phase step: the first checkpoint at which the best layer >= 1 head's induction score
  reaches `tables.INDUCTION_THRESHOLD` (0.5), as train's metrics.json measures it on its
  own probe (here on the heads stage's probe, at checkpoint resolution).
- clear step of a measure: the first checkpoint at which the pair's z exceeds `z`
  (analysis.compare.z_threshold) and stays above it at every later checkpoint (a null
  crossed once by noise and left again has not been cleared).
- lag: clear step minus phase step, in steps (< 0: the measure sees the circuit before
  the induction score does). NaN where either never happens.
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline.tables import INDUCTION_THRESHOLD, MEASURES


def phase_step(steps: pd.DataFrame, threshold: float = INDUCTION_THRESHOLD) -> float:
    """The first step whose induction score reaches `threshold`; NaN if none does."""
    reached = steps.loc[steps["induction"] >= threshold, "step"]
    return float(reached.iloc[0]) if len(reached) else math.nan


def clear_step(steps: pd.DataFrame, column: str, z: float) -> float:
    """The first step from which `column` is > z at every later checkpoint; NaN if the last is not."""
    above = (steps[column] > z).to_numpy()
    if not len(above) or not above[-1]:
        return math.nan
    below = [i for i, ok in enumerate(above) if not ok]
    first = below[-1] + 1 if below else 0
    return float(steps["step"].iloc[first])


def lags(steps: pd.DataFrame, z: float) -> dict[str, float]:
    """{measure: clear step - phase step} for every measure (module doc)."""
    phase = phase_step(steps)
    return {m: clear_step(steps, f"z_{m}", z) - phase for m in MEASURES}


def summary(steps: pd.DataFrame, z: float) -> dict:
    """The phase step and each measure's clear step and lag (None where undefined)."""

    def value(x: float) -> int | None:
        return None if math.isnan(x) else int(x)

    return {
        "induction_threshold": INDUCTION_THRESHOLD,
        "z_threshold": z,
        "phase_step": value(phase_step(steps)),
        "clear_step": {m: value(clear_step(steps, f"z_{m}", z)) for m in MEASURES},
        "lag": {m: value(v) for m, v in lags(steps, z).items()},
    }
