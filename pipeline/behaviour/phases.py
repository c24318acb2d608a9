"""When things happen in training, read from the dynamics stage's steps.tsv (one row per
checkpoint): the induction phase change, and the first checkpoint at which a measure's
K-composition of the top induction <- previous-token pair clears its null.

Torch-free: the dynamics, figures and compare stages all read it, and the last two import
no model code.

- phase step: the first checkpoint at which the best layer >= 1 head's induction score
  reaches `tables.INDUCTION_THRESHOLD` (0.5), as train's metrics.json measures it on its
  own probe (here on the heads stage's probe, at checkpoint resolution).
- clear step of a measure: the first checkpoint at which the pair is a discovery (its BH q
  at that checkpoint, `q_<measure>`, at most `fdr`, analysis.composition.fdr:
  `pipeline.circuits.significance`) and stays one at every later checkpoint (a null crossed once by
  noise and left again has not been cleared).
- z growth of a measure: the slope of the pair's raw z against steps, least squares over the
  checkpoints from the phase step's 500 steps before to it (how fast the circuit stands out of
  that measure's Haar null while it forms).
- lag: clear step minus phase step, in steps (< 0: the measure sees the circuit before
  the induction score does). NaN where either never happens.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..tables import INDUCTION_THRESHOLD, MEASURES


def phase_step(steps: pd.DataFrame, threshold: float = INDUCTION_THRESHOLD) -> float:
    """The first step whose induction score reaches `threshold`; NaN if none does."""
    reached = steps.loc[steps["induction"] >= threshold, "step"]
    return float(reached.iloc[0]) if len(reached) else math.nan


def clear_step(steps: pd.DataFrame, column: str, fdr: float) -> float:
    """The first step from which `column` (a q) is <= fdr at every later checkpoint; NaN if the
    last is not."""
    above = (steps[column] <= fdr).to_numpy()
    if not len(above) or not above[-1]:
        return math.nan
    below = [i for i, ok in enumerate(above) if not ok]
    first = below[-1] + 1 if below else 0
    return float(steps["step"].iloc[first])


def lags(steps: pd.DataFrame, fdr: float) -> dict[str, float]:
    """{measure: clear step - phase step} for every measure (module doc)."""
    phase = phase_step(steps)
    return {m: clear_step(steps, f"q_{m}", fdr) - phase for m in MEASURES}


def clear_gap(steps: pd.DataFrame, later: str, earlier: str, fdr: float) -> float:
    """Clear step of measure `later` minus that of `earlier`, in steps; NaN where either never
    clears, and with a single checkpoint (a loaded model is its own only one, step 0): one
    checkpoint shows no order, so claim (t) is untestable there, not a tie at 0."""
    if len(steps) < 2:
        return math.nan
    return clear_step(steps, f"q_{later}", fdr) - clear_step(steps, f"q_{earlier}", fdr)


GROWTH_WINDOW = 500  # steps before the phase step over which z growth is measured


def z_growth(steps: pd.DataFrame, measure: str) -> float:
    """Slope (raw z per 100 steps) of the pair's z under `measure` over [phase - GROWTH_WINDOW,
    phase]; NaN without a phase step or with fewer than three finite checkpoints there."""
    phase = phase_step(steps)
    if math.isnan(phase):
        return math.nan
    window = steps[(steps["step"] >= phase - GROWTH_WINDOW) & (steps["step"] <= phase)]
    window = window[np.isfinite(window[f"z_{measure}"].to_numpy(dtype=float))]
    if len(window) < 3:
        return math.nan
    slope = np.polyfit(window["step"].to_numpy(dtype=float), window[f"z_{measure}"].to_numpy(dtype=float), 1)[
        0
    ]
    return float(slope * 100)


def summary(steps: pd.DataFrame, fdr: float) -> dict:
    """The phase step and each measure's clear step, lag and z growth (None where undefined)."""

    def value(x: float) -> int | None:
        return None if math.isnan(x) else int(x)

    return {
        "induction_threshold": INDUCTION_THRESHOLD,
        "fdr": fdr,
        "phase_step": value(phase_step(steps)),
        "clear_step": {m: value(clear_step(steps, f"q_{m}", fdr)) for m in MEASURES},
        "lag": {m: value(v) for m, v in lags(steps, fdr).items()},
        "z_growth": {m: (None if math.isnan(g := z_growth(steps, m)) else round(g, 6)) for m in MEASURES},
    }
