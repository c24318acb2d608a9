"""pipeline/circuits/channel_null.py: the channel null (Haar blocks, the log top share's mean and sd by
hand, and the law of rotating the reader), channels.csv's rows (each pair's table summary, null and
z; no channels at the zero tolerance; scale-free), the gate and calibration of channel discoveries
(measured_channels, every_pair_tested, calibrate_channels, channels_summary), and the calibration
and power the procedure promises: untrained weights, surrogates of the trained model, a planted
channel."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import oracles
import pandas as pd
import planted
import pytest
import torch
import yaml
from block_models import PAIR, block_model, heads_of, the_pair
from models import F64, head_weights, random_model
from trained_heads import trained_weights as trained_heads

from pipeline import streams
from pipeline.behaviour import calibration
from pipeline.circuits import channel_null, channels, rotated, scoring, significance, weights
from pipeline.circuits.scoring import ZERO_RTOL, haar_blocks, later_pairs, placebo_pairs
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig, ModelConfig
from pipeline.tables import CHANNEL_STATISTICS, CHANNELS_COLUMNS, KINDS

TOL = CompositionConfig().channel_tolerance


FDR = 0.05


ROOT = Path(__file__).resolve().parents[1]


ROW_COLUMNS = [
    "src_layer", "src_head", "dst_layer", "dst_head", "writer_channel", "reader_channel", "writer_block",
    "reader_block", "top_share", "effective_channels", "kind", "null_mean", "null_std", "z",
    *CHANNEL_STATISTICS,
]  # fmt: skip


def model_heads(shape: str = "three_layers", seed: int = 0) -> HeadWeights:
    return from_state_dict(random_model(shape, seed=seed).state_dict())


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


def mask(d: int, keep: int) -> torch.Tensor:
    m = torch.zeros(d, dtype=F64)
    m[keep] = 1
    return m


def replace_heads(hw: HeadWeights, **heads) -> HeadWeights:
    from dataclasses import replace

    return replace(hw, **heads)


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


def test_channel_blocks_are_haar_blocks_zero_padded_to_d_head() -> None:
    wide = channel_null.channel_blocks(5, 6, 4, torch.Generator().manual_seed(7))
    torch.testing.assert_close(wide, haar_blocks(5, 6, 4, torch.Generator().manual_seed(7)), rtol=0, atol=0)
    narrow = channel_null.channel_blocks(5, 3, 4, torch.Generator().manual_seed(7))  # d_model 3 < d_head 4
    assert narrow.shape == (5, 4, 4)
    torch.testing.assert_close(narrow[:, :3, :3], haar_blocks(5, 3, 3, torch.Generator().manual_seed(7)))
    assert (narrow[:, 3] == 0).all() and (narrow[:, :, 3] == 0).all()


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
        monkeypatch.setattr(channel_null, "_NULL_CHUNK", chunk * draws * d * d)
    mean, sd = channel_null.top_share_null(s, t, blocks, TOL)
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


def test_the_channel_null_is_rotating_the_reader_in_the_residual_stream() -> None:
    """channel_blocks' crosses are the law of W^T R K under a Haar R: the log top share's mean and sd
    over 4000 blocks match those of actually rotating one pair's reader by 4000 Haar matrices
    (within five standard errors), for a pair with distinct spectra."""
    hw = model_heads("tiny", seed=4)
    writer, reader = channels.writer_circuit(hw), channels.reader_circuit(hw, "K")
    s, t = writer.s[0, 0], reader.s[1, 1]  # [d_head]
    n = 4000
    blocks = channel_null.channel_blocks(n, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    mean, sd = channel_null.top_share_null(s[None], t[None], blocks, TOL)
    G = torch.randn(n, hw.d_model, hw.d_model, generator=torch.Generator().manual_seed(1), dtype=F64)
    Q, R = torch.linalg.qr(G)
    Q = Q * torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0)[:, None, :]  # Haar [n, D, D]
    cross = writer.writes[0, 0].mT @ Q @ reader.reads[1, 1]  # [n, d_head, d_head]: w_i . R k_j
    tops = channels.top_share((s[:, None] * cross * t[None, :]).square()).log()  # [n]
    assert abs(mean.item() - tops.mean().item()) < 5 * tops.std().item() / n**0.5
    assert sd.item() == pytest.approx(tops.std().item(), rel=0.1)
    assert tops.std().item() > 0.01  # a real spread, so the comparison can fail


@pytest.mark.parametrize("placebo", [False, True])
def test_channel_rows_are_each_pairs_table_summary_and_null(placebo: bool) -> None:
    hw = tiny(seed=1)
    blocks = channel_null.channel_blocks(16, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    rows, tables = channel_null.channel_rows(hw, blocks, TOL, placebo=placebo)
    pairs = (placebo_pairs if placebo else later_pairs)(2, 3)
    n = len(pairs[0])
    assert list(rows.columns) == ROW_COLUMNS and rows.index.equals(pd.RangeIndex(3 * n))
    assert rows["kind"].tolist() == [kind for kind in KINDS for _ in range(n)]
    writer = channels.writer_circuit(hw)
    i, h, j, g = (torch.as_tensor(x) for x in pairs)
    for kind in KINDS:
        mine = rows[rows["kind"] == kind].reset_index(drop=True)
        for column, want in zip(PAIR, pairs, strict=True):
            assert mine[column].tolist() == want.tolist()
        reader = channels.reader_circuit(hw, kind)
        # distinct singular values (steps > TOL): blocks of one direction, the per-direction results
        assert (mine["writer_block"] == 1).all() and (mine["reader_block"] == 1).all()
        p = channels.normalised(channels.pair_shares(writer, reader, pairs))
        torch.testing.assert_close(tables[kind], p, rtol=0, atol=0)
        directions = torch.arange(hw.d_head).expand(n, hw.d_head)  # each direction its own block
        pd.testing.assert_frame_equal(
            mine[ROW_COLUMNS[:10]], channels.summary_rows(p, directions, directions, pairs)
        )
        mean, sd = channel_null.top_share_null(writer.s[i, h], reader.s[j, g], blocks, 0.0)  # per direction
        np.testing.assert_array_equal(mine["null_mean"], mean.numpy())
        np.testing.assert_array_equal(mine["null_std"], sd.numpy())
        z = (np.log(mine["top_share"]) - mine["null_mean"]) / mine["null_std"]
        np.testing.assert_allclose(mine["z"], z, rtol=1e-12, atol=1e-12)
        assert np.isfinite(mine["z"]).all()
        if kind == "K" and not placebo:
            for name, value in rotated.rotation_statistics(hw, pairs).items():
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
    blocks = channel_null.channel_blocks(8, 16, 4, torch.Generator().manual_seed(0))
    same = blocks[:1].expand(2, 4, 4).clone()
    for hw, b in ((rank_one, blocks), (tiny(seed=2), same)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows, _ = channel_null.channel_rows(hw, b, TOL)
        assert (rows["null_std"] == 0).all() and rows["z"].isna().all()
        assert rows["top_share"].notna().all()


def test_a_score_exactly_at_the_zero_tolerance_has_no_channels_and_one_above_it_has() -> None:
    blocks = channel_null.channel_blocks(8, 4, 2, torch.Generator().manual_seed(0))
    for eps, defined in ((ZERO_RTOL, False), (2 * ZERO_RTOL, True)):
        hw = two_channel_writer(eps)
        c = oracles.channels(hw, "K")
        assert c.scores()[0, 0, 1, 0].item() == pytest.approx(eps, rel=1e-15)
        rows, tables = channel_null.channel_rows(hw, blocks, TOL)
        k = rows[rows["kind"] == "K"].iloc[0]
        if defined:
            assert c.normalised()[0, 0, 1, 0].tolist() == [[0, 0], [1, 0]]  # writer channel 1, reader 0
            assert tables["K"][0].tolist() == [[0, 0], [1, 0]]
            assert (k.writer_channel, k.reader_channel, k.top_share) == (1, 0, 1)
        else:
            assert c.scores()[0, 0, 1, 0].item() == ZERO_RTOL  # exactly at the tolerance: zero
            assert c.normalised()[0, 0, 1, 0].isnan().all() and tables["K"][0].isnan().all()
            assert pd.isna(k.writer_channel) and math.isnan(k.top_share) and math.isnan(k.z)


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
    blocks = channel_null.channel_blocks(16, D, d, torch.Generator().manual_seed(0))
    want, _ = channel_null.channel_rows(hw, blocks, TOL)
    got, _ = channel_null.channel_rows(head_weights(*small), blocks, TOL)
    assert len(got) == 3 * 4 and got["dst_layer"].eq(1).all()  # Q, K, V x (2 writers x 2 readers)
    assert got["top_share"].notna().all() and got["writer_channel"].notna().all()
    for column in ("writer_channel", "reader_channel"):
        assert got[column].tolist() == want[column].tolist()
    for column in ("top_share", "effective_channels", "null_mean", "null_std", "z"):
        np.testing.assert_allclose(got[column].to_numpy(), want[column].to_numpy(), rtol=1e-9)


def test_the_channel_nulls_progress_bar_names_the_placebo_and_counts_kinds(capsys) -> None:
    from pipeline import cli

    hw = tiny(seed=5)
    blocks = channel_null.channel_blocks(4, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    capsys.readouterr()
    with cli.showing_progress("bar"):
        channel_null.channel_rows(hw, blocks, TOL, placebo=True)
    err = capsys.readouterr().err
    found = re.findall(r"channels placebo null: +\d+%\|[^|]*\| (\d+)/(\d+) \[[^\]]*(?:kind/s|s/kind)\]", err)
    assert found and found[-1] == ("3", "3"), err


def test_calibrate_channels_leaves_untested_rows_undiscovered_in_a_bool_column() -> None:
    hw = tiny(seed=4)
    gen = torch.Generator().manual_seed(7)
    blocks = channel_null.channel_blocks(24, hw.d_model, hw.d_head, gen)
    rows, _ = channel_null.channel_rows(hw, blocks, TOL)
    placebo, _ = channel_null.channel_rows(hw, blocks, TOL, placebo=True)
    tested = np.arange(len(rows)) % 2 == 0
    later, calibrated = channel_null.calibrate_channels(
        rows.assign(pair_discovery=tested), placebo, 0.5, tested
    )
    assert later["discovery"].dtype == bool and not later.loc[~tested, "discovery"].any()
    assert later.loc[~tested, "p"].isna().all() and later.loc[tested, "p"].notna().all()
    assert calibrated["pair_discovery"].dtype == bool and not calibrated["pair_discovery"].any()
    assert "variant" not in calibrated.columns and "discovery" in calibrated.columns


def test_a_pair_that_is_not_a_discovery_has_no_channel_discovery() -> None:
    """The stage's gate: only whole-pair discoveries are tested (BH over them alone); the rest have
    NaN p and q and no channel discovery, whatever their channel z. The placebo rows are all tested."""
    hw = model_heads("tiny", seed=1)
    blocks = channel_null.channel_blocks(32, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    later, _ = channel_null.channel_rows(hw, blocks, TOL)
    placebo, _ = channel_null.channel_rows(hw, blocks, TOL, placebo=True)
    assert list(later["kind"].unique()) == ["Q", "K", "V"]
    tested = np.zeros(len(later), dtype=bool)
    tested[[0, 3]] = True
    later["z"] = np.where(tested, later["z"], 50.0)  # untested pairs far above any bar
    got, got_placebo = channel_null.calibrate_channels(later, placebo, 0.05, tested)
    assert got["p"].notna().to_numpy().tolist() == tested.tolist()
    assert not got.loc[~tested, "discovery"].any()
    assert got_placebo["p"].notna().all() and not got_placebo["pair_discovery"].any()


def test_measured_channels_tests_the_whole_pair_discoveries_against_the_seeds_null() -> None:
    hw = tiny(seed=3)
    cfg = CompositionConfig(baseline_samples=4, null_samples=32, fdr=0.05)
    pairs = list(zip(*later_pairs(2, 3), strict=True))
    flags = {(kind, *map(int, p)): (n % 3 == 0) for kind in KINDS for n, p in enumerate(pairs)}
    dropped = ("V", 0, 0, 1, 0)  # a pair the scores do not have is not a discovery (flag True above)
    assert flags[dropped]
    later, placebo, tables = channel_null.measured_channels(hw, scores_table(flags, dropped), cfg, seed=5)
    assert list(later.columns) == list(CHANNELS_COLUMNS) == list(placebo.columns)
    want = [flags[(r.kind, r.src_layer, r.src_head, r.dst_layer, r.dst_head)] for r in later.itertuples()]
    want[[r.kind for r in later.itertuples()].index("V")] = False  # the dropped pair
    assert later["pair_discovery"].tolist() == want and later["pair_discovery"].dtype == bool
    assert later["p"].notna().tolist() == want and not later.loc[~np.array(want), "discovery"].any()
    assert len(placebo) == 3 * len(placebo_pairs(2, 3)[0]) and placebo["p"].notna().all()
    assert not placebo["pair_discovery"].any()
    # the null: the seed's channels.null stream, cfg.null_samples draws
    gen = torch.Generator().manual_seed(streams.seed_of(5, "channels.null"))
    blocks = channel_null.channel_blocks(32, hw.d_model, hw.d_head, gen)
    expected, expected_tables = channel_null.channel_rows(hw, blocks, TOL)
    pd.testing.assert_frame_equal(later[ROW_COLUMNS].reset_index(drop=True), expected[ROW_COLUMNS])
    assert set(tables) == set(KINDS)
    for kind in KINDS:
        assert tables[kind].dtype == torch.float32 and tables[kind].device.type == "cpu"
        torch.testing.assert_close(
            tables[kind], expected_tables[kind].float(), rtol=0, atol=0, equal_nan=True
        )
    # float32 weights are analysed in float64, as the same weights given in float64
    again, _, _ = channel_null.measured_channels(
        hw.to(torch.float32), scores_table(flags, dropped), cfg, seed=5
    )
    doubled, _, _ = channel_null.measured_channels(
        hw.to(torch.float32).to(F64), scores_table(flags, dropped), cfg, seed=5
    )
    pd.testing.assert_frame_equal(again, doubled)
    other, _, _ = channel_null.measured_channels(hw, scores_table(flags, dropped), cfg, seed=6)
    assert not np.allclose(other["null_mean"], later["null_mean"])


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
    _, _, tables = channel_null.measured_channels(hw, scores, cfg, seed=5, device=device)
    n_matrices = len(dataclasses.fields(hw))
    assert sum(1 for args in sent if args and args[0] is device) == n_matrices + 1  # the weights, the blocks
    assert sum(1 for args in sent if args == ("cpu", torch.float32)) == len(KINDS) == len(tables)


def test_the_tolerance_sets_the_blocks_of_the_composition_stages_tables() -> None:
    """measured_channels blocks at cfg.channel_tolerance: tolerance 0 splits the near-equal writer
    block of two into two directions, the default joins them."""
    d = 4
    hw = heads_of(
        block_model((2.0, 2.0 * (1 - TOL / 2), 1.0, 0.5), torch.eye(d, dtype=F64), torch.eye(d, dtype=F64))
    )
    scores = pd.DataFrame([{"kind": "K", "variant": "true", **dict(zip(PAIR, (0, 0, 1, 0), strict=True)),
                            "discovery": True}])  # fmt: skip
    sizes = {}
    for tol in (0.0, TOL):
        cfg = CompositionConfig(baseline_samples=4, null_samples=8, channel_tolerance=tol)
        later, _, _ = channel_null.measured_channels(hw, scores, cfg, seed=0)
        sizes[tol] = int(the_pair(later)["writer_block"])
    assert sizes == {0.0: 1, TOL: 2}


def test_every_pair_tested_tests_every_later_pair_against_the_seeds_null() -> None:
    hw = tiny(seed=4)
    later = channel_null.every_pair_tested(hw, fdr=0.05, seed=2, draws=24, tol=TOL)
    n = len(later_pairs(2, 3)[0])
    assert len(later) == 3 * n and later["p"].notna().all() and later["q"].notna().all()
    assert not later["pair_discovery"].any() and later["pair_discovery"].dtype == bool
    gen = torch.Generator().manual_seed(streams.seed_of(2, "channels.null"))
    expected, _ = channel_null.channel_rows(
        hw, channel_null.channel_blocks(24, hw.d_model, hw.d_head, gen), TOL
    )
    np.testing.assert_array_equal(later["null_mean"], expected["null_mean"])
    np.testing.assert_array_equal(later["z"], expected["z"])
    single = channel_null.every_pair_tested(hw.to(torch.float32), fdr=0.05, seed=2, draws=24, tol=TOL)
    doubled = channel_null.every_pair_tested(
        hw.to(torch.float32).to(F64), fdr=0.05, seed=2, draws=24, tol=TOL
    )
    pd.testing.assert_frame_equal(single, doubled)


def test_every_pair_tested_is_calibrated_against_the_placebo_pairs_rows() -> None:
    """Its null is the placebo pairs' channel rows (they cannot compose), not the later pairs'."""
    hw = tiny(seed=4)
    later = channel_null.every_pair_tested(hw, fdr=0.05, seed=2, draws=24, tol=TOL)
    gen = torch.Generator().manual_seed(streams.seed_of(2, "channels.null"))
    blocks = channel_null.channel_blocks(24, hw.d_model, hw.d_head, gen)
    rows, _ = channel_null.channel_rows(hw, blocks, TOL)
    placebo, _ = channel_null.channel_rows(hw, blocks, TOL, placebo=True)
    assert len(placebo) == 3 * len(placebo_pairs(2, 3)[0])
    expected, _ = channel_null.calibrate_channels(
        rows.assign(pair_discovery=False), placebo, 0.05, np.ones(len(rows), bool)
    )
    pd.testing.assert_frame_equal(later, expected)
    wrong, _ = channel_null.calibrate_channels(
        rows.assign(pair_discovery=False), rows, 0.05, np.ones(len(rows), bool)
    )
    assert not np.allclose(wrong["p"], later["p"])  # the later pairs as their own null differ


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
    out = channel_null.channels_summary(later, placebo)
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


@pytest.fixture(scope="module")
def trained_weights(synthetic_seed0):
    return trained_heads(synthetic_seed0)


SURROGATES = 20


@pytest.mark.parametrize("shape", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
def test_untrained_weights_have_at_most_one_kind_with_a_channel_discovery(shape):
    """Fresh weights, every later pair tested: of the 9 (seed, kind) families at most one has any
    channel discovery (BH's bound under a complete null)."""
    raw = yaml.safe_load((ROOT / "conf" / "model" / f"{shape}.yaml").read_text())
    raw["d_vocab"], raw["n_ctx"] = 512, 64
    model_cfg = ModelConfig(**raw)
    found = []
    for seed in range(3):
        fresh = random_model(model_cfg, seed=seed, dtype=torch.float32, perturb_biases=False)
        hw, _ = weights.prepare(fresh.state_dict(), model_cfg)
        found.append(
            channel_null.every_pair_tested(hw, FDR, seed, 64, CompositionConfig().channel_tolerance)
            .groupby("kind")["discovery"]
            .any()
        )
    assert pd.concat(found).sum() <= 1, found


@pytest.mark.slow
def test_surrogates_of_the_trained_model_have_channel_discoveries_at_most_at_the_nominal_rate(
    trained_weights,
):
    """20 surrogates, every later pair tested: at most the FDR's share of the (surrogate, kind)
    families has any channel discovery."""
    hw, _ = trained_weights
    found = [
        channel_null.every_pair_tested(
            scoring.surrogate(hw, torch.Generator().manual_seed(i)),
            FDR,
            0,
            64,
            CompositionConfig().channel_tolerance,
        )
        .groupby("kind")["discovery"]
        .any()
        for i in range(SURROGATES)
    ]
    share = pd.concat(found, axis=1).to_numpy().mean()
    assert share <= FDR, share


CHANNEL_BOUND = 3.5  # the channel z above which a planted channel of a discovered pair must be found


@pytest.mark.slow
def test_a_planted_channel_is_found_once_the_pair_is_a_discovery(trained_weights):
    """Power: the least-read layer-1 head's keys turned, by a rotation that keeps every spectrum,
    to read a layer-0 head's strongest output channel (planted.plant_key_channel) at growing
    strength: the top channel is the planted (0, 0) from strength 0.3, its share and channel z
    grow with the strength, and the pair is a channel discovery whenever it is a whole-pair
    discovery and its channel z passes CHANNEL_BOUND; the strongest plants are (so this cannot
    pass by never reaching it)."""
    hw, c = trained_weights
    raw = significance.raw_tables(hw, c, 0, "shortformer")[0]
    src, quiet = calibration.readers(raw)["least_read"]
    shares, zs, tested = [], [], 0
    for strength in (0.1, 0.3, 0.5, 0.7, 1.0):
        fake = planted.plant_key_channel(hw, src, quiet, strength)
        scores, _ = significance.measured(fake, c, 0, "shortformer")
        later, _, _ = channel_null.measured_channels(fake, scores, c, 0)
        pair = later[(later["kind"] == "K") & (later["src_layer"] == 0) & (later["src_head"] == src)
                     & (later["dst_head"] == quiet)].iloc[0]  # fmt: skip
        shares.append(pair["top_share"])
        zs.append(pair["z"])
        if strength >= 0.3:
            assert (pair["writer_channel"], pair["reader_channel"]) == (0, 0), (strength, pair)
        if pair["pair_discovery"] and pair["z"] > CHANNEL_BOUND:
            tested += 1
            assert pair["discovery"], (strength, pair)
    assert shares == sorted(shares) and zs == sorted(zs), (shares, zs)
    assert tested >= 1, zs
    assert pair["top_share"] > 0.8, pair
