"""The memory estimate (pipeline/memory.py): its parameter count is the model's, its chunk sizes
and held-out batches are the code's, the project's own configs fit in a few GB, and a refusal
names the key that dominates with both numbers; the heads and dynamics libraries refuse before
they read. The refusals through the stages are in test_bad_input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import checkpoint, memory, params
from pipeline.behaviour import ablation, dynamics, heads
from pipeline.config import ModelConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint, train
from pipeline.model.transformer import AttnOnlyTransformer

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)
SHAPES = {
    "small": SMALL,
    "layernorm": replace(SMALL, normalization_type="LN"),
    "no-bias": replace(SMALL, use_bias=False),
    "standard-positions-three-layers": replace(SMALL, positional_embedding_type="standard", n_layers=3),
    "paper": ModelConfig(n_heads=12, d_head=64, d_model=768, n_ctx=64, d_vocab=1024),
}


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_parameter_count_is_the_models(shape):
    cfg = SHAPES[shape]
    with torch.device("meta"):  # shapes only: nothing allocated
        model = AttnOnlyTransformer(cfg)
    assert memory.parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    # the weights' terms count every tensor of the state dict, buffers (biases without bias) too
    terms = memory._weights(memory._Shape(cfg), 1, "elements")
    assert sum(t.bytes for t in terms) == sum(t.numel() for t in model.state_dict().values())


def test_chunks_are_the_codes(monkeypatch):
    """The path ablation chunks by the estimate's ABLATION_CHUNK, and train's held-out loss by
    the estimate's `loss_chunk`: a smaller LOSS_CHUNK shrinks train's chunks and the estimate alike."""
    assert ablation._CHUNK == memory.ABLATION_CHUNK
    monkeypatch.setattr(memory, "LOSS_CHUNK", 3 * SMALL.n_ctx * SMALL.d_vocab)  # 3 sequences a chunk
    model = AttnOnlyTransformer(SMALL)
    chunks: list[int] = []
    model.register_forward_pre_hook(lambda _, args: chunks.append(len(args[0])))
    loss = train._chunked_loss(model, torch.randint(0, SMALL.d_vocab, (8, SMALL.n_ctx)))
    assert chunks == [3, 3, 2] and loss.shape == (8, SMALL.n_ctx - 1)
    shape = memory._Shape(SMALL)
    assert memory._heldout_loss(shape, 8).bytes == 3 * memory._heldout_loss(shape, 1).bytes


@pytest.mark.parametrize("n_train, fraction, n", [(64, 0.05, 8), (64, 0.5, 8), (10, 0.05, 8), (1000, 0.1, 7)])
def test_held_out_sequences_are_the_datas(n_train, fraction, n):
    """The estimate's held-out batch has as many sequences as datasets.load gives the train and
    heads stages: at most the held-out part of the synthetic data."""
    cfg = cfg_of("setup=synthetic", f"data.n_train_sequences={n_train}", f"data.eval_fraction={fraction}")
    dataset = datasets.load(cfg.data, SMALL, 0, n, need_train=False)
    assert memory._n_eval(cfg.data, n) == len(dataset.eval)


def test_a_token_files_held_out_sequences_are_at_most_the_estimates(tmp_path):
    """Text and token files: the estimate takes the `n` asked for, datasets.load gives at most that."""
    np.save(tmp_path / "tokens.npy", np.arange(2000) % SMALL.d_vocab)
    for fraction, n in [(0.05, 8), (0.5, 8), (0.05, 2)]:
        cfg = cfg_of(
            "data.source=tokens", f"data.dir={tmp_path}", "data.tokens.path=tokens.npy",
            f"data.eval_fraction={fraction}",
        )  # fmt: skip
        dataset = datasets.load(cfg.data, SMALL, 0, n, need_train=False)
        assert 0 < len(dataset.eval) <= memory._n_eval(cfg.data, n) == n


def test_a_known_answer():
    """The tiny model trained with batch 8: five float32 copies of its 1,952 parameters, a
    training step's activations (which outweigh the evaluation's here), the synthetic data."""
    cfg = cfg_of("setup=synthetic", "model.n_heads=2", "model.d_head=4", "model.d_model=16",
                 "model.n_ctx=20", "model.d_vocab=16", "data.n_train_sequences=64", "train.batch_size=8",
                 "train.eval_batch_size=8", "train.probe_length=6", "analysis.heads.repeat_length=6",
                 "analysis.heads.window_length=2")  # fmt: skip
    terms = {t.what.split(" (")[0].split(",")[0]: t.bytes for t in memory.training(cfg).terms}
    B, T, H, V, D, hd = 8, 20, 2, 16, 16, 8
    assert terms["the embeddings W_E"] == 20 * (2 * V * D + V)
    assert terms["the positional embedding W_pos"] == 20 * T * D
    assert terms["the attention weights"] == 20 * 2 * (4 * H * D * 4 + 3 * hd + D)
    assert terms["the attention patterns of a training batch"] == 4 * 2 * B * H * T * T
    assert terms["the logits of a training batch"] == 16 * B * T * V
    assert terms["the synthetic data"] == 8 * (64 * (T + 12) + 3 * V)


# the project's configs (conf/), as composed for a run: (overrides, what the heads stage needs)
REAL = [
    ((), 2e9),  # the default: the text setup, the text model (1.7 GB)
    (("setup=synthetic",), 2e9),  # 1.3 GB (measured: 1.4 GB)
    (("model=paper",), 3e9),  # 2.4 GB
    (("setup=synthetic", "model=paper"), 3e9),
    # the heads stage really needs ~6 GB here (5.9 GB): one source head's results [64, 256, 8, 512]
    # in float64 are 0.5 GB, and the path ablation holds several (measured: 1.8 GB at
    # eval_sequences 16, estimated 1.9 GB)
    (("model=tl_attn_only_2l",), 7e9),
    (("setup=synthetic", "model=tl_attn_only_2l"), 7e9),
]


@pytest.mark.parametrize("overrides, heads_need", REAL, ids=[" ".join(o) or "default" for o, _ in REAL])
def test_the_projects_configs_are_not_refused(overrides, heads_need):
    cfg = cfg_of(*overrides)
    memory.require_fits(memory.training(cfg), available=int(3e9))  # a machine with 3 GB free
    memory.require_fits(memory.loading(cfg.model, cfg, "config.json"), available=int(3e9))
    heads = memory.heads_stage(cfg.model, cfg.analysis.heads, cfg.data, "config.json")
    memory.require_fits(heads, available=int(heads_need))
    assert memory.training(cfg).bytes > 20e6  # not vacuous: each is at least tens of MB
    assert heads.bytes > 100e6


def test_a_refusal_names_the_key_and_both_numbers():
    cfg = cfg_of("setup=synthetic", "model.d_vocab=1000000000")
    with pytest.raises(UserError) as e:
        memory.require_fits(memory.training(cfg), available=int(20.1e9))
    message = str(e.value)
    assert message.startswith("model.d_vocab = 1000000000: the model, its optimizer and the largest buffers ")
    # logits 16 x 32 x 64 x 1e9 B = 32.8 TB, embeddings 20 x 129e9 B = 2.6 TB, the rest < 0.1 TB
    assert "need about 35.4 TB (most of it the logits of a training batch" in message
    assert message.endswith("more than the 20.1 GB of memory available")


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.n_ctx=1000000", "model.n_ctx"),
        ("train.batch_size=10000000000", "train.batch_size"),
        ("train.eval_batch_size=100000000000", "train.eval_batch_size"),
        ("data.n_train_sequences=1000000000000", "data.n_train_sequences"),
        ("model.d_model=1000000", "model.d_model"),
    ],
)
def test_the_key_named_is_the_one_that_grew(override, key):
    with pytest.raises(UserError) as e:
        memory.require_fits(memory.training(cfg_of("setup=synthetic", override)), available=int(1e9))
    assert e.value.where == key


def test_a_checkpoints_shape_is_named_by_its_file():
    cfg = cfg_of("setup=synthetic")
    shape = replace(cfg.model, n_ctx=10**6)
    with pytest.raises(UserError) as e:
        memory.require_fits(memory.heads_stage(shape, cfg.analysis.heads, cfg.data, "c/config.json"), 10**9)
    assert e.value.where == "c/config.json: n_ctx" and e.value.value == 10**6


def _too_large_config(tmp_path: Path) -> Path:
    """config.json of a model whose analysis needs terabytes (its n_ctx), and nothing else large."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tl_checkpoint.tl_config(replace(SMALL, n_ctx=10**7))))
    return config


