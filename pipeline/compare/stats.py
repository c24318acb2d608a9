"""Across seeds: composition between role groups, the errata's claims per seed as one long
table, then means with bootstrap confidence intervals and a verdict per claim.

Head indices are arbitrary across seeds (head 3 of one model is not head 3 of another),
so seeds are compared through the roles the heads stage gives each head. For a kind, a
variant and a role-group pair "dst <- src" (say induction <- previous_token), the cell is
every head pair whose earlier head has role src and whose later head has role dst. A
pair's composition is its *excess*, score - baseline_mean (what the paper plots); per
cell, groups.csv keeps n_pairs, max_excess, mean_excess and max_z.

Every per-seed number is a row of the long table (`LONG_COLUMNS`): seed, claim,
hypothesis (denominators: rotated, true, or "-"), kind, variant, effect (the ablation
effect, or "-"), statistic, value. A claim's own number has statistic == the claim's
name (`pipeline.compare.claims`); the rest are what it is built from. Wide views (the
report's tables) are pivots of it.

The composition tables carry six measures: scores.csv's five variants and invariant.csv's
basis-invariant scores as variant `invariant` (`read.read_seed`). Claims (b), (mz) and (c)
are also tested with the invariant measure in the corrected score's place (b_inv, mz_inv,
c_inv), and claim (t) reads the dynamics stage's steps.tsv: when each measure's K z of the
top induction <- previous-token pair clears its null, against the induction phase change
(`pipeline.phases`).

A statistic is NaN for a seed that lacks the heads it needs (no recent-window head, say);
such seeds are left out of it and counted. Across seeds: the mean and a percentile
bootstrap interval (seeded; `analysis.compare`); a verdict per claim and hypothesis:
holds (the interval lies past the threshold), fails (before it), inconclusive (it
straddles, or fewer than two seeds), untestable (no seed has the heads).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline import phases, tables
from pipeline.compare.claims import CLAIM_KIND, CLAIMS, PRIMARY_EFFECT, threshold
from pipeline.compare.read import TRAIN_METRICS, SeedInputs
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import (
    CURVE_COLUMNS,
    ERRATA,
    HYPOTHESES,
    INVARIANT,
    KINDS,
    MEASURES,
    ROLES,
    VARIANTS,
    excess,
)

GROUP_KEYS = list(tables.GROUP_KEYS)
DIMENSIONS = list(tables.DIMENSIONS)
LONG_COLUMNS = list(tables.CLAIMS_COLUMNS)
STATS_COLUMNS = list(tables.STATS_COLUMNS)
NONE = "-"  # a dimension that does not apply to a row


@dataclass
class Comparison:
    claims: pd.DataFrame  # the long table, LONG_COLUMNS, every seed
    stats: pd.DataFrame  # STATS_COLUMNS: each statistic across seeds
    summary: dict  # the headline: verdicts with intervals (DVC metrics)
    groups: pd.DataFrame  # seed + group_composition, every seed
    roles: pd.DataFrame  # seed + heads.csv, every seed
    curves: pd.DataFrame  # seed + curve.tsv, every seed
    mean_curve: pd.DataFrame  # curve.tsv averaged over seeds at each step (DVC plots)


# --- one seed ------------------------------------------------------------------------


def with_roles(scores: pd.DataFrame, heads: pd.DataFrame, where: str = "heads.csv") -> pd.DataFrame:
    """scores.csv plus src_role, dst_role and excess = score - baseline_mean."""
    role = heads.set_index(["layer", "head"])["role"]
    if role.index.has_duplicates:
        raise UserError(where, "lists a head twice")
    out = scores.copy()
    for side in ("src", "dst"):
        key = pd.MultiIndex.from_arrays([out[f"{side}_layer"], out[f"{side}_head"]])
        out[f"{side}_role"] = role.reindex(key).to_numpy()
        missing = out[f"{side}_role"].isna()
        if missing.any():
            row = out[missing].iloc[0]
            head = (int(row[f"{side}_layer"]), int(row[f"{side}_head"]))
            raise UserError(where, "has no role for a head the scores name", head)
    out["excess"] = excess(out)
    return out


def _order(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Kinds, variants and roles in their fixed order (unknown values after, alphabetically)."""
    rank = {v: i for i, v in enumerate((*KINDS, *MEASURES, *ROLES))}
    key = lambda col: col.map(lambda v: (rank.get(v, len(rank)), str(v)))  # noqa: E731
    return frame.sort_values(list(keys), key=key, kind="stable").reset_index(drop=True)


