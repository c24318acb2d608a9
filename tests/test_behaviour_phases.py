"""pipeline/behaviour/phases.py: the timing rules of a phase change, on known answers.

The phase step, the step from which a pair stays a discovery, their lag, and the growth of z
before the phase step."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline import tables
from pipeline.behaviour import phases


def steps_with(induction, q, z=None) -> pd.DataFrame:
    z = [0.0] * 5 if z is None else z
    return pd.DataFrame({"step": [0, 100, 200, 300, 400], "induction": induction, "q_true": q, "z_true": z})


def test_phase_step_is_the_first_checkpoint_at_the_threshold():
    assert phases.phase_step(steps_with([0, 0.2, 0.5, 0.4, 0.7], [0] * 5)) == 200  # 0.5 counts
    assert math.isnan(phases.phase_step(steps_with([0, 0.2, 0.49, 0.4, 0.3], [0] * 5)))


@pytest.mark.parametrize(
    "q, cleared",
    [
        ([1, 0.01, 0.02, 0.001, 0.001], 100),
        ([1, 0.01, 0.5, 0.01, 0.01], 300),  # discovered at 100, lost again: cleared for good at 300
        ([0.01] * 5, 0),
        ([1, 0.06, 0.051, 0.05, 0.05], 300),  # q = fdr is a discovery
        ([1, 0.01, 0.01, 0.01, 0.2], None),  # not a discovery at the end: not cleared
        ([1, 0.01, float("nan"), 0.01, 0.01], 300),  # an undefined q is not a discovery
    ],
)
def test_clear_step_is_the_first_from_which_the_pair_stays_a_discovery(q, cleared):
    got = phases.clear_step(steps_with([0] * 5, q), "q_true", 0.05)
    assert (math.isnan(got) and cleared is None) or got == cleared


def test_lag_is_clear_step_minus_phase_step():
    s = steps_with([0, 0.2, 0.6, 0.7, 0.7], [1, 0.01, 0.01, 0.01, 0.01])
    for m in tables.MEASURES:
        if m != "true":
            s[f"q_{m}"] = [1.0] * 5
            s[f"z_{m}"] = [0.0] * 5
    lags = phases.lags(s, 0.05)
    assert lags["true"] == 100 - 200 and all(math.isnan(v) for m, v in lags.items() if m != "true")
    summary = phases.summary(s, 0.05)
    assert (
        summary["phase_step"] == 200
        and summary["lag"]["true"] == -100
        and summary["lag"]["invariant"] is None
    )


def test_z_growth_is_the_slope_before_the_phase_step():
    # phase at 200: the window is [0, 200] (500 steps before it reach below 0); z = 1 + 3 x step/100
    s = steps_with([0, 0.2, 0.6, 0.7, 0.7], [1] * 5, z=[1, 4, 7, 0, 0])
    assert phases.z_growth(s, "true") == pytest.approx(3.0, abs=1e-12)
    assert math.isnan(phases.z_growth(steps_with([0] * 5, [1] * 5), "true"))  # no phase change


def test_phases_summary_known_answers_under_their_keys():
    """Checkpoints 0, 100, 200 with best induction 0.1, 0.3, 0.6: the phase step is 200 (the first
    at 0.5 or more). Measure true's q 0.5, 0.01, 0.02 clears at 100 (<= fdr 0.05 from there on),
    a lag of -100; every other measure's q stays 1: no clear step, no lag. Every z is 0, 1, 3 over
    steps 0, 100, 200: least-squares slope 300 / 20000 = 0.015 per step, 1.5 per 100 steps."""
    steps = pd.DataFrame({"step": [0, 100, 200], "tokens": [0, 800, 1600], "eval_loss": [3.0, 2.5, 2.0],
                          "induction": [0.1, 0.3, 0.6], "prev_token": [0.2, 0.7, 0.8]})  # fmt: skip
    for m in tables.MEASURES:
        steps[f"z_{m}"] = [0.0, 1.0, 3.0]
        steps[f"q_{m}"] = [0.5, 0.01, 0.02] if m == "true" else [1.0, 1.0, 1.0]
    others = [m for m in tables.MEASURES if m != "true"]
    assert phases.summary(steps, 0.05) == {
        "induction_threshold": 0.5,
        "fdr": 0.05,
        "phase_step": 200,
        "clear_step": {"true": 100, **dict.fromkeys(others)},
        "lag": {"true": -100, **dict.fromkeys(others)},
        "z_growth": dict.fromkeys(tables.MEASURES, 1.5),
    }


def test_z_growth_reads_steps_held_as_python_objects():
    """A step column of Python ints (pandas leaves one so when it concatenates onto an empty table):
    phase step 200 (induction 0.6), z 0, 1, 3 over steps 0, 100, 200: slope 300 / 20000 = 0.015
    per step, 1.5 per 100 steps, as with int steps."""
    steps = pd.DataFrame({"step": pd.Series([0, 100, 200], dtype=object), "induction": [0.1, 0.3, 0.6],
                          "z_true": [0.0, 1.0, 3.0]})  # fmt: skip
    assert phases.z_growth(steps, "true") == pytest.approx(1.5, abs=1e-12)
