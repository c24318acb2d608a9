"""Across seeds: composition between role groups, the errata's claims per seed as one long
table, then means with small-sample (Student's t) intervals, sign counts and a verdict per claim.

Head indices are arbitrary across seeds (head 3 of one model is not head 3 of another),
so seeds are compared through the roles the heads stage gives each head. For a kind, a
variant and a role-group pair "dst <- src" (say induction <- previous_token), the cell is
every head pair whose earlier head has role src and whose later head has role dst. A
pair's composition is its *excess*, score - baseline_mean (what the paper plots); per
cell, groups.csv keeps n_pairs, max_excess, mean_excess, max_z (raw) and discoveries.

Every per-seed number is a row of the long table (`LONG_COLUMNS`): seed, claim,
hypothesis (denominators: rotated, true, or "-"), kind, variant, effect (the ablation
effect, or "-"), statistic, value. A claim's own number has statistic == the claim's
name (`pipeline.compare.claims`); the rest are what it is built from. Wide views (the
report's tables) are pivots of it.

The composition tables carry six measures: scores.csv's five variants and invariant.csv's
basis-invariant scores as variant `invariant` (`read.read_seed`). Claims (b), (m) and (c)
are also tested with the invariant measure in the corrected score's place (b_inv, m_inv,
c_inv), and claim (t) reads the dynamics stage's steps.tsv: when each measure's K z of the
top induction <- previous-token pair clears its null, against the induction phase change
(`pipeline.behaviour.phases`).

A statistic is NaN for a seed that lacks the heads it needs (no recent-window head, say);
such seeds are left out of it and counted. Across seeds: the mean and a t interval of it
(`analysis.compare.ci`; with 3-5 seeds a percentile bootstrap has only a handful of distinct
resamples), every seed's value, the seeds on each side of the threshold and the exact sign
test. A verdict per claim and hypothesis: holds (fails) when at least
`analysis.compare.min_seeds` seeds are tested, every one lies above (below) the threshold,
and so does the whole interval; untestable when no seed has the heads; else inconclusive. A
claim that names an `absent` statistic (claims.Claim.absent) and would fail while the
composition it needs is absent in every tested seed is "absent": the heads are there, and their
pairs do not compose, so the claim's premise does not hold in these models (not a failure of
the score).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import tables
from ..config import CompareConfig
from ..errors import UserError
from ..tables import (
    ABLATED_ROLES,
    CAUSAL_THRESHOLDS,
    CURVE_COLUMNS,
    HYPOTHESES,
    KINDS,
    MEASURES,
    ROLE_STATISTICS,
    ROLES,
    excess,
    threshold_key,
)
from . import calibration
from .claims import CLAIM_KIND, CLAIMS, NONE, PRIMARY_EFFECT, Row, Seed
from .read import TRAIN_METRICS, SeedInputs

# what each verdict word means (the report's legend); "holds" and "fails" follow `summarize`'s rule
VERDICT_WORDS = {
    "holds": "every seed on the claim's side of its threshold, and the interval of the mean too",
    "fails": "every seed on the other side, and the interval too",
    "inconclusive": "the seeds disagree, or the interval crosses the threshold, or too few seeds",
    "untestable": "no seed has the heads the claim needs",
    "absent": (
        "the heads the claim needs exist in every tested seed, and none of their pairs composes even "
        "tested alone: the composition the claim is about is absent from these models, which says "
        "nothing for or against the score (the detection limit says how strong a composition would "
        "have been found)"
    ),
    "uncalibrated": (
        "the claim counts discoveries of a measure that finds more on the calibrate stage's nulls than "
        "the FDR allows in this run: computed and shown, not judged"
    ),
}
GROUP_KEYS = list(tables.GROUP_KEYS)
C_BASELINE_AT = 0.05  # the causal threshold at which summary.json sets (c) beside the role-only ranker
DIMENSIONS = list(tables.DIMENSIONS)
LONG_COLUMNS = list(tables.CLAIMS_COLUMNS)
STATS_COLUMNS = list(tables.STATS_COLUMNS)


@dataclass
class Comparison:
    claims: pd.DataFrame  # the long table, LONG_COLUMNS, every seed
    stats: pd.DataFrame  # STATS_COLUMNS: each statistic across seeds
    summary: dict  # every verdict with its interval, per-seed values and sign test (verdicts.json)
    headline: dict  # one verdict and one number per claim, the training means (summary.json: DVC metrics)
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
    """One row per non-empty cell (kind, variant, dst_role, src_role): n_pairs, max/mean excess,
    max raw z, discoveries.

    NaN scores (an undefined errata score) are skipped; a cell of only NaN stays NaN.
    """
    out = (
        scored.groupby(GROUP_KEYS, sort=False)
        .agg(
            n_pairs=("excess", "size"),
            max_excess=("excess", "max"),
            mean_excess=("excess", "mean"),
            max_z=("z", "max"),
            discoveries=("discovery", "sum"),
        )
        .reset_index()
    )
    return _order(out, GROUP_KEYS)


def seed_statistics(
    inp: SeedInputs, scored: pd.DataFrame, groups: pd.DataFrame, edge_threshold: float, fdr: float
) -> pd.DataFrame:
    """The long table of one seed: LONG_COLUMNS (module doc). The training metrics, the role
    counts and the role ablation, then every claim of `CLAIMS` (`_claim_rows`)."""
    rows = [("training", Row(key, inp.metrics[key])) for key in TRAIN_METRICS]
    counts = inp.heads["role"].value_counts()
    rows += [
        ("roles", Row(role, counts.get(role, 0)))
        for role in (*ROLES, *sorted(set(counts.index) - set(ROLES)))
    ]
    for role in ABLATED_ROLES:  # does the circuit serve the text? (NaN: no head of the role)
        for statistic in ROLE_STATISTICS:
            value = inp.role_ablation[role][statistic]  # serves_heldout: 1 or 0
            rows.append(
                ("role_ablation", Row(f"{role}_{statistic}", math.nan if value is None else float(value)))
            )
    rows += _claim_rows(Seed(inp, scored, groups.set_index(GROUP_KEYS), edge_threshold, fdr))
    return pd.DataFrame(
        [{"seed": inp.seed, "claim": claim, "hypothesis": row.hypothesis, "kind": row.kind,
          "variant": row.variant, "effect": row.effect, "statistic": row.statistic,
          "value": float(row.value)} for claim, row in rows],
        columns=LONG_COLUMNS,
    )  # fmt: skip


def _claim_rows(seed: Seed) -> list[tuple[str, Row]]:
    """Every claim's rows for one seed, named by claim, in the order of `CLAIMS`, except that a
    restatement with the invariant measure sits beside the claim it restates and, within the two,
    the rows without a hypothesis come first, then each hypothesis's rows (c, c_inv under rotated
    denominators, then c, c_inv under true ones)."""
    rows = [(name, row) for name, claim in CLAIMS.items() for row in claim.compute(seed)]
    position = {name: i for i, name in enumerate(CLAIMS)}
    rank = {h: i for i, h in enumerate((NONE, *HYPOTHESES))}
    return sorted(rows, key=lambda r: (position[CLAIMS[r[0]].restates or r[0]], rank[r[1].hypothesis]))


# --- across seeds --------------------------------------------------------------------


def t_interval(values: Sequence[float], ci: float) -> tuple[float | None, float | None]:
    """Student's t interval of the mean over seeds (NaN left out): valid for a handful of seeds,
    where a bootstrap has only a few distinct resamples; None with fewer than two values, and
    the value itself when every seed agrees exactly."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return None, None
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    from scipy.stats import t as student_t  # here: the report stage imports this package only for names

    half = float(student_t.ppf((1 + ci) / 2, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def sign_test(values: Sequence[float], limit: float) -> float | None:
    """Exact two-sided sign test of the seeds' values against `limit` (ties left out); None without
    a value off the limit. With 3 seeds it cannot go below 0.25: that is why a verdict asks for
    every seed to agree *and* for the t interval to exclude the threshold."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x) & (x != limit)]
    if not len(x):
        return None
    from scipy.stats import binomtest

    return float(binomtest(int((x > limit).sum()), len(x), 0.5).pvalue)


def verdict(stat: dict, limit: float, values: Sequence[float], min_seeds: int) -> str:
    """holds / fails: at least `min_seeds` seeds tested, every one past `limit` on the same side,
    and the t interval on that side too; untestable: no seed has the heads; else inconclusive."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if stat["n"] == 0:
        return "untestable"
    if len(x) < min_seeds or stat["lo"] is None:
        return "inconclusive"
    if stat["lo"] > limit and (x > limit).all():
        return "holds"
    if stat["hi"] < limit and (x < limit).all():
        return "fails"
    return "inconclusive"


def across_seeds(claims: pd.DataFrame, cfg: CompareConfig) -> pd.DataFrame:
    """STATS_COLUMNS: each statistic's n, mean, sd and t interval over seeds, in the long table's order."""
    rows = []
    for key, group in claims.groupby(DIMENSIONS, sort=False):
        x = group["value"].astype(float)
        n = int(x.notna().sum())
        lo, hi = t_interval(x, cfg.ci)
        rows.append(
            dict(zip(DIMENSIONS, key, strict=True))
            | {
                "n": n,
                "mean": float(x.mean()) if n else math.nan,
                "sd": float(x.std(ddof=1)) if n > 1 else math.nan,
                "lo": lo,
                "hi": hi,
            }  # fmt: skip
        )
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def summarize(
    claims: pd.DataFrame, stats: pd.DataFrame, cfg: CompareConfig, calibrated: dict | None = None
) -> dict:
    """The headline (summary.json): per claim and hypothesis, the verdict, every seed's value, the
    seeds on each side of the threshold, the sign test, the mean and t interval; the mean of the
    training metrics and of the role counts. `calibrated`: the run's calibration
    (calibration.summary); a claim resting on a measure it finds uncalibrated is "uncalibrated"."""
    doubtful = calibration.uncalibrated((calibrated or {}).get("measures", {}))
    n_seeds = int(claims["seed"].nunique())
    rule = (
        f"holds (fails): at least {cfg.min_seeds} seeds, every seed above (below) the threshold, and "
        f"the {cfg.ci:.0%} t interval of the mean above (below) it; else inconclusive"
    )
    summary: dict = {"n_seeds": n_seeds, "rule": rule, "claims": {}}
    for name, claim in CLAIMS.items():
        limit = claim.threshold
        own = stats[(stats["claim"] == name) & (stats["statistic"] == name)]
        per_seed = claims[(claims["claim"] == name) & (claims["statistic"] == name)]
        summary["claims"][name] = {}
        for column, h in claim.sides():
            mine_stats = own[own[column] == h]
            s = (
                mine_stats.iloc[0].to_dict()
                if len(mine_stats)
                else {"n": 0, "mean": None, "lo": None, "hi": None}
            )
            mine = per_seed[per_seed[column] == h]
            values = mine["value"].astype(float)
            decided = verdict(s, limit, values, cfg.min_seeds)
            absent = _absent_seeds(claims, name, claim.absent)
            if decided == "fails" and absent is not None and absent == int(values.notna().sum()):
                decided = "absent"
            summary["claims"][name][h] = {
                "verdict": (
                    "uncalibrated" if doubtful & set(claim.rests_on) and decided != "untestable" else decided
                ),
                **({"seeds_absent": absent} if claim.absent else {}),
                "seeds_holding": int((values > limit).sum()),
                "seeds_failing": int((values < limit).sum()),
                "seeds_tested": int(values.notna().sum()),
                "mean": s["mean"],
                "lo": s["lo"],
                "hi": s["hi"],
                "sign_p": sign_test(values, limit),
                "per_seed": {str(seed): v for seed, v in zip(mine["seed"], values, strict=True)},
                "threshold": limit,
            }
    if calibrated is not None:
        summary["calibration"] = calibrated
    summary["causal_check"] = _causal_check(claims, stats)
    summary["m_by_kind"] = _by_kind_and_rotation(stats, "m", "m_kind")
    summary["detection_limits"] = _detection_limits(claims)
    for section in ("training", "roles", "role_ablation"):
        rows = stats[stats["claim"] == section]
        summary[section] = dict(zip(rows["statistic"], rows["mean"], strict=True))
    return _json_safe(summary)


def _absent_seeds(claims: pd.DataFrame, name: str, statistic: str | None) -> int | None:
    """The seeds in which the claim's composition is absent (its `absent` statistic is 1); None
    for a claim without one."""
    if statistic is None:
        return None
    rows = claims[(claims["claim"] == name) & (claims["statistic"] == statistic)]
    return int((rows["value"] == 1).sum())


def headline(summary: dict) -> dict:
    """summary.json, the DVC metrics `dvc exp show` prints (22 columns): the number of seeds, a
    verdict and a mean per claim, the training means; the rest is in verdicts.json.

    A claim tested under both denominator hypotheses (a, c, c_inv, d) has one verdict, a word when
    the two agree and "rotated/true" ("holds/inconclusive") when they differ, and the rotated
    hypothesis's mean, in a column that says so (`mean.a_rotated`). A claim computed against each
    rotation (m, m_inv, t: `Claim.versus`) holds (fails) only when it holds (fails) against both,
    else it is inconclusive (untestable, uncalibrated: when every rotation's is); its mean is the
    lower of the rotations' (`mean.m_min`)."""
    out: dict = {"n_seeds": summary["n_seeds"], "verdict": {}, "mean": {}}
    for name, by_hypothesis in summary["claims"].items():
        verdicts = list(dict.fromkeys(s["verdict"] for s in by_hypothesis.values()))
        if CLAIMS[name].versus:
            out["verdict"][name] = verdicts[0] if len(verdicts) == 1 else "inconclusive"
            means = [s["mean"] for s in by_hypothesis.values() if s["mean"] is not None]
            out["mean"][f"{name}_min"] = min(means) if means else None
            continue
        out["verdict"][name] = (
            verdicts[0] if len(verdicts) == 1 else "/".join(s["verdict"] for s in by_hypothesis.values())
        )
        first, s = next(iter(by_hypothesis.items()))
        out["mean"][name if first == NONE else f"{name}_{first}"] = s["mean"]
    out["training"] = dict(summary["training"])
    # (m) per kind against each rotation, and each model's K detection limits (raw z), for `dvc exp show`
    out["m_by_kind"] = {
        kind: {rotation: s["mean"] for rotation, s in by_rotation.items()}
        for kind, by_rotation in summary.get("m_by_kind", {}).items()
    }
    # (c)'s cell beside its verdict: the corrected score's and the role-only ranker's PR-AUC of the
    # role-free causal edges at 0.05 (the baseline a score must beat), mean over seeds
    check = summary.get("causal_check", {}).get(f"at_{threshold_key(C_BASELINE_AT)}", {})
    out["c_vs_roles"] = {
        "pr_auc_true": check.get("pr_auc", {}).get("true", {}).get("mean"),
        "role_pr_auc": check.get("role_pr_auc", {}).get("mean"),
    }
    out["detection_limit_K"] = {
        seed: {m: limits.get(CLAIM_KIND, {}).get(m) for m in ("true", *HYPOTHESES["rotated"])}
        for seed, limits in summary.get("detection_limits", {}).items()
    }
    return out


def _by_kind_and_rotation(stats: pd.DataFrame, claim: str, statistic: str) -> dict:
    """{kind: {rotation: {"mean", "lo", "hi"}}} of one statistic computed per kind and rotation."""
    rows = stats[(stats["claim"] == claim) & (stats["statistic"] == statistic)]
    out: dict = {}
    for r in rows.itertuples():
        out.setdefault(r.kind, {})[r.variant] = {"mean": r.mean, "lo": r.lo, "hi": r.hi}
    return out


def _detection_limits(claims: pd.DataFrame) -> dict:
    """{seed: {kind: {measure: raw z}}}: the raw z a lone composing pair needs in each model
    (claim m's detection_limit rows)."""
    rows = claims[(claims["claim"] == "m") & (claims["statistic"] == "detection_limit")]
    out: dict = {}
    for r in rows.itertuples():
        out.setdefault(f"seed{r.seed}", {}).setdefault(r.kind, {})[r.variant] = r.value
    return out


def _causal_check(claims: pd.DataFrame, stats: pd.DataFrame) -> dict:
    """Claim (c)'s cell (K, PRIMARY_EFFECT): the causal edges per seed, each measure's Spearman rho
    of the pair-specific parts (interaction: what (c) compares) and of the raw values, PR-AUC and
    ROC-AUC per seed with their mean and t interval, and the role-only ranker's PR-AUC (the
    baseline a score must beat) likewise; the PR-AUCs again at each of CAUSAL_THRESHOLDS."""
    mine = (claims["claim"] == "c") & (claims["kind"] == CLAIM_KIND) & (claims["effect"] == PRIMARY_EFFECT)
    cell = (stats["claim"] == "c") & (stats["kind"] == CLAIM_KIND) & (stats["effect"] == PRIMARY_EFFECT)
    edges = claims[mine & (claims["statistic"] == "causal_edges")]
    out: dict = {
        "kind": CLAIM_KIND,
        "effect": PRIMARY_EFFECT,
        "causal_edges": {str(s): v for s, v in zip(edges["seed"], edges["value"], strict=True)},
    }

    def across(statistic: str, variant: str = NONE) -> dict:
        per_seed = claims[mine & (claims["statistic"] == statistic) & (claims["variant"] == variant)]
        s = stats[cell & (stats["statistic"] == statistic) & (stats["variant"] == variant)]
        return {
            "mean": float(s["mean"].iloc[0]) if len(s) else None,
            "lo": s["lo"].iloc[0] if len(s) else None,
            "hi": s["hi"].iloc[0] if len(s) else None,
            "per_seed": {str(x): v for x, v in zip(per_seed["seed"], per_seed["value"], strict=True)},
        }

    for key in ("interaction", "spearman", "pr_auc", "roc_auc"):  # interaction: what (c) itself compares
        out[key] = {m: across(key, m) for m in MEASURES}
    out["role_pr_auc"] = across("role_pr_auc")
    for t in CAUSAL_THRESHOLDS:  # where an edge starts to count, and what that does to the ranking
        at = threshold_key(t)
        out[f"at_{at}"] = {
            "pr_auc": {m: across(f"pr_auc_at_{at}", m) for m in MEASURES},
            "role_pr_auc": across(f"role_pr_auc_at_{at}"),
        }
    return out


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


def compare(
    inputs: Sequence[SeedInputs], cfg: CompareConfig, edge_threshold: float, fdr: float
) -> Comparison:
    """The per-seed long table and its summary across seeds, in the order of `inputs`.
    `edge_threshold`: the paper's plotting threshold on the excess (analysis.figures); `fdr`:
    analysis.composition.fdr (the dynamics stage's clear steps)."""
    if not inputs:
        raise UserError("seeds", "no seeds to compare", [])
    long, groups, roles, curves = [], [], [], []
    for inp in inputs:
        scored = with_roles(inp.scores, inp.heads, where=f"heads.csv of seed {inp.seed}")
        g = group_composition(scored)
        long.append(seed_statistics(inp, scored, g, edge_threshold, fdr))
        groups.append(g.assign(seed=inp.seed))
        roles.append(inp.heads.assign(seed=inp.seed))
        curves.append(inp.curve.assign(seed=inp.seed))
    claims = pd.concat(long, ignore_index=True)
    stats = across_seeds(claims, cfg)
    calibrated = calibration.summary(inputs, fdr) if any(i.calibration for i in inputs) else None

    def seed_first(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[["seed", *[c for c in frame.columns if c != "seed"]]].reset_index(drop=True)

    all_curves = seed_first(pd.concat(curves))
    return Comparison(
        claims=claims,
        stats=stats,
        summary=(summary := summarize(claims, stats, cfg, calibrated)),
        headline=headline(summary),
        groups=seed_first(pd.concat(groups)),
        roles=seed_first(pd.concat(roles)),
        curves=all_curves,
        mean_curve=mean_curve(all_curves),
    )
