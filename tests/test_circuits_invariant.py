"""Composition in the whitened residual frame (pipeline/circuits/invariant.py): unchanged by the residual
stream's GL(d_model) symmetry where the Frobenius scores change; the small-space computation
equals the dense token-path formula; the null's singular-value identity; known answers
(the planted model, white frames give the Frobenius scores); determinism. Against dense float64 on
small cases: the residual stream's second moments by their recursion (each up to an exact power of
two), frames at their rank tolerance, scores, baselines and the rotated-writer null for any G_l
(ranks 0, 1 and full, the placebo pairs too), the refusals, and the progress bar of a call that
skips frames."""

from __future__ import annotations

import re
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import planted
import pytest
import torch
from models import random_model
from test_circuits_composition import random_heads

from pipeline import cli, streams
from pipeline.circuits import composition, invariant, weights
from pipeline.circuits.invariant import COLUMNS, KINDS, Frame, invariant_scores
from pipeline.circuits.scoring import baseline, haar_blocks, later_pairs, placebo_pairs
from pipeline.config import CompositionConfig
from pipeline.model.transformer import Transformer
from pipeline.tables import INVARIANT

FAST = CompositionConfig(baseline_samples=32, null_samples=16)
F64 = torch.float64
PAIR = ["src_layer", "src_head", "dst_layer", "dst_head"]


def well_conditioned(D: int, seed: int) -> torch.Tensor:
    """T = Q1 diag(s) Q2, Q Haar, s from 0.5 to 2 (condition number 4): far from orthogonal."""
    g = torch.Generator().manual_seed(seed)
    Q1, Q2 = (torch.linalg.qr(torch.randn(D, D, generator=g, dtype=F64)).Q for _ in range(2))
    return Q1 @ torch.diag(torch.linspace(0.5, 2.0, D, dtype=F64)) @ Q2


