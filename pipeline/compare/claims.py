"""The errata's claims, one unit each: what the claim says, which per-seed statistic tests it,
the threshold it must clear, the other statistics computed beside it (in words, for the report)
and the function that computes them all for one seed. `pipeline.compare.stats` runs every claim
of `CLAIMS` on every seed and turns their numbers into verdicts; the report reads the words. A
new claim is one `@claim(...)` function here: its rows enter claims.csv and stats.csv, its
verdict verdicts.json, summary.json and the report (a figure panel is chosen by hand, in
`pipeline.present.figures.compare`).

The errata (docs/errata.md) says the library took the Frobenius norm of a cyclically
rotated strand; it names the numerators only. Claims that depend on the scale of the
original score are tested under both hypotheses about its denominators (`HYPOTHESES`:
rotated too, or true), each over both rotations (B C D A and D A B C): a claim holds
for a hypothesis when it holds whichever rotation the library used (the worse of the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..behaviour import phases
from ..tables import (
    ABLATED_ROLES,
    CAUSAL_THRESHOLDS,
    ERRATA,
    HYPOTHESES,
    INVARIANT,
    KINDS,
    MEASURES,
    PROJECTION,
    SERVES_LEVEL,
    VARIANTS,
    threshold_key,
)
from .read import SeedInputs

CLAIM_KIND = "K"  # the errata is about induction heads' K-composition
# claim (c): what K-composition predicts is the later head's attention, so the ablation's effect on
# it, whatever the head's role: the change of b's attention pattern on held-out text (total
# variation; pipeline/behaviour/ablation.py). The change of b's induction score on the probe
# counted only the composition that serves induction, which the original (rotated) score filters
# for by construction. The other effects (that one, the loss on the probe and on held-out text)
# are reported beside it, with the role-only ranker's PR-AUC and the pattern effect's PR-AUC at
# each of CAUSAL_THRESHOLDS
PRIMARY_EFFECT = "pattern_effect"
NONE = "-"  # a dimension that does not apply to a row: a claim that does not depend on the denominators


@dataclass(frozen=True)
class Seed:
    """What a claim's statistics read of one seed: its files, its scores with roles and excess
    (`stats.with_roles`), its role-group cells (`stats.group_composition`) and the two settings
    of the analysis that claims use."""

    inp: SeedInputs
    scored: pd.DataFrame
    groups: pd.DataFrame  # indexed by GROUP_KEYS: kind, variant, dst_role, src_role
    edge_threshold: float  # analysis.figures.edge_threshold: the paper's plotting threshold (claim d)
    fdr: float  # analysis.composition.fdr: a clear step is a discovery kept (claim t)

    def cell(self, kind: str, variant: str, dst: str, src: str, column: str) -> float:
        """One column of a role-group cell; NaN when the seed has no such pair."""
        key = (kind, variant, dst, src)
        return float(self.groups.at[key, column]) if key in self.groups.index else math.nan


@dataclass(frozen=True)
class Row:
    """One number of a claim for one seed: a row of the long table, less its seed and claim."""

    statistic: str  # the claim's own name for its own number, else an auxiliary statistic
    value: float
    hypothesis: str = NONE
    kind: str = NONE
    variant: str = NONE
    effect: str = NONE


Compute = Callable[[Seed], Iterator[Row]]  # a claim's rows for one seed


@dataclass(frozen=True)
class Claim:
    """One claim: its words (the report, verdicts.json), its threshold (the verdict) and its
    computation (the long table)."""

    name: str
    statement: str  # the errata's (or the paper's) words
    statistic: str  # what the per-seed number is
    threshold: float  # the number must exceed it: 0, or 0.5 (a count: at least one; a 0-or-1 indicator: yes)
    by_hypothesis: bool  # tested under each denominator hypothesis
    compute: Compute  # every row of the claim for one seed
    auxiliary: Mapping[str, str]  # the other statistics of its rows, in words
    restates: str | None  # the claim it restates with the basis-invariant measure (rows side by side)
    # the rotations the claim's own number is computed against, one row each (variant column): a
    # verdict per rotation, and the claim holds (fails) only when it holds (fails) against every one
    versus: tuple[str, ...] = ()
    # the measures whose discoveries its statistic counts: where the calibrate stage finds one of
    # them discovering more on its nulls than the FDR allows (stats.calibration_summary), the claim
    # is computed and shown, and its verdict is "uncalibrated"
    rests_on: tuple[str, ...] = ()
    # an auxiliary statistic, 1 in a seed where the composition the claim needs is absent (the
    # heads exist, and none of their pairs composes even tested alone): a claim that would fail
    # in every seed while it is absent in every tested seed is "absent", not "fails"
    absent: str | None = None
    # what the per-seed number is, in a line: the title of its panel in the claims figure, and of
    # its row where a table is short of room; a restatement's, the measure that takes the corrected
    # score's place
    label: str = ""

    def hypotheses(self) -> tuple[str, ...]:
        return tuple(HYPOTHESES) if self.by_hypothesis else (NONE,)

    def sides(self) -> tuple[tuple[str, str], ...]:
        """(column, value) of each verdict's rows: a hypothesis, or a rotation (`versus`)."""
        if self.versus:
            return tuple(("variant", v) for v in self.versus)
        return tuple(("hypothesis", h) for h in self.hypotheses())


