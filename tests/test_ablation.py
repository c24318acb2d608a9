"""Causal path ablation: known answers on the planted model, and the fast all-pairs path
equal to the direct single-edge ablation through per-head inputs."""

from __future__ import annotations

import planted
import pytest
import torch
from models import random_model

from pipeline.behaviour import ablation
from pipeline.model.transformer import next_token_loss

LENGTH = 7


@pytest.fixture(scope="module")
def planted_effects():
    return ablation.path_ablation(planted.model(), planted.repeated(64, LENGTH, seed=0), LENGTH)


def test_cutting_the_previous_token_head_from_the_induction_heads_keys_destroys_induction(planted_effects):
    row = planted_effects.set_index(["kind", "src_layer", "src_head", "dst_layer", "dst_head"]).loc[
        ("K", 0, 0, 1, 0)
    ]
    assert row["attn_effect"] > 0.8  # clean induction score ~1.0 falls below 0.2
    assert row["loss_effect"] > 0.5  # and the second copy is no longer predicted


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


def test_table_layout(planted_effects):
    assert list(planted_effects.columns) == ablation.COLUMNS
    assert list(planted_effects["kind"].unique()) == list(ablation.KINDS)
    assert (planted_effects["src_layer"] < planted_effects["dst_layer"]).all()


@pytest.mark.parametrize("chunk", [ablation._CHUNK, 1], ids=["batched", "one-head-at-a-time"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"positional_embedding_type": "standard", "normalization_type": "LN"}],
    ids=["shortformer", "standard+LN"],
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
        attn, loss = ablation.ablate_path(
            model, tokens, (row.src_layer, row.src_head), (row.dst_layer, row.dst_head), row.kind, 5
        )
        assert row.attn_effect == pytest.approx(attn, abs=1e-12)
        assert row.loss_effect == pytest.approx(loss, abs=1e-12)
    assert (fast.loc[fast["kind"] == "V", "attn_effect"] == 0).all()  # values never move a pattern
    assert fast["loss_effect"].abs().max() > 1e-4  # the model is not trivially insensitive


def test_mean_of_a_constant_output_is_the_output_itself():
    """A batch of one sequence repeated: each head's mean write equals its write, nothing changes."""
    model = random_model("three_layers")
    tokens = torch.tensor([[0, 3, 5, 7, 1, 3, 5, 7, 1]]).repeat(4, 1)
    effects = ablation.path_ablation(model, tokens, 4)
    assert effects["attn_effect"].abs().max() < 1e-12 and effects["loss_effect"].abs().max() < 1e-12


def test_a_source_after_the_destination_is_refused():
    with pytest.raises(ValueError, match="before"):
        ablation.ablate_path(
            random_model("three_layers"), torch.zeros(1, 9, dtype=torch.long), (1, 0), (1, 1), "K", 4
        )


# --- ablating a role's heads together (whether the circuit serves the text) ----------------


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


def test_heads_loss_effects_of_many_sets_equal_each_set_alone():
    """The role ablation's placebo sets share one clean pass (`heads_loss_effects`): each set's
    effect is the one it has alone, bit for bit, whichever layer it starts at and in any order."""
    model = random_model("three_layers")
    tokens = torch.randint(
        0, model.cfg.d_vocab, (6, model.cfg.n_ctx), generator=torch.Generator().manual_seed(4)
    )
    sets = [[(2, 1)], [(0, 0), (2, 2)], [(1, 1)], [(0, 2)], [(1, 0), (1, 2), (2, 0)]]
    together = ablation.heads_loss_effects(model, tokens, sets)
    alone = [ablation.heads_loss_effect(model, tokens, s) for s in sets]
    assert together == alone
    assert len(set(together)) == len(sets)  # different sets, different effects
    with pytest.raises(ValueError, match="no heads"):
        ablation.heads_loss_effects(model, tokens, [[(0, 0)], []])
