"""pipeline/circuits/channels.py: each pair's shares sum to its dense squared numerator and rebuild the
true score (against the dense oracle, tests/oracles.py); the circuits' SVDs, the shares of any
pairs in any chunking, normalised shares, top shares and summaries by hand; planted one- and
two-channel compositions give their known tables; the table is a function of the circuits alone
(residual rotations, head-basis changes); the blocking rule by hand, and the block shares against
dense float64 projectors, unchanged (as is every row of the table) when a degenerate block's
directions are turned within it."""

from __future__ import annotations

import math

import numpy as np
import oracles
import pandas as pd
import pytest
import torch
from block_models import EXACT, NAMED, PAIR, block_model, heads_of, rows_and_tables, the_pair, turn
from models import F64, head_weights, random_model
from symmetries import (
    assert_same_table,
    change_head_bases,
    invertible,
    orthogonal,
    paper_letters,
    rotate_residual,
)

from pipeline.circuits import channels
from pipeline.circuits.composition import true_scores
from pipeline.circuits.scoring import later_pairs, placebo_pairs
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig
from pipeline.tables import KINDS

TOL = CompositionConfig().channel_tolerance


fro2 = lambda M: torch.linalg.matrix_norm(M).square()  # noqa: E731


SUMMARY_COLUMNS = [
    "src_layer", "src_head", "dst_layer", "dst_head", "writer_channel", "reader_channel", "writer_block",
    "reader_block", "top_share", "effective_channels",
]  # fmt: skip


def model_heads(shape: str = "three_layers", seed: int = 0) -> HeadWeights:
    return from_state_dict(random_model(shape, seed=seed).state_dict())


def tiny(seed: int = 0) -> HeadWeights:
    """2 layers of 3 heads, d_model 16, d_head 4."""
    return from_state_dict(random_model(seed=seed).state_dict())


def test_circuit_svd_rebuilds_the_dense_circuit_with_its_orientation() -> None:
    hw = model_heads()
    OV = hw.W_V @ hw.W_O  # [L, H, d_model, d_model]
    svd = channels.writer_circuit(hw)
    eye = torch.eye(hw.d_head, dtype=F64)
    torch.testing.assert_close(svd.reads @ torch.diag_embed(svd.s) @ svd.writes.mT, OV, rtol=0, atol=1e-12)
    torch.testing.assert_close(svd.reads.mT @ svd.reads, eye.expand_as(svd.reads.mT @ svd.reads))
    torch.testing.assert_close(svd.writes.mT @ svd.writes, eye.expand_as(svd.reads.mT @ svd.reads))
    torch.testing.assert_close(svd.s, torch.linalg.svdvals(OV)[..., : hw.d_head], rtol=1e-12, atol=0)
    # x OV writes along `writes`: reads^T OV = diag(s) writes^T
    torch.testing.assert_close(svd.reads.mT @ OV, svd.s[..., None] * svd.writes.mT, rtol=0, atol=1e-12)
    QKt = hw.W_K @ hw.W_Q.mT  # K's reader circuit: the keys read the residual
    k = channels.reader_circuit(hw, "K")
    torch.testing.assert_close(k.reads.mT @ QKt, k.s[..., None] * k.writes.mT, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_sum_to_the_dense_squared_numerator_and_rebuild_the_true_score(kind: str) -> None:
    hw = model_heads()
    c = oracles.channels(hw, kind)
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
    torch.testing.assert_close(c.shares, oracles.channels(hw, kind).shares, equal_nan=True)
    ones = torch.where(c.scores().isnan(), torch.nan, 1.0).to(F64)  # [L, H, L, H]
    torch.testing.assert_close(channels.normalised(c.shares).sum((-2, -1)), ones, equal_nan=True)


def test_d_model_below_d_head_pads_with_zero_channels() -> None:
    g = torch.Generator().manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    hw = head_weights(r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 3, 4), r(2, 2, 4, 3))  # d_model 3 < d_head 4
    c = oracles.channels(hw, "K")
    assert c.shares.shape == (2, 2, 2, 2, 4, 4)
    assert (c.shares[0, :, 1, :, 3] == 0).all() and (c.shares[0, :, 1, :, :, 3] == 0).all()
    A, B, C, D = paper_letters(hw, "K", (0, 1), (1, 0))
    assert c.shares[0, 1, 1, 0].sum().item() == pytest.approx(fro2(A @ B @ C @ D).item(), rel=1e-10)


