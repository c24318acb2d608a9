"""The heads analysis's memory estimate (pipeline/behaviour/heads.py, `memory_estimate`): made of
the model's, the path ablation's and the data's own terms, the larger of the pattern scores and
the ablation, keyed by the checkpoint's file; and `load_model` refuses a shape before reading
the checkpoint.

Known answers for the heads analysis (pipeline/behaviour/heads.py): which head it reads for QK
positivity, which batches each ablation effect comes from, a score exactly at its role's
threshold. The fixture is asymmetric where a wrong head would otherwise give the right answer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import torch

from pipeline import memory, params
from pipeline.behaviour import ablation, heads
from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig, DataConfig, HeadsConfig, ModelConfig, RoleThresholds
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint, transformer
from pipeline.model.transformer import AttnOnlyTransformer

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
C = "c/config.json"  # a checkpoint's config.json: its shape's keys are named by the file
E, R = "analysis.heads.eval_sequences", "analysis.heads.repeat_length"


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


def keyed(estimate: memory.Estimate) -> list[tuple[list[str], bool]]:
    return [([s.key for s in t.sizes], t.host) for t in estimate.terms]


def batches(model: ModelConfig, h: HeadsConfig, data: DataConfig) -> tuple[memory.Batch, memory.Batch]:
    s = memory.Shape(model, C)
    E_ = memory.size(E, h.eval_sequences)
    probe = memory.Batch(
        E_, memory.size(R, h.repeat_length), 1 + 2 * h.repeat_length, "the probe",
        ("eval_sequences", "1 + 2 repeat_length"),
    )  # fmt: skip
    held = memory.Batch(
        memory.Size(E, datasets.eval_count(data, h.eval_sequences), 64), s.n_ctx, model.n_ctx,
        "the held-out batch", ("eval_sequences", "n_ctx"),
    )  # fmt: skip
    return probe, held


WEIGHTS = [
    ([f"{C}: d_vocab", f"{C}: d_model"], False),
    ([f"{C}: n_ctx", f"{C}: d_model"], False),
    ([f"{C}: n_layers", f"{C}: n_heads", f"{C}: d_head", f"{C}: d_model"], False),
]


def test_the_heads_estimate_for_the_pattern_scores():
    """16 layers, a probe of 1 + 2 x 8 positions beside a held-out batch of 20 (token files: no
    synthetic data): both caches kept, with one layer's scores and the logits of the held-out
    batch beside them, outweigh either path ablation."""
    deep = ModelConfig(n_layers=16, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
    h, data = HeadsConfig(eval_sequences=4, repeat_length=8), DataConfig(source="tokens")
    s, F64 = memory.Shape(deep, C), memory.FLOAT64
    probe, held = batches(deep, h, data)
    estimate = heads.memory_estimate(deep, h, data, C)
    assert estimate.terms == (
        *transformer.weight_terms(s, 3 * F64, "the model and the head weights in float64, and a copy"),
        *transformer.cache_terms(s, probe, F64),
        *transformer.cache_terms(s, held, F64),
        *transformer.forward_terms(s, held, F64),
    )
    assert keyed(estimate) == [
        *WEIGHTS,
        ([E, f"{C}: n_heads", R], False),
        ([E, R, f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_vocab"], False),
    ]


def test_the_heads_estimate_for_the_path_ablation():
    """2 layers on 64 synthetic sequences (3 held out): the path ablation of the held-out batch
    outweighs the pattern scores; its eval_sequences is the held-out part's, under the same key."""
    h, data = HeadsConfig(eval_sequences=4, repeat_length=6), DataConfig(n_train_sequences=64)
    s, F64 = memory.Shape(MODEL, C), memory.FLOAT64
    _, held = batches(MODEL, h, data)
    estimate = heads.memory_estimate(MODEL, h, data, C)
    assert estimate.terms == (
        *transformer.weight_terms(s, 3 * F64, "the model and the head weights in float64, and a copy"),
        *ablation.path_ablation_terms(s, held),
        *datasets.synthetic_terms(s, data),
    )
    assert keyed(estimate) == [
        *WEIGHTS,
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_model"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_vocab"], False),
        ([E, f"{C}: n_ctx", f"{C}: n_heads", f"{C}: d_model"], False),
        (["data.n_train_sequences", f"{C}: n_ctx"], True),
    ]
    assert [(s.value, s.reference) for s in estimate.terms[3].sizes][0] == (3, 64)


def test_a_checkpoints_shape_is_named_by_its_file():
    cfg = cfg_of("setup=synthetic")
    shape = replace(cfg.model, n_ctx=10**6)
    with pytest.raises(UserError) as e:
        memory.require_fits(
            heads.memory_estimate(shape, cfg.analysis.heads, cfg.data, "c/config.json"), 10**9
        )
    assert e.value.where == "c/config.json: n_ctx" and e.value.value == 10**6