def test_the_heads_library_refuses_a_shape_before_reading_the_checkpoint(tmp_path, monkeypatch):
    """heads.load_model checks config.json's shape as the heads stage did: the checkpoint (absent
    here: reading it would fail otherwise) is never read."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    cfg = cfg_of("setup=synthetic")
    config = _too_large_config(tmp_path)
    with pytest.raises(UserError, match="analysis buffers .* of memory available$") as e:
        heads.load_model(tmp_path / "absent.safetensors", config, cfg.analysis.heads, cfg.data)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7


def test_the_dynamics_library_refuses_a_shape_before_reading_checkpoints_or_data(tmp_path, monkeypatch):
    """dynamics.run checks the shape as the heads stage does, after the index and before the
    checkpoints (an empty file here: reading it would fail otherwise) and the data."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    (tmp_path / checkpoint.step_file(0)).write_bytes(b"")
    index = {"checkpoints": [{"step": 0, "tokens": 0, "file": checkpoint.step_file(0)}]}
    (tmp_path / checkpoint.INDEX).write_text(json.dumps(index))
    config = _too_large_config(tmp_path)
    with pytest.raises(UserError, match="analysis buffers .* of memory available$") as e:
        dynamics.run(tmp_path, config, cfg_of("setup=synthetic"), seed=0)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7