CLAIMS: dict[str, Claim] = {}  # in the order the report and summary.json list them


def claim(
    name: str,
    statement: str,
    statistic: str,
    threshold: float,
    by_hypothesis: bool = False,
    auxiliary: Mapping[str, str] | None = None,
    restates: str | None = None,
    versus: tuple[str, ...] = (),
    rests_on: tuple[str, ...] = (),
    absent: str | None = None,
    label: str = "",
) -> Callable[[Compute], Compute]:
    """Register the decorated function as claim `name`'s computation, with its words, in `CLAIMS`."""

    def register(compute: Compute) -> Compute:
        if name in CLAIMS:
            raise ValueError(f"claim {name!r} is defined twice")
        CLAIMS[name] = Claim(
            name, statement, statistic, threshold, by_hypothesis, compute, auxiliary or {}, restates,
            versus, rests_on, absent, label,
        )  # fmt: skip
        return compute

    return register


# --- what the claims compute from ----------------------------------------------------


def _nanmax(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.max()) if len(values) else math.nan


def selectivity(
    scored: pd.DataFrame,
    variant: str,
    kind: str = CLAIM_KIND,
    dst: str = "induction",
    src: str = "previous_token",
) -> float:
    """(T - O) / (|T| + |O|): T the max excess in cell (kind, dst <- src),
    O the max over all else of `variant`.

    > 0 exactly when the cell holds the strongest composition of the variant (every kind,
    every pair). NaN when the cell is empty or all NaN.
    """
    of_variant = scored[scored["variant"] == variant]
    in_cell = (of_variant["kind"] == kind) & (of_variant["dst_role"] == dst) & (of_variant["src_role"] == src)
    T, O = _nanmax(of_variant.loc[in_cell, "excess"]), _nanmax(of_variant.loc[~in_cell, "excess"])
    if math.isnan(T):
        return math.nan
    if math.isnan(O):  # nothing else to compare with: trivially singled out
        return 1.0
    scale = abs(T) + abs(O)
    return (T - O) / scale if scale > 0 else 0.0


