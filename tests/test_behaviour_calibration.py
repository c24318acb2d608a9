"""pipeline/behaviour/calibration.py: the calibrate stage's science.

Its nulls (chimeras, untrained models), the model's own non-composing pairs, planted pairs of
fixed sign, and the summaries, on small random models and hand-made tables."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from models import random_model

from pipeline.behaviour import calibration
from pipeline.circuits import significance, weights
from pipeline.config import CalibrationConfig, CompositionConfig
from pipeline.tables import MEASURES

CFG = CompositionConfig(baseline_samples=8, null_samples=8, fdr=0.05)


@pytest.fixture(scope="module")
def hw():
    return weights.from_state_dict(random_model("tiny", seed=3).state_dict())


def test_a_chimera_is_one_models_layer_0_and_the_others_later_layers(hw):
    other = weights.from_state_dict(random_model("tiny", seed=4).state_dict())
    both = calibration.chimera(hw, other)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        assert torch.equal(getattr(both, name)[0], getattr(hw, name)[0])
        assert torch.equal(getattr(both, name)[1], getattr(other, name)[1])
    assert torch.equal(both.W_E, hw.W_E)
    wide = weights.from_state_dict(random_model("three_layers", seed=4).state_dict())
    with pytest.raises(ValueError):
        calibration.chimera(hw, wide)


def test_untrained_models_are_the_initialisation_drawn_from_the_seeds_stream():
    shape = random_model("tiny").cfg
    a = calibration.untrained(shape, 0, 2)
    b = calibration.untrained(shape, 0, 2)
    c = calibration.untrained(shape, 1, 1)
    assert len(a) == 2 and torch.equal(a[0].W_Q, b[0].W_Q) and torch.equal(a[1].W_K, b[1].W_K)
    assert not torch.equal(a[0].W_Q, a[1].W_Q) and not torch.equal(a[0].W_Q, c[0].W_Q)
    std = shape.init_range  # the model's own initialisation: N(0, init_range) weights
    assert float(torch.cat([w.W_Q.flatten() for w in a]).std()) == pytest.approx(std, rel=0.15)


def test_svd_fixed_gives_each_pair_one_sign_whatever_the_input_signs():
    W = torch.randn(9, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    U, S, Vh = calibration.svd_fixed(W)
    assert torch.allclose(U @ torch.diag(S) @ Vh, W)
    top = U.abs().argmax(0)
    assert (U[top, torch.arange(4)] > 0).all()
    flipped = torch.diag(torch.tensor([-1.0, 1.0, -1.0, -1.0], dtype=torch.float64))
    U2, _, Vh2 = calibration.svd_fixed(W)  # the same matrix: the same factors, bit for bit
    assert torch.equal(U, U2) and torch.equal(Vh, Vh2)
    U3, _, Vh3 = calibration.svd_fixed(U @ flipped @ flipped @ torch.diag(S) @ Vh)
    assert torch.allclose(U3, U) and torch.allclose(Vh3, Vh)


def test_a_keys_plant_changes_only_the_readers_keys_and_grows_with_strength(hw):
    for kind, changed in (("keys", {"W_K"}), ("mixed", {"W_K", "W_V"})):
        planted = calibration.plant(hw, 1, 2, 0.5, kind)
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            same = torch.equal(getattr(planted, name), getattr(hw, name))
            assert same == (name not in changed), (kind, name)
        assert torch.equal(planted.W_K[1, :2], hw.W_K[1, :2])  # only reader 1.2's keys
        added = (planted.W_K[1, 2] - hw.W_K[1, 2]).norm()
        assert float(added) == pytest.approx(0.5 * float(hw.W_K[1, 2].norm()))
    numerator = lambda w: (w.W_V[0, 1] @ w.W_O[0, 1] @ w.W_K[1, 2] @ w.W_Q[1, 2].mT).norm()  # noqa: E731
    grows = [float(numerator(calibration.plant(hw, 1, 2, s))) for s in (0.0, 0.5, 1.0, 2.0)]
    assert grows == sorted(grows) and grows[-1] > 2 * grows[0]
    assert torch.equal(calibration.plant(hw, 1, 2, 0.3).W_K, calibration.plant(hw, 1, 2, 0.3).W_K)
    with pytest.raises(ValueError):
        calibration.plant(hw, 1, 2, 0.3, "values")


def test_the_least_and_most_read_readers_and_their_least_read_writers():
    raw = pd.DataFrame({
        "kind": "K", "variant": "true", "src_layer": 0, "dst_layer": 1,
        "src_head": [0, 1, 0, 1, 0, 1], "dst_head": [0, 0, 1, 1, 2, 2], "z": [1.0, 5.0, 0.5, -2.0, 9.0, 3.0],
    })  # fmt: skip
    # reader 0: max 5; reader 1: max 0.5 (least read); reader 2: max 9 (most read)
    assert calibration.readers(raw) == {"least_read": (1, 1), "most_read": (1, 2)}


def test_smallest_found_is_the_first_strength_at_which_a_measure_discovers_the_pair():
    table = pd.DataFrame({
        "plant": "keys", "reader": "least_read", "pair": "L0H1->L1H2",
        "strength": [0.1, 0.1, 0.2, 0.2, 0.3, 0.3], "measure": ["true", "projection"] * 3,
        "raw_z": [2.0, 1.0, 6.0, 1.5, 9.0, 2.0], "discovery": [False, False, True, False, True, False],
    })  # fmt: skip
    got = calibration.smallest_found(table)["keys"]["least_read"]
    assert got["true"] == {"pair": "L0H1->L1H2", "strength": 0.2, "raw_z": 6.0}
    assert got["projection"] == {"pair": "L0H1->L1H2", "strength": None, "raw_z": None}


def test_family_rates_pool_the_kinds_of_each_measure():
    idx = pd.MultiIndex.from_tuples([(k, m) for k in "QKV" for m in MEASURES], names=["kind", "variant"])
    one = pd.Series(False, index=idx)
    two = one.copy()
    two[("K", "true")] = True
    rates = calibration.family_rates([one, two])
    assert rates["true"] == {"families": 6, "with_discovery": 1, "rate": 1 / 6}
    assert rates["projection"] == {"families": 6, "with_discovery": 0, "rate": 0.0}


def test_p_distribution_of_uniform_p_values():
    p = np.linspace(0.0005, 0.9995, 1000)
    got = calibration.p_distribution(np.r_[p, np.nan])
    assert got["pairs"] == 1000 and got["mean"] == pytest.approx(0.5)
    assert got["deciles"] == pytest.approx(list(np.linspace(0.1, 0.9, 9)), abs=2e-3)
    assert got["above_0.9"] == pytest.approx(0.1)
    assert calibration.p_distribution(np.array([np.nan]))["mean"] is None


def test_non_composing_pairs_have_no_circuit_roles_and_no_effect_of_their_own():
    scores = pd.DataFrame({
        "kind": "K", "variant": "true", "src_layer": 0, "dst_layer": 1,
        "src_head": [0, 0, 1, 1], "dst_head": [0, 1, 0, 1],
    })  # fmt: skip
    roles = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "role": ["previous_token", "other", "induction", "other"]})  # fmt: skip
    part = scores[["kind", "src_layer", "src_head", "dst_layer", "dst_head"]].assign(
        part=[-1.0, -0.5, 0.2, -0.1]
    )
    # 0.0 -> 1.0: a circuit pair; 0.1 -> 1.0: an effect of its own; the other two compose with nothing
    assert calibration.non_composing(scores, roles, part).tolist() == [False, True, False, True]


def test_bulk_p_is_the_tests_p_with_the_location_unfloored():
    rng = np.random.default_rng(0)
    block = lambda loc, i, j: pd.DataFrame({  # noqa: E731
        "kind": "K", "variant": "true", "src_layer": i, "dst_layer": j,
        "src_head": np.repeat(np.arange(8), 8), "dst_head": np.tile(np.arange(8), 8),
        "z": rng.normal(loc, 1, 64),
    })  # fmt: skip
    placebo = pd.concat([block(-2.0, 0, 0), block(1.0, 1, 0), block(2.5, 1, 1)], ignore_index=True)
    later = block(-3.0, 0, 1)  # below chance: the test's p piles near 1, the bulk's is near uniform
    test, _ = significance.calibrate(later, placebo, 0.05)
    bulk = calibration.bulk_p(later, placebo, 0.05)
    assert test["p"].mean() > 0.9 and 0.35 < bulk.mean() < 0.65
    above = later.assign(z=later["z"] + 6.0)  # above chance the floor does not bind: the same p
    assert calibration.bulk_p(above, placebo, 0.05).tolist() == (
        significance.calibrate(above, placebo, 0.05)[0]["p"].tolist()
    )


def test_calibrate_on_a_small_model_reports_every_part(hw):
    """Every part of calibration.json on a random model and a partner: the nulls' family rates per
    measure, the planted power per plant, reader and measure, the placebo rates, the limits."""
    other = weights.from_state_dict(random_model("tiny", seed=9).state_dict())
    measured, placebo = significance.measured(hw, CFG, 0, "shortformer")
    roles = pd.DataFrame({"layer": [0, 0, 0, 1, 1, 1], "head": [0, 1, 2] * 2, "role": ["other"] * 6})
    ablation = measured[measured["variant"] == "true"][
        ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
    ]
    ablation = ablation.assign(pattern_effect=np.linspace(0.01, 0.1, len(ablation)))
    cal = CalibrationConfig(surrogates=2, untrained=2, strengths=[0.5, 2.0], claim_e_surrogates=2)
    untrained = calibration.untrained(replace(random_model("tiny").cfg), 0, 2)
    got = calibration.calibrate(hw, "shortformer", 0, CFG, cal, [other], untrained, measured, placebo, roles,
                                ablation)  # fmt: skip
    s = got.summary
    assert list(s) == [
        "families",
        "placebo",
        "non_composing",
        "detection_limits",
        "power",
        "channels",
        "claim_e",
    ]
    for null in ("surrogate", "chimera", "untrained"):
        assert set(s["families"][null]) == set(MEASURES)
    assert s["families"]["surrogate"]["true"]["families"] == 2 * 3  # two surrogates, three kinds
    assert s["families"]["chimera"]["true"]["families"] == 3
    assert set(s["power"]) == {"keys", "mixed"} and set(s["power"]["keys"]) == {"least_read", "most_read"}
    assert set(got.power["strength"]) <= {0.5, 2.0} and set(got.power["measure"]) == set(
        calibration.K_MEASURES
    )
    assert s["claim_e"]["model"]["e"] is None  # no circuit pairs: JSON null, not NaN
    # a power row is the planted model's own test with the run's seed (the same null draws)
    row = got.power.iloc[0]
    src, dst = (int(x) for x in re.fullmatch(r"L0H(\d+)->L1H(\d+)", row["pair"]).groups())
    tested, _ = significance.measured(calibration.plant(hw, src, dst, row["strength"], row["plant"]), CFG, 0,
                                      "shortformer")  # fmt: skip
    at = tested.set_index(["kind", "src_layer", "src_head", "dst_layer", "dst_head", "variant"])
    assert at.loc[("K", 0, src, 1, dst, row["measure"]), "z"] == row["raw_z"]
