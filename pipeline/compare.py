"""Across seeds: role counts, composition between role groups, and the errata's claims,
one row per seed, then means with bootstrap confidence intervals over the seeds.

Head indices are arbitrary across seeds (head 3 of one model is not head 3 of another),
so seeds are compared through the roles the heads stage gives each head. For a kind
(Q, K, V), a variant (`true`, `errata_bcda`, `errata_dabc`) and a role-group pair
"dst <- src" (say induction <- previous_token), the cell is every head pair whose
earlier head has role src and whose later head has role dst. A pair's composition is its
*excess*, score - baseline_mean (the score above what random matrices of the same shapes
give, as the paper plots); per cell, groups.csv keeps

    n_pairs       head pairs in the cell
    max_excess    the strongest pair: "an induction head composes with a previous-token head"
    mean_excess   the average pair (dilutes a strong pair among unrelated ones)
    max_z         the strongest pair against the spectrum-preserving null (composition stage)

Claims of the errata (seed/framework-errata.txt), tested per seed:

(a) the errata score singles out induction <- previous_token K-composition. For a variant v,
    T = max excess in that K cell, O = max excess over every other (kind, head pair) of v, and
    selectivity_v = (T - O) / (|T| + |O|), in [-1, 1]; > 0 exactly when the cell holds the
    strongest composition of all three kinds. Per seed: a = min over the errata variants of
    selectivity (both must single it out); holds when a > 0. selectivity_true is the contrast.
(b) the corrected score also shows induction heads composing with a recent-window head:
    b = max z of the true K cell induction <- recent_window; holds when b > z_threshold.
    Also b_rel_v = (max excess of induction <- recent_window) / (max excess of induction <-
    previous_token) per variant: how much of the previous-token composition the recent-window
    composition reaches under each score.
(c) which variant agrees better with the ablation: the heads stage's Spearman correlation
    between each variant's scores and the ablation effects. c = rho_true - max over errata
    variants of rho, for K; > 0: the corrected score agrees better. (Each kind in seeds.csv.)

A statistic is NaN for a seed that lacks the heads it needs (no recent-window head, say);
such seeds are left out of that claim and counted. Across seeds: the mean and a percentile
bootstrap interval (seeded; `analysis.compare`); a verdict per claim: holds (the interval
lies past the threshold), fails (the interval lies before it), inconclusive (it straddles,
or fewer than two seeds), untestable (no seed has the heads).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import io
from pipeline.config import CompareConfig
from pipeline.errors import UserError
from pipeline.tables import CURVE_COLUMNS, ERRATA, KINDS, ROLES, SCORES_COLUMNS, VARIANTS, excess, read_csv

HEADLINE_GROUPS = {"ind_prev": ("induction", "previous_token"), "ind_recent": ("induction", "recent_window")}
CLAIM_KIND = "K"  # the errata is about induction heads' K-composition
HEADS_COLUMNS = ("layer", "head", "role")
TRAIN_METRICS = ("eval_loss", "induction", "prev_token")  # final values, from metrics.json
GROUP_KEYS = ["kind", "variant", "dst_role", "src_role"]

CLAIMS = {
    "a": {
        "statement": "The errata (original) score singles out induction <- previous-token K-composition.",
        "column": "a",
        "threshold": 0.0,
        "meaning": "min over the errata variants of the selectivity of K induction <- previous_token "
        "(> 0: the strongest composition of all kinds and head pairs)",
    },
    "b": {
        "statement": "The corrected score also shows induction heads composing with a recent-window head.",
        "column": "b",
        "threshold": None,  # analysis.compare.z_threshold
        "meaning": "max z (against the spectrum-preserving null) of true K-composition induction <- recent_window",
    },
    "c": {
        "statement": "The corrected score agrees better with the ablation than the errata score.",
        "column": "c",
        "threshold": 0.0,
        "meaning": "Spearman rho with the ablation effects, K: true minus the better errata variant",
    },
}


@dataclass
class SeedInputs:
    """What one seed's stages wrote, as read from disk."""

    seed: int
    scores: pd.DataFrame  # composition scores.csv
    heads: pd.DataFrame  # heads.csv: layer, head, role, scores
    spearman: dict  # heads summary.json "spearman": {kind: {variant: rho}}
    metrics: dict  # train metrics.json
    curve: pd.DataFrame  # train curve.tsv


