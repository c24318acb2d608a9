"""pipeline/behaviour/ablation.py: the batched path, channel and role ablations.

Known answers on the planted model (tests/planted.py); the fast all-pairs path and the batched
channel cuts equal to the direct one-edge cuts of tests/ablation_oracles.py; a model whose K
edge runs through one direction (tests/one_direction.py) loses the whole path's effect when that
channel is cut and none when an orthogonal one is; the role ablation's sets against dense float64."""

from __future__ import annotations

import json

import numpy as np
import planted
import pytest
import torch
from ablation_oracles import ablate_channel, ablate_path
from block_models import turn
from models import F64, random_model
from one_direction import channel_table, one_direction_model
from refusals import one_line
from tl_oracle import SHAPE, hooked, tl_config_json

from pipeline import memory
from pipeline.behaviour import ablation, channel_check
from pipeline.circuits import channels, weights
from pipeline.config import ModelConfig
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import Transformer, next_token_loss

LENGTH = 7


@pytest.fixture(scope="module")
def planted_effects():
    return ablation.path_ablation(planted.model(), planted.repeated(64, LENGTH, seed=0), LENGTH)


SPAN = 5


def random_cuts(model: Transformer, edges, seed: int) -> list[ablation.ChannelCut]:
    """A cut of random unit directions w, k [d_model] for each (src, dst) of `edges`."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda: (v := torch.randn(model.cfg.d_model, generator=gen, dtype=F64)) / v.norm()  # noqa: E731
    return [ablation.ChannelCut(src, dst, unit(), unit()) for src, dst in edges]


# into layer 1 and layer 2, from both earlier layers, two cuts into head 2.1 and two from 0.1
EDGES = [((0, 1), (1, 2)), ((0, 0), (2, 1)), ((1, 2), (2, 1)), ((0, 2), (1, 0)), ((0, 1), (2, 0))]


@pytest.fixture(scope="module")
def text():
    return torch.randint(0, 20, (64, 16), generator=torch.Generator().manual_seed(3))


def pair_effect(model: Transformer, tokens: torch.Tensor) -> float:
    """The whole-path K cut 0.0 -> 1.0's pattern effect."""
    return ablate_path(model, tokens, (0, 0), (1, 0), "K", None)[2]


def test_cutting_the_previous_token_head_from_the_induction_heads_keys_destroys_induction(planted_effects):
    row = planted_effects.set_index(["kind", "src_layer", "src_head", "dst_layer", "dst_head"]).loc[
        ("K", 0, 0, 1, 0)
    ]
    assert row["attn_effect"] > 0.8  # clean induction score ~1.0 falls below 0.2
    assert row["loss_effect"] > 0.5  # and the second copy goes unpredicted


def test_every_other_edge_has_exactly_no_effect(planted_effects):
    """Every other pair is orthogonal by construction: the ablated write is never read."""
    planted_edge = (
        (planted_effects["kind"] == "K")
        & (planted_effects["src_head"] == 0)
        & (planted_effects["dst_head"] == 0)
    )
    others = planted_effects[~planted_edge]
    assert len(others) == 3 * 3 * 3 - 1
    assert others["attn_effect"].abs().max() < 1e-12 and others["loss_effect"].abs().max() < 1e-12
    assert (others["pattern_effect"] == 0).all()  # b's pattern and output, bit for bit


@pytest.mark.parametrize("text", [False, True], ids=["probe", "held-out"])
def test_cutting_the_keys_only_source_moves_the_induction_heads_pattern(text):
    """Head 1.0's keys read only 0.0's write (PREV): with it mean-ablated, 1.0 attends elsewhere on
    the probe and on random text alike (a role-free effect needs no repeat). The effect is the
    total variation between 1.0's clean and ablated rows, averaged over the batch and every query
    position, written out here on the one stream that changes."""
    model = planted.model()
    tokens = planted.random_tokens(32, planted.N_CTX, seed=1) if text else planted.repeated(32, LENGTH, 0)
    effects = ablation.path_ablation(model, tokens, None if text else LENGTH)
    row = effects.set_index(["kind", "src_layer", "src_head", "dst_layer", "dst_head"]).loc[("K", 0, 0, 1, 0)]
    assert row["pattern_effect"] > 0.3
    assert effects["pattern_effect"].between(0, 1).all()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        write = cache.result[0][:, :, 0]  # [batch, pos, d_model], in PREV only
        ablated = cache.resid_pre[1] - write + write.mean(0, keepdim=True)
        out = model.blocks[1](cache.resid_pre[1], cache.pos, replace={"K": ablated}, cache=True)
    tv = 0.5 * (out.pattern[:, 0] - cache.pattern[1][:, 0]).abs().sum(-1)  # [batch, query]
    assert row["pattern_effect"] == pytest.approx(float(tv.mean()), abs=1e-12)


