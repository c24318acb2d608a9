"""Which pairs compose: discoveries at a controlled false-discovery rate, against a null the
model itself supplies. The statistics are numpy and pandas on the score tables; `measured`
computes those tables (every measure, the pairs that can compose and those that cannot).

Why not "z > 3". Every score's raw z is measured against a Haar rotation of the writer's
residual basis (`pipeline.circuits.composition`, `pipeline.circuits.invariant`): a random writer spreads its
output over all of d_model. A trained residual stream uses far fewer directions, and trained
heads that do not compose are more orthogonal than random ones, so the raw z's centre and
spread move with the model and with training, in both directions. On a model of the paper's
shape the raw z of one kind spreads with a MAD of 3-5, and most pairs clear 3, pairs that
cannot compose among them (docs/significance.md).

The procedure, per model:

1. Pairs that cannot compose (`scoring.placebo_pairs`: a writer read by a head of its own
   layer or of an earlier one) are scored by the same formulas as the later pairs, for every
   kind and measure (placebo.csv).
2. Location and scale, by the bulk (Efron's empirical null). In each block of pairs (kind,
   measure, writer layer, reader layer), first each reader's median over the block's writers
   is taken off (a reader whose input every writer reaches, or none does, is a property of the
   reader, not of a pair), then the block is standardised by its median and MAD:

       r = z - median_{writers a'}(z_{a' b}),    z_cal = (r - median(r_block)) / (1.4826 MAD(r_block))

   so a block's centre and spread, whatever the residual stream does to them, are removed. The
   writers' own effect is kept: a previous-token head that several induction heads read is the
   circuit itself (taking each writer's median off the default models' blocks, where it feeds
   five of eight layer-1 heads, left 4 of 28 true K discoveries in three seeds).
3. Shape: the null distribution of z_cal is the pooled z_cal of every placebo pair of the
   model (every kind, measure and block). A later pair's p-value is the conformal one,

       p = (1 + #{placebo z_cal >= z_cal}) / (1 + n_placebo),

   valid (P(p <= a) <= a) for any pair exchangeable with the placebo pairs after step 2;
   heavy tails (one head that stands out of its block in every pair) are in the pool, so they
   are not taken for composition.
4. Discoveries: Benjamini-Hochberg at level `fdr` over each family of later pairs (one kind of
   one measure); q is BH's adjusted p-value, a discovery has q <= fdr. An undefined (NaN) score
   has NaN p and q, is never a discovery and does not count in the family's size.

The false-positive rate, measured on every model: each placebo block is tested the same way
against the pool of the *other* placebo blocks (leave one block out), as a family per kind and
measure; every placebo discovery is a false one. Calibration tests (tests/test_significance.py):
untrained weights of every shape in conf/model/, placebo pairs of a trained model, a planted
pair.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.config import CompositionConfig
from pipeline.tables import join_measures

MAD_NORMAL = 1.4826  # 1 / Phi^-1(3/4): a standard normal's MAD times this is 1
FAMILY = ["kind", "variant"]  # BH's family: one kind of one measure
BLOCK = ["kind", "variant", "src_layer", "dst_layer"]  # standardised together (step 2)


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


def standardised(frame: pd.DataFrame) -> np.ndarray:
    """z_cal of every row: its z less its reader's median in the block, standardised by the
    block's median and MAD (step 2)."""
    z = frame["z"].to_numpy(dtype=float)
    reader = frame.assign(z=z).groupby([*BLOCK, "dst_head"], sort=False)["z"].transform("median")
    r = z - reader.to_numpy(dtype=float)
    out = np.full(len(frame), np.nan)
    for rows in frame.groupby(BLOCK, sort=False).indices.values():
        centre, scale = empirical_null(r[rows])
        out[rows] = (r[rows] - centre) / scale
    return out


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


def _tested(frame: pd.DataFrame, z_cal: np.ndarray, pool: np.ndarray, fdr: float) -> pd.DataFrame:
    """`frame` with z_cal, p (against `pool`), q (BH per family of `frame`) and discovery."""
    p = conformal_p(z_cal, pool)
    q = np.full(len(frame), np.nan)
    for rows in frame.groupby(FAMILY, sort=False).indices.values():
        q[rows] = benjamini_hochberg(p[rows])
    with np.errstate(invalid="ignore"):
        discovery = np.isfinite(q) & (q <= fdr)
    return frame.assign(z_cal=z_cal, p=p, q=q, discovery=discovery)


def calibrate(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo), each with tables.SIGNIFICANCE_COLUMNS added (module doc), row order kept.

    Both tables have kind, variant (a measure: the five Frobenius variants and "invariant"),
    src_layer, dst_layer and the raw z. `scores`: the later pairs, tested against every placebo
    pair; `placebo`: each (src_layer, dst_layer) block tested against the others."""
    placebo_z = standardised(placebo)
    out = _tested(scores, standardised(scores), placebo_z, fdr)
    parts = []
    for rows in placebo.groupby(["src_layer", "dst_layer"], sort=False).indices.values():
        mine = np.zeros(len(placebo), dtype=bool)
        mine[rows] = True
        block = placebo.iloc[rows]
        parts.append(_tested(block, placebo_z[rows], placebo_z[~mine], fdr))
    placebo_out = (
        pd.concat(parts).loc[placebo.index]
        if parts
        else placebo.assign(z_cal=np.nan, p=np.nan, q=np.nan, discovery=False)
    )
    return out, placebo_out


def discovery_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per family (kind, variant): defined pairs, discoveries and their rate."""
    g = frame.assign(defined=np.isfinite(frame["z"].to_numpy(dtype=float))).groupby(FAMILY, sort=False)
    out = pd.DataFrame(
        {"n_pairs": g["defined"].sum().astype(int), "discoveries": g["discovery"].sum().astype(int)}
    )
    out["rate"] = out["discoveries"] / out["n_pairs"].where(out["n_pairs"] > 0)
    return out.reset_index()


def measured(
    hw, cfg: CompositionConfig, seed: int, positions: str, device: str | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(scores, placebo) of one set of weights (`weights.HeadWeights`): every measure's rows
    (scores.csv's five variants, then invariant.csv's as variant "invariant") for the later pairs
    and for the pairs that cannot compose, with the same seed (the same null draws), calibrated
    at `cfg.fdr`. What the composition stage writes, and the dynamics stage at every checkpoint;
    `device`: where the products run (`composition.composition_scores`)."""
    from pipeline.circuits import composition, invariant  # torch: imported where the scores are computed

    tables = [
        join_measures(
            composition.composition_scores(hw, cfg, seed, placebo=placebo, device=device),
            invariant.invariant_scores(hw, cfg, seed, positions, placebo=placebo, device=device),
        )
        for placebo in (False, True)
    ]
    return calibrate(*tables, cfg.fdr)