def test_an_unknown_kind_is_refused_in_one_line_naming_it_and_the_kinds() -> None:
    with pytest.raises(ValueError) as caught:
        channels.reader_circuit(tiny(), "O")
    message = str(caught.value)
    assert "\n" not in message and "'O'" in message and all(kind in message for kind in KINDS)


@pytest.mark.parametrize("chunk", [None, 3])
def test_pair_shares_of_any_pairs_in_any_chunking(chunk, monkeypatch) -> None:
    hw = from_state_dict(random_model("three_layers", seed=3).state_dict())
    if chunk is not None:  # chunks of 3 pairs: several, the last one short
        monkeypatch.setattr(channels, "_CROSS_CHUNK", chunk * hw.d_model * hw.d_head)
    for kind in KINDS:
        writer, reader = channels.writer_circuit(hw), channels.reader_circuit(hw, kind)
        later = channels.pair_shares(writer, reader, later_pairs(3, 3))
        dense = oracles.channels(hw, kind).shares
        i, h, j, g = later_pairs(3, 3)
        assert later.shape == (27, 4, 4) and later.dtype == F64
        torch.testing.assert_close(later, dense[i, h, j, g], rtol=1e-12, atol=0)
        any_pairs = channels.pair_shares(writer, reader, placebo_pairs(3, 3))
        for n, (a, b, c, e) in enumerate(zip(*placebo_pairs(3, 3), strict=True)):
            cross = writer.writes[a, b].mT @ reader.reads[c, e]
            want = (writer.s[a, b][:, None] * cross * reader.s[c, e][None, :]).square()
            torch.testing.assert_close(any_pairs[n], want, rtol=1e-13, atol=0)


def test_pair_shares_are_built_on_the_writers_device() -> None:
    """Circuits on the "meta" device (shapes only, as on an accelerator: not the CPU, torch's
    default): the [n, d_head, d_head] table of n = 3 pairs is on that device too, in their dtype."""
    eye = torch.eye(4, 2, dtype=F64, device="meta")[None, None].expand(
        2, 3, 4, 2
    )  # [layer, head, d_model, d_head]
    svd = channels.CircuitSVD(reads=eye, s=torch.ones(2, 3, 2, dtype=F64, device="meta"), writes=eye)
    pairs = (
        torch.tensor([0, 0, 1]),
        torch.tensor([0, 1, 2]),
        torch.tensor([1, 1, 1]),
        torch.tensor([2, 0, 1]),
    )
    shares = channels.pair_shares(svd, svd, pairs)
    assert (shares.device.type, shares.dtype, tuple(shares.shape)) == ("meta", F64, (3, 2, 2))