@dataclass
class Comparison:
    seeds: pd.DataFrame  # one row per seed
    stats: pd.DataFrame  # one row per numeric column of `seeds`: n, mean, lo, hi
    summary: dict  # the headline: claims and a few means with intervals (DVC metrics)
    groups: pd.DataFrame  # seed + group_composition, every seed
    roles: pd.DataFrame  # seed + heads.csv, every seed
    curves: pd.DataFrame  # seed + curve.tsv, every seed
    mean_curve: pd.DataFrame  # curve.tsv averaged over seeds at each step (DVC plots)


# --- reading -------------------------------------------------------------------------


def read_seed(seed: int, train: Path, composition: Path, heads: Path) -> SeedInputs:
    """Read seed `seed`'s files from the stages' output directories (`<dir>/seed<N>/`)."""
    sub = f"seed{seed}"
    summary_path = heads / sub / "summary.json"
    summary = io.read_json(summary_path)
    spearman = summary.get("spearman") if isinstance(summary, dict) else None
    if not isinstance(spearman, dict):
        raise UserError(f"{summary_path}: spearman", "missing: expected {kind: {variant: rho}}")
    metrics_path = train / sub / "metrics.json"
    metrics = io.read_json(metrics_path)
    for key in TRAIN_METRICS:
        if not isinstance(metrics, dict) or key not in metrics:
            raise UserError(f"{metrics_path}: {key}", "missing")
    return SeedInputs(
        seed=seed,
        scores=read_csv(composition / sub / "scores.csv", SCORES_COLUMNS),
        heads=read_csv(heads / sub / "heads.csv", HEADS_COLUMNS),
        spearman=spearman,
        metrics=metrics,
        curve=read_csv(train / sub / "curve.tsv", CURVE_COLUMNS, sep="\t"),
    )


def stale_seed_dirs(parents: Iterable[Path], seeds: Sequence[int]) -> list[Path]:
    """`seed<N>` directories under `parents` whose N is not in `seeds` (left by a longer list).

    They never enter the comparison; they do enter DVC's hash of the parent directories,
    which the compare stage depends on, so removing them reruns it once.
    """
    stale = []
    for parent in parents:
        for child in sorted(Path(parent).glob("seed*")):
            m = re.fullmatch(r"seed(\d+)", child.name)
            if m and child.is_dir() and int(m.group(1)) not in seeds:
                stale.append(child)
    return stale


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
            raise UserError(
                where,
                "has no role for a head the scores name",
                (int(row[f"{side}_layer"]), int(row[f"{side}_head"])),
            )
    out["excess"] = excess(out)
    return out


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    """Kinds, variants and roles in their fixed order (unknown roles after, alphabetically)."""
    rank = {v: i for i, v in enumerate((*KINDS, *VARIANTS, *ROLES))}
    return frame.sort_values(
        GROUP_KEYS, key=lambda col: col.map(lambda v: (rank.get(v, len(rank)), str(v)))
    ).reset_index(drop=True)


def group_composition(scored: pd.DataFrame) -> pd.DataFrame:
    """One row per non-empty cell (kind, variant, dst_role, src_role): n_pairs, max/mean excess, max z.

    NaN scores (an undefined errata score) are skipped; a cell of only NaN stays NaN.
    """
    grouped = scored.groupby(GROUP_KEYS, sort=False)
    out = grouped.agg(
        n_pairs=("excess", "size"),
        max_excess=("excess", "max"),
        mean_excess=("excess", "mean"),
        max_z=("z", "max"),
    ).reset_index()
    return _order(out)


def _in_cell(scored: pd.DataFrame, kind: str, dst: str, src: str) -> pd.Series:
    return (scored["kind"] == kind) & (scored["dst_role"] == dst) & (scored["src_role"] == src)


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
    """(T - O) / (|T| + |O|): T the max excess in cell (kind, dst <- src), O the max over all else of `variant`.

    > 0 exactly when the cell holds the strongest composition of the variant (every kind,
    every pair). NaN when the cell is empty or all NaN.
    """
    of_variant = scored[scored["variant"] == variant]
    in_cell = _in_cell(of_variant, kind, dst, src)
    T, O = _nanmax(of_variant.loc[in_cell, "excess"]), _nanmax(of_variant.loc[~in_cell, "excess"])
    if math.isnan(T):
        return math.nan
    if math.isnan(O):  # nothing else to compare with: trivially singled out
        return 1.0
    scale = abs(T) + abs(O)
    return (T - O) / scale if scale > 0 else 0.0