def group_composition(scored: pd.DataFrame) -> pd.DataFrame:
    """One row per non-empty cell (kind, variant, dst_role, src_role): n_pairs, max/mean excess, max z.

    NaN scores (an undefined errata score) are skipped; a cell of only NaN stays NaN.
    """
    out = (
        scored.groupby(GROUP_KEYS, sort=False)
        .agg(
            n_pairs=("excess", "size"),
            max_excess=("excess", "max"),
            mean_excess=("excess", "mean"),
            max_z=("z", "max"),
        )
        .reset_index()
    )
    return _order(out, GROUP_KEYS)


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


def seed_statistics(
    inp: SeedInputs, scored: pd.DataFrame, groups: pd.DataFrame, edge_threshold: float, cfg: CompareConfig
) -> pd.DataFrame:
    """The long table of one seed: LONG_COLUMNS (module doc)."""
    rows: list[dict] = []

    def add(claim: str, statistic: str, value: float, hypothesis=NONE, kind=NONE, variant=NONE, effect=NONE):
        rows.append({"seed": inp.seed, "claim": claim, "hypothesis": hypothesis, "kind": kind,
                     "variant": variant, "effect": effect, "statistic": statistic,
                     "value": float(value)})  # fmt: skip

    for key in TRAIN_METRICS:
        add("training", key, inp.metrics[key])
    counts = inp.heads["role"].value_counts()
    for role in (*ROLES, *sorted(set(counts.index) - set(ROLES))):
        add("roles", role, counts.get(role, 0))

    cell = groups.set_index(GROUP_KEYS)

    def cell_value(kind: str, variant: str, dst: str, src: str, column: str) -> float:
        key = (kind, variant, dst, src)
        return float(cell.at[key, column]) if key in cell.index else math.nan

    # (a) selectivity of K induction <- previous_token
    sel = {v: selectivity(scored, v) for v in VARIANTS}
    for v in VARIANTS:
        add("a", "selectivity", sel[v], kind=CLAIM_KIND, variant=v)
    for h, pair in HYPOTHESES.items():
        add("a", "a", _worst([sel[v] for v in pair]), hypothesis=h, kind=CLAIM_KIND)

    # (b) true K induction <- recent_window against the null; its size relative to induction <- previous_token
    add(
        "b",
        "b",
        cell_value(CLAIM_KIND, "true", "induction", "recent_window", "max_z"),
        kind=CLAIM_KIND,
        variant="true",
    )
    for v in VARIANTS:
        prev = cell_value(CLAIM_KIND, v, "induction", "previous_token", "max_excess")
        recent = cell_value(CLAIM_KIND, v, "induction", "recent_window", "max_excess")
        add("b", "relative", recent / prev if prev > 0 else math.nan, kind=CLAIM_KIND, variant=v)

    # (m) and (d): the paper's plotting, one absolute threshold on the excess
    drawn = {v: scored[(scored["variant"] == v) & (scored["excess"] > edge_threshold)] for v in VARIANTS}
    for v in VARIANTS:
        for kind in KINDS:
            add("m", "drawn", (drawn[v]["kind"] == kind).sum(), kind=kind, variant=v)
    for h, pair in HYPOTHESES.items():
        add("m", "m", _worst([len(drawn["true"]) - len(drawn[v]) for v in pair]), hypothesis=h)
    only = {v: only_k_from_one_layer0_head(drawn[v]) for v in VARIANTS}
    for v in VARIANTS:
        k = drawn[v][drawn[v]["kind"] == CLAIM_KIND]
        add(
            "d",
            "layer0_k_sources",
            len(set(zip(k["src_layer"], k["src_head"], strict=True))),
            kind=CLAIM_KIND,
            variant=v,
        )
        add("d", "only_k_one_source", only[v], variant=v)
    for h, pair in HYPOTHESES.items():
        add("d", "d", _worst([only[v] for v in pair]), hypothesis=h)

    # (mz) pairs against the null, scale-free (z does not depend on the denominators)
    above = {v: scored[(scored["variant"] == v) & (scored["z"] > cfg.z_threshold)] for v in VARIANTS}
    for v in VARIANTS:
        for kind in KINDS:
            add("mz", "pairs_z", (above[v]["kind"] == kind).sum(), kind=kind, variant=v)
    add("mz", "mz", _worst([len(above["true"]) - len(above[v]) for v in ERRATA]))

    # (c) agreement with the ablation: top source and Spearman, every effect and kind
    top: dict[tuple[str, str, str], float] = {}
    rho: dict[tuple[str, str, str], float] = {}
    for effect, measures in inp.agreement.items():
        for kind in KINDS:
            for v in MEASURES:
                t = measures.get("top_source", {}).get(kind, {}).get(v, {})
                top[effect, kind, v] = t["match"] / t["heads"] if t.get("heads") else math.nan
                r = measures.get("spearman", {}).get(kind, {}).get(v)
                rho[effect, kind, v] = float(r) if isinstance(r, (int, float)) else math.nan
                add("c", "top_source", top[effect, kind, v], kind=kind, variant=v, effect=effect)
                add("c", "spearman", rho[effect, kind, v], kind=kind, variant=v, effect=effect)
    key = (PRIMARY_EFFECT, CLAIM_KIND)
    for h, pair in HYPOTHESES.items():
        gain = top.get((*key, "true"), math.nan) - _worst(
            [top.get((*key, v), math.nan) for v in pair], "lower"
        )
        add("c", "c", gain, hypothesis=h, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)
        gain = rho.get((*key, "true"), math.nan) - _worst(
            [rho.get((*key, v), math.nan) for v in pair], "lower"
        )
        add("c", "spearman_gain", gain, hypothesis=h, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)

    # (b), (mz) and (c) with the basis-invariant measure as the corrected score
    add(
        "b_inv",
        "b_inv",
        cell_value(CLAIM_KIND, INVARIANT, "induction", "recent_window", "max_z"),
        kind=CLAIM_KIND,
        variant=INVARIANT,
    )
    invariant_above = scored[(scored["variant"] == INVARIANT) & (scored["z"] > cfg.z_threshold)]
    for kind in KINDS:
        add("mz_inv", "pairs_z", (invariant_above["kind"] == kind).sum(), kind=kind, variant=INVARIANT)
    add("mz_inv", "mz_inv", _worst([len(invariant_above) - len(above[v]) for v in ERRATA]))
    for h, pair in HYPOTHESES.items():
        gain = top.get((*key, INVARIANT), math.nan) - _worst(
            [top.get((*key, v), math.nan) for v in pair], "lower"
        )
        add("c_inv", "c_inv", gain, hypothesis=h, kind=CLAIM_KIND, effect=PRIMARY_EFFECT)

    # (t) through training: when each measure's K z of the top induction <- previous-token pair
    # clears its null, against the induction phase change (pipeline.phases)
    z = cfg.z_threshold
    clear = {m: phases.clear_step(inp.steps, f"z_{m}", z) for m in MEASURES}
    add("t", "phase_step", phases.phase_step(inp.steps))
    for m, lag in phases.lags(inp.steps, z).items():
        add("t", "clear_step", clear[m], kind=CLAIM_KIND, variant=m)
        add("t", "lag", lag, kind=CLAIM_KIND, variant=m)
    add("t", "t", _worst([clear["true"] - clear[v] for v in ERRATA]), kind=CLAIM_KIND)
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


