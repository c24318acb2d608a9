"""pipeline/circuits/channels.py's contract on small hand-made cases: a score exactly at the zero
tolerance has no channels; scores, normalised shares, summaries, the shares of any pairs and the
channel null against their formulas computed by hand (in any chunking); the errata statistics
against dense float64 (a rank-deficient query, a singular value exactly at the span's tolerance);
channel_rows, measured_channels, every_pair_tested and channels_summary in-process."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from models import head_weights, random_model

from pipeline import streams
from pipeline.circuits import channels as ch
from pipeline.circuits import significance
from pipeline.circuits.scoring import ZERO_RTOL, haar_blocks, later_pairs, placebo_pairs
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig
from pipeline.tables import CHANNEL_STATISTICS, CHANNELS_COLUMNS, KINDS

F64 = torch.float64
TOL = CompositionConfig().channel_tolerance
ROW_COLUMNS = [
    "src_layer", "src_head", "dst_layer", "dst_head", "writer_channel", "reader_channel", "writer_block",
    "reader_block", "top_share", "effective_channels", "kind", "null_mean", "null_std", "z",
    *CHANNEL_STATISTICS,
]  # fmt: skip


def tiny(seed: int = 0) -> HeadWeights:
    """2 layers of 3 heads, d_model 16, d_head 4."""
    return from_state_dict(random_model(seed=seed).state_dict())


def two_channel_writer(eps: float) -> HeadWeights:
    """Writer (0, 0): OV = e_0 e_0^T + eps e_1 e_1^T (s = 1, eps exactly); reader (1, 0)'s keys read
    e_1 alone (t = 1): the K score is eps / sqrt(1 + eps^2), exactly eps in float64 for eps = 1e-8."""
    z = lambda *s: torch.zeros(*s, dtype=F64)  # noqa: E731
    W_Q, W_K, W_V, W_O = z(2, 1, 4, 2), z(2, 1, 4, 2), z(2, 1, 4, 2), z(2, 1, 2, 4)
    W_V[0, 0, 0, 0], W_V[0, 0, 1, 1], W_O[0, 0, 0, 0], W_O[0, 0, 1, 1] = 1, eps, 1, 1
    W_K[1, 0, 1, 0], W_Q[1, 0, 2, 0] = 1, 1
    return head_weights(W_Q, W_K, W_V, W_O)


# --- the zero tolerance -------------------------------------------------------------------


def test_a_score_exactly_at_the_zero_tolerance_has_no_channels_and_one_above_it_has() -> None:
    blocks = ch.channel_blocks(8, 4, 2, torch.Generator().manual_seed(0))
    for eps, defined in ((ZERO_RTOL, False), (2 * ZERO_RTOL, True)):
        hw = two_channel_writer(eps)
        c = ch.channels(hw, "K")
        assert c.scores()[0, 0, 1, 0].item() == pytest.approx(eps, rel=1e-15)
        rows, tables = ch.channel_rows(hw, blocks, TOL)
        k = rows[rows["kind"] == "K"].iloc[0]
        if defined:
            assert c.normalised()[0, 0, 1, 0].tolist() == [[0, 0], [1, 0]]  # writer channel 1, reader 0
            assert tables["K"][0].tolist() == [[0, 0], [1, 0]]
            assert (k.writer_channel, k.reader_channel, k.top_share) == (1, 0, 1)
        else:
            assert c.scores()[0, 0, 1, 0].item() == ZERO_RTOL  # exactly at the tolerance: zero
            assert c.normalised()[0, 0, 1, 0].isnan().all() and tables["K"][0].isnan().all()
            assert pd.isna(k.writer_channel) and math.isnan(k.top_share) and math.isnan(k.z)


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValueError, match=r"^kind must be one of Q, K, V, not 'O'$"):
        ch.reader_circuit(tiny(), "O")


# --- scores, normalised shares and summaries by hand -------------------------------------------


def test_scores_and_normalised_shares_by_hand() -> None:
    g = torch.Generator().manual_seed(1)
    L, H, d = 2, 3, 4  # every axis its own size
    shares = torch.rand(L, H, L, H, d, d, generator=g, dtype=F64) * 0.01  # sums below 1
    shares[0, 1, 1, 2] = 0  # a pair that does not compose
    shares[1, 0, 0, 0] = torch.nan  # not a later pair
    s, t = torch.rand(L, H, d, generator=g, dtype=F64), torch.rand(L, H, d, generator=g, dtype=F64)
    c = ch.Channels(shares, s, t)
    scores, p = c.scores(), ch.normalised(shares)
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


def test_channel_summary_by_hand_on_layers_heads_and_channels_of_different_sizes() -> None:
    """Singular values 3, 2, 1 (steps far beyond the tolerance): every block one direction, the
    summary per direction."""
    g = torch.Generator().manual_seed(2)
    L, H, d = 3, 2, 3
    shares = torch.rand(L, H, L, H, d, d, generator=g, dtype=F64)
    shares[0, 0, 1, 1] = 0  # no channels
    shares[0, 1, 2, 0] = torch.tensor([[1, 0, 3], [0, 0, 3], [1, 1, 0]], dtype=F64)  # a tie: the first wins
    s = torch.tensor([3.0, 2.0, 1.0], dtype=F64).expand(L, H, d)
    summary = ch.channel_summary(shares, s, s, TOL)
    assert list(summary.columns) == ROW_COLUMNS[:10]
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


PAIR = ["src_layer", "src_head", "dst_layer", "dst_head"]


def test_top_share_by_hand() -> None:
    shares = torch.tensor(
        [[[1.0, 3.0], [0.0, 4.0]], [[2.0, 2.0], [2.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]]], dtype=F64
    )
    got = ch.top_share(shares)
    assert got[:2].tolist() == [0.5, 0.25] and got[2].isnan()


# --- the shares of any pairs, the null and its blocks ------------------------------------------


@pytest.mark.parametrize("chunk", [None, 3])
def test_pair_shares_of_any_pairs_in_any_chunking(chunk, monkeypatch) -> None:
    hw = from_state_dict(random_model("three_layers", seed=3).state_dict())
    if chunk is not None:  # chunks of 3 pairs: several, the last one short
        monkeypatch.setattr(ch, "_CROSS_CHUNK", chunk * hw.d_model * hw.d_head)
    for kind in KINDS:
        writer, reader = ch.writer_circuit(hw), ch.reader_circuit(hw, kind)
        later = ch.pair_shares(writer, reader, later_pairs(3, 3))
        dense = ch.channels(hw, kind).shares
        i, h, j, g = later_pairs(3, 3)
        assert later.shape == (27, 4, 4) and later.dtype == F64
        torch.testing.assert_close(later, dense[i, h, j, g], rtol=1e-12, atol=0)
        any_pairs = ch.pair_shares(writer, reader, placebo_pairs(3, 3))
        for n, (a, b, c, e) in enumerate(zip(*placebo_pairs(3, 3), strict=True)):
            cross = writer.writes[a, b].mT @ reader.reads[c, e]
            want = (writer.s[a, b][:, None] * cross * reader.s[c, e][None, :]).square()
            torch.testing.assert_close(any_pairs[n], want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("chunk", [None, 2])
def test_top_share_null_by_hand(chunk, monkeypatch) -> None:
    """Descending spectra, the odd pairs' writers with their first two values within the tolerance
    (one block of two) and the even pairs' distinct: each draw's top share over the block sums,
    written out cell by cell."""
    g = torch.Generator().manual_seed(4)
    n, draws, d = 5, 6, 3
    s, t = (torch.rand(n, d, generator=g, dtype=F64).sort(-1, descending=True).values for _ in range(2))
    s[1::2, 1] = s[1::2, 0] * (1 - TOL / 2)  # a block of the first two directions
    s[::2, 1] = s[::2, 0] * (1 - 2 * TOL)  # two blocks
    blocks = torch.randn(draws, d, d, generator=g, dtype=F64)
    if chunk is not None:  # two pairs at a time
        monkeypatch.setattr(ch, "_NULL_CHUNK", chunk * draws * d * d)
    mean, sd = ch.top_share_null(s, t, blocks, TOL)
    assert mean.shape == sd.shape == (n,)
    distinct = (t[:, :-1] - t[:, 1:] > TOL * t[:, :-1]).all() and (
        s[:, 1:2] - s[:, 2:] > TOL * s[:, 1:2]
    ).all()
    assert distinct  # else the cells below would need more sums
    for a in range(n):
        logs = []
        for b in range(draws):
            shares = (s[a][:, None] * blocks[b] * t[a][None, :]).square().tolist()  # [d, d]
            if a % 2:  # writer directions 0 and 1 are one block: their rows add
                shares = [[x + y for x, y in zip(shares[0], shares[1], strict=True)], shares[2]]
            cells = [x for row in shares for x in row]
            logs.append(math.log(max(cells) / sum(cells)))
        assert mean[a].item() == pytest.approx(np.mean(logs), rel=1e-12)
        assert sd[a].item() == pytest.approx(np.std(logs, ddof=1), rel=1e-10)


def test_channel_blocks_are_haar_blocks_zero_padded_to_d_head() -> None:
    wide = ch.channel_blocks(5, 6, 4, torch.Generator().manual_seed(7))
    torch.testing.assert_close(wide, haar_blocks(5, 6, 4, torch.Generator().manual_seed(7)), rtol=0, atol=0)
    narrow = ch.channel_blocks(5, 3, 4, torch.Generator().manual_seed(7))  # d_model 3 < d_head 4
    assert narrow.shape == (5, 4, 4)
    torch.testing.assert_close(narrow[:, :3, :3], haar_blocks(5, 3, 3, torch.Generator().manual_seed(7)))
    assert (narrow[:, 3] == 0).all() and (narrow[:, :, 3] == 0).all()


# --- the errata statistics against dense float64 -----------------------------------------------


def test_rotation_statistics_of_a_rank_deficient_query_against_dense_projectors() -> None:
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    D, d = 12, 3
    W_Q, W_K, W_V, W_O = r(2, 2, D, d), r(2, 2, D, d), r(2, 2, D, d), r(2, 2, d, D)
    W_Q[1, 0] = r(D, 2) @ r(2, d)  # rank 2
    hw = head_weights(W_Q, W_K, W_V, W_O)
    pairs = later_pairs(2, 2)
    stats = ch.rotation_statistics(hw, pairs)
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
        r = ch.rotated_channels(W_Q[1, 0], W_K[1, 0], W_V[0, 0], W_O[0, 0])
        stats = ch.rotation_statistics(hw, later_pairs(2, 1))
        assert r.alignment.item() == pytest.approx(float(inside), abs=1e-15)
        assert stats["alignment"].item() == pytest.approx(float(inside), abs=1e-15)
        assert stats["query_chance"].item() == (2 if inside else 1) / 4
        assert r.true_sq.item() == 16 and r.rotated_sq.item() == pytest.approx(16 * sigma**2, rel=1e-12)


# --- channel_rows ----------------------------------------------------------------------------


@pytest.mark.parametrize("placebo", [False, True])
def test_channel_rows_are_each_pairs_table_summary_and_null(placebo: bool) -> None:
    hw = tiny(seed=1)
    blocks = ch.channel_blocks(16, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    rows, tables = ch.channel_rows(hw, blocks, TOL, placebo=placebo)
    pairs = (placebo_pairs if placebo else later_pairs)(2, 3)
    n = len(pairs[0])
    assert list(rows.columns) == ROW_COLUMNS and rows.index.equals(pd.RangeIndex(3 * n))
    assert rows["kind"].tolist() == [kind for kind in KINDS for _ in range(n)]
    writer = ch.writer_circuit(hw)
    i, h, j, g = (torch.as_tensor(x) for x in pairs)
    for kind in KINDS:
        mine = rows[rows["kind"] == kind].reset_index(drop=True)
        for column, want in zip(PAIR, pairs, strict=True):
            assert mine[column].tolist() == want.tolist()
        reader = ch.reader_circuit(hw, kind)
        # distinct singular values (steps > TOL): blocks of one direction, the per-direction results
        assert (mine["writer_block"] == 1).all() and (mine["reader_block"] == 1).all()
        p = ch.normalised(ch.pair_shares(writer, reader, pairs))
        torch.testing.assert_close(tables[kind], p, rtol=0, atol=0)
        directions = torch.arange(hw.d_head).expand(n, hw.d_head)  # each direction its own block
        pd.testing.assert_frame_equal(
            mine[ROW_COLUMNS[:10]], ch._summary_rows(p, directions, directions, pairs)
        )
        mean, sd = ch.top_share_null(writer.s[i, h], reader.s[j, g], blocks, 0.0)  # per direction
        np.testing.assert_array_equal(mine["null_mean"], mean.numpy())
        np.testing.assert_array_equal(mine["null_std"], sd.numpy())
        z = (np.log(mine["top_share"]) - mine["null_mean"]) / mine["null_std"]
        np.testing.assert_allclose(mine["z"], z, rtol=1e-12, atol=1e-12)
        assert np.isfinite(mine["z"]).all()
        if kind == "K" and not placebo:
            for name, value in ch.rotation_statistics(hw, pairs).items():
                np.testing.assert_array_equal(mine[name], value.numpy(), err_msg=name)
        else:
            assert mine[list(CHANNEL_STATISTICS)].isna().all().all()


def test_channel_rows_z_is_nan_without_a_warning_where_the_null_does_not_spread() -> None:
    """Rank-one heads: every draw's top share is 1, sd 0 and top = mean (0 / 0); identical draws: sd 0
    and top != mean (x / 0). Either way z is NaN, quietly."""
    one = tiny(seed=2)
    rank_one = replace_heads(
        one, W_V=one.W_V * mask(4, 0), W_K=one.W_K * mask(4, 0), W_Q=one.W_Q * mask(4, 0)
    )
    blocks = ch.channel_blocks(8, 16, 4, torch.Generator().manual_seed(0))
    same = blocks[:1].expand(2, 4, 4).clone()
    for hw, b in ((rank_one, blocks), (tiny(seed=2), same)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows, _ = ch.channel_rows(hw, b, TOL)
        assert (rows["null_std"] == 0).all() and rows["z"].isna().all()
        assert rows["top_share"].notna().all()


def mask(d: int, keep: int) -> torch.Tensor:
    m = torch.zeros(d, dtype=F64)
    m[keep] = 1
    return m


def replace_heads(hw: HeadWeights, **heads) -> HeadWeights:
    from dataclasses import replace

    return replace(hw, **heads)


# --- measured_channels, every_pair_tested, channels_summary ---------------------------------


def scores_table(flags: dict[tuple, bool], dropped: tuple) -> pd.DataFrame:
    """A composition stage's scores: variant "true" rows with `flags` as discovery (not `dropped`), and
    errata rows with the opposite."""
    rows = []
    for (kind, *pair), found in flags.items():
        if (kind, *pair) != dropped:
            rows.append(
                {"kind": kind, "variant": "true", **dict(zip(PAIR, pair, strict=True)), "discovery": found}
            )
        rows.append(
            {
                "kind": kind,
                "variant": "errata_bcda",
                **dict(zip(PAIR, pair, strict=True)),
                "discovery": not found,
            }
        )
    return pd.DataFrame(rows)


def test_measured_channels_tests_the_whole_pair_discoveries_against_the_seeds_null() -> None:
    hw = tiny(seed=3)
    cfg = CompositionConfig(baseline_samples=4, null_samples=32, fdr=0.05)
    pairs = list(zip(*later_pairs(2, 3), strict=True))
    flags = {(kind, *map(int, p)): (n % 3 == 0) for kind in KINDS for n, p in enumerate(pairs)}
    dropped = ("V", 0, 0, 1, 0)  # a pair the scores do not have is not a discovery (flag True above)
    assert flags[dropped]
    later, placebo, tables = ch.measured_channels(hw, scores_table(flags, dropped), cfg, seed=5)
    assert list(later.columns) == list(CHANNELS_COLUMNS) == list(placebo.columns)
    want = [flags[(r.kind, r.src_layer, r.src_head, r.dst_layer, r.dst_head)] for r in later.itertuples()]
    want[[r.kind for r in later.itertuples()].index("V")] = False  # the dropped pair
    assert later["pair_discovery"].tolist() == want and later["pair_discovery"].dtype == bool
    assert later["p"].notna().tolist() == want and not later.loc[~np.array(want), "discovery"].any()
    assert len(placebo) == 3 * len(placebo_pairs(2, 3)[0]) and placebo["p"].notna().all()
    assert not placebo["pair_discovery"].any()
    # the null: the seed's channels.null stream, cfg.null_samples draws
    gen = torch.Generator().manual_seed(streams.seed_of(5, "channels.null"))
    blocks = ch.channel_blocks(32, hw.d_model, hw.d_head, gen)
    expected, expected_tables = ch.channel_rows(hw, blocks, TOL)
    pd.testing.assert_frame_equal(later[ROW_COLUMNS].reset_index(drop=True), expected[ROW_COLUMNS])
    assert set(tables) == set(KINDS)
    for kind in KINDS:
        assert tables[kind].dtype == torch.float32 and tables[kind].device.type == "cpu"
        torch.testing.assert_close(
            tables[kind], expected_tables[kind].float(), rtol=0, atol=0, equal_nan=True
        )
    # float32 weights are analysed in float64, as the same weights given in float64
    again, _, _ = ch.measured_channels(hw.to(torch.float32), scores_table(flags, dropped), cfg, seed=5)
    doubled, _, _ = ch.measured_channels(
        hw.to(torch.float32).to(F64), scores_table(flags, dropped), cfg, seed=5
    )
    pd.testing.assert_frame_equal(again, doubled)
    other, _, _ = ch.measured_channels(hw, scores_table(flags, dropped), cfg, seed=6)
    assert not np.allclose(other["null_mean"], later["null_mean"])


def test_every_pair_tested_tests_every_later_pair_against_the_seeds_null() -> None:
    hw = tiny(seed=4)
    later = ch.every_pair_tested(hw, fdr=0.05, seed=2, draws=24, tol=TOL)
    n = len(later_pairs(2, 3)[0])
    assert len(later) == 3 * n and later["p"].notna().all() and later["q"].notna().all()
    assert not later["pair_discovery"].any() and later["pair_discovery"].dtype == bool
    gen = torch.Generator().manual_seed(streams.seed_of(2, "channels.null"))
    expected, _ = ch.channel_rows(hw, ch.channel_blocks(24, hw.d_model, hw.d_head, gen), TOL)
    np.testing.assert_array_equal(later["null_mean"], expected["null_mean"])
    np.testing.assert_array_equal(later["z"], expected["z"])
    single = ch.every_pair_tested(hw.to(torch.float32), fdr=0.05, seed=2, draws=24, tol=TOL)
    doubled = ch.every_pair_tested(hw.to(torch.float32).to(F64), fdr=0.05, seed=2, draws=24, tol=TOL)
    pd.testing.assert_frame_equal(single, doubled)


def test_channels_summary_by_hand() -> None:
    later = pd.DataFrame(
        {
            "kind": ["Q", "Q", "K", "K", "K", "K", "V"],
            "pair_discovery": [True, False, True, True, True, False, False],
            "discovery": [False, False, True, False, True, True, True],
            "top_share": [np.nan, 0.2, 0.5, 0.9, 0.7, 0.1, 0.3],
            "effective_channels": [3.0, 1.0, 2.0, 1.2, 1.5, 9.0, 4.0],
        }
    )
    placebo = pd.DataFrame(
        {
            "kind": ["K", "K", "Q", "V"],
            "src_layer": [0, 0, 1, 1],
            "dst_layer": [0, 0, 0, 0],
            "z": [1.0, 2.0, 0.5, np.nan],
            "discovery": [True, False, False, False],
        }
    )
    out = ch.channels_summary(later, placebo)
    assert out["kinds"] == {
        "Q": {"tested": 1, "discoveries": 0, "median_top_share": None, "median_effective_channels": 3.0},
        "K": {"tested": 3, "discoveries": 2, "median_top_share": 0.7, "median_effective_channels": 1.5},
        "V": {"tested": 0, "discoveries": 0, "median_top_share": None, "median_effective_channels": None},
    }
    assert out["placebo_families"] == {
        "L0->L0": {"families": 1, "with_discovery": 1, "rate": 1.0},
        "L1->L0": {"families": 1, "with_discovery": 0, "rate": 0.0},  # V's pair is undefined: no family
        "all": {"families": 2, "with_discovery": 1, "rate": 0.5},
    }
    assert out["placebo_families"] == significance.family_summary(placebo.assign(variant="channel"))
    json.dumps(out, allow_nan=False)


def test_the_channel_nulls_progress_bar_names_the_placebo_and_counts_kinds(capsys) -> None:
    from pipeline import cli

    hw = tiny(seed=5)
    blocks = ch.channel_blocks(4, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    capsys.readouterr()
    with cli.showing_progress("bar"):
        ch.channel_rows(hw, blocks, TOL, placebo=True)
    err = capsys.readouterr().err
    found = re.findall(r"channels placebo null: +\d+%\|[^|]*\| (\d+)/(\d+) \[[^\]]*(?:kind/s|s/kind)\]", err)
    assert found and found[-1] == ("3", "3"), err


def test_normalised_is_nan_where_a_signed_table_sums_to_zero() -> None:
    """Any [.., d, d] table, signed ones too (`Rotated.writer_interaction`): NaN where the sum is 0."""
    table = torch.tensor([[[1.0, -1.0], [0.5, -0.5]], [[1.0, 3.0], [-1.0, 1.0]]], dtype=F64)
    p = ch.normalised(table)
    assert p[0].isnan().all()
    assert p[1].tolist() == [[0.25, 0.75], [-0.25, 0.25]]


def test_measured_channels_works_on_the_device_given_and_returns_its_tables_on_the_cpu(monkeypatch) -> None:
    """On a CPU the device changes no number, so watch where tensors are sent: every head matrix
    and the null's rotation blocks to the device given, each kind's table back to the CPU in
    float32 (the contract a GPU run relies on)."""
    hw = tiny(seed=3)
    cfg = CompositionConfig(baseline_samples=4, null_samples=8, fdr=0.05)
    pairs = list(zip(*later_pairs(2, 3), strict=True))
    flags = {(kind, *map(int, p)): True for kind in KINDS for p in pairs}
    scores = scores_table(flags, ("V", 0, 0, 1, 0))
    device = torch.device("cpu")  # an object of its own, so its uses can be told from any other "cpu"
    sent, to = [], torch.Tensor.to

    def spy(self, *args, **kwargs):
        sent.append(args)
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    _, _, tables = ch.measured_channels(hw, scores, cfg, seed=5, device=device)
    n_matrices = len(dataclasses.fields(hw))
    assert sum(1 for args in sent if args and args[0] is device) == n_matrices + 1  # the weights, the blocks
    assert sum(1 for args in sent if args == ("cpu", torch.float32)) == len(KINDS) == len(tables)


def test_every_pair_tested_is_calibrated_against_the_placebo_pairs_rows() -> None:
    """Its null is the placebo pairs' channel rows (they cannot compose), not the later pairs'."""
    hw = tiny(seed=4)
    later = ch.every_pair_tested(hw, fdr=0.05, seed=2, draws=24, tol=TOL)
    gen = torch.Generator().manual_seed(streams.seed_of(2, "channels.null"))
    blocks = ch.channel_blocks(24, hw.d_model, hw.d_head, gen)
    rows, _ = ch.channel_rows(hw, blocks, TOL)
    placebo, _ = ch.channel_rows(hw, blocks, TOL, placebo=True)
    assert len(placebo) == 3 * len(placebo_pairs(2, 3)[0])
    expected, _ = ch.calibrate_channels(
        rows.assign(pair_discovery=False), placebo, 0.05, np.ones(len(rows), bool)
    )
    pd.testing.assert_frame_equal(later, expected)
    wrong, _ = ch.calibrate_channels(rows.assign(pair_discovery=False), rows, 0.05, np.ones(len(rows), bool))
    assert not np.allclose(wrong["p"], later["p"])  # the later pairs as their own null differ


def test_calibrate_channels_leaves_untested_rows_undiscovered_in_a_bool_column() -> None:
    hw = tiny(seed=4)
    gen = torch.Generator().manual_seed(7)
    blocks = ch.channel_blocks(24, hw.d_model, hw.d_head, gen)
    rows, _ = ch.channel_rows(hw, blocks, TOL)
    placebo, _ = ch.channel_rows(hw, blocks, TOL, placebo=True)
    tested = np.arange(len(rows)) % 2 == 0
    later, calibrated = ch.calibrate_channels(rows.assign(pair_discovery=tested), placebo, 0.5, tested)
    assert later["discovery"].dtype == bool and not later.loc[~tested, "discovery"].any()
    assert later.loc[~tested, "p"].isna().all() and later.loc[tested, "p"].notna().all()
    assert calibrated["pair_discovery"].dtype == bool and not calibrated["pair_discovery"].any()
    assert "variant" not in calibrated.columns and "discovery" in calibrated.columns


def test_rotation_statistics_builds_its_identity_on_the_query_weights_device(monkeypatch) -> None:
    """On a CPU the device changes no number: watch the identity the query span is read against."""
    hw = tiny(seed=4)
    seen, eye = [], torch.eye

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device"))
        return eye(*args, **kwargs)

    monkeypatch.setattr(torch, "eye", spy)
    src_layer, src_head, dst_layer, dst_head = later_pairs(2, 3)
    ch.rotation_statistics(hw.to(F64), (src_layer, src_head, dst_layer, dst_head))
    assert seen.count(hw.W_Q.device) == 1  # the query span's identity; others may take the default
