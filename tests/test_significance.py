"""Discoveries at a controlled FDR (pipeline/circuits/significance.py): known answers for each step, then
the calibration the procedure promises, measured: untrained weights of every shape in
conf/model/, the pairs that cannot compose in a trained model, and a planted model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import torch
import yaml
from models import random_model

from pipeline import params
from pipeline.circuits import significance, weights
from pipeline.config import CompositionConfig, Config, ModelConfig
from pipeline.model import train
from pipeline.tables import INVARIANT, KINDS, MEASURES

ROOT = Path(__file__).resolve().parents[1]
FDR = 0.05
NORMAL_TAIL_3 = 0.5 * math.erfc(3 / math.sqrt(2))  # P(Z > 3), Z standard normal: 0.00135
FAST = CompositionConfig(baseline_samples=16, null_samples=16, fdr=FDR)


# --- known answers -------------------------------------------------------------------


def test_empirical_null_is_the_median_and_the_normal_consistent_mad():
    centre, scale = significance.empirical_null(np.array([1.0, 2.0, 3.0, 4.0, 100.0, np.nan]))
    assert centre == 3.0 and scale == pytest.approx(1.4826)  # |z - 3| = 2, 1, 0, 1, 97: MAD 1
    assert all(math.isnan(v) for v in significance.empirical_null(np.array([1.0, 2.0])))  # too few
    assert math.isnan(significance.empirical_null(np.array([5.0, 5.0, 5.0]))[1])  # no spread


def test_conformal_p_counts_the_pool_at_or_above():
    p = significance.conformal_p(np.array([5.0, 0.5, 1.0, np.nan]), np.array([0.0, 1.0, 2.0, 3.0, np.nan]))
    # 5: none of 4 at or above; 0.5: three; 1.0: three (ties count); NaN stays NaN
    assert p[:3].tolist() == [1 / 5, 4 / 5, 4 / 5] and math.isnan(p[3])


def test_benjamini_hochberg_known_answer():
    q = significance.benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.5, np.nan]))
    # sorted 0.01, 0.03, 0.04, 0.5 (m = 4, NaN not counted): p m / i = 0.04, 0.06, 0.0533, 0.5,
    # then the running minimum from the largest
    assert q[:4] == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5]) and math.isnan(q[4])
    assert np.isnan(significance.benjamini_hochberg(np.array([np.nan]))).all()


def block(z: np.ndarray, kind="K", variant="true", src_layer=0, dst_layer=1) -> pd.DataFrame:
    """A [writers, readers] grid of raw z as score-table rows."""
    a, b = np.meshgrid(np.arange(z.shape[0]), np.arange(z.shape[1]), indexing="ij")
    return pd.DataFrame({
        "kind": kind, "variant": variant, "src_layer": src_layer, "src_head": a.ravel(),
        "dst_layer": dst_layer, "dst_head": b.ravel(), "z": z.ravel(),
    })  # fmt: skip


def test_standardised_takes_off_each_readers_median_then_the_blocks():
    # reader 1 reads everything (+10 in every row): its own effect, gone; the block is then
    # 0 everywhere but writer 2 into reader 0 (+4), and a small spread to standardise by
    z = np.array([[0.0, 10.0], [1.0, 11.0], [4.0, 10.0], [-1.0, 9.0]])
    got = significance.standardised(block(z)).reshape(4, 2)
    r = z - np.median(z, axis=0)  # reader medians 0.5 and 10
    centre = np.median(r)
    scale = 1.4826 * np.median(np.abs(r - centre))
    assert got == pytest.approx((r - centre) / scale)
    assert got[2, 0] == got.max() and abs(got[:, 1]).max() < abs(got[2, 0])


def test_later_pairs_are_tested_against_every_placebo_block_and_each_block_against_the_others():
    rng = np.random.default_rng(0)
    real = block(np.linspace(-1.0, 1.0, 36).reshape(6, 6).T)  # a bulk with no tail
    real.loc[3, "z"] = 50.0  # one pair far beyond any placebo pair
    placebo = pd.concat([
        block(rng.normal(size=(20, 20)), src_layer=1, dst_layer=1),
        block(rng.normal(size=(20, 20)), src_layer=1, dst_layer=0),
    ], ignore_index=True)  # fmt: skip
    scores, tested = significance.calibrate(real, placebo, FDR)
    pool = significance.standardised(placebo)
    assert scores["p"].tolist() == significance.conformal_p(significance.standardised(real), pool).tolist()
    # beyond all 800 placebo values: p = 1/801, q = 36 p (it ranks first of 36)
    assert scores.loc[3, "q"] == pytest.approx(36 / 801)
    assert scores["discovery"].tolist() == [i == 3 for i in range(36)]
    first = placebo["dst_layer"] == 1  # its p: against the other block alone
    other = significance.conformal_p(pool[first.to_numpy()], pool[~first.to_numpy()])
    assert tested.loc[first, "p"].tolist() == other.tolist()
    assert not tested["discovery"].any()


# --- calibration -----------------------------------------------------------------------


def rate_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Discoveries over defined pairs per kind and measure."""
    return significance.discovery_table(frame).set_index(["kind", "variant"])


