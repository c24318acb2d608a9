"""The calibrate stage's outputs across seeds (pipeline/compare/calibration.py): the binomial test of
a measure's null families pooled over the seeds, and the planted power, the non-composing pairs'
p-values and claim (e) on surrogates gathered per seed, on calibration.json contents made by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from pipeline.compare import calibration
from pipeline.tables import MEASURES

FDR = 0.05


def seed(number: int, families: dict | None = None, **parts) -> SimpleNamespace:
    """A seed's inputs as the compare stage reads them: only its number and calibration.json."""
    if families is None:
        return SimpleNamespace(seed=number, calibration=None)
    found = {"families": families, "power": {}, "non_composing": {}, "detection_limits": {}} | parts
    return SimpleNamespace(seed=number, calibration=found)


def counts(n: int, k: int) -> dict:
    return {"families": n, "with_discovery": k}


def every_measure(n: int, k: int = 0, **others: tuple[int, int]) -> dict:
    return {m: counts(*others.get(m, (n, k))) for m in MEASURES}


@pytest.mark.parametrize(
    "k,n,rate,expected",
    [(0, 5, 0.05, 1.0), (2, 2, 0.5, 0.25), (1, 3, 0.1, 1 - 0.9**3), (3, 3, 0.1, 0.001), (1, 0, 0.05, None)],
)
def test_binomial_tail_is_the_chance_of_at_least_k_of_n(k, n, rate, expected):
    got = calibration.binomial_tail(k, n, rate)
    assert got is None if expected is None else got == pytest.approx(expected, rel=1e-12)


def test_families_pool_the_seeds_and_a_measure_beyond_the_fdr_on_any_null_is_uncalibrated():
    # true: 1 of 20 surrogate families with a discovery, P(X >= 1 | 20, 0.05) = 1 - 0.95^20 = 0.64
    # invariant: 10 of 20 on surrogates, far beyond 5%; clean on the other nulls
    nulls = {
        "surrogate": every_measure(10, invariant=(10, 5), true=(10, 1)),
        "chimera": every_measure(6),
        "untrained": every_measure(8),
    }
    other = {
        "surrogate": every_measure(10, invariant=(10, 5)),
        "chimera": every_measure(6),
        "untrained": every_measure(8),
    }
    out = calibration.families([seed(0, nulls), seed(1, other), seed(2)], FDR)  # seed 2 not calibrated

    true = out["true"]
    assert true["surrogate"] == {
        "families": 20,
        "with_discovery": 1,
        "rate": 0.05,
        "p": pytest.approx(1 - 0.95**20),
    }
    assert true["chimera"] == {"families": 12, "with_discovery": 0, "rate": 0.0, "p": 1.0}
    assert true["calibrated"] is True
    assert out["invariant"]["surrogate"]["with_discovery"] == 10
    assert out["invariant"]["surrogate"]["p"] < calibration.CALIBRATION_LEVEL
    assert out["invariant"]["calibrated"] is False
    assert calibration.uncalibrated(out) == {"invariant"}


def test_a_null_without_families_is_not_tested_and_a_measure_with_none_is_uncalibrated():
    only_untrained = {"untrained": every_measure(4, true=(4, 4))}  # no surrogates or chimeras at all
    out = calibration.families([seed(0, only_untrained)], FDR)
    assert out["true"]["surrogate"] == {"families": 0, "with_discovery": 0, "rate": None, "p": None}
    assert out["true"]["untrained"]["p"] == pytest.approx(FDR**4)
    assert out["true"]["calibrated"] is False  # 4 of 4: p = 0.05^4
    assert out["projection"]["calibrated"] is True  # 0 of 4 on the one null measured
    empty = calibration.families([seed(0, {})], FDR)  # a seed whose file has no family
    assert not any(entry["calibrated"] for entry in empty.values())  # nothing measured: not trusted


def test_no_calibrated_seed_gives_no_families_and_nothing_uncalibrated():
    assert calibration.families([seed(0), seed(1)], FDR) == {}
    assert calibration.uncalibrated({}) == set()


def test_power_non_composing_and_claim_e_are_gathered_per_seed():
    def parts(strength, z, bulk, p, pairs, e, surrogates):
        return {
            "power": {"keys": {"least_read": {"true": {"strength": strength, "raw_z": z}}}},
            "non_composing": {"K": {"true": {"bulk_p": {"mean": bulk, "pairs": pairs}, "p": {"mean": p}}}},
            "claim_e": {"model": {"e_specific": e}, "surrogates": [{"e_specific": v} for v in surrogates]},
            "detection_limits": {"K": {"true": 5.0 + e}},
        }

    inputs = [
        seed(3, {}, **parts(0.5, 7.5, 0.45, 0.7, 37, 0.5, [0.1, -0.3, None, math.inf])),
        seed(4, {}, **parts(None, None, 0.55, 0.8, 30, 0.25, [])),
        seed(5),
    ]
    out = calibration.summary(inputs, FDR)
    assert out["power"] == {
        "keys": {"least_read": {"true": {"strength": {"3": 0.5, "4": None}, "raw_z": {"3": 7.5, "4": None}}}}
    }
    assert out["non_composing"] == {
        "true": {"bulk_p": {"3": 0.45, "4": 0.55}, "p": {"3": 0.7, "4": 0.8}, "pairs": {"3": 37, "4": 30}}
    }
    assert out["claim_e"]["model"] == {"3": 0.5, "4": 0.25}
    # the surrogates' mean and largest over the finite values; none found: None
    assert out["claim_e"]["surrogates"]["3"] == {"mean": pytest.approx(-0.1), "max": 0.1}
    assert out["claim_e"]["surrogates"]["4"] == {"mean": None, "max": None}
    assert out["detection_limits"] == {"3": {"K": {"true": 5.5}}, "4": {"K": {"true": 5.25}}}
    assert out["rule"] == calibration.RULE
