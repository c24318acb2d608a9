"""pipeline/behaviour/channel_check.py: the causal check of the channel shares.

The discovered K pairs' channel cuts beside the whole path's on the heads stage's own batches
(against tests/ablation_oracles.py), the summary's numbers, keys and order, the t interval of two
values, and the refusals of a pair, channel or head out of range or a whole-path table that does
not fit."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from ablation_oracles import ablate_channel, ablate_path
from block_models import EXACT, NAMED, PAIR, block_model, heads_of, rows_and_tables, turn
from models import F64
from one_direction import channel_table, one_direction_model
from refusals import one_line

from pipeline.behaviour import ablation, channel_check, heads
from pipeline.circuits import weights
from pipeline.circuits.weights import HeadWeights
from pipeline.config import HeadsConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.tables import CHANNELS_COLUMNS


@pytest.fixture(scope="module")
def text():
    return torch.randint(0, 20, (64, 16), generator=torch.Generator().manual_seed(3))


LENGTH = 5


T_975_1 = 12.706204736174698  # t_{0.975} with 1 degree of freedom


@pytest.fixture(scope="module")
def planted_check():
    """The one-direction model (0.0 -> 1.0 through K, test_channel_ablation), its channel table
    with that pair and 0.2 -> 1.1 discovered, a synthetic held-out set of two batches of 16."""
    model = one_direction_model(0.25)
    hw = weights.from_state_dict(model.state_dict())
    table = channel_table(hw, {(0, 0, 1, 0), (0, 2, 1, 1)})
    text = torch.randint(0, 20, (32, 16), generator=torch.Generator().manual_seed(7))
    dataset = datasets.Dataset(train=None, eval=text, heldout=None, manifest={})
    cfg = HeadsConfig(eval_sequences=16, repeat_length=LENGTH, ablation_batches=2)
    return model, hw, table, dataset, cfg


def whole_path(model, probes, heldout) -> pd.DataFrame:
    """ablation_batches.csv for these batches: the whole-path cuts (`ablation.path_ablation`)."""
    frames = []
    for b, (probe, text) in enumerate(zip(probes, heldout, strict=True)):
        on_text = ablation.path_ablation(model, text, None)
        frames.append(
            ablation.path_ablation(model, probe, LENGTH).assign(
                heldout_loss_effect=on_text["loss_effect"].to_numpy(),
                pattern_effect=on_text["pattern_effect"].to_numpy(),
                batch=b,
            )
        )
    return pd.concat(frames, ignore_index=True)


def test_check_batches_writes_a_row_per_pair_and_batch_beside_the_whole_path(text):
    """The discovered K pairs alone (not the Q or V rows, not the undiscovered K ones), on every
    batch, their path columns the whole-path cut's on the same batch, causal_share the ratio."""
    model = one_direction_model(0.25)
    hw = weights.from_state_dict(model.state_dict())
    table = channel_table(hw, {(0, 0, 1, 0), (0, 2, 1, 1)})
    probes = [
        torch.cat([torch.zeros(8, 1, dtype=torch.long), s, s], 1)
        for s in torch.randint(1, 20, (2, 8, LENGTH), generator=torch.Generator().manual_seed(4))
    ]
    heldout = [text[:32], text[32:]]
    whole = pd.concat(
        [
            ablation.path_ablation(model, probe, LENGTH).assign(
                heldout_loss_effect=(t := ablation.path_ablation(model, held, None))[
                    "loss_effect"
                ].to_numpy(),
                pattern_effect=t["pattern_effect"].to_numpy(),
                batch=b,
            )
            for b, (probe, held) in enumerate(zip(probes, heldout, strict=True))
        ]
    )
    frame = channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole)
    assert list(frame.columns) == list(channel_check.COLUMNS)
    assert frame[["batch", "src_head", "dst_head"]].values.tolist() == [
        [0, 0, 0],
        [0, 2, 1],
        [1, 0, 0],
        [1, 2, 1],
    ]
    cuts = dict(zip((0, 2), channel_check.cuts(hw, channel_check.discovered(table)), strict=True))  # by a
    for row in frame.itertuples():
        path = ablate_path(model, heldout[row.batch], (0, row.src_head), (1, row.dst_head), "K", None)
        assert row.path_pattern_effect == pytest.approx(path[2], abs=1e-12)
        cut = cuts[row.src_head]
        channel = ablate_channel(model, heldout[row.batch], cut, None)
        assert row.channel_pattern_effect == pytest.approx(channel[2], abs=1e-12)
        assert row.channel_heldout_loss_effect == pytest.approx(channel[1], abs=1e-12)
        assert row.channel_attn_effect == pytest.approx(
            ablate_channel(model, probes[row.batch], cut, LENGTH)[0], abs=1e-12
        )
        assert row.causal_share == pytest.approx(
            row.channel_pattern_effect / row.path_pattern_effect, rel=1e-12
        )
    with pytest.raises(ValueError) as caught:  # batch 1's whole-path cuts missing
        channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole[whole["batch"] == 0])
    one_line(caught, "`whole`")


