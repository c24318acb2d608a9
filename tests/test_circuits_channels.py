"""Channels: the shares of each pair sum to its dense squared numerator and rebuild the true
score; planted one- and two-channel compositions give their known tables; the table is a
function of the circuits alone (residual rotations, head-basis changes); the errata's rotated
strand splits over the reader's factors but not over channels, and is the true one filtered
by the query's alignment with what the writer reads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from models import head_weights, random_model

from pipeline.circuits import channels as ch
from pipeline.circuits.composition import true_scores
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig

F64 = torch.float64
TOL = CompositionConfig().channel_tolerance
fro2 = lambda M: torch.linalg.matrix_norm(M).square()  # noqa: E731


def model_heads(shape: str = "three_layers", seed: int = 0) -> HeadWeights:
    return from_state_dict(random_model(shape, seed=seed).state_dict())


def paper_letters(hw: HeadWeights, kind: str, a: tuple[int, int], b: tuple[int, int]):
    """A, B, C, D as composition.py's table defines them (paper = our transposes)."""
    Wq, Wk, Wv, Wo = hw.W_Q.mT, hw.W_K.mT, hw.W_V.mT, hw.W_O.mT  # the paper's column-vector matrices
    A, B = {"Q": (Wk[b].T, Wq[b]), "K": (Wq[b].T, Wk[b]), "V": (Wo[b], Wv[b])}[kind]
    return A, B, Wo[a], Wv[a]


# --- the shares against dense float64 --------------------------------------------------


def test_circuit_svd_rebuilds_the_dense_circuit_with_its_orientation() -> None:
    hw = model_heads()
    OV = hw.W_V @ hw.W_O  # [L, H, d_model, d_model]
    svd = ch.writer_circuit(hw)
    eye = torch.eye(hw.d_head, dtype=F64)
    torch.testing.assert_close(svd.reads @ torch.diag_embed(svd.s) @ svd.writes.mT, OV, rtol=0, atol=1e-12)
    torch.testing.assert_close(svd.reads.mT @ svd.reads, eye.expand_as(svd.reads.mT @ svd.reads))
    torch.testing.assert_close(svd.writes.mT @ svd.writes, eye.expand_as(svd.reads.mT @ svd.reads))
    torch.testing.assert_close(svd.s, torch.linalg.svdvals(OV)[..., : hw.d_head], rtol=1e-12, atol=0)
    # x OV writes along `writes`: reads^T OV = diag(s) writes^T
    torch.testing.assert_close(svd.reads.mT @ OV, svd.s[..., None] * svd.writes.mT, rtol=0, atol=1e-12)
    QKt = hw.W_K @ hw.W_Q.mT  # K's reader circuit: the keys read the residual
    k = ch.reader_circuit(hw, "K")
    torch.testing.assert_close(k.reads.mT @ QKt, k.s[..., None] * k.writes.mT, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_sum_to_the_dense_squared_numerator_and_rebuild_the_true_score(kind: str) -> None:
    hw = model_heads()
    c = ch.channels(hw, kind)
    L, H = hw.n_layers, hw.n_heads
    for i, h, j, g in torch.cartesian_prod(*(torch.arange(n) for n in (L, H, L, H))).tolist():
        pair = c.shares[i, h, j, g]
        if j <= i:
            assert pair.isnan().all()
            continue
        A, B, C, D = paper_letters(hw, kind, (i, h), (j, g))
        assert (pair >= 0).all()
        assert pair.sum().item() == pytest.approx(fro2(A @ B @ C @ D).item(), rel=1e-10)
    want = true_scores(hw, kinds=kind)[kind]
    torch.testing.assert_close(c.scores(), want, rtol=1e-10, atol=0, equal_nan=True)
    torch.testing.assert_close(c.shares, ch.channel_shares(hw, kind), equal_nan=True)
    ones = torch.where(c.scores().isnan(), torch.nan, 1.0).to(F64)  # [L, H, L, H]
    torch.testing.assert_close(ch.normalised(c.shares).sum((-2, -1)), ones, equal_nan=True)


def test_d_model_below_d_head_pads_with_zero_channels() -> None:
    g = torch.Generator().manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    hw = head_weights(r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 4, 3))  # d_model 3 < d_head 4
    c = ch.channels(hw, "K")
    assert c.shares.shape == (2, 2, 2, 2, 4, 4)
    assert (c.shares[0, :, 1, :, 3] == 0).all() and (c.shares[0, :, 1, :, :, 3] == 0).all()
    A, B, C, D = paper_letters(hw, "K", (0, 1), (1, 0))
    assert c.shares[0, 1, 1, 0].sum().item() == pytest.approx(fro2(A @ B @ C @ D).item(), rel=1e-10)


