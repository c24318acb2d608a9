"""pipeline/circuits/rotated.py: the errata's rotated strand B C D A against dense float64 products; it
splits over the reader's factors but not over writer channels, is the true strand filtered by the
query's alignment with what the writer reads (rotated^2 / true^2 = alignment x anisotropy), and
depends on the reader's head basis where the shares do not; the errata statistics of a
rank-deficient query and at the span's tolerance."""

from __future__ import annotations

import oracles
import pytest
import torch
from models import F64, head_weights, random_model
from symmetries import (
    assert_same_table,
    change_head_bases,
    invertible,
    orthogonal,
    paper_letters,
    rotate_residual,
)

from pipeline.circuits import rotated
from pipeline.circuits.scoring import ZERO_RTOL, later_pairs
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.tables import CHANNEL_STATISTICS

fro2 = lambda M: torch.linalg.matrix_norm(M).square()  # noqa: E731


def model_heads(shape: str = "three_layers", seed: int = 0) -> HeadWeights:
    return from_state_dict(random_model(shape, seed=seed).state_dict())


def tiny(seed: int = 0) -> HeadWeights:
    """2 layers of 3 heads, d_model 16, d_head 4."""
    return from_state_dict(random_model(seed=seed).state_dict())


def test_rotated_strand_splits_over_the_readers_factors_not_over_writer_channels() -> None:
    hw = model_heads()
    # every layer-0 writer against every layer-1 reader, broadcast: [H_a, H_b]
    r = rotated.rotated_channels(hw.W_Q[1][None], hw.W_K[1][None], hw.W_V[0][:, None], hw.W_O[0][:, None])
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
        r = rotated.rotated_channels(W_Q, W_K, reads, W_O)
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
    base = rotated.rotated_channels(hw.W_Q[1], hw.W_K[1], hw.W_V[0], hw.W_O[0])  # head h of each layer
    R = orthogonal(hw.d_model, g)
    O = torch.stack([orthogonal(hw.d_head, g) for _ in range(hw.n_layers * hw.n_heads)])
    O = O.reshape(hw.n_layers, hw.n_heads, hw.d_head, hw.d_head)
    G = invertible((hw.n_layers, hw.n_heads, hw.d_head), g)
    for changed, same in (
        (rotate_residual(hw, R), True),
        (change_head_bases(hw, O, O), True),
        (change_head_bases(hw, G, eye.expand_as(G)), False),
    ):
        r = rotated.rotated_channels(changed.W_Q[1], changed.W_K[1], changed.W_V[0], changed.W_O[0])
        torch.testing.assert_close(r.true_sq, base.true_sq, rtol=1e-10, atol=0)
        if same:
            torch.testing.assert_close(r.rotated_sq, base.rotated_sq, rtol=1e-10, atol=0)
            torch.testing.assert_close(r.alignment, base.alignment, rtol=1e-10, atol=0)
        else:
            assert ((r.rotated_sq / base.rotated_sq - 1).abs() > 1e-3).all()
        assert_same_table(oracles.channels(hw, "K").shares, oracles.channels(changed, "K").shares)


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
    stats = rotated.rotation_statistics(hw, pairs)
    assert stats["alignment"][0].item() == pytest.approx(1.0, abs=1e-12)
    assert stats["output_query_share"][1].item() == pytest.approx(1.0, abs=1e-12)
    assert stats["query_chance"].tolist() == [d_head / d_model] * 2
    A, B, C, D = paper_letters(hw, "K", (0, 0), (1, 1))
    ratio = fro2(B @ C @ D @ A) / fro2(A @ B @ C @ D)
    assert ratio.item() == pytest.approx((stats["alignment"][0] * stats["anisotropy"][0]).item(), rel=1e-10)


def test_rotation_statistics_a_few_pairs_at_a_time_are_the_same_bits(monkeypatch) -> None:
    """The pairs go a chunk at a time, bounded by the gathered head matrices' size (a 12 x 12-head
    model's would take gigabytes at once): three pairs a chunk, the last one short, give every
    statistic of every pair bit for bit."""
    hw = model_heads("three_layers", seed=4)
    pairs = tuple(torch.as_tensor(x) for x in later_pairs(hw.n_layers, hw.n_heads))  # 27 pairs
    whole = rotated.rotation_statistics(hw, pairs)
    monkeypatch.setattr(rotated, "_PAIR_CHUNK", 3 * hw.d_model * hw.d_head + 1)
    chunked = rotated.rotation_statistics(hw, pairs)
    assert list(chunked) == list(whole)
    for name, value in whole.items():
        assert value.shape == (27,) and torch.equal(chunked[name], value), name