def test_scores_and_normalised_shares_by_hand() -> None:
    g = torch.Generator().manual_seed(1)
    L, H, d = 2, 3, 4  # every axis its own size
    shares = torch.rand(L, H, L, H, d, d, generator=g, dtype=F64) * 0.01  # sums below 1
    shares[0, 1, 1, 2] = 0  # a pair that does not compose
    shares[1, 0, 0, 0] = torch.nan  # not a later pair
    s, t = torch.rand(L, H, d, generator=g, dtype=F64), torch.rand(L, H, d, generator=g, dtype=F64)
    c = oracles.Channels(shares, s, t)
    scores, p = c.scores(), channels.normalised(shares)
    assert scores.shape == (L, H, L, H) and p.shape == shares.shape
    for a in range(L):
        for h in range(H):
            for b in range(L):
                for k in range(H):
                    pair = shares[a, h, b, k]
                    total = pair.sum().item()
                    want = math.sqrt(total) / (
                        math.dist(s[a, h].tolist(), [0] * d) * math.dist(t[b, k].tolist(), [0] * d)
                    )
                    if math.isnan(total) or total == 0:
                        assert p[a, h, b, k].isnan().all()
                        assert c.normalised()[a, h, b, k].isnan().all()
                        continue
                    assert scores[a, h, b, k].item() == pytest.approx(want, rel=1e-12)
                    torch.testing.assert_close(p[a, h, b, k], pair / total, rtol=1e-14, atol=0)
                    torch.testing.assert_close(c.normalised()[a, h, b, k], pair / total, rtol=1e-14, atol=0)
    assert scores[0, 1, 1, 2] == 0


def test_normalised_is_nan_where_a_signed_table_sums_to_zero() -> None:
    """Any [.., d, d] table, signed ones too (`Rotated.writer_interaction`): NaN where the sum is 0."""
    table = torch.tensor([[[1.0, -1.0], [0.5, -0.5]], [[1.0, 3.0], [-1.0, 1.0]]], dtype=F64)
    p = channels.normalised(table)
    assert p[0].isnan().all()
    assert p[1].tolist() == [[0.25, 0.75], [-0.25, 0.25]]


def test_top_share_by_hand() -> None:
    shares = torch.tensor(
        [[[1.0, 3.0], [0.0, 4.0]], [[2.0, 2.0], [2.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]]], dtype=F64
    )
    got = channels.top_share(shares)
    assert got[:2].tolist() == [0.5, 0.25] and got[2].isnan()