# --- planted tables ------------------------------------------------------------------------


def test_composition_through_one_direction_is_one_channel() -> None:
    """Writer (0, 0) writes only e_5; reader (1, 0)'s keys read only e_5, reader (1, 1)'s only
    e_6: one channel of share 1, and a pair that does not compose at all (NaN, <NA>)."""
    g = torch.Generator().manual_seed(7)
    W_Q, W_K, W_V = (torch.randn(2, 2, 8, 4, generator=g, dtype=F64) for _ in range(3))
    W_O = torch.randn(2, 2, 4, 8, generator=g, dtype=F64)
    e = torch.eye(8, dtype=F64)
    W_O[0, 0] = torch.randn(4, 1, generator=g, dtype=F64) @ e[5:6]  # [d_head, d_model]: writes e_5
    W_K[1, 0] = e[5][:, None] @ torch.randn(1, 4, generator=g, dtype=F64)  # keys read e_5 only
    W_K[1, 1] = e[6][:, None] @ torch.randn(1, 4, generator=g, dtype=F64)  # keys read e_6 only
    c = ch.channels(head_weights(W_Q, W_K, W_V, W_O), "K")
    p = c.normalised()
    assert p[0, 0, 1, 0, 0, 0].item() == pytest.approx(1, abs=1e-12)
    assert p[0, 0, 1, 1].isnan().all()  # zero up to rounding: no channels
    summary = ch.channel_summary(p, c.s, c.t, TOL)
    summary = summary.set_index(["src_layer", "src_head", "dst_layer", "dst_head"])
    top = summary.loc[(0, 0, 1, 0)]
    assert (top.writer_channel, top.reader_channel) == (0, 0)
    assert top.top_share == pytest.approx(1, abs=1e-12)
    assert top.effective_channels == pytest.approx(1, abs=1e-12)
    none = summary.loc[(0, 0, 1, 1)]
    assert pd.isna(none.writer_channel) and pd.isna(none.reader_channel)
    assert pd.isna(none.top_share) and pd.isna(none.effective_channels)
    assert len(summary) == 4 and summary.effective_channels.drop((0, 0, 1, 1)).ge(1 - 1e-12).all()


def test_two_orthogonal_channels_of_equal_weight() -> None:
    """OV^a = 2 e_0 e_4^T + e_1 e_5^T (s = 2, 1; writes e_4, e_5) and QK^bT = e_4 e_0^T + 2 e_5 e_1^T
    (t = 2, 1; reads e_5, e_4): writer channel 0 meets reader channel 1 and channel 1 channel 0,
    each (2 x 1)^2 = 4 of the 8 = ||2 e_0 e_0^T + 2 e_1 e_1^T||^2."""
    z = lambda *s: torch.zeros(*s, dtype=F64)  # noqa: E731
    W_Q, W_K, W_V, W_O = z(2, 1, 8, 4), z(2, 1, 8, 4), z(2, 1, 8, 4), z(2, 1, 4, 8)
    W_V[0, 0, 0, 0], W_V[0, 0, 1, 1], W_O[0, 0, 0, 4], W_O[0, 0, 1, 5] = 2, 1, 1, 1
    W_K[1, 0, 4, 0], W_K[1, 0, 5, 1], W_Q[1, 0, 0, 0], W_Q[1, 0, 1, 1] = 1, 2, 1, 1
    c = ch.channels(head_weights(W_Q, W_K, W_V, W_O), "K")
    want = z(4, 4)
    want[0, 1] = want[1, 0] = 4
    torch.testing.assert_close(c.shares[0, 0, 1, 0], want, rtol=0, atol=1e-12)
    (row,) = ch.channel_summary(c.shares, c.s, c.t, TOL).itertuples()
    assert (row.writer_channel, row.reader_channel) in {(0, 1), (1, 0)}
    assert row.top_share == pytest.approx(0.5, abs=1e-12)
    assert row.effective_channels == pytest.approx(2, abs=1e-12)