def test_summary_known_answers():
    """Per pair: the shares' mean over batches and its t interval (t_0.975 with 2 degrees of
    freedom = 4.3027); a batch whose path effect is 0 counts NaN and is left out; the median over
    the pairs' means."""
    frame = pd.DataFrame({
        "batch": [0, 1, 2] * 3, "kind": "K",
        "src_layer": 0, "src_head": [0] * 3 + [1] * 3 + [2] * 3, "dst_layer": 1, "dst_head": 0,
        "writer_channel": 0, "reader_channel": 1, "writer_block": 1, "reader_block": [1] * 6 + [2] * 3,
        "top_share": [0.9] * 3 + [0.5] * 3 + [0.2] * 3,
        "channel_pattern_effect": [0.8, 0.9, 1.0, 0.1, 0.1, 0.1, 0.3, 0.3, 0.0],
        "path_pattern_effect": [1.0, 1.0, 1.0, 0.2, 0.2, 0.2, 1.0, 1.0, 0.0],
        "causal_share": [0.8, 0.9, 1.0, 0.5, 0.5, 0.5, 0.3, 0.3, np.nan],
    })  # fmt: skip
    out = channel_check.summarize(frame)
    assert out["n_pairs"] == 3 and out["effect"] == "pattern_effect"
    first, second, third = out["pairs"]
    assert (first["src"], first["dst"], first["writer_channel"], first["reader_channel"]) == (
        "0.0",
        "1.0",
        0,
        1,
    )
    assert first["top_share"] == 0.9
    assert (first["writer_block"], first["reader_block"], third["reader_block"]) == (1, 1, 2)
    assert first["causal_share"] == pytest.approx(0.9)
    half = 4.302652729911275 * 0.1 / 3**0.5
    assert (first["causal_share_lo"], first["causal_share_hi"]) == pytest.approx((0.9 - half, 0.9 + half))
    assert first["path_pattern_effect"] == pytest.approx(1.0) and first[
        "channel_pattern_effect"
    ] == pytest.approx(0.9)
    assert (second["causal_share_lo"], second["causal_share_hi"]) == pytest.approx((0.5, 0.5))
    assert third["causal_share"] == pytest.approx(0.3) and third["causal_share_batches"] == [0.3, 0.3, None]
    assert out["median_causal_share"] == pytest.approx(0.5)
    json.dumps(out, allow_nan=False)  # JSON as written: no NaN
    empty = channel_check.summarize(frame.iloc[:0])
    assert empty["n_pairs"] == 0 and empty["pairs"] == [] and empty["median_causal_share"] is None


def test_t_interval_of_two_values_has_one_degree_of_freedom():
    """(1, 3): mean 2, sd sqrt 2, half width t_{0.975, 1} x sqrt 2 / sqrt 2 = 12.7062."""
    lo, hi = channel_check._t_interval([1.0, 3.0])
    assert (lo, hi) == pytest.approx((2 - T_975_1, 2 + T_975_1), rel=1e-12)
    assert all(math.isnan(x) for x in channel_check._t_interval([1.0]))  # one value: no interval