def test_on_a_gpu_the_data_is_held_against_the_host():
    cfg = cfg_of("setup=synthetic", "data.n_train_sequences=1000000000")  # 0.6 TB of synthetic data
    estimate = memory.training(cfg)
    memory.require_fits(estimate, available=None, device_available=int(1e9))  # the model fits the GPU
    with pytest.raises(UserError, match="data.n_train_sequences = 1000000000: .* of memory available"):
        memory.require_fits(estimate, available=int(1e9), device_available=int(1e12))
    big = memory.training(cfg_of("setup=synthetic", "model.n_ctx=100000"))
    with pytest.raises(UserError, match="model.n_ctx = 100000: .* GB of GPU memory free"):
        memory.require_fits(big, available=int(1e15), device_available=int(80e9))


def test_unknown_memory_checks_nothing():
    """The 35 TB estimate above: refused one byte short of it, accepted at exactly its size, and
    never checked against memory that is unknown (None), on the host or, on a GPU, for the host's
    terms (the GPU's free memory is still held against the rest)."""
    estimate = memory.training(cfg_of("setup=synthetic", "model.d_vocab=1000000000"))
    need = estimate.bytes
    assert need > 35e12
    with pytest.raises(UserError, match="^model.d_vocab = 1000000000: "):
        memory.require_fits(estimate, available=need - 1)
    assert memory.require_fits(estimate, available=need) is None
    assert memory.require_fits(estimate, available=None) is None
    assert memory.require_fits(estimate, available=None, device_available=need) is None
    with pytest.raises(UserError, match="of GPU memory free$"):
        memory.require_fits(estimate, available=None, device_available=int(1e9))


def test_available_bytes_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683568 kB\nMemFree:  100 kB\nMemAvailable:   1000 kB\n")
    assert memory.available_bytes(meminfo) == 1024000
    meminfo.write_text("MemTotal:       24683568 kB\n")  # a kernel without MemAvailable
    assert memory.available_bytes(meminfo) is None
    assert memory.available_bytes(tmp_path / "nowhere") is None  # not Linux
    assert memory.available_bytes() is None or memory.available_bytes() > 0


@pytest.mark.parametrize(
    "n, shown", [(0, "0 B"), (999, "999 B"), (1500, "1.5 kB"), (20.1e9, "20.1 GB"), (1.2e13, "12.0 TB")]
)
def test_human(n, shown):
    assert memory.human(n) == shown