def _worst(values: Sequence[float], better: str = "higher") -> float:
    """The worse of the rotations' values (NaN if any is NaN): min, or max when lower is better."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return min(values) if better == "higher" else max(values)


def only_k_from_one_layer0_head(drawn: pd.DataFrame) -> float:
    """1.0 when the drawn edges are K only, all from one layer-0 head; else 0.0 (claim d)."""
    k = drawn[drawn["kind"] == CLAIM_KIND]
    sources = set(zip(k["src_layer"], k["src_head"], strict=True))
    only_k = len(drawn) > 0 and len(k) == len(drawn)
    return float(only_k and len(sources) == 1 and next(iter(sources))[0] == 0)


def _discoveries(scored: pd.DataFrame, variant: str, kind: str | None = None) -> int:
    rows = scored[(scored["variant"] == variant) & scored["discovery"]]
    return int(len(rows) if kind is None else (rows["kind"] == kind).sum())


# the rotations a discovery count is compared against: a discovery does not depend on the
# denominators (z does not), so the two rotations with rotated denominators stand for all four
ROTATIONS = HYPOTHESES["rotated"]


def _cell(scored: pd.DataFrame, variant: str, dst: str, src: str) -> pd.DataFrame:
    """The K pairs dst <- src of `variant`."""
    return scored[
        (scored["variant"] == variant) & (scored["kind"] == CLAIM_KIND)
        & (scored["dst_role"] == dst) & (scored["src_role"] == src)
    ]  # fmt: skip


def _cell_discoveries(scored: pd.DataFrame, variant: str, dst: str, src: str) -> float:
    """Discoveries among the K pairs dst <- src of `variant`; NaN when the seed has no such pair."""
    cell = _cell(scored, variant, dst, src)
    return float(cell["discovery"].sum()) if len(cell) else math.nan


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _cut(inp: SeedInputs, effect: str, threshold: float | None) -> dict:
    """The heads summary's agreement of `effect` with its causal edges cut at min_effect (None) or
    at one of CAUSAL_THRESHOLDS ("by_threshold"): {"ranking", "role_baseline", ...}; {} if absent."""
    agreed = inp.agreement.get(effect, {})
    return agreed if threshold is None else agreed.get("by_threshold", {}).get(threshold_key(threshold), {})


def _ranking(
    inp: SeedInputs, effect: str, kind: str, variant: str, key: str, threshold: float | None = None
) -> float:
    return _number(_cut(inp, effect, threshold).get("ranking", {}).get(kind, {}).get(variant, {}).get(key))


def _role_pr_auc(inp: SeedInputs, effect: str, kind: str, threshold: float | None = None) -> float:
    """The role-only ranker's PR-AUC on `effect`'s causal edges (pipeline/behaviour/agreement.py)."""
    return _number(_cut(inp, effect, threshold).get("role_baseline", {}).get(kind, {}).get("pr_auc"))


def _at(statistic: str, threshold: float) -> str:
    """A statistic of claim (c) at one of CAUSAL_THRESHOLDS: "pr_auc_at_0.05"."""
    return f"{statistic}_at_{threshold_key(threshold)}"


def _agreement(inp: SeedInputs, variant: str, statistic: str = "interaction") -> float:
    """Claims (c) and (c_inv): Spearman's rho between `variant`'s K scores and PRIMARY_EFFECT over
    every K pair, of their pair-specific parts ("interaction": every writer and reader scale
    removed from both, pipeline/behaviour/agreement.py) or of the raw values ("spearman"); no
    threshold decides which edges count (the PR-AUC at each threshold is beside it)."""
    return _number(inp.agreement.get(PRIMARY_EFFECT, {}).get(statistic, {}).get(CLAIM_KIND, {}).get(variant))


def _original_agreement(inp: SeedInputs, pair: Sequence[str], statistic: str = "interaction") -> float:
    """The original's agreement: the better rotation's, which the corrected score must beat
    whichever the library used."""
    return _worst([_agreement(inp, v, statistic) for v in pair], "lower")


# --- the claims, in the order they are reported ---------------------------------------


@claim(
    "a",
    "The original score singles out induction <- previous-token K-composition, more than the "
    "corrected score does.",
    "selectivity of K induction <- previous_token, (T - O) / (|T| + |O|): T its max excess, O the "
    "max excess of every other kind and head pair of the variant (> 0: the strongest of all); "
    "the original's (the less selective rotation) minus the corrected score's",
    label="K induction <- previous-token selectivity: original - corrected",
    threshold=0.0,
    by_hypothesis=True,
    auxiliary={"selectivity": "selectivity of K induction <- previous_token (claim a) of one variant"},
)
def claim_a(seed: Seed) -> Iterator[Row]:
    """The original's selectivity of K induction <- previous_token against the corrected one's."""
    sel = {v: selectivity(seed.scored, v) for v in VARIANTS}
    for v in VARIANTS:
        yield Row("selectivity", sel[v], kind=CLAIM_KIND, variant=v)
    for h, pair in HYPOTHESES.items():
        yield Row("a", _worst([sel[v] for v in pair]) - sel["true"], hypothesis=h, kind=CLAIM_KIND)


@claim(
    "b",
    "The corrected score also shows induction heads composing with a recent-window head.",
    "discoveries (FDR analysis.composition.fdr, against the model's own null) among the true "
    "K-composition pairs induction <- recent_window (> 0.5: at least one)",
    label="K induction <- recent-window: corrected discoveries",
    threshold=0.5,
    rests_on=("true",),
    absent="b_absent",
    auxiliary={
        "relative": "max excess of K induction <- recent_window over induction <- previous_token",
        "b_absent": (
            "1 when the seed has induction <- recent_window K pairs and none composes even when tested "
            "alone: the smallest of their p-values times their number exceeds analysis.composition.fdr "
            "(so no discovery either), else 0; NaN without such pairs"
        ),
        "b_best_raw_z": "the largest corrected raw z among those pairs (beside m's detection_limit)",
    },
)
def claim_b(seed: Seed) -> Iterator[Row]:
    """Discoveries among K induction <- recent_window; whether the composition is absent there; its
    size against induction <- previous_token."""
    value = _cell_discoveries(seed.scored, "true", "induction", "recent_window")
    yield Row("b", value, kind=CLAIM_KIND, variant="true")
    cell = _cell(seed.scored, "true", "induction", "recent_window")
    p = cell["p"].dropna()
    alone = float(p.min() * len(p)) if len(p) else math.nan
    yield Row("b_absent", math.nan if math.isnan(alone) else float(alone > seed.fdr), kind=CLAIM_KIND,
              variant="true")  # fmt: skip
    yield Row("b_best_raw_z", _nanmax(cell["z"]), kind=CLAIM_KIND, variant="true")
    for v in VARIANTS:
        prev = seed.cell(CLAIM_KIND, v, "induction", "previous_token", "max_excess")
        recent = seed.cell(CLAIM_KIND, v, "induction", "recent_window", "max_excess")
        yield Row("relative", recent / prev if prev > 0 else math.nan, kind=CLAIM_KIND, variant=v)


@claim(
    "m",
    "The corrected score finds more composition than the original.",
    "K discoveries (the errata's kind): corrected minus one rotation's, per rotation (a discovery "
    "does not depend on the denominators); holds (fails) only when it holds (fails) against both",
    label="K discoveries: corrected - each rotation",
    threshold=0.0,
    versus=ROTATIONS,
    rests_on=("true", *ROTATIONS),
    auxiliary={
        "discoveries": "pairs discovered at FDR analysis.composition.fdr (pipeline/circuits/significance.py)",
        "m_kind": "discoveries of the kind, corrected minus the rotation's (claim m for Q and V beside K)",
        "placebo_rate": "discoveries among the pairs that cannot compose, per pair: the false-positive rate",
        "raw_z_above_3": "pairs whose raw z against the Haar null exceeds 3 (the uncalibrated rule)",
        "detection_limit": (
            "the raw z a lone composing pair must exceed to be a discovery, from the placebo pairs "
            "alone (pipeline/circuits/significance.py detection_limits)"
        ),
    },
)
def claim_m(seed: Seed) -> Iterator[Row]:
    """K discoveries, corrected minus each rotation's; per kind and measure, the discoveries, the
    placebo pairs' false-positive rate, the raw rule's count and the detection limit beside them."""
    from ..circuits import significance  # numpy and pandas only

    scored, placebo = seed.scored, seed.inp.placebo
    limits = significance.detection_limits(scored, placebo, seed.fdr)
    for v in MEASURES:
        for kind in KINDS:
            yield Row("discoveries", _discoveries(scored, v, kind), kind=kind, variant=v)
            rows = scored[(scored["variant"] == v) & (scored["kind"] == kind)]
            yield Row("raw_z_above_3", (rows["z"] > 3).sum(), kind=kind, variant=v)
            mine = placebo[(placebo["variant"] == v) & (placebo["kind"] == kind)]
            n = int(mine["z"].notna().sum())
            yield Row("placebo_rate", mine["discovery"].sum() / n if n else math.nan, kind=kind, variant=v)
            limit = limits.get(kind, {}).get(v, {}).get("raw_z")
            yield Row("detection_limit", math.nan if limit is None else limit, kind=kind, variant=v)
    for v in ROTATIONS:
        for kind in KINDS:
            m = _discoveries(scored, "true", kind) - _discoveries(scored, v, kind)
            yield Row("m_kind", m, kind=kind, variant=v)
            if kind == CLAIM_KIND:
                yield Row("m", m, kind=kind, variant=v)


@claim(
    "d",
    "The original figure shows only significant K-composition, and only with one layer 0 head.",
    "1 when the paper's plotting of the original (score - baseline > analysis.figures."
    "edge_threshold, its absolute threshold) draws K edges only, all from one layer-0 head, under "
    "both rotations, else 0; decides the denominators only where one hypothesis holds and the "
    "other fails",
    label="the paper's plotting draws only K edges, from one layer-0 head (1: yes)",
    threshold=0.5,
    by_hypothesis=True,
    auxiliary={
        "drawn": "pairs the paper's plotting draws (excess > analysis.figures.edge_threshold)",
        "layer0_k_sources": "distinct layer-0 heads with a drawn K edge",
        "only_k_one_source": (
            "1 when the drawn edges are K only, all from one layer-0 head (claim d, one variant)"
        ),
    },
)
def claim_d(seed: Seed) -> Iterator[Row]:
    """The paper's plotting (one absolute threshold on the excess) of the original."""
    scored = seed.scored
    drawn = {v: scored[(scored["variant"] == v) & (scored["excess"] > seed.edge_threshold)] for v in VARIANTS}
    for v in VARIANTS:
        for kind in KINDS:
            yield Row("drawn", (drawn[v]["kind"] == kind).sum(), kind=kind, variant=v)
        k = drawn[v][drawn[v]["kind"] == CLAIM_KIND]
        sources = len(set(zip(k["src_layer"], k["src_head"], strict=True)))
        yield Row("layer0_k_sources", sources, kind=CLAIM_KIND, variant=v)
    only = {v: only_k_from_one_layer0_head(drawn[v]) for v in VARIANTS}
    for v in VARIANTS:
        yield Row("only_k_one_source", only[v], variant=v)
    for h, pair in HYPOTHESES.items():
        yield Row("d", _worst([only[v] for v in pair]), hypothesis=h)