def test_summary_of_a_pair_seen_on_one_batch():
    """One batch: the pair's channels and top share are that row's, its mean share that batch's,
    no interval; two batches of another pair: its interval with one degree of freedom."""
    frame = pd.DataFrame({
        "batch": [0, 0, 1], "kind": "K", "src_layer": 0, "src_head": [1, 2, 2], "dst_layer": 1,
        "dst_head": 0, "writer_channel": [3, 1, 1], "reader_channel": [2, 0, 0], "writer_block": 1,
        "reader_block": 1,
        "top_share": [0.7, 0.4, 0.4], "channel_pattern_effect": [0.3, 0.1, 0.3],
        "path_pattern_effect": [0.6, 0.1, 0.1], "causal_share": [0.5, 1.0, 3.0],
    })  # fmt: skip
    out = channel_check.summarize(frame)
    one, two = out["pairs"]
    assert (one["src"], one["dst"], one["writer_channel"], one["reader_channel"]) == ("0.1", "1.0", 3, 2)
    assert one["top_share"] == 0.7 and one["causal_share"] == 0.5 and one["causal_share_batches"] == [0.5]
    assert one["causal_share_lo"] is None and one["causal_share_hi"] is None
    assert (two["src"], two["writer_channel"], two["reader_channel"]) == ("0.2", 1, 0)
    assert (two["causal_share_lo"], two["causal_share_hi"]) == pytest.approx((2 - T_975_1, 2 + T_975_1))
    assert out["median_causal_share"] == pytest.approx(1.25)


def test_analyse_checks_the_heads_stages_own_batches(planted_check):
    """`analyse` runs on `heads.evaluation_batches` (probe b of the run's seed with held-out batch
    b): each discovered pair on both batches, the whole path's effects those of `whole`, the
    channel's those of the channel cut on the same held-out batch."""
    model, hw, table, dataset, cfg = planted_check
    probes, heldout = heads.evaluation_batches(dataset, cfg, model.cfg.d_vocab, 3)
    assert len(probes) == 2 and [tuple(p.shape) for p in probes] == [(16, 1 + 2 * LENGTH)] * 2
    whole = whole_path(model, probes, heldout)
    frame = channel_check.analyse(model, hw, table, dataset, cfg, 3, whole)
    assert list(frame.columns) == list(channel_check.COLUMNS)
    assert frame[["batch", "src_head", "dst_head"]].values.tolist() == [
        [0, 0, 0],
        [0, 2, 1],
        [1, 0, 0],
        [1, 2, 1],
    ]
    cuts = dict(zip((0, 2), channel_check.cuts(hw, channel_check.discovered(table)), strict=True))
    for row in frame.itertuples():
        path = whole[
            (whole["kind"] == "K") & (whole["batch"] == row.batch) & (whole["src_head"] == row.src_head)
        ]
        path = path[path["dst_head"] == row.dst_head]
        assert row.path_pattern_effect == path["pattern_effect"].item()
        _, loss, moved = ablate_channel(model, heldout[row.batch], cuts[row.src_head], None)
        assert row.channel_pattern_effect == pytest.approx(moved, abs=1e-12)
        assert row.channel_heldout_loss_effect == pytest.approx(loss, abs=1e-12)
        attn = ablate_channel(model, probes[row.batch], cuts[row.src_head], LENGTH)[0]
        assert row.channel_attn_effect == pytest.approx(attn, abs=1e-12)


def test_a_whole_path_table_without_batches_is_refused(planted_check):
    """ablation.csv (the mean over batches, no "batch" column) in place of ablation_batches.csv is
    an error, even with a single batch, where each pair's row would otherwise fit."""
    model, hw, table, dataset, cfg = planted_check
    probes, heldout = heads.evaluation_batches(dataset, cfg, model.cfg.d_vocab, 3)
    probes, heldout = probes[:1], heldout[:1]
    whole = whole_path(model, probes, heldout)
    assert len(channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole)) == 2
    with pytest.raises(ValueError) as caught:
        channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole.drop(columns="batch"))
    assert one_line(caught, "`whole`", "batch").startswith("`whole`")
    with pytest.raises(ValueError) as caught:
        channel_check.check_batches(
            model, hw, table, probes, heldout, LENGTH, whole.drop(columns=["pattern_effect", "kind"])
        )
    one_line(caught, "`whole`", "kind, pattern_effect")  # every missing column, in the table's order


def test_a_pair_within_one_layer_is_refused_naming_the_table(planted_check):
    """A pair is a later pair: a reader in the writer's own layer (src_layer == dst_layer) is refused."""
    _, hw, table, _, _ = planted_check
    pairs = channel_check.discovered(table).head(1).assign(src_layer=1, dst_layer=1)
    with pytest.raises(UserError) as caught:
        channel_check.cuts(hw, pairs, "channels.csv")
    assert caught.value.where == "channels.csv"
    assert re.search(r"\b1\.\d -> 1\.\d\b", one_line(caught, "2 layers"))  # the pair and the model's layers


