"""The timing figure's points (pipeline/present/figures/compare.py): every seed's lag and the mean
where they belong."""

from __future__ import annotations

import numpy as np
import pytest
import synthetic_seeds as syn

from pipeline.compare import stats as compare
from pipeline.config import CompareConfig

EDGE, FDR = 0.1, 0.05


# --- the timing figure: every seed's lag where it belongs --------------------------------


def test_timing_figure_places_every_seeds_lag_and_mean():
    """Replaces test_compare's tick count: the points and means drawn are the lags.
    Seed 0 as synthetic_seeds (clear steps 400, 300, 200, 300, 300 for true, B C D A, D A B C,
    invariant and projection; phase step 300); seed 1's true z clears at step 300: lag 0, claim (t) 0."""
    inputs = [syn.seed_inputs(s) for s in (0, 1)]
    steps = inputs[1].steps
    steps.loc[steps["step"] == 300, ["z_true", "q_true"]] = [4.0, 0.01]
    result = compare.compare(inputs, CompareConfig(), EDGE, FDR)
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    fig = compare_figures.timing_figure(result.claims, result.stats, 0.95)
    try:
        left, right = fig.axes[:2]
        lags = {  # (seed 0, seed 1)
            "true": (100, 0),
            "errata_bcda": (0, 0),
            "errata_dabc": (-100, -100),
            "errata_bcda_trueden": (0, 0),
            "errata_dabc_trueden": (-100, -100),
            "invariant": (0, 0),
            "projection": (0, 0),  # the invariant measure's steps
        }
        assert [t.get_text() for t in left.get_xticklabels()] == [
            compare_figures.VARIANT_LABELS[m] for m in syn.MEASURES
        ]
        want = [
            (i + dx, lag)
            for i, m in enumerate(syn.MEASURES)
            for dx, lag in zip((-0.15, 0.15), lags[m], strict=True)
        ]
        np.testing.assert_allclose(dots(left), sorted(want), atol=1e-12)
        # (t) against each rotation: B C D A (seed 0 +100, seed 1 0), D A B C (+200, +100)
        np.testing.assert_allclose(
            dots(right), [(-0.15, 100.0), (0.15, 0.0), (0.85, 200.0), (1.15, 100.0)], atol=1e-12
        )
        # the mean of each column: a horizontal bar at its height (the intervals are vertical)
        bars = [
            seg for c in left.collections if not isinstance(c, PathCollection) for seg in c.get_segments()
        ]
        means = sorted(seg[0][1] for seg in bars if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0])
        assert means == pytest.approx(sorted([np.mean(v) for v in lags.values()]))
    finally:
        plt.close(fig)
    # claim (t): seed 0 at +100 holds; seed 1 at exactly the threshold (0) neither holds nor fails
    t = result.summary["claims"]["t"]["errata_bcda"]
    assert (t["seeds_holding"], t["seeds_failing"], t["seeds_tested"]) == (1, 0, 2)
    assert t["per_seed"] == {"0": 100.0, "1": 0.0}


def dots(ax) -> list[tuple[float, float]]:
    """Every scattered point (x, y) of an axis, sorted."""
    from matplotlib.collections import PathCollection

    points = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    return sorted((float(x), float(y)) for x, y in points)
