"""A causal check per channel: cutting one channel of a K edge
(`ablation.channel_ablation`) equals the direct single-edge cut; a model whose K-composition runs
through one direction loses (nearly) the whole path's effect when that channel is cut and none
when an orthogonal one is; the channel check's table and summary (`channel_check`), and the heads
stage with --channels."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from ablation_oracles import ablate_channel, ablate_path
from models import F64, random_model
from one_direction import channel_table, one_direction_model
from test_heads import stage_inputs

from pipeline.behaviour import ablation, channel_check
from pipeline.circuits import channels, weights
from pipeline.model.transformer import AttnOnlyTransformer

SPAN = 5


def random_cuts(model: AttnOnlyTransformer, edges, seed: int) -> list[ablation.ChannelCut]:
    """A cut of random unit directions w, k [d_model] for each (src, dst) of `edges`."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda: (v := torch.randn(model.cfg.d_model, generator=gen, dtype=F64)) / v.norm()  # noqa: E731
    return [ablation.ChannelCut(src, dst, unit(), unit()) for src, dst in edges]


# into layer 1 and layer 2, from both earlier layers, two cuts into head 2.1 and two from 0.1
EDGES = [((0, 1), (1, 2)), ((0, 0), (2, 1)), ((1, 2), (2, 1)), ((0, 2), (1, 0)), ((0, 1), (2, 0))]


@pytest.mark.parametrize("chunk", [ablation._CHUNK, 1], ids=["batched", "one-cut-at-a-time"])
@pytest.mark.parametrize("text", [False, True], ids=["probe", "held-out"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"positional_embedding_type": "standard", "normalization_type": "LN"}],
    ids=["shortformer", "standard+LN"],
)
def test_fast_channel_cut_equals_the_direct_single_edge_cut(overrides, text, chunk, monkeypatch):
    """The batched cut (every head of layer j reading the cut stream, cuts stacked along the batch)
    against the direct one (only head b's keys read it), on a three-layer random model: the
    edges into layer 1 pass through layer 2 on their way to the loss."""
    monkeypatch.setattr(ablation, "_CHUNK", chunk)
    model = random_model("three_layers", **overrides)
    gen = torch.Generator().manual_seed(1)
    if text:
        tokens, length = torch.randint(0, model.cfg.d_vocab, (6, 11), generator=gen), None
    else:
        span = torch.randint(0, model.cfg.d_vocab, (6, SPAN), generator=gen)
        tokens, length = torch.cat([torch.zeros(6, 1, dtype=torch.long), span, span], 1), SPAN
    cuts = random_cuts(model, EDGES, seed=2)
    fast = ablation.channel_ablation(model, tokens, cuts, length)
    assert list(fast.columns) == ablation.COLUMNS[1:]
    assert [tuple(r) for r in fast[["src_layer", "src_head", "dst_layer", "dst_head"]].to_numpy()] == [
        (*src, *dst) for src, dst in EDGES
    ]  # the cuts' order
    for row, cut in zip(fast.itertuples(), cuts, strict=True):
        attn, loss, pattern = ablate_channel(model, tokens, cut, length)
        assert row.loss_effect == pytest.approx(loss, abs=1e-12)
        assert row.pattern_effect == pytest.approx(pattern, abs=1e-12)
        if text:
            assert np.isnan(row.attn_effect) and np.isnan(attn)
        else:
            assert row.attn_effect == pytest.approx(attn, abs=1e-12)
    assert fast["pattern_effect"].min() > 1e-5  # every cut moves its reader: not trivially 0
    assert fast["loss_effect"].abs().max() > 1e-4


def test_the_cut_is_the_formula_on_the_readers_keys_alone():
    """Written out: b's key input is resid - ((write_a - batch mean) . w) (w . k) k, every other
    input of every head clean; the pattern effect is b's total variation against the clean pass."""
    model = random_model("tiny")
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=torch.Generator().manual_seed(5))
    (cut,) = random_cuts(model, [((0, 2), (1, 1))], seed=3)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        write = cache.result[0][:, :, 2]  # [batch, pos, d_model]
        centred = write - write.mean(0, keepdim=True)
        keys = cache.resid_pre[1] - ((centred @ cut.w) * (cut.w @ cut.k))[..., None] * cut.k
        out = model.blocks[1](cache.resid_pre[1], cache.pos, replace={"K": keys}, cache=True)
    tv = 0.5 * (out.pattern[:, 1] - cache.pattern[1][:, 1]).abs().sum(-1).mean()
    got = ablation.channel_ablation(model, tokens, [cut], None)
    assert got.loc[0, "pattern_effect"] == pytest.approx(float(tv), abs=1e-14)
    assert float(tv) > 1e-3