def test_an_edge_the_reader_cannot_see_has_exactly_no_pattern_effect():
    """The planted model with a fourth head per layer whose weights are all zero: 0.3 writes nothing
    (W_O = 0), so cutting it changes no reader; and 1.3 reads nothing and writes nothing (its pattern
    is uniform whatever it reads, its output 0: 0 / 0 counts 0). Exactly 0 at every kind."""
    model = planted.wide_model(1)
    for tokens, length in (
        (planted.repeated(16, LENGTH, 2), LENGTH),
        (planted.random_tokens(16, 16, 3), None),
    ):
        effects = ablation.path_ablation(model, tokens, length)
        invisible = effects[(effects["src_head"] == 3) | (effects["dst_head"] == 3)]
        assert len(invisible) == 3 * (4 + 3)
        assert (invisible["pattern_effect"] == 0).all()
        for row in invisible.itertuples():
            got = ablate_path(model, tokens, (0, row.src_head), (1, row.dst_head), row.kind, length)
            assert got[2] == 0.0


def test_the_values_effect_is_the_relative_change_of_the_readers_output():
    """V: ||result_b ablated - result_b clean|| / ||result_b clean|| per position, averaged, on a
    random model (its pattern unchanged): the fast path against a dense float64 reference."""
    model = random_model("tiny")
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=torch.Generator().manual_seed(5))
    effects = ablation.path_ablation(model, tokens, None).set_index(["kind", "src_head", "dst_head"])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        write = cache.result[0][:, :, 1]  # head 0.1's write [batch, pos, d_model]
        ablated = cache.resid_pre[1] - write + write.mean(0, keepdim=True)
        out = model.blocks[1](cache.resid_pre[1], cache.pos, replace={"V": ablated}, cache=True)
    clean, moved = cache.result[1][:, :, 2], out.result[:, :, 2]  # head 1.2
    want = ((moved - clean).norm(dim=-1) / clean.norm(dim=-1)).mean()
    assert effects.loc[("V", 1, 2), "pattern_effect"] == pytest.approx(float(want), rel=1e-12)
    assert float(want) > 1e-3


def test_table_layout(planted_effects):
    assert list(planted_effects.columns) == ablation.COLUMNS
    assert list(planted_effects["kind"].unique()) == list(ablation.KINDS)
    assert (planted_effects["src_layer"] < planted_effects["dst_layer"]).all()


# the three-layer model's variants that the fast paths are checked on: the paper's (shortformer,
# no LayerNorm), GPT-2's (standard positions, LayerNorm, an MLP after attention in each block) and
# a parallel MLP (reading the block's input beside attention, as Pythia's; seed 3, a draw where every
# edge moves its reader measurably, which the tests check so that no effect is trivially 0)
ARCHITECTURES = {
    "shortformer": {},
    "standard+LN": {"positional_embedding_type": "standard", "normalization_type": "LN"},
    "standard+LN+MLP": {"positional_embedding_type": "standard", "normalization_type": "LN", "d_mlp": 24},
    "parallel-MLP": {"d_mlp": 32, "act_fn": "relu", "parallel_attn_mlp": True, "seed": 3},
    # Pythia's block: rotary positions on half of each head's dimensions, LayerNorm, a parallel MLP
    "rotary+parallel-MLP": {
        "positional_embedding_type": "rotary",
        "rotary_dim": 2,
        "normalization_type": "LN",
        "d_mlp": 32,
        "act_fn": "gelu",
        "parallel_attn_mlp": True,
    },
}