def _rho(spearman: dict, kind: str, variant: str) -> float:
    by_variant = spearman.get(kind)
    value = by_variant.get(variant) if isinstance(by_variant, dict) else None
    return float(value) if isinstance(value, (int, float)) else math.nan  # None (undefined) -> NaN


def seed_row(inputs: SeedInputs, scored: pd.DataFrame, groups: pd.DataFrame) -> dict:
    """The one-row summary of a seed: training, role counts, headline cells and the claims' statistics."""
    row: dict = {"seed": inputs.seed}
    for key in TRAIN_METRICS:
        row[f"train_{key}"] = float(inputs.metrics[key])
    counts = inputs.heads["role"].value_counts()
    for role in (*ROLES, *sorted(set(counts.index) - set(ROLES))):
        row[f"n_{role}"] = int(counts.get(role, 0))

    cell = groups.set_index(GROUP_KEYS)
    for kind in KINDS:
        for variant in VARIANTS:
            for name, (dst, src) in HEADLINE_GROUPS.items():
                key = (kind, variant, dst, src)
                row[f"{kind}_{variant}_{name}"] = (
                    float(cell.at[key, "max_excess"]) if key in cell.index else math.nan
                )

    # (a) selectivity of K induction <- previous_token, per variant
    for variant in VARIANTS:
        row[f"a_selectivity_{variant}"] = selectivity(scored, variant)
    errata_sel = [row[f"a_selectivity_{v}"] for v in ERRATA]
    row["a"] = math.nan if any(math.isnan(s) for s in errata_sel) else min(errata_sel)

    # (b) true K induction <- recent_window against the null; its size relative to induction <- previous_token
    key = (CLAIM_KIND, "true", "induction", "recent_window")
    row["b"] = float(cell.at[key, "max_z"]) if key in cell.index else math.nan
    for variant in VARIANTS:
        prev, recent = row[f"{CLAIM_KIND}_{variant}_ind_prev"], row[f"{CLAIM_KIND}_{variant}_ind_recent"]
        row[f"b_rel_{variant}"] = recent / prev if prev > 0 and not math.isnan(recent) else math.nan

    # (c) agreement with the ablation
    for kind in KINDS:
        rhos = {v: _rho(inputs.spearman, kind, v) for v in VARIANTS}
        for variant, rho in rhos.items():
            row[f"c_rho_{kind}_{variant}"] = rho
        errata_best = (
            max(rhos[v] for v in ERRATA) if not any(math.isnan(rhos[v]) for v in ERRATA) else math.nan
        )
        row[f"c_gain_{kind}"] = rhos["true"] - errata_best
    row["c"] = row[f"c_gain_{CLAIM_KIND}"]
    return row


def describe(column: str) -> str:
    """What a column of seeds.csv holds, in words (for the report)."""
    if column.startswith("train_"):
        return f"final {column.removeprefix('train_')} of training (metrics.json)"
    if column.startswith("n_"):
        return f"heads with role {column.removeprefix('n_')}"
    if column in CLAIMS:
        return f"claim ({column}): {CLAIMS[column]['meaning']}"
    m = re.fullmatch(r"a_selectivity_(\w+)", column)
    if m:
        return f"selectivity of K induction <- previous_token under {m.group(1)} (> 0: strongest of all)"
    m = re.fullmatch(r"b_rel_(\w+)", column)
    if m:
        return f"K induction <- recent_window / induction <- previous_token, max excess, {m.group(1)}"
    m = re.fullmatch(r"c_rho_([QKV])_(\w+)", column)
    if m:
        return f"Spearman rho of {m.group(1)} {m.group(2)} scores with the ablation effects"
    m = re.fullmatch(r"c_gain_([QKV])", column)
    if m:
        return f"{m.group(1)}: rho of true minus rho of the better errata variant"
    m = re.fullmatch(r"([QKV])_(\w+)_(ind_prev|ind_recent)", column)
    if m:
        dst, src = HEADLINE_GROUPS[m.group(3)]
        return f"max excess, {m.group(1)} {m.group(2)}, {dst} <- {src}"
    return ""


# --- across seeds --------------------------------------------------------------------