def test_a_writer_direction_orthogonal_to_the_key_direction_changes_nothing():
    """w . k = 0 exactly (two coordinate axes): the cut stream is the clean one, b's pattern and
    induction score unchanged bit for bit; the loss to rounding (the later layers run fused, the
    clean pass explicit, as for `path_ablation`)."""
    model = random_model("three_layers")
    axis = torch.eye(model.cfg.d_model, dtype=F64)
    cuts = [
        ablation.ChannelCut((0, 1), (1, 2), axis[3], axis[7]),
        ablation.ChannelCut((1, 0), (2, 2), axis[0], axis[1]),
    ]
    for tokens, length in (
        (torch.tensor([[0, 3, 5, 7, 1, 3, 5, 7, 1], [0, 2, 4, 6, 8, 2, 4, 6, 8]]), 4),
        (torch.randint(0, model.cfg.d_vocab, (4, 10), generator=torch.Generator().manual_seed(6)), None),
    ):
        got = ablation.channel_ablation(model, tokens, cuts, length)
        assert (got["pattern_effect"] == 0).all() and got["loss_effect"].abs().max() < 1e-12
        if length is not None:
            assert (got["attn_effect"] == 0).all()


def test_a_source_after_the_destination_is_refused():
    model = random_model("three_layers")
    (cut,) = random_cuts(model, [((1, 0), (1, 1))], seed=0)
    with pytest.raises(ValueError, match="before"):
        ablation.channel_ablation(model, torch.zeros(1, 9, dtype=torch.long), [cut], 4)


# --- planted: K-composition through one direction ------------------------------------------


@pytest.fixture(scope="module")
def text():
    return torch.randint(0, 20, (64, 16), generator=torch.Generator().manual_seed(3))


def pair_effect(model: AttnOnlyTransformer, tokens: torch.Tensor) -> float:
    """The whole-path K cut 0.0 -> 1.0's pattern effect."""
    return ablate_path(model, tokens, (0, 0), (1, 0), "K", None)[2]


@pytest.mark.parametrize("weak", [0.0, 0.25])
def test_cutting_the_one_channel_the_path_runs_through_is_cutting_the_path(weak, text):
    """channels.csv's top channel, cut alone, gives the whole path's pattern effect: all of it when
    the writer writes along that channel alone (weak = 0: the cut and the path's mean ablation are
    the same stream, to rounding); nearly all of it when a weak second channel (share 0.034) is
    left; the weak channel cut alone, a fraction; an orthogonal channel (writer channel 0 into the
    reader channel that reads u_2, which 0.0 never writes), nothing."""
    model = one_direction_model(weak)
    hw = weights.from_state_dict(model.state_dict())  # no LayerNorm: the model's own weights
    table = channel_table(hw, {(0, 0, 1, 0)})
    pairs = channel_check.discovered(table)
    assert pairs[["kind", "src_layer", "src_head", "dst_layer", "dst_head"]].values.tolist() == [
        ["K", 0, 0, 1, 0]
    ]
    assert (pairs.loc[0, "writer_channel"], pairs.loc[0, "reader_channel"]) == (0, 0)
    assert pairs.loc[0, "top_share"] == pytest.approx(16 / (16 + 9 * weak**2), rel=1e-9)
    (top,) = channel_check.cuts(hw, pairs)
    whole = pair_effect(model, text)
    assert whole > 0.1
    share = ablation.channel_ablation(model, text, [top], None).loc[0, "pattern_effect"] / whole
    writes, reads = channels.writer_circuit(hw).writes[0, 0], channels.reader_circuit(hw, "K").reads[1, 0]
    weak_cut = ablation.ChannelCut((0, 0), (1, 0), writes[:, 1], reads[:, 1])
    orthogonal = ablation.ChannelCut((0, 0), (1, 0), writes[:, 0], reads[:, 2])
    others = ablation.channel_ablation(model, text, [weak_cut, orthogonal], None)["pattern_effect"] / whole
    if weak == 0:
        assert share == pytest.approx(1.0, abs=1e-9)
        assert others[0] < 1e-12  # a channel the writer does not write along
    else:
        assert 0.85 < share < 1.0
        assert 0.05 < others[0] < 0.5 * share
    assert abs(others[1]) < 1e-12