@pytest.mark.parametrize("chunk", [ablation._CHUNK, 1], ids=["batched", "one-head-at-a-time"])
@pytest.mark.parametrize(
    "overrides",
    list(ARCHITECTURES.values()),
    ids=list(ARCHITECTURES),
)
def test_fast_path_equals_single_edge_ablation(overrides, chunk, monkeypatch):
    """Three layers: edges into layer 1 also pass through layer 2 on their way to the loss.
    With a memory bound of 1 element, source and destination heads go one at a time."""
    monkeypatch.setattr(ablation, "_CHUNK", chunk)
    model = random_model("three_layers", **overrides)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.cat(
        [
            torch.zeros(6, 1, dtype=torch.long),
            torch.randint(0, model.cfg.d_vocab, (6, 5), generator=gen).repeat(1, 2),
        ],
        1,
    )
    fast = ablation.path_ablation(model, tokens, 5)
    assert len(fast) == 3 * (3 * 3 * 2 + 3 * 3)  # kinds x (pairs 0->1, 0->2, 1->2)
    for row in fast.itertuples():
        attn, loss, pattern = ablate_path(
            model, tokens, (row.src_layer, row.src_head), (row.dst_layer, row.dst_head), row.kind, 5
        )
        assert row.attn_effect == pytest.approx(attn, abs=1e-12)
        assert row.loss_effect == pytest.approx(loss, abs=1e-12)
        assert row.pattern_effect == pytest.approx(pattern, abs=1e-12)
    assert (fast.loc[fast["kind"] == "V", "attn_effect"] == 0).all()  # values never move a pattern
    assert fast["loss_effect"].abs().max() > 1e-4  # the model is not trivially insensitive
    for kind in ablation.KINDS:  # every kind's pattern effect is measured, not trivially 0
        assert fast.loc[fast["kind"] == kind, "pattern_effect"].min() > 1e-4, kind


@pytest.mark.parametrize(
    "overrides",
    list(ARCHITECTURES.values()),
    ids=list(ARCHITECTURES),
)
def test_fast_path_equals_single_edge_ablation_on_held_out_text(overrides):
    """Held-out text (no repeat): the loss and pattern effects of every edge, fast and direct."""
    model = random_model("three_layers", **overrides)
    tokens = torch.randint(0, model.cfg.d_vocab, (6, 11), generator=torch.Generator().manual_seed(2))
    fast = ablation.path_ablation(model, tokens, None)
    assert fast["attn_effect"].isna().all()
    for row in fast.itertuples():
        _, loss, pattern = ablate_path(
            model, tokens, (row.src_layer, row.src_head), (row.dst_layer, row.dst_head), row.kind, None
        )
        assert row.loss_effect == pytest.approx(loss, abs=1e-12)
        assert row.pattern_effect == pytest.approx(pattern, abs=1e-12)


def test_mean_of_a_constant_output_is_the_output_itself():
    """A batch of one sequence repeated: each head's mean write equals its write, nothing changes."""
    model = random_model("three_layers")
    tokens = torch.tensor([[0, 3, 5, 7, 1, 3, 5, 7, 1]]).repeat(4, 1)
    effects = ablation.path_ablation(model, tokens, 4)
    assert effects["attn_effect"].abs().max() < 1e-12 and effects["loss_effect"].abs().max() < 1e-12
    assert effects["pattern_effect"].abs().max() < 1e-12


def test_ablating_the_planted_circuit_raises_the_probe_loss():
    """Known answers on the planted circuit: the induction head and the previous-token head it reads
    each carry the second copy's prediction; a head that nothing reads and that writes nothing
    the unembedding sees changes nothing."""
    model, probe = planted.model(), planted.repeated(64, LENGTH, seed=1)
    assert ablation.heads_loss_effect(model, probe, [(1, 0)]) > 0.3  # the loss over every position
    assert ablation.heads_loss_effect(model, probe, [(0, 0)]) > 0.3
    assert abs(ablation.heads_loss_effect(model, probe, [(1, 2)])) < 1e-12


def test_heads_loss_effect_of_a_constant_batch_is_zero():
    model = random_model("three_layers")
    tokens = torch.tensor([[0, 3, 5, 7, 1, 3, 5, 7, 1]]).repeat(4, 1)
    assert abs(ablation.heads_loss_effect(model, tokens, [(0, 1), (1, 2), (2, 0)])) < 1e-12