def test_channel_summary_by_hand_on_layers_heads_and_channels_of_different_sizes() -> None:
    """Singular values 3, 2, 1 (steps far beyond the tolerance): every block one direction, the
    summary per direction."""
    g = torch.Generator().manual_seed(2)
    L, H, d = 3, 2, 3
    shares = torch.rand(L, H, L, H, d, d, generator=g, dtype=F64)
    shares[0, 0, 1, 1] = 0  # no channels
    shares[0, 1, 2, 0] = torch.tensor([[1, 0, 3], [0, 0, 3], [1, 1, 0]], dtype=F64)  # a tie: the first wins
    s = torch.tensor([3.0, 2.0, 1.0], dtype=F64).expand(L, H, d)
    summary = oracles.channel_summary(shares, s, s, TOL)
    assert list(summary.columns) == SUMMARY_COLUMNS
    pairs = later_pairs(L, H)
    assert len(summary) == len(pairs[0]) == 12
    for column, want in zip(PAIR, pairs, strict=True):
        assert summary[column].tolist() == want.tolist()
    for row in summary.itertuples():
        pair = shares[row.src_layer, row.src_head, row.dst_layer, row.dst_head].numpy()
        if pair.sum() == 0:
            assert pd.isna(row.writer_channel) and pd.isna(row.reader_channel)
            assert math.isnan(row.top_share) and math.isnan(row.effective_channels)
            continue
        p = pair / pair.sum()
        top = int(np.argmax(p))  # numpy's argmax: the first of equal maxima
        assert (row.writer_channel, row.reader_channel) == (top // d, top % d)
        assert row.top_share == pytest.approx(p.max(), rel=1e-12)
        assert row.effective_channels == pytest.approx(1 / np.square(p).sum(), rel=1e-12)
    tie = summary.set_index(PAIR).loc[(0, 1, 2, 0)]
    assert (tie.writer_channel, tie.reader_channel, tie.top_share) == (0, 2, pytest.approx(1 / 3))
    defined = summary["top_share"].notna()
    assert (
        summary.loc[defined, "writer_block"].eq(1).all() and summary.loc[defined, "reader_block"].eq(1).all()
    )
    for column in ("writer_channel", "reader_channel", "writer_block", "reader_block"):
        assert summary[column].dtype == "Int64"


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
    c = oracles.channels(head_weights(W_Q, W_K, W_V, W_O), "K")
    p = c.normalised()
    assert p[0, 0, 1, 0, 0, 0].item() == pytest.approx(1, abs=1e-12)
    assert p[0, 0, 1, 1].isnan().all()  # zero up to rounding: no channels
    summary = oracles.channel_summary(p, c.s, c.t, TOL)
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
    c = oracles.channels(head_weights(W_Q, W_K, W_V, W_O), "K")
    want = z(4, 4)
    want[0, 1] = want[1, 0] = 4
    torch.testing.assert_close(c.shares[0, 0, 1, 0], want, rtol=0, atol=1e-12)
    (row,) = oracles.channel_summary(c.shares, c.s, c.t, TOL).itertuples()
    assert (row.writer_channel, row.reader_channel) in {(0, 1), (1, 0)}
    assert row.top_share == pytest.approx(0.5, abs=1e-12)
    assert row.effective_channels == pytest.approx(2, abs=1e-12)


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_are_unchanged_by_a_rotation_of_the_residual_stream(kind: str) -> None:
    hw = model_heads(seed=1)
    R = orthogonal(hw.d_model, torch.Generator().manual_seed(2))
    assert_same_table(
        oracles.channels(hw, kind).shares, oracles.channels(rotate_residual(hw, R), kind).shares
    )


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_shares_are_unchanged_by_a_change_of_head_basis_that_keeps_the_circuits(kind: str) -> None:
    """Distinct singular values: each singular vector is unique up to sign, squared away, so the
    table is unchanged entry by entry (no permutation) under any invertible G, not only orthogonal."""
    hw = model_heads(seed=1)
    g = torch.Generator().manual_seed(3)
    G = [invertible((hw.n_layers, hw.n_heads, hw.d_head), g) for _ in range(2)]  # not orthogonal
    assert not torch.allclose(G[0] @ G[0].mT, torch.eye(hw.d_head, dtype=F64).expand_as(G[0]), atol=0.1)
    assert_same_table(
        oracles.channels(hw, kind).shares, oracles.channels(change_head_bases(hw, *G), kind).shares
    )


def test_blocks_chain_steps_within_the_tolerance_and_keep_zeros_apart() -> None:
    """Steps by hand at tol = 1/4 (exact binary fractions): 1 -> 0.75 is 0.25 of 1 (joins, at the
    tolerance itself), 0.75 -> 0.5625 is 0.25 of 0.75 (joins: the chain spans 1 to 0.5625),
    0.5625 -> 0.25 does not; 0.25 -> 0.2 joins; then exact zeros, one block of their own."""
    s = torch.tensor([1.0, 0.75, 0.5625, 0.25, 0.2, 0.0, 0.0], dtype=F64)
    blocks = channels.spectral_blocks(s, 0.25)
    assert blocks.tolist() == [0, 0, 0, 3, 3, 5, 5]
    assert channels.block_sizes(blocks).tolist() == [3, 3, 3, 2, 2, 2, 2]
    assert channels.spectral_blocks(s, 0.0).tolist() == [0, 1, 2, 3, 4, 5, 5]  # equal values only: the zeros
    # a step a hair above the tolerance splits; values zero up to rounding join the zeros
    assert channels.spectral_blocks(torch.tensor([1.0, 0.75 - 1e-12], dtype=F64), 0.25).tolist() == [0, 1]
    rounding = torch.tensor([2.0, 1e-9, 3e-17, 1e-30], dtype=F64)  # <= ZERO_RTOL x 2: zero
    assert channels.spectral_blocks(rounding, 0.5).tolist() == [0, 1, 1, 1]
    assert channels.spectral_blocks(torch.zeros(3, dtype=F64), TOL).tolist() == [0, 0, 0]  # a zero circuit
    batch = torch.tensor([[3.0, 3.0, 1.0], [3.0, 1.0, 1.0]], dtype=F64)  # [.., d]: each row its own
    assert channels.spectral_blocks(batch, TOL).tolist() == [[0, 0, 2], [0, 1, 1]]


def test_block_sums_and_their_spread_by_hand() -> None:
    """Writer blocks {0, 1}, {2}; reader blocks {0}, {1, 2}: sums at the blocks' first directions,
    zeros elsewhere; spread back, each block pair's cells share its sum evenly."""
    table = torch.arange(1.0, 10.0, dtype=F64).view(1, 3, 3)  # [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    writer, reader = torch.tensor([[0, 0, 2]]), torch.tensor([[0, 1, 1]])
    sums = channels.block_sums(table, writer, reader)
    assert sums[0].tolist() == [[5, 16, 0], [0, 0, 0], [7, 17, 0]]
    assert channels.spread(sums, writer, reader)[0].tolist() == [[2.5, 4, 4], [2.5, 4, 4], [7, 8.5, 8.5]]
    one = torch.tensor([[0, 1, 2]])
    assert channels.block_sums(table, one, one) is table  # no block of more than one direction


def test_an_exactly_degenerate_block_turned_within_it_changes_no_channel_table() -> None:
    """The same circuits from factors whose SVD turns within both blocks: every row of every kind
    (top channel, block sizes, top share, effective channels, the null and z) and every table the
    same to float64 precision, while the per-direction shares of the pair move (the SVD's
    directions in a degenerate block are arbitrary)."""
    d = 4
    base = heads_of(block_model(EXACT, torch.eye(d, dtype=F64), torch.eye(d, dtype=F64)))
    turned = heads_of(block_model(EXACT, turn(d, 0, 0.7), turn(d, 1, 1.1)))
    torch.testing.assert_close(  # the circuits are the same ...
        turned.W_V[0, 0] @ turned.W_O[0, 0], base.W_V[0, 0] @ base.W_O[0, 0], rtol=0, atol=1e-14
    )
    per_direction = [
        channels.pair_shares(
            channels.writer_circuit(hw), channels.reader_circuit(hw, "K"), ([0], [0], [1], [0])
        )[0]
        for hw in (base, turned)
    ]
    assert (per_direction[0] - per_direction[1]).abs().max() > 1e-2 * per_direction[
        0
    ].sum()  # ... not their SVDs
    (rows, tables), (rows_turned, tables_turned) = rows_and_tables(base), rows_and_tables(turned)
    pd.testing.assert_frame_equal(rows[["kind", *PAIR, *NAMED]], rows_turned[["kind", *PAIR, *NAMED]])
    numbers = ["top_share", "effective_channels", "null_mean", "null_std", "z"]
    pd.testing.assert_frame_equal(rows[numbers], rows_turned[numbers], rtol=1e-10, atol=1e-12)
    for kind in tables:
        torch.testing.assert_close(tables_turned[kind], tables[kind], rtol=0, atol=1e-12, equal_nan=True)
    top = the_pair(rows)
    assert tuple(top[NAMED]) == (0, 0, 2, 1)  # writer block {0, 1} x reader direction 0
    # shares s^2 t^2 |W_A^T k|^2: block {0, 1} x k_0 4 x 16, x k_3 4 x 1; u_2 x k_1 9; u_3 x k_2 0.25 x 9
    assert top["top_share"] == pytest.approx(64 / (64 + 4 + 9 + 2.25), rel=1e-12)
    # 0.0 -> 1.0 is K's first later pair: its table spreads the top share over the block's cells
    assert tables["K"][0, :2, 0].tolist() == pytest.approx([top["top_share"] / 2] * 2, rel=1e-12)
    assert tables["K"][0].sum().item() == pytest.approx(1, rel=1e-12)


def test_near_equal_values_keep_the_named_top_channel_under_every_turn_within_the_block() -> None:
    """s_1 = s_0 (1 - tol / 2): one block. The writer's directions turned within it by angles over
    a half turn (the circuit moves by ~ tol): the named top channel (first directions and block
    sizes) never changes and its share stays within the block's bound, while the per-direction
    top cell moves between the block's two directions."""
    d = 4
    s = (2.0, 2.0 * (1 - TOL / 2), 1.0, 0.5)
    named, shares, per_direction_tops = set(), [], set()
    for angle in np.linspace(0.0, math.pi, 13):
        hw = heads_of(block_model(s, turn(d, 0, float(angle)), torch.eye(d, dtype=F64)))
        top = the_pair(rows_and_tables(hw)[0])
        named.add(tuple(int(x) for x in top[NAMED]))
        shares.append(top["top_share"])
        c = oracles.channels(hw, "K")
        cells = c.normalised()[0, 0, 1, 0]
        per_direction_tops.add(int(cells.argmax()) // d)
    assert named == {(0, 0, 2, 1)}
    bound = (1 - TOL) ** -2  # (s_max / s_min)^2 within a block of two, a reader block of one
    assert max(shares) / min(shares) <= bound
    assert per_direction_tops == {0, 1}  # per direction, the top channel is whichever the turn favours


def dense_projector(U: torch.Tensor) -> torch.Tensor:
    return U @ U.mT


@pytest.mark.parametrize("degenerate", [True, False], ids=["blocks", "distinct"])
def test_block_shares_are_the_dense_projected_numerators_and_sum_to_the_squared_numerator(degenerate) -> None:
    """share(A, B) = ||P_A OV^a N^b Q_B||^2, P_A the projector onto writer block A's reading
    directions and Q_B onto reader block B's output directions, both from a dense float64 SVD of
    the d_model x d_model circuits (a block's projector does not depend on the basis chosen in it);
    the block shares of a pair sum to ||OV^a N^b||^2, for every later pair of every kind."""
    d = 4
    model = (
        block_model(EXACT, turn(d, 0, 0.3), turn(d, 1, 0.9)) if degenerate else random_model("tiny", seed=2)
    )
    hw = heads_of(model)
    dense = {"Q": hw.W_Q @ hw.W_K.mT, "K": hw.W_K @ hw.W_Q.mT, "V": hw.W_V @ hw.W_O}  # [L, H, D, D]
    OV = hw.W_V @ hw.W_O
    found_block = False
    for kind in ("Q", "K", "V"):
        c = oracles.channels(hw, kind)
        for i, h, j, g in zip(*later_pairs(hw.n_layers, hw.n_heads), strict=True):
            writer_blocks = channels.spectral_blocks(c.s[i, h], TOL)
            reader_blocks = channels.spectral_blocks(c.t[j, g], TOL)
            sums = channels.block_sums(c.shares[i, h, j, g][None], writer_blocks[None], reader_blocks[None])[
                0
            ]
            R, s_dense, _ = torch.linalg.svd(OV[i, h])  # reads: left singular vectors
            _, t_dense, Mh = torch.linalg.svd(dense[kind][j, g])  # outputs: right singular vectors
            product = OV[i, h] @ dense[kind][j, g]
            total = torch.linalg.matrix_norm(product).square()
            assert sums.sum().item() == pytest.approx(total.item(), rel=1e-10)
            for a in writer_blocks.unique().tolist():
                for b in reader_blocks.unique().tolist():
                    A = (writer_blocks == a).nonzero()[:, 0]
                    B = (reader_blocks == b).nonzero()[:, 0]
                    found_block |= len(A) > 1 or len(B) > 1
                    P, Q = dense_projector(R[:, A]), dense_projector(Mh.mT[:, B])
                    want = torch.linalg.matrix_norm(P @ product @ Q).square()
                    assert sums[a, b].item() == pytest.approx(want.item(), rel=1e-9, abs=1e-12 * total.item())
    assert found_block == degenerate