def test_discovered_keeps_the_tables_columns_and_numbers_its_rows_afresh(planted_check):
    _, _, table, _, _ = planted_check
    pairs = channel_check.discovered(table)
    assert list(pairs.columns) == list(table.columns)  # the table's index is dropped, not kept as a column
    assert list(pairs.index) == list(range(len(pairs))) and len(pairs) == 2


def test_a_discovered_pair_missing_from_the_whole_path_table_or_twice_in_it_is_refused(planted_check):
    """Each discovered pair's channel share divides by the whole path's effect on the same batch:
    a pair with no whole-path row (0.2 -> 1.1's K rows dropped) is refused in one exact line, and a
    pair with two (a row repeated) is refused too, rather than counted twice."""
    model, hw, table, dataset, cfg = planted_check
    probes, heldout = heads.evaluation_batches(dataset, cfg, model.cfg.d_vocab, 3)
    probes, heldout = probes[:1], heldout[:1]
    whole = whole_path(model, probes, heldout)
    gone = (
        (whole["kind"] == "K")
        & (whole["src_head"] == 2)
        & (whole["dst_layer"] == 1)
        & (whole["dst_head"] == 1)
    )
    assert gone.sum() == 1
    with pytest.raises(ValueError) as e:
        channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole[~gone])
    one_line(e, "`whole`")
    twice = pd.concat([whole, whole[gone]], ignore_index=True)
    with pytest.raises(pd.errors.MergeError):
        channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, twice)


def test_a_writer_channel_equal_to_d_head_is_out_of_range_and_refused(planted_check):
    """Channels are numbered 0 .. d_head - 1 (d_head = 4 here): writer channel 4 is refused in one
    line naming the table, as is reader channel 4 and a negative writer channel."""
    _, hw, table, _, _ = planted_check
    assert hw.d_head == 4
    first = channel_check.discovered(table).head(1)
    for writer, reader in ((4, 0), (0, 4), (-1, 0)):
        pairs = first.assign(writer_channel=writer, reader_channel=reader)
        with pytest.raises(UserError) as caught:
            channel_check.cuts(hw, pairs, "channels.csv")
        assert caught.value.where == "channels.csv"
        one_line(caught, f"({writer}, {reader})", "d_head = 4")
    last = first.assign(writer_channel=3, reader_channel=3)  # the last channel of each is in range
    assert len(channel_check.cuts(hw, last, "channels.csv")) == 1


def test_no_evaluation_batches_give_an_empty_table_with_every_column(planted_check):
    """No probe and no held-out batch: nothing is cut, and the table is empty but has all of
    COLUMNS, the channel effects included, in order."""
    model, hw, table, _, _ = planted_check
    whole = channel_check.discovered(table)[["kind", *channel_check.PAIR]].assign(
        batch=0, attn_effect=1.0, loss_effect=1.0, heldout_loss_effect=1.0, pattern_effect=1.0
    )  # a batch 0 that is not checked
    frame = channel_check.check_batches(model, hw, table, [], [], LENGTH, whole)
    assert list(frame.columns) == list(channel_check.COLUMNS) and len(frame) == 0


