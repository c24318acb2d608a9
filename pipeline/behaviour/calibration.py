"""Is the composition test calibrated and powered on this model? The calibrate stage's science:
the discoveries of pipeline/circuits/significance.py measured where every one is false, and where
a composition of known strength is planted; beside the heads stage's roles and causal effects,
which say, without the test, which of the model's own pairs do not compose.

Calibrated: the share of families (one kind of one measure of one model) with any discovery,
which Benjamini-Hochberg bounds by the FDR when nothing composes, on three nulls:

- surrogates (`scoring.surrogate`): this model's later layers each in a Haar-random basis of the
  residual stream, so every head keeps its circuits and only how the layers sit relative to each
  other is random;
- chimeras (`chimera`): this model's layer 0 with the later layers of another trained model of
  the same shape (another seed): trained geometry on both sides, and no reason to compose;
- untrained models (`untrained`): fresh initialisations of this shape.

Where a null keeps the trained geometry, the floors of the null (centre 0, scale 1) cannot make
the test pass: the chimeras' later pairs sit where trained heads sit, not at the Haar null's
centre. The non-composing later pairs of the model itself (`non_composing`: no circuit roles
between them and no causal effect of their own, from the heads stage) show the null's shape from
the other side: their p-values against the bulk of their kind (`bulk_p`: the null's location
without its chance floor) should be near uniform, not piled at 1.

Powered: a K composition planted into one pair (`plant`), at growing strength, the smallest
strength at which the pair is a discovery per measure and its raw z there. Two plants, named
apart because the second favours the rotated strands: "keys", the reader's keys turned to read the
writer's two strongest output directions and nothing else changed; "mixed", the same plus the
writer's values turned to read what the reader's queries read (the cross term D A that only the
errata's rotated strands multiply by). Two readers: the layer-1 head read least (its largest
corrected K raw z over the writers is the smallest) and the one read most, each from its
least-read writer. The singular vectors a plant is built from have fixed signs (`svd_fixed`), so
the plant, and its outcome, are a function of the weights alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import streams
from ..circuits import channel_null, rotated, scoring, significance
from ..circuits.scoring import PAIR_COLUMNS
from ..circuits.weights import HeadWeights, prepare
from ..config import CalibrationConfig, CompositionConfig, ModelConfig
from ..model.transformer import Transformer
from ..tables import KINDS, MEASURES
from .agreement import pair_part

PLANTS = ("keys", "mixed")
READERS = ("least_read", "most_read")
K_MEASURES = tuple(m for m in MEASURES if not m.endswith("_trueden"))  # a discovery ignores denominators
PLANT_RANK = 2  # directions a plant joins


# --- the nulls --------------------------------------------------------------------------


def surrogate(hw: HeadWeights, seed: int, i: int) -> HeadWeights:
    """Surrogate i of `hw` (`scoring.surrogate`), its bases drawn from the seed's stream."""
    return scoring.surrogate(
        hw, torch.Generator().manual_seed(streams.seed_of(seed, "calibration.surrogate", i))
    )


def untrained(shape: ModelConfig, seed: int, n: int) -> list[HeadWeights]:
    """n fresh initialisations of `shape`, as training starts from one (the model's own
    initialisation, in float32), each from the seed's stream, analysis-ready."""
    out = []
    for i in range(n):
        torch.manual_seed(streams.seed_of(seed, "calibration.untrained", i))
        out.append(prepare(Transformer(shape).state_dict(), shape)[0])
    return out


def chimera(first: HeadWeights, later: HeadWeights) -> HeadWeights:
    """Layer 0 of `first` with the later layers of `later` (same shape): a model whose layers
    were never trained together."""
    if (first.n_layers, first.n_heads, first.d_model, first.d_head) != (
        later.n_layers, later.n_heads, later.d_model, later.d_head,
    ):  # fmt: skip
        raise ValueError("a chimera joins models of one shape")
    names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    joined = {n: torch.cat([getattr(first, n)[:1], getattr(later, n)[1:]]) for n in names}
    return replace(first, **joined)