@pytest.mark.parametrize("shape", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
def test_untrained_weights_discover_at_most_the_nominal_rate(shape):
    """Freshly initialised weights compose with nothing: over three seeds, the later pairs and
    the placebo pairs of every kind and measure are discovered at no more than the FDR."""
    raw = yaml.safe_load((ROOT / "conf" / "model" / f"{shape}.yaml").read_text())
    raw["d_vocab"], raw["n_ctx"] = 512, 64  # the vocabulary is the tokenizer's; neither enters a score
    model_cfg = ModelConfig(**raw)
    real, placebo = [], []
    for seed in range(3):  # exactly training's initialisation: float32, the config's init, zero biases
        fresh = random_model(model_cfg, seed=seed, dtype=torch.float32, perturb_biases=False)
        hw, _ = weights.prepare(fresh.state_dict(), model_cfg)
        r, p = significance.measured(hw, FAST, seed, model_cfg.positional_embedding_type)
        real.append(r)
        placebo.append(p)
    for frame in (pd.concat(real), pd.concat(placebo)):
        rates = rate_table(frame)
        assert len(rates) == len(KINDS) * len(MEASURES)
        assert (rates["rate"] <= FDR).all(), rates[rates["rate"] > FDR]


@pytest.fixture(scope="module")
def trained():
    """The synthetic setup's model (8 heads x 8, d_model 64), seed 0: layer-0 previous-token and
    layer-1 induction heads (test_train), as the composition stage measures it."""
    cfg: Config = params.from_dict(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"))
    result = train.train(cfg, seed=0, progress=False)
    hw, _ = weights.prepare(result.model.state_dict(), result.model.cfg)
    return significance.measured(hw, cfg.analysis.composition, 0, "shortformer")


@pytest.mark.slow
def test_pairs_that_cannot_compose_are_discovered_at_most_at_the_nominal_rate(trained):
    scores, placebo = trained
    rates = rate_table(placebo)
    assert (rates["n_pairs"] == 3 * 64 - 2 * 8).all()  # L0 -> L0, L1 -> L1 (not itself), L1 -> L0
    assert (rates["rate"] <= FDR).all(), rates[rates["rate"] > FDR]
    # while the raw rule (z > 3, nominally 0.13% under a normal null) passes placebo pairs at more
    # than ten times that in some kind and measure (measured: 4.0% of K pairs, true)
    raw = placebo.assign(z3=placebo["z"] > 3).groupby(["kind", "variant"])["z3"].mean()
    assert raw.max() > 10 * NORMAL_TAIL_3


@pytest.mark.slow
def test_the_trained_induction_circuit_is_discovered_and_the_bulk_is_centred(trained):
    scores, _ = trained
    k = scores[(scores["kind"] == "K") & (scores["variant"] == "true")]
    assert k["discovery"].any()  # the induction heads' keys read a previous-token head
    for m in MEASURES:
        # the calibrated statistic's bulk is centred (the raw z's need not be: invariant's is not)
        rows = scores[scores["variant"] == m]
        for kind in KINDS:
            assert abs(np.nanmedian(rows.loc[rows["kind"] == kind, "z_cal"])) <= 0.5
    raw = scores[(scores["variant"] == INVARIANT) & (scores["kind"] == "K")]["z"]
    assert abs(np.nanmedian(raw)) > 0.5


def test_the_planted_pair_is_discovered_and_few_others():
    """tests/planted.py's model (only 0.0 -> 1.0 composes, through keys) in a random background:
    N(0, 0.05) added to every head's weights (its own entries are 1, W_Q's up to 57). Without the
    background every other score is exactly 0, a bulk with no spread, so no empirical null."""
    gen = torch.Generator().manual_seed(0)
    state = {
        name: W + 0.05 * torch.randn(W.shape, generator=gen, dtype=W.dtype) if ".attn.W_" in name else W
        for name, W in planted.state_dict().items()
    }
    scores, placebo = significance.measured(
        weights.from_state_dict(state), CompositionConfig(), 0, "shortformer"
    )
    for m in MEASURES:
        k = scores[(scores["kind"] == "K") & (scores["variant"] == m)].set_index(
            ["src_layer", "src_head", "dst_layer", "dst_head"]
        )
        assert k.loc[(0, 0, 1, 0), "discovery"], m
    found = scores[scores["discovery"]]
    others = found[~((found["kind"] == "K") & (found["src_head"] == 0) & (found["dst_head"] == 0))]
    assert len(others) <= FDR * len(scores)
    assert placebo["discovery"].mean() <= FDR