def test_check_batches_moves_the_model_and_each_batch_to_the_device_it_is_given(planted_check, monkeypatch):
    """device="meta" (there on every machine): the model is moved there in place and each probe
    and held-out batch with it before the channel cuts run; the cuts' effects (here stand-ins:
    probe -> attn 0.1, loss 0.2; held-out -> loss 0.3, pattern 0.5 x the pair's row number)
    land in their columns, divided by the whole path's pattern effect for the causal share."""
    _, hw, table, dataset, cfg = planted_check
    model = one_direction_model(0.25)  # not the fixture's: this one ends on the meta device
    probes, heldout = heads.evaluation_batches(dataset, cfg, model.cfg.d_vocab, 3)
    probes, heldout = probes[:1], heldout[:1]
    seen = []

    def stand_in(m, tokens, chosen, length):
        seen.append((next(m.parameters()).device.type, tokens.device.type, length))
        n = len(chosen)
        return pd.DataFrame({"attn_effect": [0.1] * n, "loss_effect": [0.2 if length else 0.3] * n,
                             "pattern_effect": [0.5 * (i + 1) for i in range(n)]})  # fmt: skip

    monkeypatch.setattr(ablation, "channel_ablation", stand_in)
    pairs = channel_check.discovered(table)
    whole = pairs[["kind", *channel_check.PAIR]].assign(
        batch=0, attn_effect=1.0, loss_effect=1.0, heldout_loss_effect=1.0, pattern_effect=[2.0, 4.0]
    )
    frame = channel_check.check_batches(model, hw, table, probes, heldout, LENGTH, whole, device="meta")
    assert seen == [("meta", "meta", LENGTH), ("meta", "meta", None)]
    assert next(model.parameters()).device.type == "meta"
    assert frame["channel_attn_effect"].tolist() == [0.1, 0.1]
    assert frame["channel_loss_effect"].tolist() == [0.2, 0.2]
    assert frame["channel_heldout_loss_effect"].tolist() == [0.3, 0.3]
    assert frame["channel_pattern_effect"].tolist() == [0.5, 1.0]
    assert frame["causal_share"].tolist() == [0.25, 0.25]


def test_a_head_equal_to_n_heads_is_out_of_range_and_refused(planted_check):
    """Heads are numbered 0 .. n_heads - 1 (3 here): writer head 3 is refused in one line naming
    the table, as is reader head 3; head 2 on either side is in range."""
    _, hw, table, _, _ = planted_check
    assert (hw.n_layers, hw.n_heads) == (2, 3)
    first = channel_check.discovered(table).head(1).assign(src_layer=0, dst_layer=1)
    for src, dst in ((3, 0), (0, 3)):
        with pytest.raises(UserError) as caught:
            channel_check.cuts(hw, first.assign(src_head=src, dst_head=dst), "channels.csv")
        assert caught.value.where == "channels.csv"
        one_line(caught, f"0.{src} -> 1.{dst}", "2 layers x 3 heads")
    assert len(channel_check.cuts(hw, first.assign(src_head=2, dst_head=2), "channels.csv")) == 1


def test_summary_keys_in_order_and_its_interval_named_in_words():
    """summary.json's channel_ablation: effect, interval (the 95% two-sided t interval over
    batches), n_pairs, median_causal_share, pairs, in that order; each pair's keys in theirs."""
    frame = pd.DataFrame({
        "batch": [0, 1], "kind": "K", "src_layer": 0, "src_head": 1, "dst_layer": 1, "dst_head": 0,
        "writer_channel": 3, "reader_channel": 2, "writer_block": 2, "reader_block": 1, "top_share": 0.7,
        "channel_pattern_effect": [0.3, 0.1],
        "path_pattern_effect": [0.6, 0.2], "causal_share": [1.0, 3.0],
    })  # fmt: skip
    out = channel_check.summarize(frame)
    assert list(out) == ["effect", "interval", "n_pairs", "median_causal_share", "pairs"]
    assert out["effect"] == "pattern_effect" and out["n_pairs"] == 1 and out["median_causal_share"] == 2.0
    assert out["interval"] == "two-sided 95% t interval of the mean causal share over batches"
    (pair,) = out["pairs"]
    assert list(pair) == [
        "src", "dst", "writer_channel", "reader_channel", "writer_block", "reader_block", "top_share",
        "path_pattern_effect", "channel_pattern_effect", "causal_share", "causal_share_lo",
        "causal_share_hi", "causal_share_batches",
    ]  # fmt: skip
    assert (pair["writer_channel"], pair["writer_block"], pair["reader_block"]) == (3, 2, 1)
    assert pair["path_pattern_effect"] == pytest.approx(0.4)  # (0.6 + 0.2) / 2
    assert pair["channel_pattern_effect"] == pytest.approx(0.2)  # (0.3 + 0.1) / 2
    assert pair["causal_share_batches"] == [1.0, 3.0]


