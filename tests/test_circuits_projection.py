"""The projection kernel (pipeline/circuits/projection.py): known answers on heads built to share or
avoid subspaces, its exact null against Haar draws, and TransformerLens's own projection kernel
on the same subspaces as the oracle, and 4.x's head affinity on a bridge's weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from models import head_weights, random_model
from tl_oracle import random_bridge

from pipeline.circuits import composition, projection, scoring, weights
from pipeline.model import tl_checkpoint
from pipeline.tables import INVARIANT_COLUMNS, KINDS

F64 = torch.float64


def eye_block(rows: slice, d_model: int, d_head: int) -> torch.Tensor:
    """[d_model, d_head]: the identity placed on `rows` of the residual stream."""
    out = torch.zeros(d_model, d_head, dtype=F64)
    out[rows] = torch.eye(d_head, dtype=F64)
    return out


def test_shared_subspaces_score_one_and_orthogonal_ones_zero_whatever_the_singular_values():
    D, d = 12, 3
    gains = torch.tensor([7.0, 2.0, 0.1], dtype=F64)  # the subspace counts, not how strongly it is used
    # writer 0.0 writes rows 0:3, 0.1 rows 6:9; reader 1.0's keys read rows 0:3, 1.1's rows 3:6
    W_O = torch.zeros(2, 2, d, D, dtype=F64)
    W_O[0, 0], W_O[0, 1] = (eye_block(slice(0, 3), D, d) * gains).T, eye_block(slice(6, 9), D, d).T
    W_K = torch.zeros(2, 2, D, d, dtype=F64)
    W_K[1, 0], W_K[1, 1] = eye_block(slice(0, 3), D, d), eye_block(slice(3, 6), D, d) * gains
    W_Q = W_V = torch.randn(2, 2, D, d, generator=torch.Generator().manual_seed(0), dtype=F64)

    def k_scores(W_K):
        table = projection.projection_scores(head_weights(W_Q, W_K, W_V, W_O))
        return table[table["kind"] == "K"].set_index(["src_head", "dst_head"])["score"]

    k = k_scores(W_K)
    assert k[(0, 0)] == pytest.approx(1.0)
    assert [k[(0, 1)], k[(1, 0)], k[(1, 1)]] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    # a reader whose keys read rows 2, 3, 4: one of three principal cosines with 0.0 is 1: 1/3
    W_K[1, 1] = 0.0
    W_K[1, 1, 2, 0] = W_K[1, 1, 3, 1] = W_K[1, 1, 4, 2] = 1.0
    assert k_scores(W_K)[(0, 1)] == pytest.approx(1 / 3)


def test_a_rank_deficient_head_is_scored_on_its_rank_and_a_zero_head_is_undefined():
    D, d = 10, 4
    W_O = torch.zeros(2, 1, d, D, dtype=F64)
    W_O[0, 0, :2, :2] = torch.eye(2, dtype=F64)  # rank 2: writes rows 0, 1
    W_K = torch.zeros(2, 1, D, d, dtype=F64)
    W_K[1, 0] = eye_block(slice(0, 4), D, d)  # rank 4, rows 0..3
    hw = head_weights(torch.ones(2, 1, D, d, dtype=F64), W_K, torch.ones(2, 1, D, d, dtype=F64), W_O)
    k = projection.projection_scores(hw)
    k = k[k["kind"] == "K"].iloc[0]
    assert k["score"] == pytest.approx(2 / math.sqrt(2 * 4))  # both of the writer's 2 directions read
    mean, sd = projection.moments(torch.tensor(2), torch.tensor(4), D)
    assert (k["baseline_mean"], k["baseline_std"]) == pytest.approx((float(mean), float(sd)))
    assert float(mean) == pytest.approx(2 * 4 / D / math.sqrt(8))
    zero = head_weights(torch.ones(2, 1, D, d, dtype=F64), torch.zeros(2, 1, D, d, dtype=F64),
                        torch.ones(2, 1, D, d, dtype=F64), W_O)  # fmt: skip
    got = projection.projection_scores(zero)
    assert got[got["kind"] == "K"][["score", "z"]].isna().all().all()


def test_the_null_is_exact_a_haar_rotated_writers_scores_have_the_stated_moments():
    """The moments are the distribution of the score under the measures' null (the writer's residual
    basis rotated at random): 20,000 Haar draws agree to sampling error."""
    hw = weights.from_state_dict(random_model("tiny", seed=2).state_dict())
    U_out, r_out = projection.subspaces(hw.W_O[0, 1].mT)
    U_in, r_in = projection.subspaces(hw.W_K[1, 2])
    R = scoring.haar_blocks(20_000, hw.d_model, hw.d_model, torch.Generator().manual_seed(0))
    rotated = torch.einsum("sde,ei->sdi", R, U_out)  # [draws, d_model, d_head]
    kernel = (rotated.mT @ U_in).square().sum((-2, -1)) / math.sqrt(r_out * r_in)
    mean, sd = projection.moments(r_out, r_in, hw.d_model)
    assert float(kernel.mean()) == pytest.approx(float(mean), abs=4 * float(sd) / math.sqrt(20_000))
    assert float(kernel.std()) == pytest.approx(float(sd), rel=0.03)


def test_its_table_is_every_kind_and_pair_in_the_order_of_the_other_measures():
    hw = weights.from_state_dict(random_model("three_layers", seed=1).state_dict())
    for placebo in (False, True):
        got = projection.projection_scores(hw, placebo=placebo)
        frob = composition.composition_scores(
            hw, composition.CompositionConfig(baseline_samples=2, null_samples=2), 0, placebo=placebo
        )
        frob = frob[frob["variant"] == "true"]
        assert list(got.columns) == list(INVARIANT_COLUMNS[: INVARIANT_COLUMNS.index("z") + 1])
        assert got[["kind", "src_layer", "src_head", "dst_layer", "dst_head"]].to_numpy().tolist() == (
            frob[["kind", "src_layer", "src_head", "dst_layer", "dst_head"]].to_numpy().tolist()
        )
        assert list(dict.fromkeys(got["kind"])) == list(KINDS)
        assert got["score"].between(0, 1).all()
        assert np.allclose(got["z"], (got["score"] - got["baseline_mean"]) / got["baseline_std"])


@pytest.mark.interop
def test_scores_equal_transformer_lens_projection_kernel_on_the_same_subspaces():
    from transformer_lens.tools.analysis.projection_kernel import orthonormal_subspace, projection_kernel

    hw = weights.from_state_dict(random_model("tiny", seed=5).state_dict())
    table = projection.projection_scores(hw).set_index(["kind", "src_head", "dst_head"])["score"]
    readers = {"Q": hw.W_Q, "K": hw.W_K, "V": hw.W_V}
    for kind, W in readers.items():
        for a in range(hw.n_heads):
            for b in range(hw.n_heads):
                theirs = projection_kernel(
                    orthonormal_subspace(hw.W_O[0, a].mT), orthonormal_subspace(W[1, b])
                )
                assert table[(kind, a, b)] == pytest.approx(float(theirs.normalized), abs=1e-12)


@pytest.mark.interop4
def test_the_projection_kernel_is_transformer_lens_4s_head_affinity(bridge_class):
    """Our projection measure (pipeline/circuits/projection.py) on a bridge's weights equals 4.x's
    `attention_head_subspace_affinity` (normalized) for every kind and later pair."""
    from transformer_lens.tools.analysis.projection_kernel import attention_head_subspace_affinity

    bridge = random_bridge(bridge_class, None)
    state, _ = tl_checkpoint.bridge_state_dict(bridge)
    ours = projection.projection_scores(weights.from_state_dict({k: v.double() for k, v in state.items()}))
    for kind in ("Q", "K", "V"):
        theirs = attention_head_subspace_affinity(bridge, target_role=kind).normalized.double()
        mine = ours[ours["kind"] == kind]
        index = [
            torch.as_tensor(mine[c].to_numpy()) for c in ("src_layer", "src_head", "dst_layer", "dst_head")
        ]
        want = theirs[tuple(index)]
        assert mine["score"].tolist() == pytest.approx(want.tolist(), abs=1e-6), kind