def test_rotation_statistics_of_a_rank_deficient_query_against_dense_projectors() -> None:
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    D, d = 12, 3
    W_Q, W_K, W_V, W_O = r(2, 2, D, d), r(2, 2, D, d), r(2, 2, D, d), r(2, 2, d, D)
    W_Q[1, 0] = r(D, 2) @ r(2, d)  # rank 2
    hw = head_weights(W_Q, W_K, W_V, W_O)
    pairs = later_pairs(2, 2)
    stats = rotated.rotation_statistics(hw, pairs)
    assert set(stats) == set(CHANNEL_STATISTICS)
    fro2 = lambda M: torch.linalg.matrix_norm(M).square().item()  # noqa: E731
    for n, (a, h, b, k) in enumerate(zip(*pairs, strict=True)):
        Wq, Wk, OV = W_Q[b, k], W_K[b, k], W_V[a, h] @ W_O[a, h]
        q, sigma, _ = torch.linalg.svd(Wq, full_matrices=False)
        rank = int((sigma > 1e-8 * sigma[0]).sum())
        P = q[:, :rank] @ q[:, :rank].T  # the projector onto span(W_Q)
        M = OV @ Wk
        assert stats["query_chance"][n].item() == rank / D
        assert stats["output_query_share"][n].item() == pytest.approx(fro2(OV @ P) / fro2(OV), rel=1e-10)
        assert stats["alignment"][n].item() == pytest.approx(fro2(P @ M) / fro2(M), rel=1e-10)
        gain_true = torch.sum((Wq.T @ Wq) * (M.T @ M)).item() / fro2(M)
        gain_rotated = torch.sum((Wq @ Wq.T) * (M @ M.T)).item() / fro2(P @ M)
        assert stats["anisotropy"][n].item() == pytest.approx(gain_rotated / gain_true, rel=1e-9)
    assert stats["query_chance"].tolist() == [2 / D, d / D] * 2


def test_a_query_direction_exactly_at_the_span_tolerance_is_outside_the_span() -> None:
    """W_Q with singular values exactly 4 and 4 ZERO_RTOL: its span is e_0 alone. A writer whose values
    read e_1 has alignment 0 (and 1 when that direction is a little stronger)."""
    for sigma, inside in ((ZERO_RTOL, False), (2 * ZERO_RTOL, True)):
        z = lambda *s: torch.zeros(*s, dtype=F64)  # noqa: E731
        W_Q, W_K, W_V, W_O = z(2, 1, 4, 2), z(2, 1, 4, 2), z(2, 1, 4, 2), z(2, 1, 2, 4)
        W_Q[1, 0, 0, 0], W_Q[1, 0, 1, 1] = 4, 4 * sigma  # exactly: the tolerance is relative to sigma_max
        W_K[1, 0, 2, 0] = 1  # keys read e_2
        W_V[0, 0, 1, 0], W_O[0, 0, 0, 2] = 1, 1  # the writer reads e_1 and writes e_2
        hw = head_weights(W_Q, W_K, W_V, W_O)
        r = rotated.rotated_channels(W_Q[1, 0], W_K[1, 0], W_V[0, 0], W_O[0, 0])
        stats = rotated.rotation_statistics(hw, later_pairs(2, 1))
        assert r.alignment.item() == pytest.approx(float(inside), abs=1e-15)
        assert stats["alignment"].item() == pytest.approx(float(inside), abs=1e-15)
        assert stats["query_chance"].item() == (2 if inside else 1) / 4
        assert r.true_sq.item() == 16 and r.rotated_sq.item() == pytest.approx(16 * sigma**2, rel=1e-12)


def test_rotation_statistics_builds_its_identity_on_the_query_weights_device(monkeypatch) -> None:
    """On a CPU the device changes no number: watch the identity the query span is read against."""
    hw = tiny(seed=4)
    seen, eye = [], torch.eye

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device"))
        return eye(*args, **kwargs)

    monkeypatch.setattr(torch, "eye", spy)
    src_layer, src_head, dst_layer, dst_head = later_pairs(2, 3)
    rotated.rotation_statistics(hw.to(F64), (src_layer, src_head, dst_layer, dst_head))
    assert seen.count(hw.W_Q.device) == 1  # the query span's identity; others may take the default
