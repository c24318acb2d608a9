"""The heads analysis's memory estimate (pipeline/behaviour/heads.py, `memory_estimate`): made of
the model's, the path ablation's and the data's own terms, the larger of the pattern scores and
the ablation, keyed by the checkpoint's file; and `load_model` refuses a shape before reading
the checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline import memory, params
from pipeline.behaviour import ablation, heads
from pipeline.config import DataConfig, HeadsConfig, ModelConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint, transformer

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
