"""Training's memory terms (pipeline/model/train.py, `training_estimate`, `loading_estimate`):
the held-out loss chunks as `_chunked_loss` does, each term's bytes worked out by hand for a
tiny model, and each estimate made of the terms its docstring lists, with the keys they name."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline import memory, params
from pipeline.config import Config, DataConfig, ModelConfig, TrainConfig
from pipeline.data import datasets
from pipeline.model import train, transformer
from pipeline.model.transformer import AttnOnlyTransformer

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)
# L layers, H heads of d_head dh, d_model D, context T, vocabulary V
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
C = "c/config.json"  # a checkpoint's config.json: its shape's keys are named by the file


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


def test_the_held_out_loss_chunks_as_its_term_estimates(monkeypatch):
    """A smaller LOSS_CHUNK shrinks `_chunked_loss`'s chunks and the held-out loss's term alike."""
    monkeypatch.setattr(train, "LOSS_CHUNK", 3 * SMALL.n_ctx * SMALL.d_vocab)  # 3 sequences a chunk
    model = AttnOnlyTransformer(SMALL)
    chunks: list[int] = []
    model.register_forward_pre_hook(lambda _, args: chunks.append(len(args[0])))
    loss = train._chunked_loss(model, torch.randint(0, SMALL.d_vocab, (8, SMALL.n_ctx)))
    assert chunks == [3, 3, 2] and loss.shape == (8, SMALL.n_ctx - 1)
    shape = memory.Shape(SMALL)
    assert train._heldout_loss(shape, 8).bytes == 3 * train._heldout_loss(shape, 1).bytes


def test_a_known_answer():
    """The tiny model trained with batch 8: five float32 copies of its 1,952 parameters, a
    training step's activations (which outweigh the evaluation's here), the synthetic data."""
    cfg = cfg_of("setup=synthetic", "model.n_heads=2", "model.d_head=4", "model.d_model=16",
                 "model.n_ctx=20", "model.d_vocab=16", "data.n_train_sequences=64", "train.batch_size=8",
                 "train.eval_batch_size=8", "train.probe_length=6", "analysis.heads.repeat_length=6",
                 "analysis.heads.window_length=2")  # fmt: skip
    terms = [t.bytes for t in train.training_estimate(cfg).terms]
    B, T, H, V, D, hd = 8, 20, 2, 16, 16, 8
    embeddings, positions, layers, patterns, logits, _streams, data = terms
    assert embeddings == 20 * (2 * V * D + V)
    assert positions == 20 * T * D
    assert layers == 20 * 2 * (4 * H * D * 4 + 3 * hd + D)
    assert patterns == 4 * 2 * B * H * T * T
    assert logits == 16 * B * T * V
    assert data == 8 * (64 * (T + 12) + 3 * V)


def test_the_held_out_loss_is_a_chunk_of_sequences():
    """Per sequence: logits, their copy and log-softmax [T, V], the pattern [H, T, T], streams
    [T, 4 D], q, k, v and the result [T, 4 H dh], and the ids [T]; 5 sequences fit in a chunk."""
    per_sequence = T * (3 * V + H * T + 4 * D + 4 * H * dh) + T
    term = train._heldout_loss(memory.Shape(MODEL), 5)
    assert term.bytes == 4 * 5 * per_sequence
    assert [s.key for s in term.sizes] == ["model.d_vocab", "model.n_ctx"]


def test_the_evaluation_probe_is_1_plus_2_probe_length_long():
    """64 probes outweigh one held-out sequence's loss: the probe's cached pass is the term."""
    t = TrainConfig(eval_batch_size=64, probe_length=9)
    terms = train._evaluation(memory.Shape(MODEL), t, 1)
    pos = 1 + 2 * 9
    patterns = terms[0]
    assert len(terms) == 4  # the cache's two terms and the forward pass's two
    assert patterns.bytes == 4 * L * 64 * H * pos * pos
    assert [(s.key, s.value) for s in patterns.sizes] == [
        ("train.eval_batch_size", 64),
        ("model.n_heads", H),
        ("train.probe_length", 9),
    ]


def test_a_training_steps_residual_streams():
    """Per layer 4 streams of d_model and 8 of n_heads x d_head, plus 4 of d_model, float32,
    kept and their gradients; and the int64 ids and targets."""
    B = 8
    streams = L * (4 * D + 8 * H * dh) + 4 * D
    assert streams == 320
    _patterns, logits, residual = train._training_step(
        memory.Shape(MODEL), memory.Size("train.batch_size", B, 32)
    )
    assert residual.bytes == 2 * 4 * B * T * 320 + 2 * 8 * B * T
    assert [s.key for s in logits.sizes] == ["train.batch_size", "model.n_ctx", "model.d_vocab"]


def keyed(estimate: memory.Estimate) -> list[tuple[list[str], bool]]:
    return [([s.key for s in t.sizes], t.host) for t in estimate.terms]


CFG = Config(
    model=MODEL,
    data=DataConfig(n_train_sequences=64),
    train=TrainConfig(batch_size=8, eval_batch_size=8, probe_length=6),
)


def test_the_training_estimate_is_the_weights_five_times_a_step_and_the_data():
    """A new model trained with batch 8 on 64 synthetic sequences: the weights five times, a
    training step (it outweighs the probe's evaluation here), the data in host memory."""
    s = memory.Shape(MODEL)
    estimate = train.training_estimate(CFG)
    assert estimate.terms == (
        *transformer.weight_terms(s, 5 * 4, "weights, gradients and AdamW's moments"),
        *train._training_step(s, memory.size("train.batch_size", 8)),
        *datasets.synthetic_terms(s, CFG.data),
    )
    assert keyed(estimate) == [
        (["model.d_vocab", "model.d_model"], False),
        (["model.n_ctx", "model.d_model"], False),
        (["model.n_layers", "model.n_heads", "model.d_head", "model.d_model"], False),
        (["train.batch_size", "model.n_heads", "model.n_ctx"], False),
        (["train.batch_size", "model.n_ctx", "model.d_vocab"], False),
        (["train.batch_size", "model.n_ctx", "model.d_model"], False),
        (["data.n_train_sequences", "model.n_ctx"], True),
    ]


def test_the_loading_estimate_is_the_checkpoint_twice_an_evaluation_and_the_data():
    """A checkpoint loaded and evaluated: its tensors and the model's, the induction probe's
    cached pass (8 probes of 1 + 2 x 6 outweigh the held-out loss), the synthetic data; the
    shape's keys named by the checkpoint's config.json."""
    s = memory.Shape(MODEL, C)
    estimate = train.loading_estimate(MODEL, CFG, C)
    assert estimate.terms == (
        *transformer.weight_terms(s, 2 * 4, "the checkpoint's tensors and the model's"),
        *train._evaluation(s, CFG.train, datasets.eval_count(CFG.data, 8)),
        *datasets.synthetic_terms(s, CFG.data),
    )
    E, P = "train.eval_batch_size", "train.probe_length"
    assert keyed(estimate) == [
        ([f"{C}: d_vocab", f"{C}: d_model"], False),
        ([f"{C}: n_ctx", f"{C}: d_model"], False),
        ([f"{C}: n_layers", f"{C}: n_heads", f"{C}: d_head", f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", P], False),
        ([E, P, f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", P], False),
        ([E, P, f"{C}: d_vocab"], False),
        (["data.n_train_sequences", f"{C}: n_ctx"], True),
    ]