@claim(
    "c",
    "The corrected score agrees better with the causal ablation than the original.",
    "K: Spearman's rho between the score and the path ablation's effect over every K pair, each "
    "with every writer and reader scale removed (the residual of a writer + reader fit of its log, "
    "per layer pair), corrected minus the better rotation. The effect: how far mean-ablating a's "
    "output in b's keys alone, on held-out text, moves b's own attention pattern (total variation, "
    "mean over query positions and the disjoint batches), whatever b's role. Removing the scales "
    "leaves what is specific to the pair: no score gains from tracking a head's output scale, and "
    "both denominator hypotheses give the same value",
    label="rho with the causal effect, each head's scale removed: score - the better rotation",
    threshold=0.0,
    auxiliary={
        "interaction": (
            "Spearman's rho between the pair-specific parts of the score and of the effect (claim c's "
            "comparison), per measure"
        ),
        "main_share": "share of the log effect's variance that writer and reader scales explain",
        "c_raw": (
            "the raw-effect comparison: Spearman's rho of the score with the raw |effect|, corrected minus "
            "the better rotation (scale included: it rewards a score for tracking the writer's output scale)"
        ),
        "pr_auc": "average precision of the score as a ranking of the causal edges (chance: causal_fraction)",
        "roc_auc": "P(a causal edge outscores a non-causal one)",
        "causal_edges": (
            "edges whose ablation effect reaches min_effect and exceeds its batch-to-batch spread"
        ),
        "causal_fraction": "causal edges over all pairs of the kind: PR-AUC's chance level",
        "top_source": "fraction of later heads whose top ablation source is their top-scoring source",
        "spearman": "Spearman's rho between the raw |ablation effect| and the score, over every pair",
        "role_pr_auc": (
            "PR-AUC of the role-only ranker on the same causal edges, the baseline a score must beat: "
            "it knows only heads.csv's roles and scores a pair 2 for a circuit pair (Q and K: "
            "previous_token or recent_window -> induction), 1 when both heads have a named role, else 0"
        ),
        **{
            _at(statistic, t): f"{words}, a causal edge's effect reaching {t:g} instead of min_effect"
            for t in CAUSAL_THRESHOLDS
            for statistic, words in (
                ("causal_edges", "causal edges"),
                ("pr_auc", "PR-AUC of the score"),
                ("role_pr_auc", "PR-AUC of the role-only ranker"),
            )
        },
    },
)
def claim_c(seed: Seed) -> Iterator[Row]:
    """Each score's PR-AUC (and ROC-AUC) as a ranking of the causal edges, every effect and kind,
    with the role-only ranker's PR-AUC (and, where the heads stage cut the effect at several
    thresholds, all of them again at each); the top-source and Spearman agreement beside them."""
    inp = seed.inp
    for effect in inp.agreement:
        for kind in KINDS:
            causal = _ranking(inp, effect, kind, "true", "causal")
            pairs = _ranking(inp, effect, kind, "true", "pairs")
            yield Row("causal_edges", causal, kind=kind, effect=effect)
            yield Row("causal_fraction", causal / pairs if pairs else math.nan, kind=kind, effect=effect)
            yield Row("role_pr_auc", _role_pr_auc(inp, effect, kind), kind=kind, effect=effect)
            for v in MEASURES:
                for key in ("pr_auc", "roc_auc"):
                    yield Row(key, _ranking(inp, effect, kind, v, key), kind=kind, variant=v, effect=effect)
                t = inp.agreement[effect].get("top_source", {}).get(kind, {}).get(v, {})
                yield Row("top_source", t["match"] / t["heads"] if t.get("heads") else math.nan,
                          kind=kind, variant=v, effect=effect)  # fmt: skip
                r = inp.agreement[effect].get("spearman", {}).get(kind, {}).get(v)
                yield Row("spearman", float(r) if isinstance(r, (int, float)) else math.nan,
                          kind=kind, variant=v, effect=effect)  # fmt: skip
            if "by_threshold" not in inp.agreement[effect]:
                continue
            for t in CAUSAL_THRESHOLDS:
                causal = _ranking(inp, effect, kind, "true", "causal", t)
                yield Row(_at("causal_edges", t), causal, kind=kind, effect=effect)
                yield Row(_at("role_pr_auc", t), _role_pr_auc(inp, effect, kind, t), kind=kind, effect=effect)
                for v in MEASURES:
                    value = _ranking(inp, effect, kind, v, "pr_auc", t)
                    yield Row(_at("pr_auc", t), value, kind=kind, variant=v, effect=effect)
    for effect in inp.agreement:
        for kind in KINDS:
            share = inp.agreement[effect].get("main_share", {}).get(kind)
            yield Row("main_share", _number(share), kind=kind, effect=effect)
            for v in MEASURES:
                r = inp.agreement[effect].get("interaction", {}).get(kind, {}).get(v)
                yield Row("interaction", _number(r), kind=kind, variant=v, effect=effect)
    for h, pair in HYPOTHESES.items():
        value = _agreement(inp, "true", "spearman") - _original_agreement(inp, pair, "spearman")
        yield Row("c_raw", value, hypothesis=h, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)
    value = _agreement(inp, "true") - _original_agreement(inp, ROTATIONS)
    yield Row("c", value, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)


