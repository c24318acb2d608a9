"""Does a composition score predict the causal ablation? Measures per kind and variant,
between the heads stage's ablation (`ablation.csv`, and every batch in `ablation_batches.csv`)
and the composition stage's `scores.csv` (and `invariant.csv`, as variant `invariant`, where
given). Torch-free: the heads stage writes them to its summary.json, the compare stage reads them.

- causal edges, by the ablation's own noise (`causal_edges`): the path ablation runs on K
  disjoint held-out batches (and K probes); an edge is causal for an effect when its mean over
  the batches reaches `min_effect` and exceeds its batch-to-batch spread, a one-sided t-test at
  level `CAUSAL_ALPHA` (mean / (sd / sqrt K) > t_{1 - alpha, K - 1}). The effect is signed: an
  edge whose ablation *lowers* the loss (the circuit hurts there) is never causal evidence.
- `pr_auc` (average precision) and `roc_auc` of each score as a ranking of the causal edges,
  over every pair of the kind (an undefined score ranks last); NaN without a causal edge or
  without a non-causal one. PR-AUC's chance level is the fraction of causal edges.

- `interaction`: which score predicts which head reads which, free of every scale a score
  divides away. A pair's effect is mostly the product of the writer's output scale (how much
  cutting it removes, whatever the reader), the reader's sensitivity (how sharp its pattern is)
  and what the pair itself shares; a score is a product of a pair term and factors of one head
  alone (the corrected score divides by ||OV^a|| and ||QK^b||, a rotated strand's denominators
  ||B A|| ||D C|| are one head's each, and its numerator keeps a writer factor). On the log scale
  those are additive, so per layer pair (writers x readers) the log score and the log effect are
  each fitted by writer + reader terms (least squares over the defined cells, `pair_part`), and
  rho is Spearman's between the two residuals: the pair-specific parts. Multiplying a score or
  an effect by any function of the writer alone, or of the reader alone, leaves rho exactly as
  it is, so no score gains from tracking a head's scale, and the denominator hypotheses give the
  same rho. `main_share` (per kind, of the effect): the share of the log effect's variance the
  writer and reader terms explain, how much of the raw effect is scale.
- `spearman`: the rank correlation over every (earlier, later) head pair between the raw
  |effect| and the score. Scale included: a score that co-varies with the writer's output scale
  is rewarded for it, which is why it is reported beside `interaction`, not in its place.
- `top_source`: the edges that matter. For each later head b whose strongest ablation
  effect reaches `min_effect`, is the earlier head with the largest |effect| on b also
  the earlier head with the largest score into b? Counted over those heads b.

- `role_baseline`: the same PR-AUC and ROC-AUC for a ranker that knows only the heads' roles
  (heads.csv), the baseline a score must beat: per kind, a pair scores 2 when (earlier role,
  later role) is a circuit pair the paper names (`CIRCUIT_PAIRS`), 1 when both heads have a
  named role (not "other"), else 0.
- `by_threshold` (the effects of `THRESHOLDED`): `ranking` and `role_baseline` again with the
  causal edges cut at each of tables.CAUSAL_THRESHOLDS instead of min_effect.

The effects (`EFFECTS`) are the loss change on the repeated probe, on held-out text, the change
in b's induction score on the probe (not defined for V: values cannot move a pattern), and the
role-free change in b itself on held-out text (`pattern_effect`: its attention pattern for Q
and K, its output for V; pipeline/behaviour/ablation.py). Only the last counts composition
whatever it serves: the induction score counts only what serves induction, which the original
(rotated) score picks out by construction.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..tables import CAUSAL_THRESHOLDS, KINDS, OTHER_MEASURES, VARIANTS, threshold_key

EFFECTS = ("heldout_loss_effect", "loss_effect", "attn_effect", "pattern_effect")
THRESHOLDED = ("pattern_effect",)  # ranked again at each of CAUSAL_THRESHOLDS (its scale: [0, 1] for Q, K)
# The role-only ranker's circuit pairs, per kind: (earlier roles, later roles). K: the paper's
# induction circuit (an induction head's keys read a previous-token head), with the errata's
# recent-window heads (claim b). Q: the same pairs: a ranker that knows only roles cannot tell
# which side of b's QK circuit reads the earlier head, and the baseline should be the most
# generous reading of the roles. V: the paper's two-layer section names no V circuit, so only
# the named-role level counts there.
CIRCUIT_PAIRS = {
    "Q": (("previous_token", "recent_window"), ("induction",)),
    "K": (("previous_token", "recent_window"), ("induction",)),
    "V": ((), ()),
}
UNNAMED = "other"  # the role of a head that takes none
CAUSAL_ALPHA = 0.05
PAIR = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
DST = ["dst_layer", "dst_head"]


def measures(scores: pd.DataFrame) -> tuple[str, ...]:
    """The five variants, and each other measure (tables.OTHER_MEASURES) that `scores` has rows of."""
    present = set(scores["variant"])
    return (*VARIANTS, *(m for m in OTHER_MEASURES if m in present))


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def by_kind_and_variant(frame: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """`frame`'s rows of each kind and measure, in their order, found in one pass (comparing the
    string columns for each would scan them each time); a pair with no rows gets the frame's
    empty head, as the comparison would."""
    groups = frame.groupby(["kind", "variant"], sort=False).indices
    empty = frame.iloc[:0]
    return {
        (k, v): frame.iloc[groups[k, v]] if (k, v) in groups else empty
        for k in KINDS
        for v in (*VARIANTS, *OTHER_MEASURES)
    }


def spearman(effects: pd.DataFrame, scores: pd.DataFrame, effect: str) -> dict[str, dict[str, float | None]]:
    """{kind: {variant: rho}} between |effect| and the score, over the pairs where both are
    defined; None where undefined (fewer than 3 pairs, or a constant effect or score). Ties
    get average ranks (as scipy.stats.spearmanr; pandas computes it without scipy)."""
    merged = by_kind_and_variant(effects.merge(scores, on=PAIR, how="inner"))
    out: dict[str, dict[str, float | None]] = {}
    for kind in KINDS:
        for variant in measures(scores):
            rows = merged[kind, variant]
            x, y = rows[effect].abs().to_numpy(float), rows["score"].to_numpy(float)
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            rho = math.nan
            if len(x) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
                rho = pd.Series(x).corr(pd.Series(y), method="spearman")
            out.setdefault(kind, {})[variant] = _finite(rho)
    return out


SNAP = 1e-9  # pair parts are rounded to this fraction of the largest |log value| of their layer pair


def pair_part(frame: pd.DataFrame, column: str) -> np.ndarray:
    """log `column` of each row of `frame` (PAIR columns) minus its fit by writer + reader terms
    within its layer pair (src_layer, dst_layer): least squares over the rows where the log is
    defined (a value <= 0 or NaN is left out, NaN here). Unchanged (to `SNAP`) when `column` is
    multiplied by any positive function of the writer alone or of the reader alone."""
    x = frame[column].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(x > 0, np.log(np.abs(x)), np.nan)
    out = np.full(len(frame), np.nan)
    for rows in frame.groupby(["src_layer", "dst_layer"], sort=False).indices.values():
        rows = rows[np.isfinite(y[rows])]
        if len(rows) < 3:
            continue
        writers = pd.factorize(frame["src_head"].to_numpy()[rows])[0]
        readers = pd.factorize(frame["dst_head"].to_numpy()[rows])[0]
        # [cells, 1 + writers + readers]: an intercept and one indicator per head (rank-deficient
        # by one per side: lstsq's minimum-norm solution, whose residuals are unique)
        design = np.zeros((len(rows), 1 + writers.max() + 1 + readers.max() + 1))
        design[:, 0] = 1.0
        design[np.arange(len(rows)), 1 + writers] = 1.0
        design[np.arange(len(rows)), 2 + writers.max() + readers] = 1.0
        coef, *_ = np.linalg.lstsq(design, y[rows], rcond=None)
        # residuals equal in exact arithmetic (a 2 x 2 layer pair's are +-e) differ in their last
        # bits by the order of the sums: snapped to a grid, they tie, and their ranks do not
        # depend on the machine or on how the values were read
        grid = SNAP * max(1.0, float(np.abs(y[rows]).max()))
        out[rows] = np.round((y[rows] - design @ coef) / grid) * grid
    return out


def interaction(
    effects: pd.DataFrame, scores: pd.DataFrame, effect: str
) -> tuple[dict[str, dict[str, float | None]], dict[str, float | None]]:
    """({kind: {variant: rho}}, {kind: main_share}) (module doc, `interaction`): Spearman's rho
    between the pair parts (`pair_part`) of the score and of the effect, over the pairs where both
    are defined; None with fewer than 3 such pairs or a constant part. main_share: 1 - the
    residual's variance over the log effect's, over the pairs where the log effect is defined."""
    rhos: dict[str, dict[str, float | None]] = {}
    shares: dict[str, float | None] = {}
    groups = by_kind_and_variant(scores)
    for kind in KINDS:
        mine = effects[effects["kind"] == kind]
        e = pair_part(mine, effect)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(mine[effect].to_numpy(float))
        ok = np.isfinite(e)
        shares[kind] = _finite(1 - np.var(e[ok]) / np.var(logs[ok])) if ok.sum() >= 3 else None
        part = mine[PAIR].assign(effect_part=e)
        for variant in measures(scores):
            theirs = groups[kind, variant]
            merged = part.merge(theirs[PAIR].assign(score_part=pair_part(theirs, "score")), on=PAIR)
            x, y = merged["effect_part"].to_numpy(float), merged["score_part"].to_numpy(float)
            both = np.isfinite(x) & np.isfinite(y)
            x, y = x[both], y[both]
            rho = math.nan
            if len(x) >= 3 and np.ptp(x) > 1e-12 and np.ptp(y) > 1e-12:
                rho = pd.Series(x).corr(pd.Series(y), method="spearman")
            rhos.setdefault(kind, {})[variant] = _finite(rho)
    return rhos, shares


def _top(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per later head: the earlier head (src_layer, src_head) with the largest `column`
    (NaN skipped; ties: the first in head order), and that value."""
    rows = rows.dropna(subset=[column]).sort_values([*DST, "src_layer", "src_head"], kind="stable")
    best = rows.loc[rows.groupby(DST, sort=True)[column].idxmax()]
    return best.set_index(DST)[["src_layer", "src_head", column]]