def test_the_heads_library_refuses_a_shape_before_reading_the_checkpoint(tmp_path, monkeypatch):
    """heads.load_model checks config.json's shape as the heads stage did: the checkpoint (absent
    here: reading it would fail otherwise) is never read."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    cfg = cfg_of("setup=synthetic")
    config = (
        tmp_path / "config.json"
    )  # a model whose analysis needs terabytes (its n_ctx), nothing else large
    config.write_text(json.dumps(tl_checkpoint.tl_config(replace(SMALL, n_ctx=10**7))))
    with pytest.raises(UserError) as e:
        heads.load_model(tmp_path / "absent.safetensors", config, cfg.analysis.heads, cfg.data)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7
    assert memory.human(8e9) in str(e.value) and "\n" not in str(e.value)  # against the memory given


LENGTH = 7


# --- the heads stage: a previous-token head that is not head 0, and its batches --------------

# layer 0's heads reordered: head 0 is now the duplicate-token head, head 2 the previous-token one
ORDER = [2, 1, 0]


def reordered_state() -> dict[str, torch.Tensor]:
    state = planted.state_dict()
    for name in [n for n in state if n.startswith("blocks.0.attn.") and n != "blocks.0.attn.b_O"]:
        state[name] = state[name][ORDER].clone()
    return state


@pytest.fixture(scope="module")
def reordered():
    state = reordered_state()
    model = AttnOnlyTransformer(planted.CONFIG).to(torch.float64)
    model.load_state_dict(state)
    model.eval()
    hw = weights.from_state_dict(state)
    scores = composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)
    repeated, heldout = planted.repeated(16, LENGTH, 0), planted.random_tokens(16, planted.N_CTX, 1)
    cfg = HeadsConfig(eval_sequences=16, repeat_length=LENGTH, window_length=planted.WINDOW)
    return model, scores, repeated, heldout, heads.analyse_batches(model, hw, repeated, heldout, cfg, scores)


def test_qk_positivity_reads_the_best_k_source_when_it_is_not_head_0(reordered):
    _, scores, _, _, result = reordered
    by_head = result.table.set_index(["layer", "head"])
    assert (
        by_head.loc[(0, 2), "role"] == "previous_token" and by_head.loc[(0, 0), "role"] == "duplicate_token"
    )
    # only 0.2 -> 1.0 composes (through keys); every Q score is 0, so a source picked by Q would be
    # the first head, 0.0, whose output the induction head's keys never read: NaN, not 1
    assert heads.best_sources(scores)[(1, 0)] == (0, 2)
    assert by_head.loc[(1, 0), "qk_positivity"] == pytest.approx(1.0)
    assert by_head.loc[(1, 0), "role"] == "induction" and by_head.loc[(1, 0), "induction"] > 0.99


def test_each_ablation_effect_comes_from_its_own_batch(reordered):
    model, _, repeated, heldout, result = reordered
    on_probe = ablation.path_ablation(model, repeated, LENGTH)
    on_text = ablation.path_ablation(model, heldout, None)
    got = result.ablation
    assert got[list(ablation.COLUMNS[:5])].equals(on_probe[list(ablation.COLUMNS[:5])])
    np.testing.assert_array_equal(got["loss_effect"], on_probe["loss_effect"])
    np.testing.assert_array_equal(got["attn_effect"], on_probe["attn_effect"])
    np.testing.assert_array_equal(got["heldout_loss_effect"], on_text["loss_effect"])
    np.testing.assert_array_equal(got["pattern_effect"], on_text["pattern_effect"])  # role-free: held-out
    assert not np.array_equal(on_probe["pattern_effect"], on_text["pattern_effect"])
    # the planted edge: cutting 0.2 -> 1.0 through keys costs far more on the probe than on random text
    edge = (got["kind"] == "K") & (got["src_head"] == 2) & (got["dst_layer"] == 1) & (got["dst_head"] == 0)
    assert got.loc[edge, "loss_effect"].item() > got.loc[edge, "heldout_loss_effect"].item() + 1.0


def test_analyse_ablates_each_held_out_batch_with_its_own_probe(reordered):
    """`ablation_batches` disjoint held-out batches of `eval_sequences`, batch b with the probe of
    batch b: each batch's effects are those of its own pair of batches."""
    model, scores, _, _, _ = reordered
    n, seed = 4, 5
    text = planted.random_tokens(3 * n, planted.N_CTX, 2)
    dataset = datasets.Dataset(train=None, eval=text, heldout=None, manifest={})
    cfg = HeadsConfig(
        eval_sequences=n, repeat_length=LENGTH, window_length=planted.WINDOW, ablation_batches=3
    )
    hw = weights.from_state_dict(reordered_state())
    batches = heads.analyse(model, hw, dataset, cfg, seed, scores).batches
    assert sorted(set(batches["batch"])) == [0, 1, 2]
    for b in range(3):
        probe = datasets.repeated_probe(dataset, n, LENGTH, planted.V, seed, batch=b)
        mine = batches[batches["batch"] == b].reset_index(drop=True)
        on_probe = ablation.path_ablation(model, probe, LENGTH)
        on_text = ablation.path_ablation(model, text[b * n : (b + 1) * n], None)
        np.testing.assert_array_equal(mine["loss_effect"], on_probe["loss_effect"])
        np.testing.assert_array_equal(mine["heldout_loss_effect"], on_text["loss_effect"])


# --- roles: a score exactly at its threshold ---------------------------------------------


def test_a_score_at_its_threshold_takes_the_role_and_one_just_below_does_not():
    thresholds = RoleThresholds()  # previous_token 0.5, recent_window 0.5, induction 0.3, ...
    rows = []
    for role, score in heads.ROLE_SCORE.items():
        at = getattr(thresholds, role)
        for x in (at, np.nextafter(at, 0.0)):
            rows.append({name: 0.0 for name in heads.SCORES[:6]} | {score: x})
    both = {name: 0.0 for name in heads.SCORES[:6]} | {"prev_token": 0.5, "induction": 0.9}
    table = pd.DataFrame([*rows, both]).assign(layer=0, copying=np.nan, qk_positivity=np.nan)
    table["head"] = range(len(table))
    out = heads.classify(table, thresholds)
    for k, role in enumerate(heads.ROLE_SCORE):
        assert out.loc[2 * k, "role"] == role and out.loc[2 * k, f"is_{role}"], role
        assert out.loc[2 * k + 1, "role"] == "other" and not out.loc[2 * k + 1, f"is_{role}"], role
    # a head that takes both nesting roles is a previous-token head (FIRST's order)
    assert out.iloc[-1]["role"] == "previous_token" and out.iloc[-1]["is_induction"]
