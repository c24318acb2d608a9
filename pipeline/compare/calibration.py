"""The calibrate stage's outputs across seeds (pipeline/behaviour/calibration.py writes one per seed):
which measures the run may trust, the smallest planted composition each finds, and the shape of
the null on the model's own non-composing pairs.

A measure is calibrated in a run when, on each of the three nulls (surrogates, chimeras of
trained layers, untrained models), the families with a discovery, pooled over the seeds, are no
more than the FDR allows: BH bounds the share of families with any discovery by the FDR when
nothing composes, so the count of such families is at most binomial(families, fdr), and the
measure fails when the count observed is improbable under that bound (one-sided binomial p below
`CALIBRATION_LEVEL`). A claim that counts a measure's discoveries (claims.Claim.rests_on) gets a
verdict only when every measure it rests on is calibrated (`uncalibrated`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..tables import MEASURES
from .read import SeedInputs

NULLS = ("surrogate", "chimera", "untrained")
CALIBRATION_LEVEL = 0.01  # a measure's null families beyond the FDR at this binomial p: uncalibrated
RULE = (
    "a measure is calibrated when, on each null (surrogates, chimeras of trained layers, untrained "
    "models), its families with a discovery, pooled over the seeds, are not more than the FDR allows "
    f"(one-sided binomial p >= {CALIBRATION_LEVEL:g} against a rate of the FDR)"
)


POWER_WORDS = (
    "Power: a K composition planted into one pair at growing strength (keys: the reader's keys turned "
    "to read the writer's strongest output directions; mixed: also the writer's values turned to read "
    "what the reader's queries read, a term only the rotated strands reward), into the layer-1 head "
    "read least and the one read most, each from its least-read writer: the smallest strength each "
    "measure discovers, and its raw z there, per seed (–: not found at any strength tried)."
)
NON_COMPOSING_WORDS = (
    "The model's own later K pairs that do not compose by evidence the test does not use (no circuit "
    "roles between them, no causal effect beyond what their heads' scales predict): their mean p-value "
    "against the bulk of their kind (near 0.5 when the null has their shape, piled near 1 when it is "
    "too wide) and the test's, whose chance floor lifts it where trained pairs sit below chance."
)


def binomial_tail(k: int, n: int, rate: float) -> float | None:
    """P(X >= k) for X ~ binomial(n, rate); None without a family."""
    if n == 0:
        return None
    from scipy.stats import binom  # here: the report imports this package for names only

    return float(binom.sf(k - 1, n, rate))


def families(inputs: Sequence[SeedInputs], fdr: float) -> dict:
    """{measure: {null: {"families", "with_discovery", "rate", "p"}, "calibrated": bool}} pooled over
    the seeds' calibration.json; {} when no seed was calibrated."""
    found = [inp.calibration for inp in inputs if inp.calibration is not None]
    if not found:
        return {}
    out: dict = {}
    for m in MEASURES:
        entry: dict = {}
        for null in NULLS:
            counts = [c["families"].get(null) or {} for c in found]
            n = sum(int(x.get(m, {}).get("families") or 0) for x in counts)
            k = sum(int(x.get(m, {}).get("with_discovery") or 0) for x in counts)
            entry[null] = {"families": n, "with_discovery": k, "rate": k / n if n else None,
                           "p": binomial_tail(k, n, fdr)}  # fmt: skip
        tails = [v["p"] for v in entry.values() if v["p"] is not None]
        entry["calibrated"] = bool(tails) and min(tails) >= CALIBRATION_LEVEL
        out[m] = entry
    return out


def uncalibrated(summary: dict) -> set[str]:
    """The measures a run's calibration found beyond the FDR (`families`); none when not measured."""
    return {m for m, entry in summary.items() if not entry["calibrated"]}


def _per_seed(inputs: Sequence[SeedInputs], get) -> dict:
    return {str(inp.seed): get(inp.calibration) for inp in inputs if inp.calibration is not None}


def power(inputs: Sequence[SeedInputs]) -> dict:
    """{plant: {reader: {measure: {"strength": {seed: s}, "raw_z": {seed: z}}}}}: the smallest planted
    strength each measure finds, and its raw z there, per seed (None: not found at any strength)."""
    out: dict = {}
    for inp in inputs:
        if inp.calibration is None:
            continue
        for plant, readers in inp.calibration["power"].items():
            for reader, measures in readers.items():
                for m, found in measures.items():
                    cell = (
                        out.setdefault(plant, {})
                        .setdefault(reader, {})
                        .setdefault(m, {"strength": {}, "raw_z": {}})
                    )
                    cell["strength"][str(inp.seed)] = found["strength"]
                    cell["raw_z"][str(inp.seed)] = found["raw_z"]
    return out


def non_composing(inputs: Sequence[SeedInputs], kind: str = "K") -> dict:
    """{measure: {"bulk_p": {seed: mean}, "p": {seed: mean}, "pairs": {seed: n}}}: the mean p-value of
    the model's own non-composing later pairs of `kind`, against the bulk (near 1/2 when the null
    has their shape) and the test's (with the chance floor)."""
    out: dict = {}
    for inp in inputs:
        if inp.calibration is None:
            continue
        for m, entry in inp.calibration["non_composing"].get(kind, {}).items():
            cell = out.setdefault(m, {"bulk_p": {}, "p": {}, "pairs": {}})
            cell["bulk_p"][str(inp.seed)] = entry["bulk_p"]["mean"]
            cell["p"][str(inp.seed)] = entry["p"]["mean"]
            cell["pairs"][str(inp.seed)] = entry["bulk_p"]["pairs"]
    return out


def claim_e(inputs: Sequence[SeedInputs]) -> dict:
    """{"model": {seed: e}, "surrogates": {seed: {"mean", "max"}}}: claim (e)'s statistic on each model
    and on its surrogates (where the layers' alignment is random)."""

    def spread(c: dict) -> dict:
        values = [s["e_specific"] for s in c["claim_e"]["surrogates"] if s["e_specific"] is not None]
        finite = [v for v in values if math.isfinite(v)]
        return {"mean": float(np.mean(finite)) if finite else None, "max": max(finite) if finite else None}

    return {
        "model": _per_seed(inputs, lambda c: c["claim_e"]["model"]["e_specific"]),
        "surrogates": _per_seed(inputs, spread),
    }


def summary(inputs: Sequence[SeedInputs], fdr: float) -> dict:
    """verdicts.json's "calibration": the rule, the measures' null families, the planted power, the
    non-composing pairs' p-values, claim (e) on surrogates, each model's detection limits."""
    return {
        "rule": RULE,
        "measures": families(inputs, fdr),
        "power": power(inputs),
        "non_composing": non_composing(inputs),
        "claim_e": claim_e(inputs),
        "detection_limits": _per_seed(inputs, lambda c: c["detection_limits"]),
    }