def change_of_basis(state: dict[str, torch.Tensor], T: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same function in the residual basis T: writers W -> W T, readers W -> T^-1 W."""
    T_inv = torch.linalg.inv(T)
    writes = ("embed.W_E", "pos_embed.W_pos")  # [.., d_model] rows
    out = {}
    for key, W in state.items():
        name = key.rsplit(".", 1)[-1]
        if key in writes or name in ("W_O", "b_O"):
            W = W @ T  # W_O [head, d_head, d_model], b_O [d_model]
        elif key == "unembed.W_U" or name in ("W_Q", "W_K", "W_V"):
            W = T_inv @ W  # W_U [d_model, d_vocab], W_Q [head, d_model, d_head]
        out[key] = W
    return out


def rows(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    return df[df["kind"] == kind].set_index(PAIR)


# --- the symmetry ------------------------------------------------------------------------


@pytest.mark.parametrize("pos", ["shortformer", "standard"])
def test_change_of_residual_basis_keeps_logits_and_invariant_scores_but_not_frobenius(pos):
    model = random_model(positional_embedding_type=pos, seed=1)  # tiny: no LayerNorm, biases random
    T = well_conditioned(model.cfg.d_model, seed=2)
    state = {k: v for k, v in model.state_dict().items()}
    moved_state = change_of_basis(state, T)
    moved = Transformer(model.cfg).double()
    moved.load_state_dict(moved_state)
    tokens = torch.randint(
        0, model.cfg.d_vocab, (4, model.cfg.n_ctx), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        assert torch.allclose(moved(tokens), model(tokens), atol=1e-6, rtol=0)  # the same function

    hw, hw_T = weights.from_state_dict(state), weights.from_state_dict(moved_state)
    cfg = CompositionConfig(baseline_samples=64, null_samples=32)
    a, b = (
        invariant_scores(hw, cfg, seed=0, positions=pos),
        invariant_scores(hw_T, cfg, seed=0, positions=pos),
    )
    assert a[["kind", *PAIR]].equals(b[["kind", *PAIR]]) and a["score"].notna().all()
    for column in ("score", "baseline_mean", "baseline_std", "z"):  # baseline and null drawn in the frame
        np.testing.assert_allclose(b[column], a[column], rtol=0, atol=1e-8, err_msg=column)

    # the symmetry is real: every kind's Frobenius scores move, most pairs by more than 0.01
    frob, frob_T = composition.true_scores(hw), composition.true_scores(hw_T)
    for kind in KINDS:
        moved_by = (frob_T[kind] - frob[kind])[~frob[kind].isnan()].abs()
        assert moved_by.max() > 0.05 and (moved_by > 0.01).float().mean() > 0.5, kind


def test_residual_grams_transform_as_a_metric():
    # G_l -> T^T G_l T, each up to the power of two residual_grams divides it by
    model = random_model("three_layers", positional_embedding_type="standard", seed=4)
    T = well_conditioned(model.cfg.d_model, seed=5)
    hw = weights.from_state_dict(model.state_dict())
    hw_T = weights.from_state_dict(change_of_basis(model.state_dict(), T))
    grams = zip(
        invariant.residual_grams(hw, "standard"), invariant.residual_grams(hw_T, "standard"), strict=True
    )
    unit = lambda G: G / torch.linalg.matrix_norm(G)  # noqa: E731
    for G, G_T in grams:
        torch.testing.assert_close(unit(G_T), unit(T.T @ G @ T), atol=1e-12, rtol=0)


@pytest.mark.parametrize("k", [-900, 900])
def test_scores_are_bit_identical_under_exact_rescalings_of_any_size(k):
    # each rescaling is exact (a power of two) and changes no score: the GL symmetry's T = 2^k I,
    # W_E alone (it scales every G_l), one head's W_Q, another's W_K, and W_V 2^k with W_O 2^-k
    hw = weights.from_state_dict(
        random_model("three_layers", positional_embedding_type="standard", seed=13).state_dict()
    )
    c = 2.0**k
    gl = replace(hw, W_E=hw.W_E * c, W_pos=hw.W_pos * c, W_Q=hw.W_Q / c, W_K=hw.W_K / c, W_V=hw.W_V / c,
                 W_O=hw.W_O * c, W_U=hw.W_U / c)  # fmt: skip
    apart = replace(hw, W_E=hw.W_E * c, W_pos=hw.W_pos * c, W_Q=hw.W_Q.clone(), W_K=hw.W_K.clone(),
                    W_V=hw.W_V.clone(), W_O=hw.W_O.clone())  # fmt: skip
    apart.W_Q[1, 0] *= c
    apart.W_K[2, 1] /= c
    apart.W_V[0, 2] *= c
    apart.W_O[0, 2] /= c
    base = invariant_scores(hw, FAST, seed=0, positions="standard")
    for moved in (gl, apart):
        df = invariant_scores(moved, FAST, seed=0, positions="standard")
        for column in ("score", "baseline_mean", "baseline_std", "z"):
            np.testing.assert_array_equal(df[column], base[column], err_msg=column)


def test_a_head_writing_2_to_the_600_times_more_leaves_every_score_defined_and_in_range():
    # not a symmetry: that head's paths dominate G_1 (its output is the stream), yet nothing overflows
    hw = weights.from_state_dict(random_model(positional_embedding_type="shortformer", seed=14).state_dict())
    loud = replace(hw, W_V=hw.W_V.clone(), W_O=hw.W_O.clone())
    loud.W_V[0, 1] *= 2.0**300
    loud.W_O[0, 1] *= 2.0**300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = invariant_scores(loud, FAST, seed=0)
    assert df["score"].between(0, 1).all() and np.isfinite(df["z"]).all()
    assert not np.allclose(df["score"], invariant_scores(hw, FAST, seed=0)["score"])


# --- the small-space computation equals the dense token-path formula --------------------


def dense_scores(hw: weights.HeadWeights, positions: str) -> dict[str, torch.Tensor]:
    """The module doc's token-path formula, every matrix formed: M_l stacks every path's vector
    for every token (and position), and M_j^+ reads a written vector back in its paths."""
    L, H = hw.n_layers, hw.n_heads
    M = hw.W_E / hw.W_E.shape[0] ** 0.5
    if positions == "standard":
        M = torch.cat([M, hw.W_pos / hw.W_pos.shape[0] ** 0.5])
    OV = hw.W_V @ hw.W_O  # [L, H, d_model, d_model]
    QK = hw.W_Q @ hw.W_K.mT
    paths = [M]
    for l in range(L):
        paths.append(torch.cat([paths[-1], *(paths[-1] @ OV[l, c] for c in range(H))]))
    pinv = [torch.linalg.pinv(m, rtol=1e-10) for m in paths]
    fro = torch.linalg.matrix_norm
    out = {kind: torch.full((L, H, L, H), torch.nan, dtype=F64) for kind in KINDS}
    for i in range(L):
        for j in range(i + 1, L):
            for a in range(H):
                written = paths[i] @ OV[i, a]  # a's output of every path into layer i: rows in M_j's span
                writer = fro(written @ pinv[j])
                for b in range(H):
                    Mj = paths[j]
                    out["Q"][i, a, j, b] = fro(written @ QK[j, b] @ Mj.T) / (
                        writer * fro(Mj @ QK[j, b] @ Mj.T)
                    )
                    out["K"][i, a, j, b] = fro(written @ QK[j, b].T @ Mj.T) / (
                        writer * fro(Mj @ QK[j, b] @ Mj.T)
                    )
                    reader = fro(Mj @ OV[j, b] @ pinv[j + 1])
                    out["V"][i, a, j, b] = fro(written @ OV[j, b] @ pinv[j + 1]) / (writer * reader)
    return out


@pytest.mark.parametrize(
    "pos,shape",
    [
        ("shortformer", {}),
        ("standard", {}),
        ("shortformer", {"n_layers": 3, "d_vocab": 5, "d_model": 8, "d_head": 3}),  # G_0 of rank 5 < 8
        ("standard", {"n_layers": 3, "d_vocab": 3, "n_ctx": 2, "d_model": 8, "d_head": 2, "n_heads": 2}),
    ],
)
def test_exact_small_space_scores_equal_the_dense_token_path_formula(pos, shape):
    hw = weights.from_state_dict(random_model(positional_embedding_type=pos, seed=6, **shape).state_dict())
    df = invariant_scores(hw, FAST, seed=0, positions=pos)
    dense = dense_scores(hw, pos)
    for kind in KINDS:
        r = rows(df, kind)
        expected = np.array([dense[kind][p].item() for p in r.index])
        np.testing.assert_allclose(r["score"], expected, rtol=0, atol=1e-10, err_msg=kind)
        assert r["score"].between(0, 1).all()  # submultiplicativity in the frame


def test_null_numerator_is_the_singular_value_identity_for_any_rotation():
    # ||OV_f^a Q N_b||^2 = sum s_a^2 Z^2 s_b^2 with Z = V_a^T Q U_b, for one explicit Haar Q
    hw = weights.from_state_dict(random_model(positional_embedding_type="shortformer", seed=7).state_dict())
    fr = invariant.frames(invariant.residual_grams(hw))
    r, k = fr[1].rank, hw.d_head
    OV_f = fr[0].R @ hw.W_V[0, 1] @ hw.W_O[0, 1] @ fr[1].R_pinv  # [r_0, r_1]
    QK_f = fr[1].R @ hw.W_Q[1, 2] @ hw.W_K[1, 2].T @ fr[1].R.T  # [r_1, r_1]
    Q = torch.linalg.qr(torch.randn(r, r, generator=torch.Generator().manual_seed(8), dtype=F64)).Q
    Ua, sa, Vah = torch.linalg.svd(OV_f)
    Ub, sb, _ = torch.linalg.svd(QK_f)
    Z = Vah[:k] @ Q @ Ub[:, :k]
    identity = (sa[:k].square()[:, None] * Z.square() * sb[:k].square()[None, :]).sum()
    assert identity.item() == pytest.approx(
        torch.linalg.matrix_norm(OV_f @ Q @ QK_f).square().item(), rel=1e-10
    )
    # and the factored sides the pairs use have exactly these singular values
    writers = invariant._writers(fr[0].R @ hw.W_V[0], hw.W_O[0] @ fr[1].R_pinv, k)
    readers = invariant._readers(*invariant._reader_factors(hw, fr, 1, "Q"), k)
    torch.testing.assert_close(writers.sv[1], sa[:k], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(readers.sv[2], sb[:k], atol=1e-12, rtol=1e-10)


# --- known answers -----------------------------------------------------------------------


def test_planted_model_only_induction_k_composes():
    # previous-token head 0.0 writes into PREV, which W_E and W_U never touch and induction head
    # 1.0's keys read: the token-space frame still sees it (it is one of the residual's paths),
    # and it is aligned exactly as in the Frobenius score: 1/sqrt(16), the norm of a 16-dim identity
    hw = weights.from_state_dict(planted.state_dict())
    df = invariant_scores(hw, FAST, seed=0, positions="shortformer")
    assert [f.rank for f in invariant.frames(invariant.residual_grams(hw))] == [
        16,
        48,
        64,
    ]  # TOK; +PREV, JUNK; +OUT
    k = rows(df, "K")
    assert k.loc[(0, 0, 1, 0), "score"] == pytest.approx(0.25, abs=1e-12)
    assert k.loc[(0, 0, 1, 0), "z"] > 10
    others = df.set_index(["kind", *PAIR])["score"].drop(("K", 0, 0, 1, 0))
    defined = others.dropna()
    assert (defined.abs() < 1e-12).all() and len(defined) == 3 + 2 + 9  # Q, K into 1.0; V everywhere
    # heads 1.1 and 1.2 attend by position only: their queries and keys read nothing the stream
    # carries, so Q and K into them are undefined rather than zero
    undefined = others[others.isna()].index
    assert set(undefined) == {(kind, 0, a, 1, b) for kind in "QK" for a in range(3) for b in (1, 2)}
    summary = composition.summarize(df.assign(variant=INVARIANT))["K"][INVARIANT]
    assert summary["max_pair"] == "L0H0->L1H0" and summary["n_z_above_3"] == 1


def test_white_frames_give_the_frobenius_scores():
    # G_l = I for every layer: the frame is the stored basis, and the score is the Frobenius one
    hw = random_heads(9, L=3, H=2, D=12, d=3)
    white = [torch.eye(12, dtype=F64)] * 4
    df = invariant_scores(hw, FAST, seed=0, grams=white)
    frob = composition.true_scores(hw)
    for kind in KINDS:
        r = rows(df, kind)
        np.testing.assert_allclose(r["score"], [frob[kind][p].item() for p in r.index], rtol=0, atol=1e-12)


def test_writing_and_reading_orthogonal_paths_scores_zero():
    # head a writes only into coords 0..3 (its own private subspace), head b reads only 4..7
    D, d, V = 16, 4, 24
    g = torch.Generator().manual_seed(10)
    hw = random_heads(10, L=2, H=1, D=D, d=d)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        getattr(hw, name).zero_()
    hw.W_V[0, 0, 8:] = torch.randn(D - 8, d, generator=g, dtype=F64)
    hw.W_O[0, 0, :, 0:4] = torch.randn(d, 4, generator=g, dtype=F64)
    for name in ("W_Q", "W_K", "W_V"):
        getattr(hw, name)[1, 0, 4:8] = torch.randn(4, d, generator=g, dtype=F64)
    hw.W_O[1, 0] = torch.randn(d, D, generator=g, dtype=F64)
    W_E = torch.zeros(V, D, dtype=F64)
    W_E[:, 4:] = torch.randn(V, D - 4, generator=g, dtype=F64)  # tokens fill 4..15; a adds 0..3
    hw = replace(hw, W_E=W_E)
    df = invariant_scores(hw, FAST, seed=0)
    assert (df["score"].abs() < 1e-12).all() and len(df) == 3


# --- determinism, layout, the stage ------------------------------------------------------


def test_columns_order_and_deterministic_for_a_seed():
    hw = weights.from_state_dict(
        random_model("three_layers", positional_embedding_type="shortformer", seed=11, n_heads=2).state_dict()
    )
    a, b, c = (invariant_scores(hw, FAST, seed=s) for s in (7, 7, 8))
    assert list(a.columns) == COLUMNS and len(a) == len(KINDS) * 2 * 2 * 3
    key = a[["kind", *PAIR]].assign(kind=a["kind"].map(KINDS.index))
    assert key.equals(key.sort_values(list(key.columns)).reset_index(drop=True))
    pd.testing.assert_frame_equal(a, b)
    np.testing.assert_array_equal(a["score"], c["score"])  # the scores use no randomness
    assert not np.allclose(a["z"], c["z"]) and not np.allclose(a["baseline_mean"], c["baseline_mean"])


def test_random_heads_writing_little_score_like_the_baseline():
    # heads that write little beside the embeddings leave the frame that of W_E, in which random
    # heads are random: scores, baseline and null agree. (Heads writing much more than the
    # embeddings dominate every reader: in the frame they compose, as the module doc says.)
    state = random_model(
        positional_embedding_type="shortformer", seed=12, d_model=32, d_vocab=64
    ).state_dict()
    state = {k: v * 0.1 if k.endswith("W_O") else v for k, v in state.items()}
    df = invariant_scores(weights.from_state_dict(state), CompositionConfig(200, 64), seed=0)
    assert df["baseline_mean"].nunique() == 1  # full-rank frames: one set of draws for Q, K and V
    assert abs(df["score"].mean() - df["baseline_mean"].iloc[0]) < df["baseline_std"].iloc[0]
    assert abs(df["z"].mean()) < 1 and (df["z"].abs() < 4).all()
    louder = {k: v * 10 if k.endswith("W_O") else v for k, v in state.items()}
    df = invariant_scores(weights.from_state_dict(louder), CompositionConfig(200, 64), seed=0)
    assert df["z"].mean() > 2


# --- the contract against dense float64 on small cases ------------------------------------------


CFG = CompositionConfig(baseline_samples=16, null_samples=12)


fro = torch.linalg.matrix_norm


def model_heads(pos: str = "standard", **shape) -> weights.HeadWeights:
    return weights.from_state_dict(random_model(positional_embedding_type=pos, seed=21, **shape).state_dict())


def power_of_two_ratio(A: torch.Tensor, B: torch.Tensor) -> None:
    """A = 2^k B for one integer k (to rounding)."""
    ratio = (A.flatten()[B.flatten().abs().argmax()] / B.flatten()[B.flatten().abs().argmax()]).item()
    assert ratio > 0 and float(np.log2(ratio)).is_integer(), ratio
    torch.testing.assert_close(A, ratio * B, rtol=1e-11, atol=1e-13 * A.abs().max().item())


def dense_grams(hw: weights.HeadWeights, positions: str) -> list[torch.Tensor]:
    """The module doc's recursion, every term formed: G_0 = E^T E / d_vocab (+ W_pos^T W_pos / n_ctx),
    G_{l+1} = G_l + sum_c OV^cT G_l OV^c."""
    G = hw.W_E.T @ hw.W_E / hw.W_E.shape[0]
    if positions == "standard":
        G = G + hw.W_pos.T @ hw.W_pos / hw.W_pos.shape[0]
    out = [G]
    for l in range(hw.n_layers):
        OV = hw.W_V[l] @ hw.W_O[l]
        G = G + sum(OV[c].T @ G @ OV[c] for c in range(hw.n_heads))
        out.append(G)
    return out


@pytest.mark.parametrize("pos", ["standard", "shortformer"])
def test_residual_grams_are_the_recursion_up_to_a_power_of_two_each(pos) -> None:
    # d_vocab, n_ctx and d_model all differ; one head writes 2^12 times louder, one 2^-9 times
    hw = model_heads(pos, n_layers=3, d_vocab=11, n_ctx=7, d_model=9, d_head=3)
    hw = replace(hw, W_V=hw.W_V.clone(), W_O=hw.W_O.clone(), W_pos=hw.W_pos * 3.0)
    hw.W_V[0, 1] *= 2.0**7
    hw.W_O[0, 1] *= 2.0**5
    hw.W_O[1, 2] *= 2.0**-9
    got = invariant.residual_grams(hw, pos)
    assert len(got) == 4
    for l, (G, want) in enumerate(zip(got, dense_grams(hw, pos), strict=True)):
        power_of_two_ratio(G, want)
        assert l == 0 or torch.equal(G, G.T)  # symmetric to the last bit, for eigh
        assert 0.5 <= G.abs().max().item() < 1  # each divided by its own power of two
    assert invariant.residual_grams(hw, "shortformer")[0].shape == (9, 9)


def test_positions_are_refused_by_name() -> None:
    """An unknown type is refused naming it; rotary positions start the residual with the tokens
    alone, as shortformer ones (neither adds an embedding to the stream)."""
    hw = model_heads()
    for call in (
        lambda: invariant.residual_grams(hw, "alibi"),
        lambda: invariant_scores(hw, CFG, 0, "alibi"),
    ):
        with pytest.raises(ValueError) as caught:
            call()
        assert_names(caught, "positions", "'alibi'", "shortformer", "standard", "rotary")
    assert torch.equal(invariant.residual_grams(hw)[1], invariant.residual_grams(hw, "shortformer")[1])
    assert torch.equal(
        invariant.residual_grams(hw, "rotary")[1], invariant.residual_grams(hw, "shortformer")[1]
    )


def test_frames_by_hand_at_their_rank_tolerance() -> None:
    g = torch.Generator().manual_seed(3)
    A = torch.randn(3, 5, generator=g, dtype=F64)
    fr = Frame.of(A.T @ A)  # rank 3 of 5
    assert fr.rank == 3 and fr.R.shape == (3, 5) and fr.R_pinv.shape == (5, 3)
    torch.testing.assert_close(fr.R.T @ fr.R, A.T @ A, rtol=0, atol=1e-12)
    torch.testing.assert_close(fr.R @ fr.R_pinv, torch.eye(3, dtype=F64), rtol=0, atol=1e-12)
    # the tolerance is RANK_RTOL times the largest eigenvalue, exclusive
    at = Frame.of(torch.diag(torch.tensor([1.0, 1e-10, 0.0], dtype=F64)))
    assert torch.linalg.eigvalsh(torch.diag(torch.tensor([1.0, 1e-10], dtype=F64)))[0] == 1e-10
    assert at.rank == 1 and torch.equal(at.R.abs(), torch.tensor([[1.0, 0.0, 0.0]], dtype=F64))
    big = Frame.of(torch.diag(torch.tensor([4.0, 3e-10, 1e-11], dtype=F64)))  # 3e-10 < 1e-10 x 4
    assert big.rank == 1 and Frame.of(torch.diag(torch.tensor([4.0, 5e-10, 0], dtype=F64))).rank == 2
    for empty in (torch.zeros(4, 4, dtype=F64), -torch.eye(4, dtype=F64), torch.zeros(0, 0, dtype=F64)):
        fr = Frame.of(empty)
        assert fr.rank == 0 and fr.R.shape == (0, len(empty)) and fr.R_pinv.shape == (len(empty), 0)
    assert [f.rank for f in invariant.frames([A.T @ A, torch.eye(5, dtype=F64)])] == [3, 5]


def root(G: torch.Tensor) -> torch.Tensor:
    """Some R with R^T R = G on its range (rank by the same tolerance): any other is O R."""
    lam, vec = torch.linalg.eigh(G)
    keep = lam > 1e-10 * lam.max() if lam.max() > 0 else torch.zeros_like(lam, dtype=torch.bool)
    return lam[keep].sqrt()[:, None] * vec[:, keep].T


def dense_pair(hw, R, a, b, kind):
    """(the writer OV_f^a and the reader's circuit N_b) in the frames, [r_i, r_j] and [r_j, r_out]."""
    (i, h), (j, g) = a, b
    pinv = torch.linalg.pinv
    OV_f = R[i] @ hw.W_V[i, h] @ hw.W_O[i, h] @ pinv(R[j])
    QK = hw.W_Q[j, g] @ hw.W_K[j, g].T
    N = {
        "Q": R[j] @ QK @ R[j].T,
        "K": R[j] @ QK.T @ R[j].T,
        "V": R[j] @ hw.W_V[j, g] @ hw.W_O[j, g] @ (pinv(R[j + 1]) if R[j + 1].shape[0] else R[j + 1].T),
    }[kind]
    return OV_f, N


def dense_null(OV_f, N, Z2) -> tuple[float, float]:
    """The module doc's null: sqrt(sum s_a^2 Z^2 s_b^2) / (||OV_f|| ||N||) over the squared blocks Z2."""
    k = Z2.shape[-1]
    pad = lambda s: torch.cat([s, s.new_zeros(max(0, k - len(s)))])[:k]  # noqa: E731
    sa, sb = pad(torch.linalg.svdvals(OV_f)), pad(torch.linalg.svdvals(N))
    scores = (sa.square()[None, :, None] * Z2 * sb.square()[None, None, :]).sum((-2, -1)).sqrt()
    scores = scores / (fro(OV_f) * fro(N))
    return scores.mean().item(), scores.std().item()


def dense_baseline(dims, d_head, S, gen) -> tuple[float, float]:
    """Gaussian V [r_in, d], O [d, r_mid], X [r_mid, d], Y [d, r_out]: ||V O X Y|| / (||V O|| ||X Y||)."""
    V, O, X, Y = (torch.randn(S, *s, generator=gen, dtype=F64) for s in
                  ((dims[0], d_head), (d_head, dims[1]), (dims[2], d_head), (d_head, dims[3])))  # fmt: skip
    s = fro(V @ O @ X @ Y) / (fro(V @ O) * fro(X @ Y))
    return s.mean().item(), s.std().item()


def custom_grams(D: int) -> list[torch.Tensor]:
    """G_0 rank 1, G_1 = 0, G_2 full rank, G_3 rank 2: frames of ranks 1, 0, D, 2."""
    g = torch.Generator().manual_seed(8)
    u, B, C = (torch.randn(n, D, generator=g, dtype=F64) for n in (1, 2 * D, 2))
    return [u.T @ u, torch.zeros(D, D, dtype=F64), B.T @ B / 7.0, C.T @ C * 1e3]


@pytest.mark.parametrize("placebo", [False, True])
def test_any_grams_score_in_their_frames_with_the_modules_null_and_baseline(placebo: bool) -> None:
    hw = model_heads("shortformer", n_layers=3, n_heads=2, d_model=6, d_head=2, d_vocab=9)
    grams = custom_grams(6)
    df = invariant_scores(hw, CFG, seed=4, grams=[G.float() for G in grams], placebo=placebo)
    again = invariant_scores(hw, CFG, seed=4, grams=[G.float().double() for G in grams], placebo=placebo)
    np.testing.assert_array_equal(df[["score", "z"]].to_numpy(), again[["score", "z"]].to_numpy())
    df = invariant_scores(hw, CFG, seed=4, grams=grams, placebo=placebo)
    R = [root(G) for G in grams]
    assert [r.shape[0] for r in R] == [1, 0, 6, 2]
    pairs = (placebo_pairs if placebo else later_pairs)(3, 2)
    assert len(df) == 3 * len(pairs[0])
    # the draws: one baseline per distinct (r_i, r_j, r_out), in sorted layer-pair order, then the null's
    # blocks per distinct r_j, in order of j
    gen = torch.Generator().manual_seed(streams.seed_of(4, "invariant.baseline"))
    layer_pairs = sorted({(i, j) for i, _, j, _ in zip(*pairs, strict=True)})
    base = {}
    for i, j in layer_pairs:
        for kind in KINDS:
            key = (R[i].shape[0], R[j].shape[0], R[j + 1 if kind == "V" else j].shape[0])
            if key not in base and min(key) > 0:
                base[key] = dense_baseline((key[0], key[1], key[1], key[2]), 2, CFG.baseline_samples, gen)
    gen = torch.Generator().manual_seed(streams.seed_of(4, "invariant.null"))
    blocks = {}
    for j in sorted({j for _, j in layer_pairs}):
        r = R[j].shape[0]
        if r and r not in blocks:
            blocks[r] = haar_blocks(CFG.null_samples, r, min(2, r), gen).square()
    defined = 0
    for row in df.itertuples():
        i, j, kind = row.src_layer, row.dst_layer, row.kind
        r_out = R[j + 1 if kind == "V" else j].shape[0]
        if R[i].shape[0] == 0 or R[j].shape[0] == 0 or r_out == 0:
            assert np.isnan([row.score, row.z, row.baseline_mean, row.baseline_std]).all(), row
            continue
        defined += 1
        OV_f, N = dense_pair(hw, R, (i, row.src_head), (j, row.dst_head), kind)
        score = (fro(OV_f @ N) / (fro(OV_f) * fro(N))).item()
        assert row.score == pytest.approx(score, rel=1e-9), row
        mean, std = dense_null(OV_f, N, blocks[R[j].shape[0]])
        if std == 0:  # a frame of rank 1: every rotation is +-1, the null has no spread
            assert np.isnan(row.z) and R[j].shape[0] == 1, row
        else:
            assert row.z == pytest.approx((score - mean) / std, rel=1e-7, abs=1e-9), row
        key = (R[i].shape[0], R[j].shape[0], r_out)
        assert (row.baseline_mean, row.baseline_std) == pytest.approx(base[key], rel=1e-10), row
    # later: L0 -> L2, 4 pairs x 3 kinds (L1's frame is empty); placebo: L0 -> L0 and L2 -> L0 (6 pairs)
    # x Q, K (V reads into L1's empty frame), L2 -> L2 (2 pairs) x 3 kinds
    assert defined == (6 * 2 + 2 * 3 if placebo else 4 * 3)


def test_full_rank_frames_share_one_baseline_and_one_null_draw_over_three_layers() -> None:
    hw = model_heads("standard", n_layers=3, n_heads=2, d_model=6, d_head=2, d_vocab=9)
    df = invariant_scores(hw, CFG, seed=1, positions="standard")
    grams = invariant.residual_grams(hw, "standard")
    R = [root(G) for G in grams]
    assert [r.shape[0] for r in R] == [6] * 4
    gen = torch.Generator().manual_seed(streams.seed_of(1, "invariant.baseline"))
    want = baseline(invariant._chain_scores, (6, 6, 6, 6), 2, CFG.baseline_samples, gen)[INVARIANT]
    gen = torch.Generator().manual_seed(streams.seed_of(1, "invariant.baseline"))
    assert want == pytest.approx(dense_baseline((6, 6, 6, 6), 2, CFG.baseline_samples, gen), rel=1e-10)
    assert (df["baseline_mean"] == want[0]).all() and (df["baseline_std"] == want[1]).all()
    gen = torch.Generator().manual_seed(streams.seed_of(1, "invariant.null"))
    Z2 = haar_blocks(CFG.null_samples, 6, 2, gen).square()
    for row in df.itertuples():
        OV_f, N = dense_pair(hw, R, (row.src_layer, row.src_head), (row.dst_layer, row.dst_head), row.kind)
        mean, std = dense_null(OV_f, N, Z2)
        assert row.z == pytest.approx((row.score - mean) / std, rel=1e-7, abs=1e-9), row


def assert_names(caught, *named: str) -> None:
    """The refusal is one line and names each of `named` (the argument, the value, the choices)."""
    message = str(caught.value)
    assert "\n" not in message and all(x in message for x in named), (message, named)


def test_grams_of_the_wrong_count_are_refused() -> None:
    hw = model_heads()  # two layers: G_0, G_1, G_2
    eye = torch.eye(16, dtype=F64)
    for n in (2, 4):
        with pytest.raises(ValueError) as caught:  # G_0 .. G_L: 3 of them, and the count given
            invariant_scores(hw, CFG, 0, grams=[eye] * n)
        assert_names(caught, "grams", "3", str(n))


def bar(err: str, desc: str) -> tuple[int, int, str]:
    found = re.findall(rf"{re.escape(desc)}: +\d+%\|[^|]*\| (\d+)/(\d+) \[[^\]]*?([a-z ]+)/s\]", err)
    found = found or re.findall(rf"{re.escape(desc)}: +\d+%\|[^|]*\| (\d+)/(\d+) \[[^\]]*?s/([a-z ]+)\]", err)
    assert found, err
    return int(found[-1][0]), int(found[-1][1]), found[-1][2]


def test_the_progress_bar_counts_skipped_frames_and_names_the_placebo(capsys) -> None:
    hw = model_heads("shortformer", n_layers=3, n_heads=2, d_model=6, d_head=2, d_vocab=9)
    capsys.readouterr()
    with cli.showing_progress("bar"):
        invariant_scores(hw, CFG, seed=0, grams=custom_grams(6))
        invariant_scores(hw, CFG, seed=0, grams=custom_grams(6), placebo=True)
    err = capsys.readouterr().err
    assert bar(err, "invariant null") == (9, 9, "layer pair")  # 3 kinds x (0, 1), (0, 2), (1, 2)
    assert bar(err, "invariant placebo null") == (18, 18, "layer pair")  # 3 kinds x 6 (i >= j)


def test_padded_singular_values_of_any_batch_shape() -> None:
    g = torch.Generator().manual_seed(6)
    M = torch.randn(2, 6, 3, 4, generator=g, dtype=F64)  # [2, 6] batch of 3 x 4: three singular values
    s = torch.linalg.svdvals(M)
    for k, want in ((2, s[..., :2]), (3, s), (5, torch.cat([s, torch.zeros(2, 6, 2, dtype=F64)], -1))):
        got = invariant._padded_svdvals(M, k)
        assert got.shape == (2, 6, k)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_a_head_reading_nothing_the_stream_carries_writes_nothing_however_loud() -> None:
    """Head 0.0's values read only coordinates 12..15, which no token fills: its paths are zero, so
    every G_l is the same whatever the size of its W_O (2^200 here: the largest OV exponent of its
    layer, the power of two dividing G_0 and the other heads' terms in the recursion), and every
    other pair scores as before."""
    hw = weights.from_state_dict(random_model(positional_embedding_type="shortformer", seed=22).state_dict())
    W_E, W_V = hw.W_E.clone(), hw.W_V.clone()
    W_E[:, 12:] = 0
    W_V[0, 0, :12] = 0
    quiet = replace(hw, W_E=W_E, W_V=W_V)
    W_O = quiet.W_O.clone()
    W_O[0, 0] *= 2.0**200
    loud = replace(quiet, W_O=W_O)
    for G_loud, G_quiet in zip(invariant.residual_grams(loud), invariant.residual_grams(quiet), strict=True):
        power_of_two_ratio(G_loud, G_quiet)
    a, b = (invariant_scores(x, CFG, seed=0) for x in (quiet, loud))
    silent = (a["src_layer"] == 0) & (a["src_head"] == 0)
    assert a.loc[silent, "score"].isna().all() and b.loc[silent, "score"].isna().all()
    assert a.loc[~silent, "score"].notna().all()
    for column in ("score", "z", "baseline_mean"):
        np.testing.assert_allclose(b.loc[~silent, column], a.loc[~silent, column], rtol=1e-12, err_msg=column)


def test_float32_weights_are_analysed_in_float64() -> None:
    hw = model_heads("standard")
    single, double = hw.to(torch.float32), hw.to(torch.float32).to(F64)
    for a, b in zip(
        invariant.residual_grams(single, "standard"),
        invariant.residual_grams(double, "standard"),
        strict=True,
    ):
        assert a.dtype == F64 and torch.equal(a, b)


class _Stop(Exception):
    """Raised by a spy once it has seen what it looks for."""


def test_the_writers_of_a_pair_are_moved_to_the_device_asked_like_the_readers(monkeypatch) -> None:
    """analysis.device: the pair products run there, writers and readers alike (a writer left on
    the CPU beside readers on a GPU fails); "meta" stands in for a device that is not the CPU."""
    seen = []

    def spy(w, r):  # the pair scores, after the baseline (which runs on the CPU, _writers too)
        seen.append((w.P.device.type, r.X.device.type))
        raise _Stop

    monkeypatch.setattr(invariant, "_pair_scores", spy)
    with pytest.raises(_Stop):
        invariant_scores(model_heads(), CFG, seed=0, device="meta")
    assert seen == [("meta", "meta")]


def test_a_kind_that_is_not_q_k_or_v_is_refused_naming_the_kinds() -> None:
    hw = model_heads()
    fr = invariant.frames(invariant.residual_grams(hw, "standard"))
    with pytest.raises(ValueError) as e:
        invariant._reader_factors(hw, fr, 1, "O")
    assert str(e.value) == "kind must be one of Q, K, V, not 'O'"
