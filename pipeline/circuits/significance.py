"""Which pairs compose: discoveries at a controlled false-discovery rate, against a null the
model itself supplies. The statistics are numpy and pandas on the score tables; `measured`
computes those tables (every measure, the pairs that can compose and those that cannot).

Why not "z > 3". Every score's raw z is measured against a Haar rotation of the writer's
residual basis (`pipeline.circuits.composition`, `pipeline.circuits.invariant`): a random writer
spreads its output over all of d_model. A trained residual stream uses far fewer directions, so
heads that share the stream without composing stand at raw z of several units, in either
direction, and where they stand moves with the model, with the layers a pair joins and with
training: on a trained two-layer model the pairs that cannot compose sit near -1.8 (layer 0 read
by layer 0), +1.1 (layer 1 read by layer 0) and +2.4 (layer 1 read by layer 1), and the later
pairs that do not compose lower still, near -2.7 (docs/maths.md, "Significance").

So a later pair is judged against the pairs of its own kind: where the non-composing pairs of
its layer pair sit (location), and how far a non-composing pair strays from where its block sits
(shape), each estimated without the pair itself. The procedure, per model:

1. Pairs that cannot compose (`scoring.placebo_pairs`: a writer read by a head of its own
   layer or of an earlier one) are scored by the same formulas as the later pairs, for every
   kind and measure (placebo.csv). They are grouped in blocks (src_layer, dst_layer).
2. Shape, per kind and measure (`null_of`): each placebo pair's raw z minus its own block's
   median (`aligned`: the blocks sit apart, and pooling them unaligned would turn their distance
   into spread), pooled over the blocks; the scale is the pool's normal-consistent MAD, floored
   by the Haar null's sd (1): under a surrogate that breaks the alignment between layers a pair's
   raw z has exactly sd 1, so a narrower null would call chance alignment composition.
3. Location, per pair (`centres`): the median raw z of the other pairs of its kind, measure and
   block (most pairs of a block do not compose, and a median ignores up to half of them), floored
   by the Haar null's centre (0). The floor makes the null composite, "no composition beyond the
   model's non-composing pairs of this kind, nor beyond chance alignment": a pair is a discovery
   only when it stands above both, so a pair less aligned than a random rotation never is.

       z_cal = (z - max(0, median of the block's other z)) / max(1, 1.4826 MAD of the aligned placebo z)

4. Tail, per kind and measure (`null_p`): a pair's p-value against the pool of step 2 (aligned,
   over the same scale). Up to the pool's 80th percentile u it is the conformal one,

       p = (1 + #{pool >= z_cal}) / (1 + n_pool),

   valid (P(p <= a) <= a) for a pair exchangeable with the pooled placebo deviations. Beyond u
   the top fifth's exponential tail carries it on,

       p = (1 + #{pool > u}) / (1 + n_pool) x exp(-(z_cal - u) / beta),

   beta the top fifth's mean excess over u (at least a normal's, MIN_TAIL_MEAN): one family's
   placebo pairs are too few for the p a lone pair needs (176 at 2 x 8 heads: the conformal p >=
   1/177, above fdr / 64), and a family's own tail keeps a heavy-tailed measure from borrowing a
   light-tailed one's bar. The mean excess grows with a heavy top (one head that stands out in
   every pair), so such a tail is fitted heavy, not ignored.
5. Discoveries: Benjamini-Hochberg at level `fdr` over each family of later pairs (one kind of
   one measure); q is BH's adjusted p-value, a discovery has q <= fdr. An undefined (NaN) score
   has NaN p and q, is never a discovery and does not count in the family's size.

Power, per model (`detection_limits`): the raw z a lone composing pair needs in each family,
centre + scale x the z_cal at which its p reaches fdr / m (`lone_pair_bar`), the centre that of
its block; nothing the pair does moves its own bar.

The false-positive rate, measured on every model: each placebo block is tested the same way,
its location from its own pairs (each without itself) and its shape from the *other* placebo
blocks alone (leave one block out), as a family per kind and measure; every placebo discovery is
a false one, and `family_rates` counts the families with any (what BH bounds under a complete
null). The calibrate stage (pipeline/behaviour/calibration.py) measures the same on surrogates,
on chimeras of trained layers and on untrained models, and the power of planted pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config import CompositionConfig
from ..tables import INVARIANT, PROJECTION, join_measures

# The procedure in a paragraph, for the report and the generated docs (the module doc has it in full).
DESCRIPTION = (
    "A pair composes when it is a discovery: Benjamini-Hochberg at the configured FDR, per kind and "
    "measure, over the p-values of the later pairs against the model's own null. A pair's location is "
    "where the other pairs of its kind and layer pair sit (the median of their raw z), never below "
    "chance alignment (raw z 0), so a discovery stands above both its peers and chance; the null's "
    "shape is how far a pair that cannot compose (a writer read by a head of its own layer or of an "
    "earlier one) strays from where its own block of such pairs sits, pooled over the blocks: its "
    "normal-consistent MAD (at least the Haar null's 1), conformal up to the 80th percentile and an "
    "exponential tail beyond. The detection limit is the raw z a lone composing pair needs."
)
MAD_NORMAL = 1.4826  # 1 / Phi^-1(3/4): a standard normal's MAD times this is 1
FAMILY = ["kind", "variant"]  # BH's family, and the null's: one kind of one measure
PLACEBO_BLOCK = ["src_layer", "dst_layer"]  # placebo pairs of one block: left out together
# the Haar null's own centre and scale: floors for a pair's location (step 3) and the scale (step 2)
HAAR_CENTRE, HAAR_SCALE = 0.0, 1.0
# step 4: the share of a family's placebo pairs whose excess over the rest fits its exponential tail,
# and a floor for its mean: a standard normal's mean excess over its 80th percentile (0.558), so a
# placebo family with almost no spread in its top fifth cannot make a thin tail
TAIL_FRACTION = 0.2
MIN_TAIL_MEAN = 0.558
MIN_TAIL_PAIRS = 5  # fewer pairs above the threshold: the conformal p alone


def aligned(placebo: pd.DataFrame) -> np.ndarray:
    """Each placebo row's raw z minus the median of its family's block (kind, variant, src_layer,
    dst_layer): how far a non-composing pair strays from where its block sits (step 2). NaN where
    z is, or where the block has no finite z."""
    z = placebo["z"].to_numpy(dtype=float)
    out = np.full(len(z), np.nan)
    for rows in placebo.groupby([*FAMILY, *PLACEBO_BLOCK], sort=False).indices.values():
        finite = z[rows][np.isfinite(z[rows])]
        if len(finite):
            out[rows] = z[rows] - float(np.median(finite))
    return out


def null_of(placebo: pd.DataFrame) -> pd.DataFrame:
    """Step 2's shape per family (kind, variant), from the placebo pairs alone: column scale, the
    normal-consistent MAD of the aligned placebo z (`aligned`) floored by the Haar null's sd; NaN
    for a family with fewer than three defined placebo pairs (no null: nothing in it is tested)."""
    deviations = aligned(placebo)
    rows = {}
    for key, rows_of in placebo.groupby(FAMILY, sort=False).indices.items():
        d = deviations[rows_of]
        d = d[np.isfinite(d)]
        if len(d) < 3:
            rows[key] = math.nan
            continue
        scale = MAD_NORMAL * float(np.median(np.abs(d)))  # about 0: aligned on each block's median
        rows[key] = max(scale, HAAR_SCALE) if scale > 0 else HAAR_SCALE  # no spread: Haar's
    index = (
        pd.MultiIndex.from_tuples(list(rows), names=FAMILY)
        if rows
        else pd.MultiIndex.from_arrays([[], []], names=FAMILY)
    )
    return pd.DataFrame({"scale": list(rows.values())}, index=index, dtype=float)


def centres(frame: pd.DataFrame, floor: float | None = HAAR_CENTRE) -> np.ndarray:
    """Step 3's location of every row: the median raw z of the other rows of its family and block
    (kind, variant, src_layer, dst_layer), floored by `floor` (the Haar null's centre; None: not
    floored, the bulk of the block alone, for checking the null's shape); `floor` itself where no
    other row of the block is defined; NaN where the row's z is NaN (or nothing locates it)."""
    z = frame["z"].to_numpy(dtype=float)
    out = np.full(len(z), np.nan)
    for rows in frame.groupby([*FAMILY, *PLACEBO_BLOCK], sort=False).indices.values():
        defined = rows[np.isfinite(z[rows])]
        if len(defined) == 1 and floor is not None:  # no other pair to locate it by: chance
            out[defined] = floor
        if len(defined) < 2:
            continue
        values = z[defined]
        others = [np.median(np.delete(values, k)) for k in range(len(values))]  # a block: <= 150 pairs
        out[defined] = others if floor is None else np.maximum(others, floor)
    return out


def standardised(frame: pd.DataFrame, null: pd.DataFrame, floor: float | None = HAAR_CENTRE) -> np.ndarray:
    """z_cal of every row: (z - its location (`centres`, floored at `floor`)) / its family's scale
    (`null_of`); NaN where its family has no null."""
    keys = pd.MultiIndex.from_frame(frame[FAMILY])
    scale = null["scale"].reindex(keys).to_numpy(dtype=float)
    return (frame["z"].to_numpy(dtype=float) - centres(frame, floor)) / scale


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
    """(u, share, beta) of step 4: u the pool's (1 - TAIL_FRACTION) quantile, share = (1 + #{pool >
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
    """Step 4's p of each z_cal against one family's placebo pool: conformal up to the tail's
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


def tested(frame: pd.DataFrame, z_cal: np.ndarray, pool: pd.DataFrame, fdr: float) -> pd.DataFrame:
    """`frame` with z_cal, p (each family against its own family's rows of `pool`: FAMILY columns
    and z_cal), q (BH per family of `frame`) and discovery."""
    p = np.full(len(frame), np.nan)
    q = np.full(len(frame), np.nan)
    by_family = pool.groupby(FAMILY, sort=False)["z_cal"]
    for key, rows in frame.groupby(FAMILY, sort=False).indices.items():
        if key in by_family.groups:
            p[rows] = null_p(z_cal[rows], by_family.get_group(key).to_numpy(dtype=float))
        q[rows] = benjamini_hochberg(p[rows])
    with np.errstate(invalid="ignore"):
        discovery = np.isfinite(q) & (q <= fdr)
    return frame.assign(z_cal=z_cal, p=p, q=q, discovery=discovery)


def calibrate(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo), each with tables.SIGNIFICANCE_COLUMNS added (module doc), row order kept.

    Both tables have kind, variant (a measure: the five Frobenius variants and the others),
    src_layer, dst_layer and the raw z. `scores`: the later pairs, each located in its own block
    and shaped by every placebo pair; `placebo`: each (src_layer, dst_layer) block located in
    itself and shaped by the other blocks alone."""
    null = null_of(placebo)
    out = tested(scores, standardised(scores, null), pools(placebo, null), fdr)
    parts = []
    for rows in placebo.groupby(PLACEBO_BLOCK, sort=False).indices.values():
        mine = np.zeros(len(placebo), dtype=bool)
        mine[rows] = True
        others = placebo[~mine]
        theirs = null_of(others)
        block = placebo.iloc[rows]
        parts.append(tested(block, standardised(block, theirs), pools(others, theirs), fdr))
    placebo_out = (
        pd.concat(parts).loc[placebo.index]
        if parts
        else placebo.assign(z_cal=np.nan, p=np.nan, q=np.nan, discovery=False)
    )
    return out, placebo_out


def pools(placebo: pd.DataFrame, null: pd.DataFrame) -> pd.DataFrame:
    """The placebo pairs' FAMILY columns and their aligned z over their family's scale: step 4's
    pools."""
    scale = null["scale"].reindex(pd.MultiIndex.from_frame(placebo[FAMILY])).to_numpy(dtype=float)
    return placebo[FAMILY].assign(z_cal=aligned(placebo) / scale)


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
    "Power"), with its location (the median of the family's later pairs, floored at 0: what any
    one pair of them is measured from, give or take the pair itself) and scale. JSON-ready: an
    unreachable bar is None. One layer pair per family (a two-layer model); with more, the
    location is the median over every later pair of the family, and "layer_pairs" gives each
    layer pair's own bar ({"L{a}->L{b}": {"raw_z", "centre"}}): its centre the median of its
    block, where `calibrate` locates each of its pairs."""
    null = null_of(placebo)
    by_family = pools(placebo, null).groupby(FAMILY, sort=False)["z_cal"]
    every_z = scores["z"].to_numpy(dtype=float)
    layers = scores[list(PLACEBO_BLOCK)].to_numpy()  # [rows, 2]: each pair's (src_layer, dst_layer)
    out: dict = {}
    for (kind, variant), rows in scores.groupby(FAMILY, sort=False).indices.items():
        z = every_z[rows]
        m = int(np.isfinite(z).sum())
        mine = (kind, variant) in by_family.groups
        bar = (
            lone_pair_bar(by_family.get_group((kind, variant)).to_numpy(float), m, fdr) if mine else math.nan
        )
        scale = float(null["scale"].get((kind, variant), math.nan))
        limit = _limit(z, bar, scale)
        out.setdefault(kind, {})[variant] = {"z_cal": _json(bar), **limit, "scale": _json(scale)}
        blocks = sorted({(int(a), int(b)) for a, b in layers[rows]})
        if len(blocks) > 1:
            out[kind][variant]["layer_pairs"] = {
                f"L{a}->L{b}": _limit(z[(layers[rows] == (a, b)).all(axis=1)], bar, scale) for a, b in blocks
            }
    return out


def _limit(z: np.ndarray, bar: float, scale: float) -> dict:
    """{"raw_z", "centre"}: the raw z a lone pair among pairs of raw z `z` needs to clear `bar`
    (a calibrated z) at `scale`, and its location: their median, floored at the Haar centre."""
    finite = z[np.isfinite(z)]
    centre = max(float(np.median(finite)), HAAR_CENTRE) if finite.size else math.nan
    return {"raw_z": _json(centre + scale * bar), "centre": _json(centre)}


def _json(v: float) -> float | None:
    """A finite float, or None (JSON has no inf or NaN)."""
    return float(v) if math.isfinite(v) else None


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


def raw_tables(
    hw, cfg: CompositionConfig, seed: int, positions: str, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo) of one set of weights (`weights.HeadWeights`), not yet calibrated: every
    measure's rows (scores.csv's five variants, then invariant.csv's and projection.csv's as those
    variants, tables.MEASURES) for the
    later pairs and for the pairs that cannot compose, with the same seed (the same null draws);
    `device`: where the products run (`composition.composition_scores`)."""
    from . import composition, invariant, projection  # torch: imported where the scores are computed

    scores, placebo = (
        join_measures(
            composition.composition_scores(hw, cfg, seed, placebo=placebo, device=device),
            {
                INVARIANT: invariant.invariant_scores(
                    hw, cfg, seed, positions, placebo=placebo, device=device
                ),
                PROJECTION: projection.projection_scores(hw, placebo=placebo),
            },
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