# the claims about the corrected score, with the basis-invariant measure in its place
# (invariant.csv): (a) and (d) are about the original score alone


@claim(
    "b_inv",
    "(b) with the basis-invariant measure as the corrected score: induction heads also compose "
    "with a recent-window head.",
    "discoveries among the invariant K-composition pairs induction <- recent_window (> 0.5: at least one)",
    label="basis-invariant",
    threshold=0.5,
    restates="b",
    rests_on=(INVARIANT,),
)
def claim_b_inv(seed: Seed) -> Iterator[Row]:
    value = _cell_discoveries(seed.scored, INVARIANT, "induction", "recent_window")
    yield Row("b_inv", value, kind=CLAIM_KIND, variant=INVARIANT)


@claim(
    "m_inv",
    "(m) with the basis-invariant measure as the corrected score: it finds more composition "
    "than the original.",
    "K discoveries: invariant minus one rotation's, per rotation",
    label="basis-invariant",
    threshold=0.0,
    restates="m",
    versus=ROTATIONS,
    rests_on=(INVARIANT, *ROTATIONS),
)
def claim_m_inv(seed: Seed) -> Iterator[Row]:
    for v in ROTATIONS:
        m = _discoveries(seed.scored, INVARIANT, CLAIM_KIND) - _discoveries(seed.scored, v, CLAIM_KIND)
        yield Row("m_inv", m, kind=CLAIM_KIND, variant=v)


