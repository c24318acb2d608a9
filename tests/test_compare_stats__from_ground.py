"""A verdict at the threshold (pipeline/compare/stats.py)."""

from __future__ import annotations

from pipeline.compare import stats as compare


def test_a_verdict_needs_the_whole_interval_beyond_the_threshold():
    """Every seed above 0, but the interval's lower end exactly at 0: inconclusive, not holds (nor,
    mirrored, fails)."""
    holds_but_touches = {"n": 3, "lo": 0.0, "hi": 0.4}
    assert compare.verdict(holds_but_touches, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "inconclusive"
    assert compare.verdict({"n": 3, "lo": 1e-9, "hi": 0.4}, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "holds"
    assert compare.verdict({"n": 3, "lo": -0.4, "hi": 0.0}, 0.0, [-0.1, -0.2, -0.3], 3) == "inconclusive"