def discovered_families(tested: pd.DataFrame) -> pd.Series:
    """Per family (kind, variant) of a calibrated table: whether it has any discovery."""
    return tested.groupby(significance.FAMILY, sort=False)["discovery"].any()


def family_rates(found: Iterable[pd.Series]) -> dict:
    """{measure: {"families", "with_discovery", "rate"}} over the models' families (each model's
    `discovered_families`), every kind of a measure pooled; JSON-ready."""
    table = pd.concat(list(found), axis=1)  # [families, models]
    out = {}
    for measure in MEASURES:
        rows = (
            table.xs(measure, level="variant") if measure in table.index.get_level_values("variant") else None
        )
        n = 0 if rows is None else int(rows.notna().to_numpy().sum())
        hits = 0 if rows is None else int(rows.fillna(False).to_numpy().sum())
        out[measure] = {"families": n, "with_discovery": hits, "rate": hits / n if n else None}
    return out


def null_families(models: Sequence[HeadWeights], cfg: CompositionConfig, seed: int, positions: str) -> dict:
    """`family_rates` of `models` scored and calibrated exactly as the composition stage does."""
    return family_rates(
        discovered_families(significance.measured(hw, cfg, seed, positions)[0]) for hw in models
    )


# --- the model's own non-composing pairs ---------------------------------------------------


