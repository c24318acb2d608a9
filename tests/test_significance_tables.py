"""significance.raw_tables and significance.measured on a small random model: every measure's rows
for the later and the placebo pairs, computed by the two measures with the caller's seed,
positions and device, then calibrated at the config's fdr."""

from __future__ import annotations

import pandas as pd
import pytest
from models import random_model

from pipeline.circuits import composition, invariant, significance, weights
from pipeline.config import CompositionConfig
from pipeline.tables import INVARIANT, join_measures

CFG = CompositionConfig(baseline_samples=4, null_samples=4, fdr=0.3)


@pytest.fixture(scope="module")
def hw():
    return weights.from_state_dict(random_model("tiny", seed=4).state_dict())


@pytest.fixture(scope="module")
def expected(hw):
    """(scores, placebo) of seed 3, "standard" positions, from the two measures directly."""
    return tuple(
        join_measures(
            composition.composition_scores(hw, CFG, 3, placebo=is_placebo),
            invariant.invariant_scores(hw, CFG, 3, "standard", placebo=is_placebo),
        )
        for is_placebo in (False, True)
    )


@pytest.fixture
def calls(monkeypatch):
    """Every call of the two measures, with its arguments, the real scores returned."""
    seen = []

    def spy(name, real):
        def wrapped(*args, **kwargs):
            seen.append((name, args, kwargs))
            return real(*args, **kwargs)

        return wrapped

    for module, name in ((composition, "composition_scores"), (invariant, "invariant_scores")):
        monkeypatch.setattr(module, name, spy(name, getattr(module, name)))
    return seen


def test_raw_tables_are_both_measures_of_the_later_and_the_placebo_pairs(hw, calls, expected):
    scores, placebo = significance.raw_tables(hw, CFG, 3, "standard", device="cpu")
    assert [(name, args, kwargs) for name, args, kwargs in calls] == [
        ("composition_scores", (hw, CFG, 3), {"placebo": False, "device": "cpu"}),
        ("invariant_scores", (hw, CFG, 3, "standard"), {"placebo": False, "device": "cpu"}),
        ("composition_scores", (hw, CFG, 3), {"placebo": True, "device": "cpu"}),
        ("invariant_scores", (hw, CFG, 3, "standard"), {"placebo": True, "device": "cpu"}),
    ]
    for got, want in zip((scores, placebo), expected, strict=True):
        pd.testing.assert_frame_equal(got, want)
        assert (got["variant"] == INVARIANT).any()
    # 2 layers of 3 heads: 9 later pairs; placebo: 2 x 6 of a head's own layer, 9 earlier readers
    assert len(scores) == 3 * 6 * 9 and len(placebo) == 3 * 6 * (12 + 9)


def test_measured_is_raw_tables_calibrated_at_the_configs_fdr(hw, calls, expected):
    got = significance.measured(hw, CFG, 3, "standard", device="cpu")
    assert {kwargs["device"] for _, _, kwargs in calls} == {"cpu"} and len(calls) == 4
    want = significance.calibrate(*expected, CFG.fdr)
    for a, b in zip(got, want, strict=True):
        pd.testing.assert_frame_equal(a, b)
    # fdr 0.3, not the default 0.05: the discoveries are the q at or below it
    scores = got[0]
    assert scores["discovery"].tolist() == (scores["q"] <= 0.3).tolist()