def test_heads_loss_effect_of_the_last_layer_equals_a_dense_float64_reference():
    """Ablating heads of the last layer: the final stream is its input plus every head's write,
    the ablated ones replaced by their batch mean, plus b_O; the loss from there."""
    model = random_model("three_layers")
    tokens = torch.randint(
        0, model.cfg.d_vocab, (5, model.cfg.n_ctx), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    last = model.cfg.n_layers - 1
    result = cache.result[last].clone()  # [batch, pos, head, d_model]
    for h in (0, 2):
        result[:, :, h] = result[:, :, h].mean(0, keepdim=True)
    resid = cache.resid_pre[last] + result.sum(2) + model.blocks[last].attn.b_O
    with torch.no_grad():
        expected = next_token_loss(model.logits_from(resid, last + 1), tokens) - next_token_loss(
            logits, tokens
        )
    got = ablation.heads_loss_effect(model, tokens, [(last, 0), (last, 2)])
    assert got == pytest.approx(float(expected), abs=1e-12)


@pytest.mark.parametrize("overrides", list(ARCHITECTURES.values()), ids=list(ARCHITECTURES))
def test_heads_loss_effects_of_many_sets_equal_each_set_alone(overrides):
    """The role ablation's placebo sets share one clean pass (`heads_loss_effects`): each set's
    effect is the one it has alone, bit for bit, whichever layer it starts at and in any order."""
    model = random_model("three_layers", **overrides)
    tokens = torch.randint(
        0, model.cfg.d_vocab, (6, model.cfg.n_ctx), generator=torch.Generator().manual_seed(4)
    )
    sets = [[(2, 1)], [(0, 0), (2, 2)], [(1, 1)], [(0, 2)], [(1, 0), (1, 2), (2, 0)]]
    together = ablation.heads_loss_effects(model, tokens, sets)
    alone = [ablation.heads_loss_effect(model, tokens, s) for s in sets]
    assert together == alone
    assert len(set(together)) == len(sets)  # different sets, different effects
    with pytest.raises(ValueError) as caught:  # an empty set of heads
        ablation.heads_loss_effects(model, tokens, [[(0, 0)], []])
    one_line(caught)


def test_source_heads_are_stacked_per_block_call_as_many_as_the_memory_bound_allows(monkeypatch):
    """The tiny model (3 heads of d_model 16), 2 sequences of 6: one source head's per-head result
    is 2 x 6 x 3 x 16 = 576 elements. With a bound of 2 x 576, each call into layer 1's block
    stacks two source heads (a batch of 4), then the third alone (a batch of 2), once per kind."""
    model = random_model("tiny")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(ablation, "_CHUNK", 2 * 2 * 6 * 3 * 16)
    sizes = []

    def seen(module, args, kwargs):
        if kwargs.get("replace"):
            sizes.append(args[0].shape[0])

    handle = model.blocks[1].register_forward_pre_hook(seen, with_kwargs=True)
    try:
        ablation.path_ablation(model, tokens, None)
    finally:
        handle.remove()
    assert sizes == [4, 4, 4, 2, 2, 2]


def test_pattern_effect_is_half_the_l1_change_of_each_query_row_over_its_keys():
    """One ablation, one batch, one head, one query row over two keys: clean (1/2, 1/2), ablated
    (1, 0): the row's total variation is 1/2 (|1/2| + |-1/2| over the keys, halved)."""
    clean = torch.tensor([[[[0.5, 0.5]]]], dtype=torch.float64)  # [batch, head, query, key]
    pattern = torch.tensor([[[[[1.0, 0.0]]]]], dtype=torch.float64)  # [n, batch, head, query, key]
    effect = ablation._pattern_effect("K", pattern, clean, torch.zeros(0), torch.zeros(0))
    assert effect.tolist() == [[0.5]]


@pytest.mark.parametrize("chunk", [ablation._CHUNK, 1], ids=["batched", "one-cut-at-a-time"])
@pytest.mark.parametrize("text", [False, True], ids=["probe", "held-out"])
@pytest.mark.parametrize(
    "overrides",
    list(ARCHITECTURES.values()),
    ids=list(ARCHITECTURES),
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
    with pytest.raises(ValueError) as caught:
        ablation.channel_ablation(model, torch.zeros(1, 9, dtype=torch.long), [cut], 4)
    assert one_line(caught, 1).count("1") == 2  # the source layer and the destination layer


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


VARIANTS = [(pos, norm) for pos in ("standard", "shortformer") for norm in (None, "LN")]


@pytest.mark.interop
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_ablating_a_set_of_heads_equals_transformer_lens_hooks(tmp_path, pos, norm):
    """`ablation.heads_loss_effect` against HookedTransformer with each ablated head's z replaced
    by its batch mean at every position (a head's write is linear in its z)."""
    pytest.importorskip("transformer_lens")
    from pipeline.behaviour import ablation

    config = {**SHAPE, "positional_embedding_type": pos, "normalization_type": norm, "attn_only": True}
    theirs = hooked({**config, "act_fn": None}, seed=5)
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pth", tmp_path / "config.json", dtype=torch.float64)
    tokens = torch.randint(0, 50, (6, 16), generator=torch.Generator().manual_seed(6))
    heads = [(0, 0), (0, 1), (0, 3), (1, 2)]

    def mean_z(z, hook):  # [batch, pos, head, d_head]
        layer = int(hook.name.split(".")[1])
        for l, h in heads:
            if l == layer:
                z[:, :, h] = z[:, :, h].mean(0, keepdim=True)
        return z

    with torch.no_grad():
        clean = theirs(tokens, return_type="loss")
        hooks = [(f"blocks.{l}.attn.hook_z", mean_z) for l in (0, 1)]
        ablated = theirs.run_with_hooks(tokens, return_type="loss", fwd_hooks=hooks)
    expected = float(ablated - clean)
    assert abs(expected) > 1e-3  # the check can fail: these heads matter to this random model
    assert ablation.heads_loss_effect(ours, tokens, heads) == pytest.approx(expected, abs=1e-5)


def test_a_block_of_one_direction_cuts_as_the_single_direction_formula() -> None:
    """A block of one direction ([d_model, 1] columns) is resid - ((delta . w)(w . k)) k, written out,
    and the same cut as the vectors themselves."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(4)
    w, k = (torch.nn.functional.normalize(torch.randn(model.cfg.d_model, generator=gen, dtype=F64), dim=0)
            for _ in range(2))  # fmt: skip
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=gen)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    write = cache.result[0][:, :, 2]  # [batch, pos, d_model]
    delta = write - write.mean(0, keepdim=True)
    want = cache.resid_pre[1] - ((delta @ w) * (w @ k))[..., None] * k
    as_block = ablation._channel_cut(cache, ablation.ChannelCut((0, 2), (1, 1), w[:, None], k[:, None]))
    as_vectors = ablation._channel_cut(cache, ablation.ChannelCut((0, 2), (1, 1), w, k))
    scale = cache.resid_pre[1].abs().max().item()
    torch.testing.assert_close(as_block, want, rtol=0, atol=1e-15 * scale)
    torch.testing.assert_close(as_vectors, as_block, rtol=0, atol=0)
    cuts = [
        ablation.ChannelCut((0, 2), (1, 1), w[:, None], k[:, None]),
        ablation.ChannelCut((0, 2), (1, 1), w, k),
    ]
    got = ablation.channel_ablation(model, tokens, cuts, None)
    assert got["pattern_effect"].iloc[0] == pytest.approx(got["pattern_effect"].iloc[1], rel=1e-12)
    assert got["pattern_effect"].iloc[0] > 1e-4


def test_a_block_cut_is_the_projection_of_the_mean_ablated_write() -> None:
    """Two directions each: resid - (delta W W^T) K K^T with dense projectors, and unchanged when
    either block's columns are replaced by another orthonormal basis of their span."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(6)
    D = model.cfg.d_model
    W = torch.linalg.qr(torch.randn(D, 2, generator=gen, dtype=F64))[0]  # [d_model, 2]
    K = torch.linalg.qr(torch.randn(D, 2, generator=gen, dtype=F64))[0]
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=gen)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    write = cache.result[0][:, :, 1]
    delta = write - write.mean(0, keepdim=True)
    want = cache.resid_pre[1] - delta @ (W @ W.mT) @ (K @ K.mT)
    scale = cache.resid_pre[1].abs().max().item()
    for G, H in ((torch.eye(2, dtype=F64), torch.eye(2, dtype=F64)), (turn(2, 0, 0.4), turn(2, 0, -1.3))):
        got = ablation._channel_cut(cache, ablation.ChannelCut((0, 1), (1, 0), W @ G, K @ H))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14 * scale)


