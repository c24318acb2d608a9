"""pipeline/circuits/analysis.py: `composition`, the composition stage's science in one call: its
tables are the calibrated measures (significance.measured) split into the five variants and the
invariant measure, their channels (channel_null.measured_channels), and a summary of each, all for
the seed, positions and device given."""

from __future__ import annotations

import inspect
import json

import pandas as pd
import pytest
import torch
from models import random_model

from pipeline.circuits import analysis, channel_null, scoring, significance, weights
from pipeline.config import CompositionConfig
from pipeline.tables import INVARIANT, PROJECTION, VARIANTS, split_measures

CFG = CompositionConfig(baseline_samples=4, null_samples=4, fdr=0.5)  # discoveries even here


@pytest.fixture(scope="module")
def heads():
    model = random_model("tiny", seed=1, positional_embedding_type="standard")
    hw, _ = weights.prepare(model.state_dict(), model.cfg)
    return hw


def test_composition_is_the_split_measures_their_channels_and_summaries(heads) -> None:
    got = analysis.composition(heads, CFG, 4, "standard")
    measured, placebo = significance.measured(heads, CFG, 4, "standard")
    scores, others = split_measures(measured)
    assert set(got.scores["variant"]) == set(VARIANTS) and len(got.scores) == 5 * len(got.invariant)
    assert "variant" not in got.invariant.columns and (measured["variant"] == INVARIANT).any()
    pd.testing.assert_frame_equal(got.scores, scores)
    pd.testing.assert_frame_equal(got.invariant, others[INVARIANT])
    pd.testing.assert_frame_equal(got.projection, others[PROJECTION])
    pd.testing.assert_frame_equal(got.placebo, placebo)
    split, split_placebo, shares = channel_null.measured_channels(heads, scores, CFG, 4)
    pd.testing.assert_frame_equal(got.channels, split)
    pd.testing.assert_frame_equal(got.channels_placebo, split_placebo)
    assert set(got.shares) == set(shares)
    for kind in shares:
        torch.testing.assert_close(got.shares[kind], shares[kind], rtol=0, atol=0)
    want = {
        "fdr": 0.5,
        **scoring.summarize(measured, placebo),
        "detection_limits": significance.detection_limits(measured, placebo, 0.5),
        "placebo_families": significance.family_summary(placebo),
        "channels": channel_null.channels_summary(split, split_placebo),
    }
    assert list(got.summary) == list(want)
    assert json.dumps(got.summary, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_composition_reads_its_seed_positions_and_fdr(heads) -> None:
    base = analysis.composition(heads, CFG, 4, "standard")
    other_seed = analysis.composition(heads, CFG, 5, "standard")
    assert not base.scores["z"].equals(other_seed.scores["z"])  # the null's draws
    assert not base.channels.equals(other_seed.channels)  # the channels' draws
    shortformer = analysis.composition(heads, CFG, 4, "shortformer")
    pd.testing.assert_frame_equal(shortformer.scores, base.scores)  # Frobenius scores leave out W_pos
    assert not shortformer.invariant["score"].equals(base.invariant["score"])  # the invariant does not
    strict = analysis.composition(
        heads, CompositionConfig(baseline_samples=4, null_samples=4, fdr=0.2), 4, "standard"
    )
    assert strict.summary["fdr"] == 0.2
    assert strict.scores["discovery"].sum() < base.scores["discovery"].sum()
    assert strict.summary["detection_limits"] != base.summary["detection_limits"]


def test_composition_runs_every_product_on_the_device_given(heads, monkeypatch) -> None:
    """`device` reaches the measures' and the channels' products (on a CPU-only machine the values
    cannot show it: test_circuits_significance.py compares devices where CUDA is present)."""
    seen = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            bound = inspect.signature(fn).bind(*args, **kwargs)
            bound.apply_defaults()
            seen.append((name, bound.arguments["device"]))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(significance, "measured", spy("measured", significance.measured))
    monkeypatch.setattr(channel_null, "measured_channels", spy("channels", channel_null.measured_channels))
    analysis.composition(heads, CFG, 4, "standard", device="cpu")
    assert seen == [("measured", "cpu"), ("channels", "cpu")]
