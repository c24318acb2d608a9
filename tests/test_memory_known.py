"""The memory estimate's terms worked out by hand from their docstrings (pipeline/memory.py) for a
tiny model: the path ablation's chunk, one layer's scores, the held-out loss, a training step's
residual streams; and a refusal's wording with one term and with several."""

from __future__ import annotations

import pytest

from pipeline import memory
from pipeline.config import Config, DataConfig, HeadsConfig, ModelConfig, TrainConfig
from pipeline.errors import UserError

# L layers, H heads of d_head dh, d_model D, context T, vocabulary V
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)


def batch(n: int, pos: int) -> memory._Batch:
    size = memory.Size("analysis.heads.eval_sequences", n, 64)
    return memory._Batch(size, memory._Shape(MODEL).n_ctx, pos, "the held-out batch", ("n", "pos"))


def by_what(terms) -> dict[str, int]:
    return {t.what: t.bytes for t in terms}


def test_the_path_ablations_chunk_and_logits():
    """n = 3 sequences of 20: every source head in one chunk (H of them), every later head's loss
    pass too; float64."""
    n, sources = 3, H
    outputs = sources * n * (2 * T * H * D + H * T * T)  # results, deltas, patterns
    block_call = sources * n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    loss_passes = H * n * T * (4 * V + 2 * D + H * T)
    assert (outputs, block_call, loss_passes) == (12480, 33600, 16320)
    terms = by_what(memory._ablation(memory._Shape(MODEL), batch(n, T)))
    assert terms["one chunk of the path ablation on the held-out batch"] == 8 * (12480 + 33600)
    assert terms["the logits of the held-out batch, [n, pos, d_vocab], with their copy and log-softmax"] == (
        8 * 3 * n * T * V
    )


def test_the_path_ablations_chunk_when_the_loss_passes_are_larger():
    """A large vocabulary: the later heads' loss passes outweigh the block call."""
    big = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=1000)
    n = 3
    outputs = H * n * (2 * T * H * D + H * T * T)
    loss_passes = H * n * T * (4 * 1000 + 2 * D + H * T)
    assert (outputs, loss_passes) == (12480, 488640)
    chunk = next(
        t for t in memory._ablation(memory._Shape(big), batch(n, T)) if t.what.startswith("one chunk")
    )
    assert chunk.bytes == 8 * (12480 + 488640)
    assert [s.key for s in chunk.sizes] == ["analysis.heads.eval_sequences", "model.n_ctx", "model.d_vocab"]


def test_one_layers_scores_and_the_logits_beside_the_cache():
    n = 3
    terms = by_what(memory._computing(memory._Shape(MODEL), batch(n, T), memory.FLOAT64))
    # scores and masked scores [n, H, T, T], and q, k, v [n, T, H, dh]
    assert terms["one layer's attention scores on the held-out batch"] == 8 * n * (
        2 * H * T * T + 3 * T * H * dh
    )
    assert terms["the logits of the held-out batch, [n, pos, d_vocab]"] == 8 * 2 * n * T * V


def test_the_held_out_loss_is_a_chunk_of_sequences():
    """Per sequence: logits, their copy and log-softmax [T, V], the pattern [H, T, T], streams
    [T, 4 D], q, k, v and the result [T, 4 H dh], and the ids [T]; 5 sequences fit in a chunk."""
    per_sequence = T * (3 * V + H * T + 4 * D + 4 * H * dh) + T
    term = memory._heldout_loss(memory._Shape(MODEL), 5)
    assert (term.what, term.bytes) == (
        "the held-out loss, a chunk of sequences at a time",
        4 * 5 * per_sequence,
    )
    assert [s.key for s in term.sizes] == ["model.d_vocab", "model.n_ctx"]