# L layers, H heads of d_head dh, d_model D, context T, vocabulary V
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)


def batch(n: int, pos: int, model: ModelConfig = MODEL) -> memory.Batch:
    size = memory.Size("analysis.heads.eval_sequences", n, 64)
    return memory.Batch(size, memory.Shape(model).n_ctx, pos, "the held-out batch", ("n", "pos"))


def logits_and_chunk(model: ModelConfig, n: int, pos: int) -> tuple[memory.Term, memory.Term]:
    *_cache, logits, chunk = ablation.path_ablation_terms(memory.Shape(model), batch(n, pos, model))
    return logits, chunk


def test_the_path_ablations_chunk_and_logits():
    """n = 3 sequences of 20: every source head in one chunk (H of them), every later head's loss
    pass too; float64."""
    n, sources = 3, H
    outputs = sources * n * (2 * T * H * D + H * T * T)  # results, deltas, patterns
    block_call = sources * n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    loss_passes = H * n * T * (4 * V + 2 * D + H * T)
    assert (outputs, block_call, loss_passes) == (12480, 33600, 16320)
    logits, chunk = logits_and_chunk(MODEL, n, T)
    assert chunk.bytes == 8 * (12480 + 33600)
    assert logits.bytes == 8 * 3 * n * T * V


def test_the_path_ablations_chunk_when_the_loss_passes_are_larger():
    """A large vocabulary: the later heads' loss passes outweigh the block call."""
    big = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=1000)
    n = 3
    outputs = H * n * (2 * T * H * D + H * T * T)
    loss_passes = H * n * T * (4 * 1000 + 2 * D + H * T)
    assert (outputs, loss_passes) == (12480, 488640)
    _, chunk = logits_and_chunk(big, n, T)
    assert chunk.bytes == 8 * (12480 + 488640)
    assert [s.key for s in chunk.sizes] == ["analysis.heads.eval_sequences", "model.n_ctx", "model.d_vocab"]


