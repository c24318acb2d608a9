"""pipeline/circuits/invariant.py's contract against dense float64 on small cases: the residual
stream's second moments by their recursion (each up to an exact power of two), frames at their rank
tolerance, scores, baselines and the rotated-writer null for any G_l (ranks 0, 1 and full, the
placebo pairs too), the refusals, and the progress bar of a call that skips frames."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from models import random_model

from pipeline import cli, streams
from pipeline.circuits import invariant, weights
from pipeline.circuits.invariant import KINDS, Frame, invariant_scores
from pipeline.circuits.scoring import baseline, haar_blocks, later_pairs, placebo_pairs
from pipeline.config import CompositionConfig
from pipeline.tables import INVARIANT

F64 = torch.float64
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


# --- second moments and frames ------------------------------------------------------------------


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
    hw = model_heads()
    for call in (
        lambda: invariant.residual_grams(hw, "rotary"),
        lambda: invariant_scores(hw, CFG, 0, "rotary"),
    ):
        with pytest.raises(
            ValueError, match=r"^positions must be one of shortformer, standard, not 'rotary'$"
        ):
            call()
    assert torch.equal(invariant.residual_grams(hw)[1], invariant.residual_grams(hw, "shortformer")[1])


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


# --- any G_l: scores, baselines and the null against dense float64 --------------------------------


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


def test_grams_of_the_wrong_count_are_refused() -> None:
    hw = model_heads()  # two layers: G_0, G_1, G_2
    eye = torch.eye(16, dtype=F64)
    for n in (2, 4):
        with pytest.raises(ValueError, match=rf"^grams: expected 3 matrices \(G_0 \.\. G_L\), got {n}$"):
            invariant_scores(hw, CFG, 0, grams=[eye] * n)


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