# --- the check's table and summary ------------------------------------------------------------


def test_check_batches_writes_a_row_per_pair_and_batch_beside_the_whole_path(text):
    """The discovered K pairs alone (not the Q or V rows, not the undiscovered K ones), on every
    batch, their path columns the whole-path cut's on the same batch, causal_share the ratio."""
    model = one_direction_model(0.25)
    hw = weights.from_state_dict(model.state_dict())
    table = channel_table(hw, {(0, 0, 1, 0), (0, 2, 1, 1)})
    probes = [
        torch.cat([torch.zeros(8, 1, dtype=torch.long), s, s], 1)
        for s in torch.randint(1, 20, (2, 8, SPAN), generator=torch.Generator().manual_seed(4))
    ]
    heldout = [text[:32], text[32:]]
    whole = pd.concat(
        [
            ablation.path_ablation(model, probe, SPAN).assign(
                heldout_loss_effect=(t := ablation.path_ablation(model, held, None))[
                    "loss_effect"
                ].to_numpy(),
                pattern_effect=t["pattern_effect"].to_numpy(),
                batch=b,
            )
            for b, (probe, held) in enumerate(zip(probes, heldout, strict=True))
        ]
    )
    frame = channel_check.check_batches(model, hw, table, probes, heldout, SPAN, whole)
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
            ablate_channel(model, probes[row.batch], cut, SPAN)[0], abs=1e-12
        )
        assert row.causal_share == pytest.approx(
            row.channel_pattern_effect / row.path_pattern_effect, rel=1e-12
        )
    with pytest.raises(ValueError, match="no whole-path cut"):
        channel_check.check_batches(model, hw, table, probes, heldout, SPAN, whole[whole["batch"] == 0])


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


# --- the stage --------------------------------------------------------------------------------


@pytest.mark.slow
def test_heads_stage_with_channels_writes_the_check(tmp_path):
    """The planted model (tests/planted.py): its one composing K pair 0.0 -> 1.0 is the one
    discovered; channel_ablation.csv holds it on each of the three batches beside the whole path of
    ablation_batches.csv, summary.json its entry. Without --channels, neither (an earlier run's
    table removed)."""
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    hw, _ = weights.load(tmp_path / "heads.safetensors")
    channel_table(hw, {(0, 0, 1, 0)}).to_csv(tmp_path / "channels.csv", index=False)
    out = tmp_path / "out"
    assert stage.main([*args, "--channels", str(tmp_path / "channels.csv"), "--out", str(out)]) == 0
    frame = pd.read_csv(out / "channel_ablation.csv")
    assert list(frame.columns) == list(channel_check.COLUMNS)
    assert frame[["batch", "kind", "src_layer", "src_head", "dst_layer", "dst_head"]].values.tolist() == [
        [b, "K", 0, 0, 1, 0] for b in range(3)
    ]
    batches = pd.read_csv(out / "ablation_batches.csv")
    path = batches[(batches["kind"] == "K") & (batches["src_head"] == 0) & (batches["dst_head"] == 0)]
    np.testing.assert_array_equal(frame["path_pattern_effect"], path["pattern_effect"])
    assert (frame["channel_pattern_effect"] > 0).all()
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["channel_ablation"]
    assert entry["n_pairs"] == 1 and entry["pairs"][0]["src"] == "0.0" and entry["pairs"][0]["dst"] == "1.0"
    assert entry["pairs"][0]["causal_share"] == pytest.approx(frame["causal_share"].mean())
    assert entry["median_causal_share"] == entry["pairs"][0]["causal_share"]

    assert stage.main([*args, "--out", str(out)]) == 0
    assert not (out / "channel_ablation.csv").exists()
    assert "channel_ablation" not in json.loads((out / "summary.json").read_text())