def bootstrap_ci(values: Sequence[float], cfg: CompareConfig) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean over seeds (NaN left out); None with fewer than two.

    Every statistic is resampled with the same seeded generator, so the intervals do not
    depend on which other columns exist.
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return None, None
    import scipy.stats  # here, not at the top: the report stage imports this module only for names

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


def _stat(values: pd.Series, cfg: CompareConfig) -> dict:
    x = values.astype(float)
    n = int(x.notna().sum())
    lo, hi = bootstrap_ci(x, cfg)
    return {"n": n, "mean": float(x.mean()) if n else None, "lo": lo, "hi": hi}


def verdict(stat: dict, threshold: float) -> str:
    """holds / fails / inconclusive / untestable: where the interval lies relative to `threshold`."""
    if stat["n"] == 0:
        return "untestable"
    if stat["lo"] is None:
        return "inconclusive"
    if stat["lo"] > threshold:
        return "holds"
    if stat["hi"] < threshold:
        return "fails"
    return "inconclusive"


def claim_threshold(name: str, cfg: CompareConfig) -> float:
    threshold = CLAIMS[name]["threshold"]
    return cfg.z_threshold if threshold is None else threshold


def summarize(seeds: pd.DataFrame, cfg: CompareConfig) -> tuple[pd.DataFrame, dict]:
    """Every numeric column's mean and interval (stats), and the headline (summary.json)."""
    columns = [c for c in seeds.columns if c != "seed"]
    stats = {c: _stat(seeds[c], cfg) for c in columns}
    table = pd.DataFrame(
        [{"column": c, **s} for c, s in stats.items()], columns=["column", "n", "mean", "lo", "hi"]
    )
    summary: dict = {"n_seeds": int(len(seeds))}
    for name, claim in CLAIMS.items():
        s = stats[claim["column"]]
        threshold = claim_threshold(name, cfg)
        summary[name] = {
            "verdict": verdict(s, threshold),
            "seeds_holding": int((seeds[claim["column"]].astype(float) > threshold).sum()),
            "seeds_tested": s["n"],
            "mean": s["mean"],
            "lo": s["lo"],
            "hi": s["hi"],
        }
    headline = [f"train_{k}" for k in TRAIN_METRICS] + [
        f"n_{r}" for r in ("previous_token", "recent_window", "induction")
    ]
    summary["mean"] = {c.removeprefix("train_"): stats[c]["mean"] for c in headline}
    return table, _json_safe(summary)


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
    return obj


def mean_curve(curves: pd.DataFrame) -> pd.DataFrame:
    """curve.tsv averaged over seeds at each step; every seed must have evaluated at the same steps."""
    steps = curves.groupby("seed")["step"].apply(tuple)
    if steps.nunique() > 1:
        raise UserError(
            "curve.tsv",
            "seeds were evaluated at different steps (different train configs?)",
            sorted(steps.index),
        )
    mean = curves.drop(columns="seed").groupby("step", sort=True).mean().reset_index()[list(CURVE_COLUMNS)]
    return mean.astype({"tokens": curves["tokens"].dtype})  # the same at each step: keep it an integer


def compare(inputs: Sequence[SeedInputs], cfg: CompareConfig) -> Comparison:
    """The per-seed rows and their summary across seeds, in the order of `inputs`."""
    if not inputs:
        raise UserError("seeds", "no seeds to compare", [])
    rows, groups, roles, curves = [], [], [], []
    for inp in inputs:
        scored = with_roles(inp.scores, inp.heads, where=f"heads.csv of seed {inp.seed}")
        g = group_composition(scored)
        rows.append(seed_row(inp, scored, g))
        groups.append(g.assign(seed=inp.seed))
        roles.append(inp.heads.assign(seed=inp.seed))
        curves.append(inp.curve.assign(seed=inp.seed))
    seeds = pd.DataFrame(rows)
    role_columns = [c for c in seeds.columns if c.startswith("n_")]
    seeds[role_columns] = seeds[role_columns].fillna(0).astype(int)  # a role some seed lacks
    stats, summary = summarize(seeds, cfg)

    def seed_first(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[["seed", *[c for c in frame.columns if c != "seed"]]].reset_index(drop=True)

    all_curves = seed_first(pd.concat(curves))
    return Comparison(
        seeds=seeds,
        stats=stats,
        summary=summary,
        groups=seed_first(pd.concat(groups)),
        roles=seed_first(pd.concat(roles)),
        curves=all_curves,
        mean_curve=mean_curve(all_curves),
    )