def test_the_evaluation_probe_is_1_plus_2_probe_length_long():
    """64 probes outweigh one held-out sequence's loss: the probe's cached pass is the term."""
    t = TrainConfig(eval_batch_size=64, probe_length=9)
    terms = by_what(memory._evaluation(memory._Shape(MODEL), t, 1))
    pos = 1 + 2 * 9
    probe = "the attention patterns of the induction probe, [eval_batch_size, n_heads, 1 + 2 probe_length, "
    assert terms[probe + "1 + 2 probe_length] float32 per layer"] == 4 * L * 64 * H * pos * pos
    patterns = next(t for t in memory._evaluation(memory._Shape(MODEL), t, 1) if t.what.startswith(probe))
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
    terms = memory._training_step(memory._Shape(MODEL), memory.Size("train.batch_size", B, 32))
    found = by_what(terms)
    what = "the residual streams, queries, keys and values of a training batch, and their gradients"
    assert found[what] == 2 * 4 * B * T * 320 + 2 * 8 * B * T
    logits = next(t for t in terms if t.what.startswith("the logits of a training batch"))
    assert [s.key for s in logits.sizes] == ["train.batch_size", "model.n_ctx", "model.d_vocab"]


def test_a_refusal_says_needs_for_one_term_and_need_for_several():
    one = memory.Term("the synthetic data", 3_000_000, (memory.Size("data.n_train_sequences", 10**6, 20000),))
    two = memory.Term("the logits", 1_000_000, (memory.Size("model.d_vocab", 100, 64),))
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate("the model", (one,)), available=2_000_000)
    assert str(caught.value) == (
        "data.n_train_sequences = 1000000: the synthetic data needs about 3.0 MB, "
        "more than the 2.0 MB of memory available"
    )
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate("the model", (one, two)), available=2_000_000)
    assert str(caught.value) == (
        "data.n_train_sequences = 1000000: the model need about 4.0 MB (most of it the synthetic data), "
        "more than the 2.0 MB of memory available"
    )


def test_the_weights_terms_and_the_key_a_refusal_names():
    """4 bytes a parameter and buffer (biases counted without use_bias too): W_E and W_U, 2 V D, and
    b_U, V; W_pos, T D; per layer W_Q, W_K, W_V, W_O, 4 H D dh, and b_Q, b_K, b_V, b_O,
    3 H dh + D. The attention weights are the largest term and grow with n_layers, n_heads, d_head
    and d_model; n_layers is the one furthest above its default (2 of 2, the others below theirs)."""
    embeddings, positions = 2 * V * D + V, T * D
    layers = L * (4 * H * D * dh + 3 * H * dh + D)
    assert (embeddings, positions, layers) == (528, 320, 1104)
    terms = memory._weights(memory._Shape(MODEL), 4, "float32")
    assert [(t.what, t.bytes) for t in terms] == [
        ("the embeddings W_E, W_U (float32)", 4 * 528),
        ("the positional embedding W_pos (float32)", 4 * 320),
        ("the attention weights (float32)", 4 * 1104),
    ]
    assert [[(s.key, s.value) for s in t.sizes] for t in terms] == [
        [("model.d_vocab", V), ("model.d_model", D)],
        [("model.n_ctx", T), ("model.d_model", D)],
        [("model.n_layers", L), ("model.n_heads", H), ("model.d_head", dh), ("model.d_model", D)],
    ]
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate("the weights", tuple(terms)), available=1000)
    assert str(caught.value) == (
        "model.n_layers = 2: the weights need about 7.8 kB (most of it the attention weights (float32)), "
        "more than the 1.0 kB of memory available"
    )


