"""Composition in the whitened residual frame (pipeline/circuits/invariant.py): unchanged by the residual
stream's GL(d_model) symmetry where the Frobenius scores change; the small-space computation
equals the dense token-path formula; the null's singular-value identity; known answers
(the planted model, white frames give the Frobenius scores); determinism; the stage's table."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import torch
from models import random_model
from test_composition import random_heads

from pipeline.circuits import composition, invariant, weights
from pipeline.circuits.invariant import COLUMNS, KINDS, invariant_scores
from pipeline.config import CompositionConfig
from pipeline.errors import UserError
from pipeline.model.transformer import AttnOnlyTransformer
from pipeline.tables import INVARIANT, SIGNIFICANCE_COLUMNS

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
    moved = AttnOnlyTransformer(model.cfg).double()
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


def test_positions_from_the_weights_metadata():
    config = lambda pos: {"config": json.dumps({"positional_embedding_type": pos})}  # noqa: E731
    assert weights.positions_of(config("shortformer")) == "shortformer"
    assert weights.positions_of(config("standard")) == "standard"
    assert weights.positions_of({}) == "standard"  # TransformerLens's default
    with pytest.raises(UserError, match="positional_embedding_type"):
        weights.positions_of(config("rotary"))
    with pytest.raises(UserError, match="not JSON"):
        weights.positions_of({"config": "{"})


def test_stage_writes_invariant_csv_and_its_summary(tmp_path):
    from pipeline import params
    from stages import composition as stage

    ROOT = Path(__file__).resolve().parents[1]
    (tmp_path / "params.yaml").write_text(
        params.dump(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"))
    )
    hw = weights.from_state_dict(planted.state_dict())
    weights.save(
        tmp_path / "heads.safetensors",
        hw,
        {"config": json.dumps({"positional_embedding_type": "shortformer"})},
    )
    out = tmp_path / "out"
    args = ["--params", str(tmp_path / "params.yaml"), "--weights", str(tmp_path / "heads.safetensors")]
    assert stage.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "invariant.csv")
    assert list(table.columns) == [*COLUMNS, *SIGNIFICANCE_COLUMNS] and len(table) == 27
    summary = json.loads((out / "summary.json").read_text())
    assert summary["K"]["invariant"]["max_pair"] == "L0H0->L1H0" and "true" in summary["K"]
