"""The formats and domains of the claims' statistics, for every printed number.

Each statistic's domain (the values it can take, `DOMAINS`: PR-AUC in [0, 1], Spearman's rho in [-1,
1], counts >= 0) and its one format (`Formats`): its decimals from its scale, every interval clipped
to the domain, no zero with a sign. Declared beside the claims' registry (`claims.py`), whose
statistics they are; the report and the generated docs text print with them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Domain:
    """The values a statistic can take: its range, and whether each seed's value is a whole
    number (a count, a step); the mean over seeds of either is a fraction."""

    lo: float = -math.inf
    hi: float = math.inf
    whole: bool = False

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def clip(self, lo: float, hi: float) -> tuple[float, float]:
        """An interval inside the range. The t interval is symmetric about the mean and knows no
        bound, so a PR-AUC of 0.84 over three seeds can reach 1.03; the value itself cannot. Clipping
        never changes whether the interval lies above a threshold inside the range (a verdict)."""
        return (lo if missing(lo) else max(lo, self.lo), hi if missing(hi) else min(hi, self.hi))


UNIT = Domain(0.0, 1.0)  # fractions, rates, shares, PR-AUC and ROC-AUC, p-values
INDICATOR = Domain(0.0, 1.0, whole=True)  # 0 or 1 per seed; its mean, the fraction of seeds with 1
CORRELATION = Domain(-1.0, 1.0)  # Spearman's rho, selectivity ((T - O) / (|T| + |O|))
DIFFERENCE = Domain(-2.0, 2.0)  # one of those minus another
COUNT = Domain(0.0, whole=True)  # pairs, edges, heads, discoveries, steps
WHOLE = Domain(whole=True)  # a difference of counts or of steps
NONNEGATIVE = Domain(0.0)
REAL = Domain()

# Every statistic of the long table (pipeline/compare/claims.py STATISTICS, and each claim's own)
# and the values it can take: the one place that decides how its intervals are clipped and whether
# its values are whole. `tests/test_compare_formats.py` checks that every statistic is here.
DOMAINS: dict[str, Domain] = {
    # the claims' own numbers
    "a": DIFFERENCE, "b": COUNT, "b_inv": COUNT, "c": DIFFERENCE, "c_inv": DIFFERENCE, "c_proj": DIFFERENCE,
    "d": INDICATOR, "e": REAL, "m": WHOLE, "m_inv": WHOLE, "t": WHOLE,
    # (a), (b)
    "selectivity": CORRELATION, "relative": REAL, "b_absent": INDICATOR, "b_best_raw_z": REAL,
    # (m)
    "discoveries": COUNT, "m_kind": WHOLE, "placebo_rate": UNIT, "raw_z_above_3": COUNT,
    "detection_limit": REAL,
    # (d)
    "drawn": COUNT, "layer0_k_sources": COUNT, "only_k_one_source": INDICATOR,
    # (c), and each of its `_at_<threshold>` statistics
    "pr_auc": UNIT, "roc_auc": UNIT, "role_pr_auc": UNIT, "causal_edges": COUNT, "causal_fraction": UNIT,
    "top_source": UNIT, "spearman": CORRELATION, "interaction": CORRELATION, "main_share": UNIT,
    "c_raw": DIFFERENCE,
    # (e)
    "alignment": REAL, "other_alignment": REAL,
    "excess": REAL, "excess_alignment": REAL, "excess_anisotropy": REAL, "output_query": REAL,
    "pairs": COUNT, "effective_channels": Domain(1.0), "top_share": UNIT, "channel_discoveries": COUNT,
    "causal_share": NONNEGATIVE,
    # (t)
    "phase_step": COUNT, "clear_step": COUNT, "lag": WHOLE, "z_growth": REAL, "z_growth_ratio": REAL,
}  # fmt: skip
# the rows that are not a claim's: training's final values (a name that means another thing in
# another claim), the role ablation's by their ending (one statistic per ablated role), the roles'
CLAIM_DOMAINS: dict[str, dict[str, Domain]] = {
    "training": {"eval_loss": NONNEGATIVE, "induction": UNIT, "prev_token": UNIT},
}
SUFFIX_DOMAINS = {
    "_loss_effect": REAL, "_placebo_p": UNIT, "_placebo_p_lower": UNIT, "_serves_heldout": INDICATOR,
}  # fmt: skip
WHOLE_CLAIMS = ("roles",)  # every statistic a count (heads with the role)
AT_THRESHOLD = re.compile(r"_at_[0-9.]+$")  # claim (c) again at a threshold: the same statistic


def base_statistic(statistic: str) -> str:
    """`pr_auc_at_0.05` -> `pr_auc`: a statistic at a threshold is the same statistic."""
    return AT_THRESHOLD.sub("", statistic)


def domain(claim: str, statistic: str, default: Domain | None = REAL) -> Domain | None:
    """The values `statistic` of `claim` can take (DOMAINS); `default` for one not listed."""
    if claim in WHOLE_CLAIMS:
        return COUNT
    if statistic in CLAIM_DOMAINS.get(claim, {}):
        return CLAIM_DOMAINS[claim][statistic]
    for end, found in SUFFIX_DOMAINS.items():
        if claim == "role_ablation" and statistic.endswith(end):
            return found
    return DOMAINS.get(base_statistic(statistic), default)


def missing(value) -> bool:
    """None or NaN: a number the table does not have."""
    return value is None or (isinstance(value, float) and math.isnan(value))


# the domains and formats in words, for the tables that print them
CLIPPING = (
    "Intervals are clipped to the range the statistic can take (PR-AUC, ROC-AUC, shares, rates and "
    "0/1 indicators to [0, 1], Spearman's rho and selectivity to [-1, 1], their differences to "
    "[-2, 2], counts and steps to 0 or more): the t interval is symmetric about the mean and knows "
    "no bound. Every number of a statistic has the same decimals (three significant digits at its "
    "largest); counts per seed are whole."
)

SIGNIFICANT = 3  # digits of a statistic's largest number; its other numbers get as many decimals
MAX_PLACES = 6


def places(scale: float, whole: bool = False) -> int:
    """Decimals for the numbers of one statistic whose largest magnitude is `scale`: three
    significant digits there (0.84 -> 0.840; 12.3; 1234), so a statistic's numbers share one
    format whatever their own size. The mean of whole numbers: a tenth (none from 100 on)."""
    if whole:
        return 0 if scale >= 100 else 1
    if not (scale > 0 and math.isfinite(scale)):
        return 2
    return min(MAX_PLACES, max(0, SIGNIFICANT - 1 - math.floor(math.log10(scale))))


def fixed(value, decimals: int) -> str:
    """`value` to `decimals` places; a dash when missing; never a signed zero ("-0.00": a small
    negative number rounded, or -0.0, is just zero at this precision)."""
    if missing(value):
        return "–"
    if isinstance(value, bool):
        return str(value)
    text = f"{float(value):.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


@dataclass(frozen=True)
class Format:
    """How every number of one statistic is printed."""

    domain: Domain
    places: int  # decimals of the mean and its interval (and of each seed's value, unless whole)

    def value(self, x) -> str:
        """One seed's value: a whole number without decimals."""
        return fixed(x, 0 if self.domain.whole else self.places)

    def mean(self, x) -> str:
        return fixed(x, self.places)

    def interval(self, mean, lo, hi) -> str:
        """ "0.84 [0.65, 1.00]": the mean and its interval, clipped to the statistic's range."""
        if missing(lo) or missing(hi):
            return self.mean(mean)
        lo, hi = self.domain.clip(lo, hi)
        return f"{self.mean(mean)} [{self.mean(lo)}, {self.mean(hi)}]"


class Formats:
    """One Format per statistic (claim and statistic, a threshold's alike), wherever on the page
    its numbers appear: its domain, and its decimals. A bounded statistic's come from its range
    (two for [0, 1], [-1, 1] and [-2, 2]: PR-AUC reads 0.84 and 1.00 in every row and run, the
    role-only ranker's beside it too); an unbounded one's from its largest mean or interval end
    over every row of stats.csv (each kind, variant and effect)."""

    def __init__(self, stats: pd.DataFrame):
        scale: dict[tuple[str, str], float] = {}
        for r in stats.itertuples(index=False):
            key = (r.claim, base_statistic(r.statistic))
            ends = domain(r.claim, r.statistic).clip(r.lo, r.hi)
            finite = [abs(float(x)) for x in (r.mean, *ends) if not missing(x) and math.isfinite(x)]
            scale[key] = max([scale.get(key, 0.0), *finite])
        self._scale = scale

    def __call__(self, claim: str, statistic: str) -> Format:
        d = domain(claim, statistic)
        if d.bounded:
            return Format(d, places(max(abs(d.lo), abs(d.hi))))
        return Format(d, places(self._scale.get((claim, base_statistic(statistic)), 0.0), d.whole))