def test_the_later_heads_loss_passes_take_every_head_whose_logits_fit_in_a_chunk():
    """One sequence of one position over a vocabulary of one token: a later head's logits are one
    element, so a chunk of ABLATION_CHUNK = 2^24 elements holds the loss passes of all 2^23 + 1
    heads at once (as `behaviour.ablation` chunks them: 2^24 // (1 x 1 x 1) heads); the source heads'
    results, 2^23 + 1 elements each, fit one at a time (2^24 // (2^23 + 1) = 1)."""
    heads = 2**23 + 1
    m = ModelConfig(n_layers=2, n_heads=heads, d_head=1, d_model=1, n_ctx=1, d_vocab=1)
    outputs = 1 * 1 * (2 * 1 * heads * 1 + heads * 1 * 1)  # one source: result, delta, pattern
    block_call = 1 * 1 * (3 * heads + 2 * heads + 6)
    loss_passes = heads * 1 * 1 * (4 * 1 + 2 * 1 + heads * 1)  # every later head at once
    assert loss_passes > block_call
    size = memory.Size("analysis.heads.eval_sequences", 1, 64)
    one = memory._Batch(size, memory._Shape(m).n_ctx, 1, "the held-out batch", ("n", "pos"))
    terms = by_what(memory._ablation(memory._Shape(m), one))
    assert terms["one chunk of the path ablation on the held-out batch"] == 8 * (outputs + loss_passes)


def test_on_a_gpu_a_refusal_of_several_terms_names_the_estimate_and_the_gpus_free_memory():
    """With the GPU's free memory given, the device terms are held against it, the host terms
    (the synthetic data) against the host's memory: each refusal names the estimate."""
    logits = memory.Term("the logits", 3_000_000, (memory.Size("model.d_vocab", 100, 64),))
    weights = memory.Term("the weights", 1_000_000, (memory.Size("model.d_model", 128, 64),))
    data = memory.Term(
        "the synthetic data", 500, (memory.Size("data.n_train_sequences", 10, 20000),), host=True
    )
    estimate = memory.Estimate("the model and its buffers", (logits, weights, data))
    memory.require_fits(estimate, available=1000, device_available=4_000_000)  # each part fits its memory
    with pytest.raises(UserError) as caught:
        memory.require_fits(estimate, available=10**12, device_available=2_000_000)
    assert str(caught.value) == (
        "model.d_vocab = 100: the model and its buffers need about 4.0 MB (most of it the logits), "
        "more than the 2.0 MB of GPU memory free"
    )
    with pytest.raises(UserError) as caught:
        memory.require_fits(estimate, available=400, device_available=10**12)
    assert str(caught.value) == (
        "data.n_train_sequences = 10: the synthetic data needs about 500 B, "
        "more than the 400 B of memory available"
    )


@pytest.mark.parametrize(
    "n, shown",
    [
        (999, "999 B"),
        (1000, "1.0 kB"),
        (12.0e12, "12.0 TB"),
        (3.0e18, "3.0 EB"),
        (1.5e21, "1.5 ZB"),
        (-2e6, "-2.0 MB"),
    ],
)
def test_bytes_are_shown_in_decimal_units_with_one_decimal(n, shown):
    assert memory.human(n) == shown


# --- the words of each stage's estimate: every term's text and the keys it names -----------------

C = "c/config.json"  # a checkpoint's config.json: its shape's keys are named by the file


def described(estimate: memory.Estimate) -> tuple[str, list[tuple[str, list[str], bool]]]:
    return estimate.what, [(t.what, [s.key for s in t.sizes], t.host) for t in estimate.terms]