# --- across seeds --------------------------------------------------------------------


def bootstrap_ci(values: Sequence[float], cfg: CompareConfig) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean over seeds (NaN left out); None with fewer than two.

    Every statistic is resampled with the same seeded generator, so the intervals do not
    depend on which other statistics exist.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return None, None
    if np.ptp(x) == 0:  # every seed agrees: the interval is that value
        return float(x[0]), float(x[0])
    import scipy.stats  # here, not at the top: the report stage imports this package only for names

    result = scipy.stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=cfg.ci,
        n_resamples=cfg.bootstrap_samples,
        method="percentile",
        rng=np.random.default_rng(cfg.bootstrap_seed),
    )
    lo, hi = result.confidence_interval
    return float(lo), float(hi)


def verdict(stat: dict, limit: float) -> str:
    """holds / fails / inconclusive / untestable: where the interval lies relative to `limit`."""
    if stat["n"] == 0:
        return "untestable"
    if stat["lo"] is None:
        return "inconclusive"
    if stat["lo"] > limit:
        return "holds"
    if stat["hi"] < limit:
        return "fails"
    return "inconclusive"


def across_seeds(claims: pd.DataFrame, cfg: CompareConfig) -> pd.DataFrame:
    """STATS_COLUMNS: each statistic's n, mean and interval over seeds, in the long table's order."""
    rows = []
    for key, group in claims.groupby(DIMENSIONS, sort=False):
        x = group["value"].astype(float)
        n = int(x.notna().sum())
        lo, hi = bootstrap_ci(x, cfg)
        rows.append(
            dict(zip(DIMENSIONS, key, strict=True))
            | {"n": n, "mean": float(x.mean()) if n else math.nan, "lo": lo, "hi": hi}
        )
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def summarize(claims: pd.DataFrame, stats: pd.DataFrame, cfg: CompareConfig) -> dict:
    """The headline (summary.json): per claim and hypothesis, the verdict, the seeds where it
    holds, the mean and interval; the mean of the training metrics and of the role counts."""
    n_seeds = int(claims["seed"].nunique())
    summary: dict = {"n_seeds": n_seeds, "claims": {}}
    for name, claim in CLAIMS.items():
        limit = threshold(claim, cfg.z_threshold)
        own = stats[(stats["claim"] == name) & (stats["statistic"] == name)].set_index("hypothesis")
        per_seed = claims[(claims["claim"] == name) & (claims["statistic"] == name)]
        summary["claims"][name] = {}
        for h in claim.hypotheses():
            s = own.loc[h].to_dict() if h in own.index else {"n": 0, "mean": None, "lo": None, "hi": None}
            values = per_seed.loc[per_seed["hypothesis"] == h, "value"].astype(float)
            summary["claims"][name][h] = {
                "verdict": verdict(s, limit),
                "seeds_holding": int((values > limit).sum()),
                "seeds_tested": int(values.notna().sum()),
                "mean": s["mean"],
                "lo": s["lo"],
                "hi": s["hi"],
                "threshold": limit,
            }
    for section in ("training", "roles"):
        rows = stats[stats["claim"] == section]
        summary[section] = dict(zip(rows["statistic"], rows["mean"], strict=True))
    return _json_safe(summary)