def top_source(
    effects: pd.DataFrame, scores: pd.DataFrame, effect: str, min_effect: float
) -> dict[str, dict[str, dict[str, int]]]:
    """{kind: {variant: {"match": m, "heads": n}}}: of the n later heads whose largest |effect|
    reaches `min_effect`, m have that edge's earlier head as their top-scoring source."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    groups = by_kind_and_variant(scores)
    for kind in KINDS:
        cut = effects[effects["kind"] == kind].assign(size=lambda f: f[effect].abs())
        causal = _top(cut, "size")
        causal = causal[causal["size"] >= min_effect]
        for variant in measures(scores):
            ranked = _top(groups[kind, variant], "score")
            both = causal.merge(ranked, left_index=True, right_index=True, suffixes=("_causal", ""))
            match = (both["src_layer_causal"] == both["src_layer"]) & (
                both["src_head_causal"] == both["src_head"]
            )
            out.setdefault(kind, {})[variant] = {"match": int(match.sum()), "heads": int(len(causal))}
    return out


def causal_edges(batches: pd.DataFrame, effect: str, min_effect: float) -> pd.DataFrame:
    """One row per pair (PAIR) of `batches` (a "batch" column and the effects): n (batches),
    mean, sd and `causal` (module doc). With one batch there is no spread to exceed: causal
    when the effect reaches `min_effect`; an effect constant over the batches likewise."""
    from scipy.stats import t as student_t  # here: the compare stage imports this module for names

    g = batches.groupby(PAIR, sort=False)[effect]
    out = pd.DataFrame({"n": g.count(), "mean": g.mean(), "sd": g.std(ddof=1)}).reset_index()
    n = out["n"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = out["mean"].to_numpy(float) / (out["sd"].to_numpy(float) / np.sqrt(n))
        critical = student_t.ppf(1 - CAUSAL_ALPHA, np.maximum(n - 1, 1))
        beyond_noise = np.where((n < 2) | (out["sd"].to_numpy(float) == 0), True, t > critical)
    out["causal"] = (out["mean"].to_numpy(float) >= min_effect) & beyond_noise
    return out


def _ranked(score: np.ndarray) -> np.ndarray:
    """Average ranks (1 = lowest) with an undefined score below every defined one."""
    return pd.Series(np.where(np.isfinite(score), score, -np.inf)).rank(method="average").to_numpy()


def average_precision(labels: np.ndarray, score: np.ndarray) -> float:
    """PR-AUC as average precision: sum over the distinct scores t, highest first, of
    (recall(t) - recall(previous t)) x precision(t), counting every pair scored >= t (ties
    together); NaN without a positive or a negative."""
    labels = np.asarray(labels, dtype=bool)
    score = np.where(np.isfinite(score), score, -np.inf)
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == len(labels):
        return math.nan
    ap, recall_before = 0.0, 0.0
    for t in np.unique(score)[::-1]:
        chosen = score >= t
        tp = int((labels & chosen).sum())
        recall = tp / n_pos
        ap += (recall - recall_before) * tp / int(chosen.sum())
        recall_before = recall
    return ap


def roc_auc(labels: np.ndarray, score: np.ndarray) -> float:
    """P(a causal edge outscores a non-causal one), ties counting 1/2 (Mann-Whitney); NaN
    without a positive or a negative."""
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = _ranked(np.asarray(score, dtype=float))
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def ranking(
    causal: pd.DataFrame, scores: pd.DataFrame
) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """{kind: {variant: {"pr_auc", "roc_auc", "causal", "pairs"}}}: each score as a ranking of the
    causal edges (`causal_edges`) over the pairs both tables have."""
    merged = by_kind_and_variant(causal.merge(scores, on=PAIR, how="inner"))
    out: dict = {}
    for kind in KINDS:
        for variant in measures(scores):
            rows = merged[kind, variant]
            labels, score = rows["causal"].to_numpy(bool), rows["score"].to_numpy(float)
            out.setdefault(kind, {})[variant] = {
                "pr_auc": _finite(average_precision(labels, score)),
                "roc_auc": _finite(roc_auc(labels, score)),
                "causal": int(labels.sum()),
                "pairs": int(len(rows)),
            }
    return out


def role_scores(pairs: pd.DataFrame, roles: pd.DataFrame) -> np.ndarray:
    """The role-only ranker's score of each row of `pairs` (PAIR), from `roles` (heads.csv: layer,
    head, role): 2 for a circuit pair of its kind (`CIRCUIT_PAIRS`), 1 when both heads have a
    named role, else 0."""
    role = dict(zip(zip(roles["layer"], roles["head"], strict=True), roles["role"], strict=True))
    out = []
    for kind, i, a, j, b in pairs[PAIR].itertuples(index=False):
        if (i, a) not in role or (j, b) not in role:
            raise ValueError(f"no role for head {(i, a) if (i, a) not in role else (j, b)}")
        src, dst = role[i, a], role[j, b]
        sources, readers = CIRCUIT_PAIRS[kind]
        out.append(2 if src in sources and dst in readers else int(UNNAMED not in (src, dst)))
    return np.asarray(out, dtype=float)


def role_ranking(causal: pd.DataFrame, roles: pd.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """{kind: {"pr_auc", "roc_auc", "causal", "pairs"}}: the role-only ranker (`role_scores`) as a
    ranking of the causal edges (`causal_edges`), over every pair of the kind."""
    out: dict = {}
    for kind in KINDS:
        rows = causal[causal["kind"] == kind]
        labels, score = rows["causal"].to_numpy(bool), role_scores(rows, roles)
        out[kind] = {
            "pr_auc": _finite(average_precision(labels, score)),
            "roc_auc": _finite(roc_auc(labels, score)),
            "causal": int(labels.sum()),
            "pairs": int(len(rows)),
        }
    return out


def summarize(
    effects: pd.DataFrame,
    scores: pd.DataFrame,
    min_effect: float,
    batches: pd.DataFrame | None = None,
    roles: pd.DataFrame | None = None,
) -> dict:
    """{effect: {"interaction", "main_share", "spearman", "top_source", and with `batches`
    (ablation_batches.csv) "ranking", with `roles` (heads.csv) too "role_baseline", and for the
    effects of THRESHOLDED
    "by_threshold": {"0.05": {"ranking", "role_baseline"}, ...}}} for every effect in EFFECTS."""
    out = {}
    for effect in EFFECTS:
        rhos, main_share = interaction(effects, scores, effect)
        out[effect] = {
            "interaction": rhos,
            "main_share": main_share,
            "spearman": spearman(effects, scores, effect),
            "top_source": top_source(effects, scores, effect, min_effect),
        }
        if batches is None:
            continue
        out[effect]["ranking"] = ranking(causal_edges(batches, effect, min_effect), scores)
        if roles is not None:
            out[effect]["role_baseline"] = role_ranking(causal_edges(batches, effect, min_effect), roles)
        if effect in THRESHOLDED:
            out[effect]["by_threshold"] = {}
            for threshold in CAUSAL_THRESHOLDS:
                causal = causal_edges(batches, effect, threshold)
                cut = {"ranking": ranking(causal, scores)}
                if roles is not None:
                    cut["role_baseline"] = role_ranking(causal, roles)
                out[effect]["by_threshold"][threshold_key(threshold)] = cut
    return out