def test_the_training_estimates_words():
    """A new model trained with batch 8 on 64 synthetic sequences: the weights five times, a
    training step (it outweighs the probe's evaluation here), the data in host memory."""

    cfg = Config(
        model=MODEL,
        data=DataConfig(n_train_sequences=64),
        train=TrainConfig(batch_size=8, eval_batch_size=8, probe_length=6),
    )
    copies = "(weights, gradients and AdamW's moments)"
    assert described(memory.training(cfg)) == (
        "the model, its optimizer and the largest buffers",
        [
            (f"the embeddings W_E, W_U {copies}", ["model.d_vocab", "model.d_model"], False),
            (f"the positional embedding W_pos {copies}", ["model.n_ctx", "model.d_model"], False),
            (
                f"the attention weights {copies}",
                ["model.n_layers", "model.n_heads", "model.d_head", "model.d_model"],
                False,
            ),
            (
                "the attention patterns of a training batch, [batch, n_heads, n_ctx, n_ctx] float32 "
                "per layer",
                ["train.batch_size", "model.n_heads", "model.n_ctx"],
                False,
            ),
            (
                "the logits of a training batch, [batch, n_ctx, d_vocab] float32: a copy, their log-softmax "
                "and the gradients",
                ["train.batch_size", "model.n_ctx", "model.d_vocab"],
                False,
            ),
            (
                "the residual streams, queries, keys and values of a training batch, and their gradients",
                ["train.batch_size", "model.n_ctx", "model.d_model"],
                False,
            ),
            (
                "the synthetic data, [n_train_sequences, n_ctx] int64 generated up front",
                ["data.n_train_sequences", "model.n_ctx"],
                True,
            ),
        ],
    )


def test_the_loading_estimates_words():
    """A checkpoint loaded and evaluated: its tensors and the model's, the induction probe's
    cached pass (8 probes of 1 + 2 x 6 outweigh the held-out loss), the synthetic data."""

    cfg = Config(
        model=MODEL,
        data=DataConfig(n_train_sequences=64),
        train=TrainConfig(batch_size=8, eval_batch_size=8, probe_length=6),
    )
    copies = "(the checkpoint's tensors and the model's)"
    probe = "the induction probe"
    assert described(memory.loading(MODEL, cfg, C)) == (
        "the checkpoint and the largest evaluation buffers",
        [
            (f"the embeddings W_E, W_U {copies}", [f"{C}: d_vocab", f"{C}: d_model"], False),
            (f"the positional embedding W_pos {copies}", [f"{C}: n_ctx", f"{C}: d_model"], False),
            (
                f"the attention weights {copies}",
                [f"{C}: n_layers", f"{C}: n_heads", f"{C}: d_head", f"{C}: d_model"],
                False,
            ),
            (
                f"the attention patterns of {probe}, [eval_batch_size, n_heads, 1 + 2 probe_length, "
                "1 + 2 probe_length] float32 per layer",
                ["train.eval_batch_size", f"{C}: n_heads", "train.probe_length"],
                False,
            ),
            (
                f"the cached head results of {probe}, [eval_batch_size, 1 + 2 probe_length, n_heads, "
                "d_model] per layer",
                ["train.eval_batch_size", "train.probe_length", f"{C}: d_model"],
                False,
            ),
            (
                f"one layer's attention scores on {probe}",
                ["train.eval_batch_size", f"{C}: n_heads", "train.probe_length"],
                False,
            ),
            (
                f"the logits of {probe}, [eval_batch_size, 1 + 2 probe_length, d_vocab]",
                ["train.eval_batch_size", "train.probe_length", f"{C}: d_vocab"],
                False,
            ),
            (
                "the synthetic data, [n_train_sequences, n_ctx] int64 generated up front",
                ["data.n_train_sequences", f"{C}: n_ctx"],
                True,
            ),
        ],
    )


HEADS_WEIGHTS = "(the model and the head weights in float64, and a copy)"


def heads_weights() -> list[tuple[str, list[str], bool]]:
    return [
        (f"the embeddings W_E, W_U {HEADS_WEIGHTS}", [f"{C}: d_vocab", f"{C}: d_model"], False),
        (f"the positional embedding W_pos {HEADS_WEIGHTS}", [f"{C}: n_ctx", f"{C}: d_model"], False),
        (
            f"the attention weights {HEADS_WEIGHTS}",
            [f"{C}: n_layers", f"{C}: n_heads", f"{C}: d_head", f"{C}: d_model"],
            False,
        ),
    ]