@claim(
    "c_inv",
    "(c) with the basis-invariant measure as the corrected score: it agrees better with the "
    "causal ablation than the original.",
    "K, the later head's attention pattern on held-out text (as in c): Spearman's rho between the "
    "pair-specific parts of the score and of the effect, invariant minus the better rotation",
    label="basis-invariant",
    threshold=0.0,
    restates="c",
)
def claim_c_inv(seed: Seed) -> Iterator[Row]:
    value = _agreement(seed.inp, INVARIANT) - _original_agreement(seed.inp, ROTATIONS)
    yield Row("c_inv", value, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)


@claim(
    "c_proj",
    "(c) with the projection kernel (the overlap of the writer's and the reader's subspaces, "
    "Yamagiwa et al. 2026) as the corrected score: it agrees better with the causal ablation "
    "than the original.",
    "K, the later head's attention pattern on held-out text (as in c): Spearman's rho between the "
    "pair-specific parts of the score and of the effect, projection kernel minus the better rotation",
    label="projection kernel",
    threshold=0.0,
    restates="c",
)
def claim_c_proj(seed: Seed) -> Iterator[Row]:
    value = _agreement(seed.inp, PROJECTION) - _original_agreement(seed.inp, ROTATIONS)
    yield Row("c_proj", value, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)


# through training (the dynamics stage; pipeline.behaviour.phases): not the errata's claim, the
# question it raises