def test_the_later_heads_loss_passes_take_every_head_whose_logits_fit_in_a_chunk():
    """One sequence of one position over a vocabulary of one token: a later head's logits are one
    element, so a chunk of _CHUNK = 2^24 elements holds the loss passes of all 2^23 + 1 heads at
    once (2^24 // (1 x 1 x 1) heads); the source heads' results, 2^23 + 1 elements each, fit one
    at a time (2^24 // (2^23 + 1) = 1)."""
    heads = 2**23 + 1
    m = ModelConfig(n_layers=2, n_heads=heads, d_head=1, d_model=1, n_ctx=1, d_vocab=1)
    outputs = 1 * 1 * (2 * 1 * heads * 1 + heads * 1 * 1)  # one source: result, delta, pattern
    block_call = 1 * 1 * (3 * heads + 2 * heads + 6)
    loss_passes = heads * 1 * 1 * (4 * 1 + 2 * 1 + heads * 1)  # every later head at once
    assert loss_passes > block_call
    _, chunk = logits_and_chunk(m, 1, 1)
    assert chunk.bytes == 8 * (outputs + loss_passes)


def test_the_chunk_term_follows_the_ablations_chunk_size(monkeypatch):
    """A smaller _CHUNK (what a test sets to make the ablation's chunks small) shrinks the
    estimate's chunk alike: one source head a chunk instead of both."""
    _, whole = logits_and_chunk(MODEL, 3, T)
    monkeypatch.setattr(ablation, "_CHUNK", 1)
    assert ablation._sources_per_chunk(3, T, H, D) == ablation._heads_per_loss_chunk(3, T, V) == 1
    _, one = logits_and_chunk(MODEL, 3, T)
    n = 3
    outputs = n * (2 * T * H * D + H * T * T)
    block_call = n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    assert one.bytes == 8 * (outputs + block_call) < whole.bytes