def bulk_p(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> np.ndarray:
    """Each later pair's p-value against the bulk of its kind: the test's p (significance.calibrate)
    with its block's location unfloored, so a pair at its block's median gets p near 1/2 whether
    or not the block sits below chance. For checking the null's shape, not for testing."""
    null = significance.null_of(placebo)
    z_cal = significance.standardised(scores, null, floor=None)
    return significance.tested(scores, z_cal, significance.pools(placebo, null), fdr)["p"].to_numpy()


CIRCUIT = (("previous_token", "recent_window"), ("induction",))  # the errata's K circuit: writers, readers


def non_composing(scores: pd.DataFrame, roles: pd.DataFrame, effect_part: pd.DataFrame) -> np.ndarray:
    """A mask of `scores`' rows whose pair shows no composition by evidence the test does not use:
    not a circuit pair by role (CIRCUIT, from heads.csv) and no causal effect of its own (its
    ablation effect's pair part, behaviour.agreement.pair_part of the pattern effect, at most 0:
    no larger than its writer's and reader's scales predict). `effect_part`: PAIR columns and
    `part`."""
    role = roles.set_index(["layer", "head"])["role"]
    src = role.reindex(pd.MultiIndex.from_arrays([scores["src_layer"], scores["src_head"]])).to_numpy()
    dst = role.reindex(pd.MultiIndex.from_arrays([scores["dst_layer"], scores["dst_head"]])).to_numpy()
    circuit = np.isin(src, CIRCUIT[0]) & np.isin(dst, CIRCUIT[1])
    pair = ["kind", *PAIR_COLUMNS]
    part = scores[pair].merge(effect_part, on=pair, how="left")["part"].to_numpy(dtype=float)
    return ~circuit & (part <= 0)


def p_distribution(p: np.ndarray) -> dict:
    """{"pairs", "mean", "deciles", "above_0.9"} of finite p-values: uniform p has mean 1/2, deciles
    0.1 .. 0.9 and a tenth above 0.9; JSON-ready."""
    p = np.asarray(p, dtype=float)
    p = p[np.isfinite(p)]
    if not len(p):
        return {"pairs": 0, "mean": None, "deciles": None, "above_0.9": None}
    return {
        "pairs": int(len(p)),
        "mean": float(p.mean()),
        "deciles": [float(x) for x in np.quantile(p, np.linspace(0.1, 0.9, 9))],
        "above_0.9": float((p > 0.9).mean()),
    }


# --- power ------------------------------------------------------------------------------------


def svd_fixed(W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """torch.linalg.svd(W, full_matrices=False) with each singular pair's sign fixed: the entry of
    largest magnitude of each left singular vector is positive (the right one flips with it), so
    the factors are a function of W alone, not of the LAPACK build."""
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    at = U.abs().argmax(dim=-2, keepdim=True)  # [.., 1, k]
    sign = torch.sign(torch.gather(U, -2, at))
    sign = torch.where(sign == 0, 1.0, sign).to(U.dtype)
    return U * sign, S, Vh * sign.mT


def plant(hw: HeadWeights, src_head: int, dst_head: int, strength: float, kind: str = "keys") -> HeadWeights:
    """`hw` (two or more layers) with K-composition of layer-0 head `src_head` into layer-1 head
    `dst_head` planted at `strength` (module doc). "keys": b's keys read a's PLANT_RANK strongest
    output directions into b's strongest query directions, a rank-2 term of norm `strength`
    times ||W_K^b|| added to W_K^b. "mixed": also a's values read what b's queries read, a term of
    norm `strength` times ||W_V^a|| added to W_V^a. Every other weight as it was."""
    if kind not in PLANTS:
        raise ValueError(f"plant kind must be one of {', '.join(PLANTS)}, not {kind!r}")
    U_O, _, out = svd_fixed(hw.W_O[0, src_head])  # [d_head, d_head], [d_head, d_model]: a's output directions
    U_Q, _, query = svd_fixed(hw.W_Q[1, dst_head])  # [d_model, d_head], [d_head, d_head]
    k = PLANT_RANK
    W_K, W_V = hw.W_K.clone(), hw.W_V.clone()
    keys = out[:k].T @ query[:k]  # [d_model, d_head], Frobenius norm sqrt(k)
    W_K[1, dst_head] += keys * (strength * hw.W_K[1, dst_head].norm() / k**0.5)
    if kind == "mixed":
        values = (
            U_Q[:, :k] @ U_O[:, :k].T
        )  # [d_model, d_head]: b's query inputs into a's strongest value dims
        W_V[0, src_head] += values * (strength * hw.W_V[0, src_head].norm() / k**0.5)
    return replace(hw, W_K=W_K, W_V=W_V)


def readers(raw: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """{reader: (layer-0 writer, layer-1 reader)}: the layer-1 heads read least and most (the
    largest corrected K raw z over their layer-0 writers, smallest and largest), each with its
    least-read writer. `raw`: the model's later pairs (significance.raw_tables)."""
    k = raw[
        (raw["kind"] == "K") & (raw["variant"] == "true") & (raw["src_layer"] == 0) & (raw["dst_layer"] == 1)
    ]
    best = k.groupby("dst_head")["z"].max()
    out = {}
    for name, dst in (("least_read", int(best.idxmin())), ("most_read", int(best.idxmax()))):
        mine = k[k["dst_head"] == dst].sort_values(["z", "src_head"])
        out[name] = (int(mine["src_head"].iloc[0]), dst)
    return out


def power(
    hw: HeadWeights, cfg: CompositionConfig, seed: int, positions: str, strengths: Sequence[float]
) -> pd.DataFrame:
    """One row per plant, reader, strength and measure (K_MEASURES) until every measure has found
    the planted pair: the pair, its raw z and whether it is a discovery."""
    raw, _ = significance.raw_tables(hw, cfg, seed, positions)
    rows = []
    for kind in PLANTS:
        for reader, (src, dst) in readers(raw).items():
            found: set[str] = set()
            for strength in sorted(strengths):
                tested, _ = significance.measured(plant(hw, src, dst, strength, kind), cfg, seed, positions)
                at = (tested["kind"] == "K") & (tested["src_layer"] == 0) & (tested["src_head"] == src)
                pair = tested[at & (tested["dst_layer"] == 1) & (tested["dst_head"] == dst)].set_index(
                    "variant"
                )
                for m in K_MEASURES:
                    rows.append({"plant": kind, "reader": reader, "pair": f"L0H{src}->L1H{dst}",
                                 "strength": strength, "measure": m, "raw_z": float(pair.at[m, "z"]),
                                 "discovery": bool(pair.at[m, "discovery"])})  # fmt: skip
                    found |= {m} if pair.at[m, "discovery"] else set()
                if found >= set(K_MEASURES):
                    break
    return pd.DataFrame(rows)


def smallest_found(table: pd.DataFrame) -> dict:
    """{plant: {reader: {measure: {"strength", "raw_z", "pair"}}}}: the smallest strength at which the
    planted pair is a discovery, and its raw z there (None: not found at any strength tried)."""
    out: dict = {}
    for (kind, reader, measure), rows in table.groupby(["plant", "reader", "measure"], sort=False):
        hit = rows[rows["discovery"]].sort_values("strength")
        first = hit.iloc[0] if len(hit) else None
        out.setdefault(kind, {}).setdefault(reader, {})[measure] = {
            "pair": rows["pair"].iloc[0],
            "strength": None if first is None else float(first["strength"]),
            "raw_z": None if first is None else float(first["raw_z"]),
        }
    return out


def limits(scores: pd.DataFrame, placebo: pd.DataFrame, fdr: float) -> dict:
    """{kind: {measure: raw z}}: the model's detection limits (significance.detection_limits)."""
    found = significance.detection_limits(scores, placebo, fdr)
    return {kind: {m: v["raw_z"] for m, v in by.items()} for kind, by in found.items() if kind in KINDS}


def summary(parts: Mapping[str, object]) -> dict:
    """calibration.json: the parts in a fixed order, NaN as None."""

    def safe(x):
        if isinstance(x, dict):
            return {k: safe(v) for k, v in x.items()}
        if isinstance(x, list):
            return [safe(v) for v in x]
        if isinstance(x, float) and not math.isfinite(x):
            return None
        return x

    return safe(dict(parts))


# --- claim (e) and the channel statistic on the nulls ---------------------------------------


def claim_e_values(hw: HeadWeights, pairs: pd.DataFrame, others: pd.DataFrame) -> dict[str, float]:
    """Claim (e)'s statistics on `hw` for the circuit pairs `pairs` (src/dst layer and head
    columns): "e", the mean of ln(alignment / chance) over them, and "e_specific", that minus the
    same over `others` (the same writers' other K pairs), from `rotated.rotation_statistics`."""

    def mean_log(rows: pd.DataFrame) -> float:
        if not len(rows):
            return math.nan
        index = tuple(torch.as_tensor(rows[c].to_numpy()) for c in PAIR_COLUMNS)
        s = rotated.rotation_statistics(hw.to(torch.float64), index)
        return float(torch.log(s["alignment"] / s["query_chance"]).mean())

    e = mean_log(pairs)
    return {"e": e, "e_specific": e - mean_log(others)}


def channel_families(models: Sequence[HeadWeights], cfg: CompositionConfig, seed: int) -> dict:
    """{kind: {"families", "with_discovery", "rate"}}: the channel statistic tested on every later
    pair of each model (`channel_null.every_pair_tested`), the share of (model, kind) families with any
    channel discovery."""
    found = [
        channel_null.every_pair_tested(hw, cfg.fdr, seed, cfg.null_samples, cfg.channel_tolerance)
        .groupby("kind")["discovery"]
        .any()
        for hw in models
    ]
    table = pd.concat(found, axis=1)
    return {
        kind: {
            "families": int(table.loc[kind].notna().sum()),
            "with_discovery": int(table.loc[kind].fillna(False).sum()),
            "rate": float(table.loc[kind].fillna(False).mean()),
        }
        for kind in table.index
    }


# --- everything, for one model ---------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    summary: dict  # calibration.json (JSON-ready)
    power: pd.DataFrame  # power.csv: every planted pair tried (`power`)


def circuit_pairs(scores: pd.DataFrame, roles: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(P, O) of claim (e): the discovered corrected K pairs previous_token -> induction, and the
    same writers' other later K pairs whose reader is not an induction head."""
    role = roles.set_index(["layer", "head"])["role"]
    k = scores[(scores["kind"] == "K") & (scores["variant"] == "true")]
    src = role.reindex(pd.MultiIndex.from_arrays([k["src_layer"], k["src_head"]])).to_numpy()
    dst = role.reindex(pd.MultiIndex.from_arrays([k["dst_layer"], k["dst_head"]])).to_numpy()
    P = k[(src == "previous_token") & (dst == "induction") & k["discovery"].to_numpy(dtype=bool)]
    writers = set(zip(P["src_layer"], P["src_head"], strict=True))
    same = np.array([w in writers for w in zip(k["src_layer"], k["src_head"], strict=True)], dtype=bool)
    return P, k[same & (dst != "induction")]


def calibrate(
    hw: HeadWeights,
    positions: str,
    seed: int,
    cfg: CompositionConfig,
    cal: CalibrationConfig,
    partners: Sequence[HeadWeights],
    untrained: Sequence[HeadWeights],
    measured: pd.DataFrame,
    placebo: pd.DataFrame,
    roles: pd.DataFrame,
    ablation: pd.DataFrame,
) -> Calibration:
    """The calibrate stage's tables for one model (module doc). `partners`: other trained models of
    its shape (the chimeras' later layers); `untrained`: fresh initialisations; `measured`,
    `placebo`: its composition (every measure, calibrated); `roles`: heads.csv; `ablation`:
    ablation.csv (the pattern effect)."""
    surrogates = [
        scoring.surrogate(
            hw, torch.Generator().manual_seed(streams.seed_of(seed, "calibration.surrogate", i))
        )
        for i in range(cal.surrogates)
    ]
    chimeras = [chimera(hw, other) for other in partners]
    families = {
        "surrogate": null_families(surrogates, cfg, seed, positions),
        "chimera": null_families(chimeras, cfg, seed, positions) if chimeras else None,
        "untrained": null_families(untrained, cfg, seed, positions),
    }
    effect = ablation[["kind", *PAIR_COLUMNS]].assign(part=pair_part(ablation, "pattern_effect"))
    quiet = non_composing(measured, roles, effect)
    bulk = bulk_p(measured, placebo, cfg.fdr)
    spread = {}
    for (kind, variant), rows in measured.groupby(["kind", "variant"], sort=False).indices.items():
        if variant in K_MEASURES:
            mine = rows[quiet[rows]]
            spread.setdefault(kind, {})[variant] = {
                "bulk_p": p_distribution(bulk[mine]),
                "p": p_distribution(measured["p"].to_numpy(dtype=float)[mine]),
            }
    table = power(hw, cfg, seed, positions, cal.strengths)
    P, O = circuit_pairs(measured, roles)
    claim_e = {
        "model": claim_e_values(hw, P, O),
        "surrogates": [claim_e_values(surrogate(hw, seed, i), P, O) for i in range(cal.claim_e_surrogates)],
    }
    summary_ = summary({
        "families": families,
        "placebo": {m: significance.family_summary(placebo[placebo["variant"] == m])["all"]
                    for m in MEASURES},
        "non_composing": spread,
        "detection_limits": limits(measured, placebo, cfg.fdr),
        "power": smallest_found(table),
        "channels": {"surrogate": channel_families(surrogates, cfg, seed),
                     "untrained": channel_families(untrained, cfg, seed)},
        "claim_e": claim_e,
    })  # fmt: skip
    return Calibration(summary_, table)
