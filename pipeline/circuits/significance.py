"""Which pairs compose: discoveries at a controlled false-discovery rate, against a null the
model itself supplies, estimated only from what cannot compose. The statistics are numpy and
pandas on the score tables; `measured` computes those tables (every measure, the pairs that can
compose and those that cannot).

Why not "z > 3". Every score's raw z is measured against a Haar rotation of the writer's
residual basis (`pipeline.circuits.composition`, `pipeline.circuits.invariant`): a random writer spreads its
output over all of d_model. A trained residual stream uses far fewer directions, so heads that
share the stream without composing (a layer-0 head and another layer-0 head that cannot read
it) stand at raw z of several units, in both directions, and their spread moves with the model
and with training (docs/maths.md, "Significance").

Why not each block's own spread (the procedure before issue 31). Standardising the pairs under
test by their own median and MAD makes power depend on the block: composition and writer
heterogeneity inflate the MAD, so a circuit at raw z 20-30 ended below the bar in one seed while
the same circuit cleared it in another. The null's centre, scale and tail now come from pairs
that cannot compose; the pairs under test enter only as the values tested.

The procedure, per model:

1. Pairs that cannot compose (`scoring.placebo_pairs`: a writer read by a head of its own
   layer or of an earlier one) are scored by the same formulas as the later pairs, for every
   kind and measure (placebo.csv).
2. Location and scale, per kind and measure, from those pairs alone (`null_of`): the median and
   the normal-consistent MAD of their raw z over every placebo block. Each is floored by the
   Haar null's own (centre 0, scale 1): under a surrogate that breaks the alignment between
   layers (`surrogate`) a pair's raw z has exactly that mean and sd, so a null narrower or lower
   than it would call chance alignment composition. The composite null hypothesis, "no
   composition beyond the stream's shared geometry and beyond chance", is the wider of the two:

       z_cal = (z - max(0, median_placebo z)) / max(1, 1.4826 MAD_placebo z)

3. Shape, per kind and measure too (`null_p`): a later pair's p-value against its own family's
   placebo z_cal (step 2). Up to the pool's 80th percentile u it is the conformal one,

       p = (1 + #{placebo z_cal >= z_cal}) / (1 + n_placebo),

   valid (P(p <= a) <= a) for a pair exchangeable with the placebo pairs after step 2. Beyond u
   the top fifth's exponential tail carries it on,

       p = (1 + #{placebo z_cal > u}) / (1 + n_placebo) x exp(-(z_cal - u) / beta),

   beta the top fifth's mean excess over u (at least a normal's, MIN_TAIL_MEAN). Why a tail: one
   family's placebo pairs are too few for the p a lone pair needs (176 at 2 x 8 heads: the
   conformal p >= 1/177, above fdr / 64), and pooling the measures (the procedure before) let the
   rotated scores' heavier tails borrow the true score's bar: 8% of untrained families of B C D A
   had a discovery. The mean excess grows with a heavy top (one head that stands out in every
   pair), so such a tail is fitted heavy, not ignored.
4. Discoveries: Benjamini-Hochberg at level `fdr` over each family of later pairs (one kind of
   one measure); q is BH's adjusted p-value, a discovery has q <= fdr. An undefined (NaN) score
   has NaN p and q, is never a discovery and does not count in the family's size.

Power, per model (`detection_limits`): the raw z a lone composing pair needs in each family,
centre + scale x the z_cal at which its p reaches fdr / m (`lone_pair_bar`); it depends on the
model's placebo pairs only, never on the pairs under test (summary.json).

The false-positive rate, measured on every model: each placebo block is tested the same way,
its null (steps 2 and 3) from the *other* placebo blocks alone (leave one block out), as a
family per kind and measure; every placebo discovery is a false one, and `family_rates` counts
the families with any (what BH bounds under a complete null). Calibration tests
(tests/test_significance.py): untrained weights of every shape in conf/model/, surrogates of a
trained model, placebo pairs of a trained model, planted pairs of growing strength
(tools/calibrate_composition.py measures the same on a run's models).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config import CompositionConfig
from ..tables import join_measures

MAD_NORMAL = 1.4826  # 1 / Phi^-1(3/4): a standard normal's MAD times this is 1
FAMILY = ["kind", "variant"]  # BH's family, and the null's: one kind of one measure
PLACEBO_BLOCK = ["src_layer", "dst_layer"]  # placebo pairs of one block: left out together
# the Haar null's own centre and scale: a floor for the placebo pairs' (step 2)
HAAR_CENTRE, HAAR_SCALE = 0.0, 1.0
# step 3: the share of a family's placebo pairs whose excess over the rest fits its exponential tail,
# and a floor for its mean: a standard normal's mean excess over its 80th percentile (0.558), so a
# placebo family with almost no spread in its top fifth cannot make a thin tail
TAIL_FRACTION = 0.2
MIN_TAIL_MEAN = 0.558
MIN_TAIL_PAIRS = 5  # fewer pairs above the threshold: the conformal p alone


def empirical_null(z: np.ndarray) -> tuple[float, float]:
    """(centre, scale): the median and the normal-consistent MAD of the finite z; NaN when fewer
    than three are finite or they do not spread (scale 0: nothing to standardise by)."""
    z = np.asarray(z, dtype=float)
    z = z[np.isfinite(z)]
    if len(z) < 3:
        return math.nan, math.nan
    centre = float(np.median(z))
    scale = MAD_NORMAL * float(np.median(np.abs(z - centre)))
    return centre, (scale if scale > 0 else math.nan)


def null_of(placebo: pd.DataFrame) -> pd.DataFrame:
    """Step 2's null per family (kind, variant), from the placebo pairs alone: columns centre and
    scale, each floored by the Haar null's; both NaN for a family with fewer than three defined
    placebo pairs (no null: nothing in it is tested)."""
    rows = {}
    for key, rows_of in placebo.groupby(FAMILY, sort=False).indices.items():
        centre, scale = empirical_null(placebo["z"].to_numpy(dtype=float)[rows_of])
        if math.isnan(centre):
            rows[key] = (math.nan, math.nan)
            continue
        scale = HAAR_SCALE if math.isnan(scale) else max(scale, HAAR_SCALE)  # no spread: Haar's
        rows[key] = (max(centre, HAAR_CENTRE), scale)
    index = (
        pd.MultiIndex.from_tuples(list(rows), names=FAMILY)
        if rows
        else pd.MultiIndex.from_arrays([[], []], names=FAMILY)
    )
    return pd.DataFrame(list(rows.values()), index=index, columns=["centre", "scale"], dtype=float)


def standardised(frame: pd.DataFrame, null: pd.DataFrame) -> np.ndarray:
    """z_cal of every row: (z - centre) / scale of its family's `null` (`null_of`); NaN where its
    family has none."""
    keys = pd.MultiIndex.from_frame(frame[FAMILY])
    at = null.reindex(keys)
    z = frame["z"].to_numpy(dtype=float)
    return (z - at["centre"].to_numpy(dtype=float)) / at["scale"].to_numpy(dtype=float)


def conformal_p(z_cal: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """(1 + #{pool >= z_cal}) / (1 + n) per value, over the finite pool; NaN where z_cal is NaN
    (or the pool is empty)."""
    pool = np.sort(np.asarray(pool, dtype=float)[np.isfinite(pool)])
    z_cal = np.asarray(z_cal, dtype=float)
    at_least = len(pool) - np.searchsorted(pool, z_cal, side="left")
    p = (1 + at_least) / (1 + len(pool))
    return np.where(np.isfinite(z_cal) & (len(pool) > 0), p, np.nan)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """BH's adjusted p-values (q) over the finite p; NaN stays NaN and is not counted in m."""
    p = np.asarray(p, dtype=float)
    q = np.full_like(p, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = len(finite)
    if m == 0:
        return q
    order = finite[np.argsort(p[finite], kind="stable")]
    ranked = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(1.0, np.minimum.accumulate(ranked[::-1])[::-1])
    return q


def tail(pool: np.ndarray) -> tuple[float, float, float] | None:
    """(u, share, beta) of step 3: u the pool's (1 - TAIL_FRACTION) quantile, share = (1 + #{pool >
    u}) / (1 + n) the conformal p at u, beta the mean excess over u (floored by MIN_TAIL_MEAN);
    None when fewer than MIN_TAIL_PAIRS lie above u."""
    pool = np.asarray(pool, dtype=float)
    pool = pool[np.isfinite(pool)]
    if not len(pool):
        return None
    u = float(np.quantile(pool, 1 - TAIL_FRACTION))
    above = pool[pool > u]
    if len(above) < MIN_TAIL_PAIRS:
        return None
    return u, (1 + len(above)) / (1 + len(pool)), max(float(np.mean(above - u)), MIN_TAIL_MEAN)


def null_p(z_cal: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Step 3's p of each z_cal against one family's placebo pool: conformal up to the tail's
    threshold u, then share x exp(-(z_cal - u) / beta) (`tail`); NaN where z_cal is NaN."""
    p = conformal_p(z_cal, pool)
    fitted = tail(pool)
    if fitted is None:
        return p
    u, share, beta = fitted
    z_cal = np.asarray(z_cal, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        beyond = share * np.exp(-(z_cal - u) / beta)
        return np.where(z_cal > u, beyond, p)


def _tested(frame: pd.DataFrame, z_cal: np.ndarray, pool: pd.DataFrame, fdr: float) -> pd.DataFrame:
    """`frame` with z_cal, p (each family against its own family's rows of `pool`: FAMILY columns
    and z_cal), q (BH per family of `frame`) and discovery."""
    p = np.full(len(frame), np.nan)
    q = np.full(len(frame), np.nan)
    pools = pool.groupby(FAMILY, sort=False)["z_cal"]
    for key, rows in frame.groupby(FAMILY, sort=False).indices.items():
        if key in pools.groups:
            p[rows] = null_p(z_cal[rows], pools.get_group(key).to_numpy(dtype=float))
        q[rows] = benjamini_hochberg(p[rows])
    with np.errstate(invalid="ignore"):
        discovery = np.isfinite(q) & (q <= fdr)
    return frame.assign(z_cal=z_cal, p=p, q=q, discovery=discovery)


def calibrate(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo), each with tables.SIGNIFICANCE_COLUMNS added (module doc), row order kept.

    Both tables have kind, variant (a measure: the five Frobenius variants and "invariant"),
    src_layer, dst_layer and the raw z. `scores`: the later pairs, tested against the null of
    every placebo pair; `placebo`: each (src_layer, dst_layer) block tested against the null of
    the others alone."""
    null = null_of(placebo)
    out = _tested(scores, standardised(scores, null), _pool(placebo, null), fdr)
    parts = []
    for rows in placebo.groupby(PLACEBO_BLOCK, sort=False).indices.values():
        mine = np.zeros(len(placebo), dtype=bool)
        mine[rows] = True
        others = placebo[~mine]
        theirs = null_of(others)
        block = placebo.iloc[rows]
        parts.append(_tested(block, standardised(block, theirs), _pool(others, theirs), fdr))
    placebo_out = (
        pd.concat(parts).loc[placebo.index]
        if parts
        else placebo.assign(z_cal=np.nan, p=np.nan, q=np.nan, discovery=False)
    )
    return out, placebo_out


def _pool(placebo: pd.DataFrame, null: pd.DataFrame) -> pd.DataFrame:
    """The placebo pairs' FAMILY columns and z_cal under `null`: step 3's pools."""
    return placebo[FAMILY].assign(z_cal=standardised(placebo, null))


def lone_pair_bar(pool: np.ndarray, m: int, fdr: float) -> float:
    """The z_cal a lone pair of a family of m must reach to be a discovery, p <= fdr / m (BH's
    first step), against one family's pool (`null_p`): in the tail, u + beta ln(share m / fdr);
    below it, above the (k + 1)-th largest pool value, k = floor(fdr (1 + n) / m) - 1 (inf when
    no value can be, k < 0); NaN without a pool."""
    values = np.sort(np.asarray(pool, dtype=float)[np.isfinite(pool)])[::-1]
    if not len(values) or m < 1:
        return math.nan
    fitted = tail(values)
    if fitted is not None:
        u, share, beta = fitted
        bar = u + beta * math.log(share * m / fdr)
        if bar > u:
            return bar
    k = math.floor(fdr * (1 + len(values)) / m + 1e-12) - 1
    if k < 0:
        return math.inf
    return float(values[k]) if k < len(values) else -math.inf


def detection_limits(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> dict:
    """{kind: {variant: {"z_cal", "raw_z", "centre", "scale"}}}: per family of `scores`, the
    calibrated and the raw z that a lone composing pair must exceed to be a discovery (module doc,
    "Power"), with the null's centre and scale; from the placebo pairs alone. JSON-ready: an
    unreachable bar is None."""
    null = null_of(placebo)
    pools = _pool(placebo, null).groupby(FAMILY, sort=False)["z_cal"]
    out: dict = {}
    for (kind, variant), rows in scores.groupby(FAMILY, sort=False).indices.items():
        m = int(np.isfinite(scores["z"].to_numpy(dtype=float)[rows]).sum())
        mine = (kind, variant) in pools.groups
        bar = lone_pair_bar(pools.get_group((kind, variant)).to_numpy(float), m, fdr) if mine else math.nan
        centre, scale = null.loc[(kind, variant)] if (kind, variant) in null.index else (math.nan, math.nan)
        raw = centre + scale * bar
        out.setdefault(kind, {})[variant] = {
            key: (float(v) if math.isfinite(v) else None)
            for key, v in (("z_cal", bar), ("raw_z", raw), ("centre", centre), ("scale", scale))
        }
    return out


def family_rates(placebo: pd.DataFrame) -> pd.DataFrame:
    """Per placebo block and family (src_layer, dst_layer, kind, variant): defined pairs,
    discoveries and whether it has any (`calibrate`'s placebo table: every one is false); BH
    bounds the share of families with any under a complete null by fdr."""
    defined = np.isfinite(placebo["z"].to_numpy(dtype=float))
    g = placebo.assign(defined=defined).groupby([*PLACEBO_BLOCK, *FAMILY], sort=False)
    out = pd.DataFrame(
        {"n_pairs": g["defined"].sum().astype(int), "discoveries": g["discovery"].sum().astype(int)}
    )
    out["any"] = out["discoveries"] > 0
    return out.reset_index()


def family_summary(placebo: pd.DataFrame) -> dict:
    """{"L0->L0": {"families", "with_discovery", "rate"}, ...}: `family_rates` per placebo block,
    then over all blocks ("all"); JSON-ready."""
    rates = family_rates(placebo)
    out = {}
    for (i, j), block in rates.groupby(PLACEBO_BLOCK, sort=True):
        out[f"L{i}->L{j}"] = _family_counts(block)
    out["all"] = _family_counts(rates)
    return out


def _family_counts(rates: pd.DataFrame) -> dict:
    families = int((rates["n_pairs"] > 0).sum())
    hits = int(rates["any"].sum())
    return {"families": families, "with_discovery": hits, "rate": hits / families if families else None}


def discovery_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per family (kind, variant): defined pairs, discoveries and their rate."""
    g = frame.assign(defined=np.isfinite(frame["z"].to_numpy(dtype=float))).groupby(FAMILY, sort=False)
    out = pd.DataFrame(
        {"n_pairs": g["defined"].sum().astype(int), "discoveries": g["discovery"].sum().astype(int)}
    )
    out["rate"] = out["discoveries"] / out["n_pairs"].where(out["n_pairs"] > 0)
    return out.reset_index()


def raw_tables(
    hw, cfg: CompositionConfig, seed: int, positions: str, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo) of one set of weights (`weights.HeadWeights`), not yet calibrated: every
    measure's rows (scores.csv's five variants, then invariant.csv's as variant "invariant") for the
    later pairs and for the pairs that cannot compose, with the same seed (the same null draws);
    `device`: where the products run (`composition.composition_scores`)."""
    from . import composition, invariant  # torch: imported where the scores are computed

    scores, placebo = (
        join_measures(
            composition.composition_scores(hw, cfg, seed, placebo=placebo, device=device),
            invariant.invariant_scores(hw, cfg, seed, positions, placebo=placebo, device=device),
        )
        for placebo in (False, True)
    )
    return scores, placebo


def measured(
    hw, cfg: CompositionConfig, seed: int, positions: str, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`raw_tables` calibrated at `cfg.fdr`: what the composition stage writes, and the dynamics
    stage at every checkpoint."""
    return calibrate(*raw_tables(hw, cfg, seed, positions, device), cfg.fdr)