def test_summary_lists_the_pairs_in_the_tables_order_not_sorted():
    """Pairs 0.2 -> 1.0 then 0.1 -> 1.1 then 0.1 -> 1.0 in the table: the summary keeps that order
    (sorted, 0.1 -> 1.0 would come first), each pair with its own single batch's share."""
    frame = pd.DataFrame({
        "batch": 0, "kind": "K", "src_layer": 0, "src_head": [2, 1, 1], "dst_layer": 1,
        "dst_head": [0, 1, 0], "writer_channel": [0, 1, 2], "reader_channel": [3, 4, 5], "writer_block": 1,
        "reader_block": 1,
        "top_share": [0.2, 0.3, 0.4], "channel_pattern_effect": 0.1, "path_pattern_effect": 0.2,
        "causal_share": [0.5, 0.6, 0.7],
    })  # fmt: skip
    out = channel_check.summarize(frame)
    assert [(p["src"], p["dst"]) for p in out["pairs"]] == [("0.2", "1.0"), ("0.1", "1.1"), ("0.1", "1.0")]
    assert [p["writer_channel"] for p in out["pairs"]] == [0, 1, 2]
    assert [p["causal_share"] for p in out["pairs"]] == [0.5, 0.6, 0.7]


def test_check_batches_names_the_channels_table_in_a_refusal_by_default(planted_check):
    """Without a `source`, a pair out of range is refused naming the table "channels": a writer
    head 3 of 3 heads (0 .. 2), refused before any batch is cut."""
    model, hw, table, _, _ = planted_check
    table = table.copy()
    first = table.index[table["kind"].eq("K") & table["pair_discovery"].eq(True)][0]
    assert table.loc[first, "dst_head"] == 0  # 0.0 -> 1.0, the table's first discovery
    table.loc[first, ["src_layer", "src_head", "dst_layer"]] = [0, 3, 1]
    whole = channel_check.discovered(table)[["kind", *channel_check.PAIR]].assign(
        batch=0, attn_effect=1.0, loss_effect=1.0, heldout_loss_effect=1.0, pattern_effect=1.0
    )
    with pytest.raises(UserError) as caught:
        channel_check.check_batches(model, hw, table, [], [], LENGTH, whole)
    assert caught.value.where == "channels"
    one_line(caught, "0.3 -> 1.0", "2 layers x 3 heads")


@pytest.fixture(scope="module")
def short_text() -> torch.Tensor:
    return torch.randint(0, 20, (32, 16), generator=torch.Generator().manual_seed(3))


def channels_csv(hw: HeadWeights) -> pd.DataFrame:
    """channels.csv's rows of the weights with 0.0 -> 1.0 (K) the one discovered pair."""
    rows, _ = rows_and_tables(hw)
    rows["pair_discovery"] = (rows["kind"] == "K") & (rows[PAIR] == [0, 0, 1, 0]).all(axis=1)
    for column in CHANNELS_COLUMNS:
        rows[column] = rows[column] if column in rows else np.nan
    return rows[list(CHANNELS_COLUMNS)]


def test_the_channel_ablation_of_a_degenerate_block_is_the_same_whatever_its_directions(short_text) -> None:
    """The heads stage's cut of the named top channel (`channel_check.cuts`: the whole block pair),
    from the weights and from the weights turned within the blocks: the same effects to float64
    precision; cutting one direction of the block instead moves with the turn."""
    d = 4
    models = [
        block_model(EXACT, torch.eye(d, dtype=F64), torch.eye(d, dtype=F64)),
        block_model(EXACT, turn(d, 0, 0.7), turn(d, 1, 1.1)),
    ]
    effects, single = [], []
    for model in models:
        hw = heads_of(model)
        pairs = channel_check.discovered(channels_csv(hw))
        assert pairs[NAMED].values.tolist() == [[0, 0, 2, 1]]
        (cut,) = channel_check.cuts(hw, pairs)
        assert tuple(cut.w.shape) == (hw.d_model, 2) and tuple(cut.k.shape) == (hw.d_model, 1)
        effects.append(ablation.channel_ablation(model, short_text, [cut], None).iloc[0])
        one = ablation.ChannelCut(cut.src, cut.dst, cut.w[:, 0], cut.k[:, 0])  # direction 0 of the block
        single.append(ablation.channel_ablation(model, short_text, [one], None).iloc[0])
    assert effects[0]["pattern_effect"] > 1e-3
    for column in ("loss_effect", "pattern_effect"):
        assert effects[1][column] == pytest.approx(effects[0][column], rel=1e-10, abs=1e-14)
    assert (
        abs(single[1]["pattern_effect"] - single[0]["pattern_effect"]) > 1e-3 * effects[0]["pattern_effect"]
    )