def summary_json(summary: dict) -> str:
    """summary.json's text: keys in the order built (DVC shows columns in file order: verdict
    before numbers), strict JSON (no NaN), so equal summaries give equal bytes."""
    return json.dumps(summary, indent=2, allow_nan=False) + "\n"


def _json_safe(obj):
    """NaN -> None (JSON null): summary.json must be valid JSON for DVC and browsers."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


def mean_curve(curves: pd.DataFrame) -> pd.DataFrame:
    """curve.tsv averaged over seeds at each step; every seed must have evaluated at the same steps."""
    steps = curves.groupby("seed")["step"].apply(tuple)
    if steps.nunique() > 1:
        problem = "seeds were evaluated at different steps (different train configs?)"
        raise UserError("curve.tsv", problem, sorted(steps.index))
    mean = curves.drop(columns="seed").groupby("step", sort=True).mean().reset_index()[list(CURVE_COLUMNS)]
    return mean.astype({"tokens": curves["tokens"].dtype})  # the same at each step: keep it an integer


def compare(inputs: Sequence[SeedInputs], cfg: CompareConfig, edge_threshold: float) -> Comparison:
    """The per-seed long table and its summary across seeds, in the order of `inputs`.
    `edge_threshold`: the paper's plotting threshold on the excess (analysis.figures)."""
    if not inputs:
        raise UserError("seeds", "no seeds to compare", [])
    long, groups, roles, curves = [], [], [], []
    for inp in inputs:
        scored = with_roles(inp.scores, inp.heads, where=f"heads.csv of seed {inp.seed}")
        g = group_composition(scored)
        long.append(seed_statistics(inp, scored, g, edge_threshold, cfg))
        groups.append(g.assign(seed=inp.seed))
        roles.append(inp.heads.assign(seed=inp.seed))
        curves.append(inp.curve.assign(seed=inp.seed))
    claims = pd.concat(long, ignore_index=True)
    stats = across_seeds(claims, cfg)

    def seed_first(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[["seed", *[c for c in frame.columns if c != "seed"]]].reset_index(drop=True)

    all_curves = seed_first(pd.concat(curves))
    return Comparison(
        claims=claims,
        stats=stats,
        summary=summarize(claims, stats, cfg),
        groups=seed_first(pd.concat(groups)),
        roles=seed_first(pd.concat(roles)),
        curves=all_curves,
        mean_curve=mean_curve(all_curves),
    )