# --- what the table depends on ---------------------------------------------------------------


def orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64)).Q


def invertible(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """[*shape, n, n]: U diag(e^x) V^T, x uniform in [-0.5, 0.5]: condition number <= e."""
    *batch, n = shape
    U, V = (torch.linalg.qr(torch.randn(*batch, n, n, generator=g, dtype=F64)).Q for _ in range(2))
    return U @ torch.diag_embed(torch.rand(*batch, n, generator=g, dtype=F64).sub(0.5).exp()) @ V.mT


def rotate_residual(hw: HeadWeights, R: torch.Tensor) -> HeadWeights:
    return head_weights(R @ hw.W_Q, R @ hw.W_K, R @ hw.W_V, hw.W_O @ R.mT)


def change_head_bases(hw: HeadWeights, G_QK: torch.Tensor, G_OV: torch.Tensor) -> HeadWeights:
    """W_Q G, W_K G^-T (QK kept) and W_V G', G'^-1 W_O (OV kept), per head."""
    inv = torch.linalg.inv
    return head_weights(hw.W_Q @ G_QK, hw.W_K @ inv(G_QK).mT, hw.W_V @ G_OV, inv(G_OV) @ hw.W_O)


def assert_same_table(a: torch.Tensor, b: torch.Tensor) -> None:
    total = a.sum((-2, -1), keepdim=True)
    torch.testing.assert_close(a / total, b / total, rtol=0, atol=1e-10, equal_nan=True)


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_are_unchanged_by_a_rotation_of_the_residual_stream(kind: str) -> None:
    hw = model_heads(seed=1)
    R = orthogonal(hw.d_model, torch.Generator().manual_seed(2))
    assert_same_table(ch.channel_shares(hw, kind), ch.channel_shares(rotate_residual(hw, R), kind))


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_are_unchanged_by_a_change_of_head_basis_that_keeps_the_circuits(kind: str) -> None:
    """Distinct singular values: each singular vector is unique up to sign, squared away, so the
    table is unchanged entry by entry (no permutation) under any invertible G, not only orthogonal."""
    hw = model_heads(seed=1)
    g = torch.Generator().manual_seed(3)
    G = [invertible((hw.n_layers, hw.n_heads, hw.d_head), g) for _ in range(2)]  # not orthogonal
    assert not torch.allclose(G[0] @ G[0].mT, torch.eye(hw.d_head, dtype=F64).expand_as(G[0]), atol=0.1)
    assert_same_table(ch.channel_shares(hw, kind), ch.channel_shares(change_head_bases(hw, *G), kind))


# --- the errata's rotation ---------------------------------------------------------------------


def test_rotated_strand_splits_over_the_readers_factors_not_over_writer_channels() -> None:
    hw = model_heads()
    # every layer-0 writer against every layer-1 reader, broadcast: [H_a, H_b]
    r = ch.rotated_channels(hw.W_Q[1][None], hw.W_K[1][None], hw.W_V[0][:, None], hw.W_O[0][:, None])
    signed = 0
    for a in range(hw.n_heads):
        for b in range(hw.n_heads):
            A, B, C, D = paper_letters(hw, "K", (0, a), (1, b))
            W_Q, W_K, OV = hw.W_Q[1, b], hw.W_K[1, b], hw.W_V[0, a] @ hw.W_O[0, a]
            assert r.rotated_sq[a, b].item() == pytest.approx(fro2(B @ C @ D @ A).item(), rel=1e-10)
            assert r.true_sq[a, b].item() == pytest.approx(fro2(A @ B @ C @ D).item(), rel=1e-10)
            # the shares: sigma_m^2 kappa_n^2 (q_m . OV k_n)^2 from dense SVDs of W_Q and W_K
            q, sigma, _ = torch.linalg.svd(W_Q, full_matrices=False)
            k, kappa, _ = torch.linalg.svd(W_K, full_matrices=False)
            dense = (sigma[:, None] * (q.T @ OV @ k) * kappa[None, :]).square()
            torch.testing.assert_close(r.shares[a, b], dense, rtol=1e-9, atol=1e-12)
            # over writer channels: the sum is exact, the diagonal >= 0, the rest signed
            inter = r.writer_interaction[a, b]
            assert inter.sum().item() == pytest.approx(r.rotated_sq[a, b].item(), rel=1e-10)
            assert (inter.diagonal() >= 0).all()
            signed += int((inter < -1e-6 * inter.abs().max()).any())
            # alignment and gains, dense: M = OV W_K, P_Q = q q^T
            M = OV @ W_K
            P = q @ q.T
            align = torch.trace(P @ M @ M.T) / fro2(M)
            assert r.alignment[a, b].item() == pytest.approx(align.item(), rel=1e-10)
            gain_true = torch.sum((W_Q.T @ W_Q) * (M.T @ M)) / fro2(M)
            assert r.gain_true[a, b].item() == pytest.approx(gain_true.item(), rel=1e-10)
            s2 = sigma.square()
            for gain in (r.gain_true[a, b], r.gain_rotated[a, b]):
                assert s2.min() * (1 - 1e-12) <= gain <= s2.max() * (1 + 1e-12)
    assert signed == hw.n_heads**2  # every random pair has writer channels that cancel
    torch.testing.assert_close(r.rotated_sq, r.shares.sum((-2, -1)), rtol=1e-12, atol=0)
    torch.testing.assert_close(r.rotated_sq, r.true_sq * r.alignment * r.anisotropy, rtol=1e-10, atol=0)
    assert ((r.alignment >= 0) & (r.alignment <= 1)).all()


def test_rotated_strand_is_the_true_one_filtered_by_the_querys_alignment() -> None:
    """An isotropic query (W_Q = c times orthonormal columns): anisotropy 1, rotated^2 = alignment
    true^2. The writer's values reading inside the queries' span: alignment 1, rotated = true;
    reading orthogonal to it: alignment 0, rotated = 0, though true > 0 (the errata's filter)."""
    g = torch.Generator().manual_seed(11)
    D, d = 12, 3
    basis = orthogonal(D, g)
    W_Q = 1.7 * basis[:, :d]  # isotropic query, reads span(basis[:, :3])
    W_K, W_O = torch.randn(D, d, generator=g, dtype=F64), torch.randn(d, D, generator=g, dtype=F64)
    mix = torch.randn(D - d, d, generator=g, dtype=F64)
    for reads, alignment in (
        (basis[:, :d] @ torch.randn(d, d, generator=g, dtype=F64), 1.0),  # inside the query span
        (basis[:, d:] @ mix, 0.0),  # orthogonal to it
        (torch.randn(D, d, generator=g, dtype=F64), None),  # anywhere
    ):
        r = ch.rotated_channels(W_Q, W_K, reads, W_O)
        assert r.anisotropy.item() == pytest.approx(1, rel=1e-10) or alignment == 0
        assert r.gain_true.item() == pytest.approx(1.7**2, rel=1e-10)
        assert r.true_sq > 0
        if alignment is not None:
            assert r.alignment.item() == pytest.approx(alignment, abs=1e-12)
        assert r.rotated_sq.item() == pytest.approx(
            (r.alignment * r.true_sq).item(), rel=1e-9, abs=1e-12 * r.true_sq.item()
        )


def test_rotated_strand_depends_on_the_readers_head_basis_and_the_shares_do_not() -> None:
    """Orthogonal changes of basis and residual rotations leave B C D A alone; a general G that
    keeps QK^b changes it (the errata's norm is not a function of the circuits), never the shares."""
    hw = model_heads(seed=4)
    g = torch.Generator().manual_seed(5)
    eye = torch.eye(hw.d_head, dtype=F64)
    base = ch.rotated_channels(hw.W_Q[1], hw.W_K[1], hw.W_V[0], hw.W_O[0])  # head h of each layer
    R = orthogonal(hw.d_model, g)
    O = torch.stack([orthogonal(hw.d_head, g) for _ in range(hw.n_layers * hw.n_heads)])
    O = O.reshape(hw.n_layers, hw.n_heads, hw.d_head, hw.d_head)
    G = invertible((hw.n_layers, hw.n_heads, hw.d_head), g)
    for changed, same in (
        (rotate_residual(hw, R), True),
        (change_head_bases(hw, O, O), True),
        (change_head_bases(hw, G, eye.expand_as(G)), False),
    ):
        r = ch.rotated_channels(changed.W_Q[1], changed.W_K[1], changed.W_V[0], changed.W_O[0])
        torch.testing.assert_close(r.true_sq, base.true_sq, rtol=1e-10, atol=0)
        if same:
            torch.testing.assert_close(r.rotated_sq, base.rotated_sq, rtol=1e-10, atol=0)
            torch.testing.assert_close(r.alignment, base.alignment, rtol=1e-10, atol=0)
        else:
            assert ((r.rotated_sq / base.rotated_sq - 1).abs() > 1e-3).all()
        assert_same_table(ch.channel_shares(hw, "K"), ch.channel_shares(changed, "K"))


# --- the channel null and its calibration -------------------------------------------------


def test_the_channel_null_is_rotating_the_reader_in_the_residual_stream() -> None:
    """channel_blocks' crosses are the law of W^T R K under a Haar R: the log top share's mean and sd
    over 4000 blocks match those of actually rotating one pair's reader by 4000 Haar matrices
    (within five standard errors), for a pair with distinct spectra."""
    hw = model_heads("tiny", seed=4)
    writer, reader = ch.writer_circuit(hw), ch.reader_circuit(hw, "K")
    s, t = writer.s[0, 0], reader.s[1, 1]  # [d_head]
    n = 4000
    blocks = ch.channel_blocks(n, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    mean, sd = ch.top_share_null(s[None], t[None], blocks, TOL)
    G = torch.randn(n, hw.d_model, hw.d_model, generator=torch.Generator().manual_seed(1), dtype=F64)
    Q, R = torch.linalg.qr(G)
    Q = Q * torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0)[:, None, :]  # Haar [n, D, D]
    cross = writer.writes[0, 0].mT @ Q @ reader.reads[1, 1]  # [n, d_head, d_head]: w_i . R k_j
    tops = ch.top_share((s[:, None] * cross * t[None, :]).square()).log()  # [n]
    assert abs(mean.item() - tops.mean().item()) < 5 * tops.std().item() / n**0.5
    assert sd.item() == pytest.approx(tops.std().item(), rel=0.1)
    assert tops.std().item() > 0.01  # a real spread, so the comparison can fail


def test_a_pair_that_is_not_a_discovery_has_no_channel_discovery() -> None:
    """The stage's gate: only whole-pair discoveries are tested (BH over them alone); the rest have
    NaN p and q and no channel discovery, whatever their channel z. The placebo rows are all tested."""
    hw = model_heads("tiny", seed=1)
    blocks = ch.channel_blocks(32, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    later, _ = ch.channel_rows(hw, blocks, TOL)
    placebo, _ = ch.channel_rows(hw, blocks, TOL, placebo=True)
    assert list(later["kind"].unique()) == ["Q", "K", "V"]
    tested = np.zeros(len(later), dtype=bool)
    tested[[0, 3]] = True
    later["z"] = np.where(tested, later["z"], 50.0)  # untested pairs far above any bar
    got, got_placebo = ch.calibrate_channels(later, placebo, 0.05, tested)
    assert got["p"].notna().to_numpy().tolist() == tested.tolist()
    assert not got.loc[~tested, "discovery"].any()
    assert got_placebo["p"].notna().all() and not got_placebo["pair_discovery"].any()


def test_errata_statistics_of_a_writer_that_reads_where_the_queries_read() -> None:
    """rotation_statistics: a writer whose values read exactly the span of the reader's queries has
    alignment 1, and rotated^2 / true^2 = alignment x anisotropy; query_chance = rank(W_Q) / d_model;
    a writer whose output lies in the query span has output_query_share 1."""
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    d_model, d_head = 12, 3
    W_Q, W_K = r(2, 2, d_model, d_head), r(2, 2, d_model, d_head)
    W_V, W_O = r(2, 2, d_model, d_head), r(2, 2, d_head, d_model)
    W_V[0, 0] = W_Q[1, 1] @ r(d_head, d_head)  # a's values read span(W_Q^b)
    W_O[0, 1] = r(d_head, d_head) @ W_Q[1, 0].mT  # a' writes into span(W_Q^b')
    hw = head_weights(W_Q, W_K, W_V, W_O)
    pairs = tuple(torch.tensor(x) for x in ([0, 0], [0, 1], [1, 1], [1, 0]))  # (0,0)->(1,1), (0,1)->(1,0)
    stats = ch.rotation_statistics(hw, pairs)
    assert stats["alignment"][0].item() == pytest.approx(1.0, abs=1e-12)
    assert stats["output_query_share"][1].item() == pytest.approx(1.0, abs=1e-12)
    assert stats["query_chance"].tolist() == [d_head / d_model] * 2
    A, B, C, D = paper_letters(hw, "K", (0, 0), (1, 1))
    ratio = fro2(B @ C @ D @ A) / fro2(A @ B @ C @ D)
    assert ratio.item() == pytest.approx((stats["alignment"][0] * stats["anisotropy"][0]).item(), rel=1e-10)


def test_a_head_scaled_down_a_hundred_thousandfold_keeps_its_channel_table() -> None:
    """Each pair's channel table is scale-free: the pair's own score is its numerator over its own
    writer's and reader's norms, so a layer-1 head whose four matrices are scaled by 1e-5 (its
    circuits by 1e-10, far below ZERO_RTOL against the other heads') still has a defined table, the
    same as unscaled, pair by pair: top channel, top share, effective channels, null and z."""
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    L, H, D, d = 2, 2, 8, 3
    W_Q, W_K, W_V, W_O = r(L, H, D, d), r(L, H, D, d), r(L, H, D, d), r(L, H, d, D)
    hw = head_weights(W_Q, W_K, W_V, W_O)
    small = [W.clone() for W in (W_Q, W_K, W_V, W_O)]
    for W in small:
        W[1, 0] *= 1e-5
    blocks = ch.channel_blocks(16, D, d, torch.Generator().manual_seed(0))
    want, _ = ch.channel_rows(hw, blocks, TOL)
    got, _ = ch.channel_rows(head_weights(*small), blocks, TOL)
    assert len(got) == 3 * 4 and got["dst_layer"].eq(1).all()  # Q, K, V x (2 writers x 2 readers)
    assert got["top_share"].notna().all() and got["writer_channel"].notna().all()
    for column in ("writer_channel", "reader_channel"):
        assert got[column].tolist() == want[column].tolist()
    for column in ("top_share", "effective_channels", "null_mean", "null_std", "z"):
        np.testing.assert_allclose(got[column].to_numpy(), want[column].to_numpy(), rtol=1e-9)


def test_pair_shares_are_built_on_the_writers_device() -> None:
    """Circuits on the "meta" device (shapes only, as on an accelerator: not the CPU, torch's
    default): the [n, d_head, d_head] table of n = 3 pairs is on that device too, in their dtype."""
    eye = torch.eye(4, 2, dtype=F64, device="meta")[None, None].expand(
        2, 3, 4, 2
    )  # [layer, head, d_model, d_head]
    svd = ch.CircuitSVD(reads=eye, s=torch.ones(2, 3, 2, dtype=F64, device="meta"), writes=eye)
    pairs = (
        torch.tensor([0, 0, 1]),
        torch.tensor([0, 1, 2]),
        torch.tensor([1, 1, 1]),
        torch.tensor([2, 0, 1]),
    )
    shares = ch.pair_shares(svd, svd, pairs)
    assert (shares.device.type, shares.dtype, tuple(shares.shape)) == ("meta", F64, (3, 2, 2))