def test_the_heads_estimates_words_for_the_pattern_scores():
    """16 layers, a probe of 1 + 2 x 8 positions beside a held-out batch of 20 (token files: no
    synthetic data): both caches kept, with one layer's scores and the logits of the held-out
    batch beside them, outweigh either path ablation."""

    deep = ModelConfig(n_layers=16, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
    h = HeadsConfig(eval_sequences=4, repeat_length=8)
    E, R = "analysis.heads.eval_sequences", "analysis.heads.repeat_length"
    assert described(memory.heads_stage(deep, h, DataConfig(source="tokens"), C)) == (
        "the model, its weights and the largest analysis buffers",
        [
            *heads_weights(),
            (
                "the attention patterns of the probe, [eval_sequences, n_heads, 1 + 2 repeat_length, "
                "1 + 2 repeat_length] float64 per layer",
                [E, f"{C}: n_heads", R],
                False,
            ),
            (
                "the cached head results of the probe, [eval_sequences, 1 + 2 repeat_length, n_heads, "
                "d_model] per layer",
                [E, R, f"{C}: d_model"],
                False,
            ),
            *held_out_patterns_and_results(E),
            (
                "one layer's attention scores on the held-out batch",
                [E, f"{C}: n_heads", f"{C}: n_ctx"],
                False,
            ),
            (
                "the logits of the held-out batch, [eval_sequences, n_ctx, d_vocab]",
                [E, f"{C}: n_ctx", f"{C}: d_vocab"],
                False,
            ),
        ],
    )


def held_out_patterns_and_results(E: str) -> list[tuple]:
    """The held-out batch's attention patterns and cached head results, as both heads estimates
    describe them (`described`), with `E` the key of their eval_sequences."""
    return [
        (
            "the attention patterns of the held-out batch, [eval_sequences, n_heads, n_ctx, n_ctx] "
            "float64 per layer",
            [E, f"{C}: n_heads", f"{C}: n_ctx"],
            False,
        ),
        (
            "the cached head results of the held-out batch, [eval_sequences, n_ctx, n_heads, d_model] "
            "per layer",
            [E, f"{C}: n_ctx", f"{C}: d_model"],
            False,
        ),
    ]


def test_the_heads_estimates_words_for_the_path_ablation():
    """2 layers on 64 synthetic sequences (3 held out): the path ablation of the held-out batch
    outweighs the pattern scores; its eval_sequences is the held-out part's, under the same key."""

    h = HeadsConfig(eval_sequences=4, repeat_length=6)
    E = "analysis.heads.eval_sequences"
    estimate = memory.heads_stage(MODEL, h, DataConfig(n_train_sequences=64), C)
    assert described(estimate) == (
        "the model, its weights and the largest analysis buffers",
        [
            *heads_weights(),
            *held_out_patterns_and_results(E),
            (
                "the logits of the held-out batch, [eval_sequences, n_ctx, d_vocab], with their copy and "
                "log-softmax",
                [E, f"{C}: n_ctx", f"{C}: d_vocab"],
                False,
            ),
            (
                "one chunk of the path ablation on the held-out batch",
                [E, f"{C}: n_ctx", f"{C}: n_heads", f"{C}: d_model"],
                False,
            ),
            (
                "the synthetic data, [n_train_sequences, n_ctx] int64 generated up front",
                ["data.n_train_sequences", f"{C}: n_ctx"],
                True,
            ),
        ],
    )
    assert [(s.value, s.reference) for s in estimate.terms[3].sizes][0] == (3, 64)


def test_available_memory_is_kibibytes_times_1024_and_a_unitless_value_is_bytes(tmp_path):
    """MemAvailable in kB counts 1024-byte units; a value with no unit (or another one) is taken
    as bytes, unscaled: 1000 kB is 1 024 000 bytes, a bare 1000 is 1000."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  5000 kB\nMemAvailable:   1000\n")
    assert memory.available_bytes(meminfo) == 1000
    meminfo.write_text("MemAvailable:   1000 B\n")
    assert memory.available_bytes(meminfo) == 1000
    meminfo.write_text("MemAvailable:   3 kB\n")
    assert memory.available_bytes(meminfo) == 3072