def _channel_pairs(seed: Seed) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(P, O): channels.csv's K rows of the discovered (corrected) induction <- previous_token pairs,
    and every other later K row."""
    role = seed.inp.heads.set_index(["layer", "head"])["role"]
    k = seed.inp.channels[seed.inp.channels["kind"] == CLAIM_KIND]
    src = role.reindex(pd.MultiIndex.from_frame(k[["src_layer", "src_head"]])).to_numpy()
    dst = role.reindex(pd.MultiIndex.from_frame(k[["dst_layer", "dst_head"]])).to_numpy()
    mine = (src == "previous_token") & (dst == "induction") & k["pair_discovery"].to_numpy(dtype=bool)
    return k[mine], k[~mine]


def _same_writers(P: pd.DataFrame, O: pd.DataFrame, seed: Seed) -> pd.DataFrame:
    """The rows of O (channels.csv's other K rows) whose writer is one of P's and whose reader is
    not an induction head: where else the circuit's writers are read."""
    role = seed.inp.heads.set_index(["layer", "head"])["role"]
    dst = role.reindex(pd.MultiIndex.from_frame(O[["dst_layer", "dst_head"]])).to_numpy()
    writers = set(zip(P["src_layer"], P["src_head"], strict=True))
    mine = [w in writers for w in zip(O["src_layer"], O["src_head"], strict=True)]
    return O[np.asarray(mine, dtype=bool) & (dst != "induction")]


def _mean_log(frame: pd.DataFrame, column: str, over: str | None = None) -> float:
    """mean ln(column / over) over the rows (NaN without a row or with a non-positive value)."""
    x = frame[column].to_numpy(dtype=float) / (frame[over].to_numpy(dtype=float) if over else 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.mean(np.log(x))) if len(x) and (x > 0).all() else math.nan


@claim(
    "e",
    "What the library computed measures the extent to which the induction head's query is built "
    "from the same subspace that the previous token head moved data into.",
    "specific alignment: the mean over the discovered K induction <- previous_token pairs of "
    "ln(alignment / chance), minus the same mean over the same previous-token heads' K pairs into "
    "readers that are not induction heads. alignment: the share of what the previous-token head's "
    "values read (weighted as B C D A weighs it) inside the span of the reader's query input; "
    "chance, rank(W_Q) / d_model, its value for a randomly rotated writer (> 0: the writer's values "
    "read where the induction heads' queries read more than where its other readers' queries read)",
    label="ln(alignment / chance): circuit pairs - the writer's other readers",
    threshold=0.0,
    rests_on=("true",),
    auxiliary={
        "alignment": (
            "mean ln(alignment / chance) over the circuit pairs alone (> 0: aligned beyond a randomly "
            "rotated writer, whatever the writer's other readers show)"
        ),
        "other_alignment": (
            "mean ln(alignment / chance) over the same writers' K pairs into readers that are not "
            "induction heads"
        ),
        "excess": (
            "ln(B C D A / A B C D) (true denominators), mean over those pairs minus over every other "
            "K pair: how much more of the true score the rotated strand keeps for them; exactly "
            "excess_alignment + excess_anisotropy"
        ),
        "excess_alignment": "the part of the excess from the query alignment, 1/2 ln alignment",
        "excess_anisotropy": "the part from the query's anisotropy, 1/2 ln anisotropy (rotated.py)",
        "output_query": (
            "mean ln(output_query_share / chance): the writer's OUTPUT inside the query span (the "
            "literal reading; it is Q-composition's numerator, not what B C D A weighs)"
        ),
        "pairs": "discovered K induction <- previous_token pairs",
        "effective_channels": "their median effective number of channels of the corrected score",
        "top_share": "their median top channel's share of the corrected score",
        "channel_discoveries": "those of them composing mainly through one channel (calibrated)",
        "causal_share": (
            "their median share of the whole path's pattern effect that cutting the top channel "
            "alone carries (heads summary.json channel_ablation)"
        ),
    },
)
def claim_e(seed: Seed) -> Iterator[Row]:
    """The errata's explanation of its bug, in the channels: alignment of the previous-token head's
    value input with the induction head's query input, and where the rotated strand's excess
    comes from (docs/maths.md, "Channels")."""
    P, O = _channel_pairs(seed)
    aligned = _mean_log(P, "alignment", "query_chance")
    theirs = _mean_log(_same_writers(P, O, seed), "alignment", "query_chance")
    yield Row("e", aligned - theirs, kind=CLAIM_KIND)
    yield Row("alignment", aligned, kind=CLAIM_KIND)
    yield Row("other_alignment", theirs, kind=CLAIM_KIND)
    parts = {
        name: 0.5 * (_mean_log(P, column) - _mean_log(O, column))
        for name, column in (("excess_alignment", "alignment"), ("excess_anisotropy", "anisotropy"))
    }
    yield Row("excess", sum(parts.values()), kind=CLAIM_KIND)
    for name, value in parts.items():
        yield Row(name, value, kind=CLAIM_KIND)
    yield Row("output_query", _mean_log(P, "output_query_share", "query_chance"), kind=CLAIM_KIND)
    yield Row("pairs", float(len(P)), kind=CLAIM_KIND)
    yield Row("effective_channels", float(P["effective_channels"].median()) if len(P) else math.nan,
              kind=CLAIM_KIND)  # fmt: skip
    yield Row("top_share", float(P["top_share"].median()) if len(P) else math.nan, kind=CLAIM_KIND)
    yield Row("channel_discoveries", float(P["discovery"].sum()) if len(P) else math.nan, kind=CLAIM_KIND)
    mine = {(f"{r.src_layer}.{r.src_head}", f"{r.dst_layer}.{r.dst_head}") for r in P.itertuples()}
    shares = [
        p["causal_share"]
        for p in seed.inp.channel_ablation.get("pairs", [])
        if (p["src"], p["dst"]) in mine and p["causal_share"] is not None
    ]
    yield Row("causal_share", float(np.median(shares)) if shares else math.nan, kind=CLAIM_KIND)


@claim(
    "t",
    "The original score sees the induction circuit form earlier than the corrected one.",
    "steps from the original's clear step to the corrected's (clear step: the first checkpoint "
    "from which the top induction <- previous-token pair's K-composition is a discovery at "
    "every later one), per rotation (> 0: the original is earlier); holds (fails) only when it "
    "holds (fails) against both",
    label="steps from each rotation's clear step to the corrected one's",
    threshold=0.0,
    versus=ROTATIONS,
    rests_on=("true", *ROTATIONS),
    auxiliary={
        "phase_step": "the first checkpoint at which the best induction score reaches 0.5 (dynamics)",
        "clear_step": "the first checkpoint from which the pair's K-composition stays a discovery (dynamics)",
        "lag": "clear step minus phase step, in steps (< 0: the measure sees the circuit first)",
        "z_growth": "slope of the pair's raw K z per 100 steps over the 500 steps before the phase step",
        "z_growth_ratio": "z growth of the original (the slower rotation) over the corrected score's",
    },
)
def claim_t(seed: Seed) -> Iterator[Row]:
    """When each measure's K-composition of the top induction <- previous-token pair becomes a
    discovery for good, against the induction phase change (pipeline.behaviour.phases)."""
    steps, fdr = seed.inp.steps, seed.fdr
    clear = {m: phases.clear_step(steps, f"q_{m}", fdr) for m in MEASURES}
    growth = {m: phases.z_growth(steps, m) for m in MEASURES}
    yield Row("phase_step", phases.phase_step(steps))
    for m, lag in phases.lags(steps, fdr).items():
        yield Row("clear_step", clear[m], kind=CLAIM_KIND, variant=m)
        yield Row("lag", lag, kind=CLAIM_KIND, variant=m)
        yield Row("z_growth", growth[m], kind=CLAIM_KIND, variant=m)
    ratio = [growth[v] / growth["true"] if growth["true"] > 0 else math.nan for v in ERRATA]
    yield Row("z_growth_ratio", _worst(ratio), kind=CLAIM_KIND)
    for v in ROTATIONS:
        yield Row("t", phases.clear_gap(steps, "true", v, fdr), kind=CLAIM_KIND, variant=v)


HYPOTHESIS_LABELS = {
    "rotated": "rotated denominators (||B A|| ||D C||)",
    "true": "true denominators (||A B|| ||C D||)",
    NONE: "either (does not depend on the denominators)",
    # the rows of a claim computed against each rotation (Claim.versus)
    "errata_bcda": "against B C D A (either denominators)",
    "errata_dabc": "against D A B C (either denominators)",
}

# what the other statistics of the long table mean: the role ablation's, then every claim's own
STATISTICS = {
    **{
        f"{role}_{effect}_loss_effect": f"loss change (nats) on {where} when every {role} head is "
        "mean-ablated at once (positive: the heads lower the loss there)"
        for role in ABLATED_ROLES
        for effect, where in (("heldout", "held-out text"), ("probe", "the repeated probe"))
    },
    **{
        f"{role}_placebo_p": f"exact permutation p that the {role} heads' held-out loss change is larger "
        "than that of other heads: (1 + sets at or above) / (1 + sets), over every other set of as many "
        "heads of the same layers (analysis.heads.placebo_sets at most, drawn uniformly beyond)"
        for role in ABLATED_ROLES
    },
    **{
        f"{role}_placebo_p_lower": f"the same p in the other direction, that the {role} heads' held-out "
        "loss change is smaller than that of other heads: (1 + sets at or below) / (1 + sets)"
        for role in ABLATED_ROLES
    },
    **{
        f"{role}_serves_heldout": f"1 when the {role} heads' held-out loss change reaches "
        f"analysis.heads.min_effect and its placebo_p <= {SERVES_LEVEL:g}, else 0 (mean: the fraction "
        "of seeds)"
        for role in ABLATED_ROLES
    },
    **{statistic: words for c in CLAIMS.values() for statistic, words in c.auxiliary.items()},
}
