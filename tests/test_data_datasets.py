"""pipeline/data/datasets.py: the synthetic, token-file and text sources and their batches.

Seeded synthetic sequences with copies and topics, held-out splits no training window reaches,
the probe of repeated spans, token streams with copies, and the refusals of bad token files,
paths and settings."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from refusals import one_line

from pipeline import io, memory, params, streams
from pipeline.config import (
    CopiesConfig,
    DataConfig,
    ModelConfig,
    SyntheticDataConfig,
    TextDataConfig,
    TokenizerConfig,
    TokensDataConfig,
)
from pipeline.data import datasets, tokenizer
from pipeline.errors import UserError

MODEL = ModelConfig()  # 64 tokens of context, 64-token vocabulary


COPY_KEYS = {"rate", "min_span", "max_span", "min_distance"}


def synthetic(n: int = 2000, seed: int = 0, model: ModelConfig = MODEL, **changes) -> np.ndarray:
    copies = replace(CopiesConfig(), **{k: v for k, v in changes.items() if k in COPY_KEYS})
    syn = replace(SyntheticDataConfig(), **{k: v for k, v in changes.items() if k not in COPY_KEYS})
    cfg = DataConfig(synthetic=syn, copies=copies)
    return datasets.synthetic_sequences(n, model, cfg, np.random.default_rng(seed))


def _induction_and_offset_accuracy(x: np.ndarray) -> tuple[float, np.ndarray]:
    """How often the token after the last earlier occurrence of x[t-1] is x[t] (induction),
    and, for each offset k, how often x[t - k] is x[t]; over positions t >= 33."""
    hits, total = 0, 0
    for row in x:
        last: dict[int, int] = {}
        for t in range(1, len(row)):
            if t >= 33 and row[t - 1] in last:
                hits += row[last[row[t - 1]] + 1] == row[t]
                total += 1
            last[row[t - 1]] = t - 1
    offsets = np.array([(x[:, 33:] == x[:, 33 - k : x.shape[1] - k]).mean() for k in range(1, 33)])
    return hits / total, offsets


def tokenized(tmp_path, **text) -> DataConfig:
    """The tokenizer stage's output for a text config, written where the stage would."""
    cfg = DataConfig(source="text", dir=str(tmp_path), eval_fraction=0.1,
                     text=TextDataConfig(**text), tokenizer=TokenizerConfig(vocab_size=400),
                     copies=CopiesConfig(rate=0.0))  # fmt: skip
    result, manifest = tokenizer.from_config(cfg, n_ctx=16)
    io.write_npy(tmp_path / "tok" / "tokens.npy", result.tokens)
    io.write_json(tmp_path / "tok" / "manifest.json", manifest)
    return cfg


def tokens_config(tmp_path, name: str = "ids.npy") -> DataConfig:
    return DataConfig(
        source="tokens", dir=str(tmp_path), eval_fraction=0.1, tokens=TokensDataConfig(path=name)
    )


N_CTX = 8


SHORT_MODEL = ModelConfig(n_ctx=N_CTX)  # a 64-token vocabulary


def token_file(tmp_path, copies: CopiesConfig) -> DataConfig:
    """Ids 0..49 four times, saved as a [20, 10] array: 200 tokens, the last 20 held out."""
    ids = (np.arange(200) % 50).astype(np.uint16).reshape(20, 10)
    np.save(tmp_path / "ids.npy", ids)
    return DataConfig(
        source="tokens", dir=str(tmp_path), eval_fraction=0.1, tokens=TokensDataConfig(path="ids.npy"),
        copies=copies,
    )  # fmt: skip


def write_tokenized(directory, tokens: np.ndarray, train_tokens: int):
    io.write_npy(directory / "tokens.npy", tokens)
    io.write_json(directory / "manifest.json", {"source": "text", "train_tokens": train_tokens, "vocab": 40})


def npy_with_a_long_error(path):
    """A .npy whose header names a dtype of 300 q's: numpy's message runs past 200 characters."""
    import struct

    header = ("{'descr': '" + "q" * 300 + "', 'fortran_order': False, 'shape': (3,)}").encode()
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0" * 24)
    with pytest.raises(ValueError) as numpy_says:
        np.load(path, mmap_mode="r", allow_pickle=False)
    first = str(numpy_says.value).splitlines()[0]
    assert len(first) > 200
    return first[:200]


def _runs(row: np.ndarray) -> list[int]:
    """The lengths of the runs of equal tokens in `row`, left to right."""
    cuts = [0, *(np.flatnonzero(row[1:] != row[:-1]) + 1).tolist(), len(row)]
    return [b - a for a, b in zip(cuts, cuts[1:], strict=False)]


def test_synthetic_is_seeded_and_in_range():
    a, b, c = synthetic(seed=0), synthetic(seed=0), synthetic(seed=1)
    assert a.shape == (2000, 64) and a.dtype == np.int64
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 64


def test_copies_repeat_the_token_distance_back():
    """rate 1, spans as long as the context: from position min_distance on, one copy
    runs whose distance can only be min_distance (the first position it may start)."""
    x = synthetic(n=50, rate=1.0, min_span=64, max_span=64, min_distance=3)
    assert np.array_equal(x[:, 3:], x[:, :-3])


def test_background_tokens_come_from_the_segment_topic():
    """No copies, one segment per sequence, always on topic: each sequence uses one topic."""
    x = synthetic(n=200, seed=5, rate=0.0, min_segment=64, max_segment=64, topic_fraction=1.0, topics=8)
    members, offsets, sizes = datasets._topics(64, 8, np.random.default_rng(5))  # the generator's first draw
    assert sorted(members.tolist()) == list(range(64)) and sizes.tolist() == [8] * 8
    topic_of = np.empty(64, dtype=int)
    for t, (o, n) in enumerate(zip(offsets, sizes, strict=True)):
        topic_of[members[o : o + n]] = t
    assert all(len(set(topic_of[row].tolist())) == 1 for row in x)
    assert len({topic_of[row[0]] for row in x}) == 8  # and every topic is used


def test_induction_predicts_far_better_than_any_fixed_offset():
    """So no purely positional head can fake an induction head on this data."""
    induction, offsets = _induction_and_offset_accuracy(synthetic(n=500))
    assert induction > 0.4
    assert offsets.max() < 0.2 and induction > 2.5 * offsets.max()


def test_synthetic_split_holds_out_the_first_sequences():
    cfg = DataConfig(n_train_sequences=400, eval_fraction=0.05)
    ds = datasets.load(cfg, MODEL, seed=3, n_eval=64)
    rows = datasets.synthetic_sequences(400, MODEL, cfg, np.random.default_rng(streams.seed_of(3, "data")))
    assert torch.equal(ds.eval, torch.from_numpy(rows[:20]))  # 5% of 400, fewer than n_eval
    assert torch.equal(ds.train.rows, torch.from_numpy(rows[20:]))
    assert torch.equal(datasets.load(cfg, MODEL, seed=3, n_eval=8, need_train=False).eval, ds.eval[:8])
    assert ds.heldout is None  # the probe of a synthetic source: uniformly random tokens
    assert ds.manifest["source"] == "synthetic" and ds.manifest["train_sequences"] == 380


def test_batches_are_seeded_rows():
    source = datasets.Rows(np.arange(40).reshape(10, 4))
    a = source.batch(6, torch.Generator().manual_seed(0))
    assert torch.equal(a, source.batch(6, torch.Generator().manual_seed(0)))
    assert a.shape == (6, 4) and torch.equal(a[:, 1] - a[:, 0], torch.ones(6, dtype=torch.long))


def test_text_source_reads_the_tokenizer_output_and_holds_out_its_tail(tmp_path):
    cfg = tokenized(tmp_path, corpus="kjv", max_chars=50_000)
    manifest = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    assert manifest["text"]["corpus"] == "kjv" and manifest["text"]["max_chars"] == 50_000
    model = ModelConfig(d_vocab=400, n_ctx=32)
    ds = datasets.load(cfg, model, seed=0, n_eval=8, tokenized=tmp_path / "tok")
    tokens = np.load(tmp_path / "tok" / "tokens.npy")
    cut = manifest["train_tokens"]
    assert torch.equal(ds.eval[0], torch.from_numpy(tokens[cut : cut + 32].astype(np.int64)))
    assert np.array_equal(ds.heldout, tokens[cut:]) and ds.manifest["vocab"] <= 400
    train = {tuple(tokens[i : i + 32]) for i in range(cut - 31)}
    batch = ds.train.batch(16, torch.Generator().manual_seed(0))
    assert all(tuple(row.tolist()) in train for row in batch)  # training windows come from before the cut
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, ModelConfig(d_vocab=100, n_ctx=32), 0, 8, tmp_path / "tok")
    assert (caught.value.where, caught.value.value) == ("model.d_vocab", 100)
    one_line(caught, tmp_path / "tok", "400")  # the tokenizer and its size
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, ModelConfig(d_vocab=400, n_ctx=8000, n_heads=1, d_head=8), 0, 8, tmp_path / "tok")
    one_line(caught, "n_ctx = 8000")


def test_copies_are_written_into_training_windows_only(tmp_path):
    cfg = tokenized(tmp_path, corpus="kjv", max_chars=50_000)
    copying = replace(cfg, copies=CopiesConfig(rate=1.0, min_span=32, max_span=32, min_distance=3))
    model = ModelConfig(d_vocab=400, n_ctx=32)
    plain = datasets.load(cfg, model, 0, 8, tmp_path / "tok")
    copied = datasets.load(copying, model, 0, 8, tmp_path / "tok")
    batch = copied.train.batch(16, torch.Generator().manual_seed(0))
    assert torch.equal(batch[:, 3:], batch[:, :-3])  # one copy at distance 3 from position 3 on
    assert torch.equal(plain.eval, copied.eval) and copied.manifest["copies"]["rate"] == 1.0


def test_the_copy_rate_falls_linearly_to_zero_over_the_annealed_part_of_training():
    copies = CopiesConfig(rate=0.1, anneal_start=0.5, anneal_end=0.75)
    rates = [datasets.copy_rate(copies, step, 100) for step in (0, 49, 50, 60, 74, 75, 99)]
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.06, 0.004, 0.0, 0.0])
    step_down = CopiesConfig(rate=0.1, anneal_start=0.75, anneal_end=0.75)
    assert [datasets.copy_rate(step_down, s, 100) for s in (74, 75)] == [0.1, 0.0]
    assert datasets.copy_rate(CopiesConfig(rate=0.1), 99, 100) == 0.1  # the default: copies throughout


def test_the_stream_counts_the_copied_tokens_it_writes(tmp_path):
    cfg = tokenized(tmp_path, corpus="kjv", max_chars=50_000)
    # rate 1, spans as long as the window from distance 3: exactly positions 3..31 are copies
    copying = replace(cfg, copies=CopiesConfig(rate=1.0, min_span=32, max_span=32, min_distance=3))
    stream = datasets.load(copying, ModelConfig(d_vocab=400, n_ctx=32), 0, 8, tmp_path / "tok").train
    gen = torch.Generator().manual_seed(0)
    stream.batch(16, gen)
    assert (stream.tokens_drawn, stream.tokens_copied) == (16 * 32, 16 * 29)
    before = gen.get_state()
    plain = stream.batch(16, gen, rate=0.0)  # annealed to zero: no copies, the same draws
    assert (stream.tokens_drawn, stream.tokens_copied) == (32 * 32, 16 * 29)
    gen.set_state(before)
    assert not torch.equal(plain[:, 3:], plain[:, :-3])
    assert torch.equal(plain, stream.batch(16, gen, rate=0.0))


def test_the_probe_repeats_held_out_spans_and_is_seeded(tmp_path):
    cfg = tokenized(tmp_path, corpus="kjv", max_chars=50_000)
    ds = datasets.load(cfg, ModelConfig(d_vocab=400, n_ctx=32), 0, 8, tmp_path / "tok", need_train=False)
    probe = datasets.repeated_probe(ds, 6, 10, 400, seed=3)
    assert probe.shape == (6, 21) and torch.equal(probe[:, 1:11], probe[:, 11:])
    held = ds.heldout.tolist()
    for row in probe.tolist():  # [first, span] is a stretch of held-out text
        assert any(held[i : i + 11] == row[:11] for i in range(len(held) - 10))
    assert torch.equal(probe, datasets.repeated_probe(ds, 6, 10, 400, seed=3))
    assert not torch.equal(probe, datasets.repeated_probe(ds, 6, 10, 400, seed=4))
    # each evaluation batch its own draws, and no seed's batch 1 is the next seed's batch 0
    assert not torch.equal(probe, datasets.repeated_probe(ds, 6, 10, 400, seed=3, batch=1))
    next_seed = datasets.repeated_probe(ds, 6, 10, 400, seed=4)
    assert not torch.equal(datasets.repeated_probe(ds, 6, 10, 400, seed=3, batch=1), next_seed)


def test_tokens_file_is_memory_mapped_with_a_manifest(tmp_path):
    ids = (np.arange(1000) % 50).astype(np.uint16)
    np.save(tmp_path / "ids.npy", ids)
    ds = datasets.load(tokens_config(tmp_path), ModelConfig(n_ctx=20), seed=0, n_eval=64)
    assert isinstance(ds.train.tokens, np.memmap)
    assert (
        ds.manifest["files"][0]["sha256"] == hashlib.sha256((tmp_path / "ids.npy").read_bytes()).hexdigest()
    )
    assert ds.manifest["train_tokens"] == 900 and ds.eval.shape == (5, 20)
    assert torch.equal(ds.eval[0], torch.from_numpy(ids[900:920].astype(np.int64)))
    assert ds.train.batch(4, torch.Generator().manual_seed(1)).dtype == torch.long


@pytest.mark.parametrize("source", ["tokens", "text"])
def test_training_never_sees_a_held_out_token(tmp_path, source):
    """Token ids 0..199 in order, the last 40 held out: every training window's largest id is
    159 (the last training token is reached), the held-out stream, its windows and the probe
    start at 160 (and the probe reaches its end)."""
    ids, cut = np.arange(200, dtype=np.uint16), 160
    if source == "tokens":
        np.save(tmp_path / "ids.npy", ids)
        cfg = replace(tokens_config(tmp_path), eval_fraction=0.2, copies=CopiesConfig(rate=0.0))
        tokenized_dir = None
    else:  # the tokenizer stage's output, written by hand
        tokenized_dir = tmp_path / "tok"
        io.write_npy(tokenized_dir / "tokens.npy", ids)
        io.write_json(tokenized_dir / "manifest.json", {"source": "text", "train_tokens": cut, "vocab": 200})
        cfg = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    ds = datasets.load(cfg, ModelConfig(d_vocab=256, n_ctx=8), seed=0, n_eval=64, tokenized=tokenized_dir)
    gen = torch.Generator().manual_seed(0)
    seen = torch.cat([ds.train.batch(32, gen) for _ in range(50)])  # 1,600 windows over 153 starts
    assert int(seen.max()) == cut - 1 and int(seen.min()) == 0
    assert int(ds.heldout[0]) == cut and len(ds.heldout) == 40
    assert torch.equal(ds.eval, torch.arange(cut, 200).view(5, 8))  # consecutive, non-overlapping
    probe = datasets.repeated_probe(ds, 500, 6, 256, seed=0)  # 500 spans over 34 possible starts
    assert int(probe.min()) == cut and int(probe[:, 0].max()) == 200 - 7  # the last span is drawn too


@pytest.mark.parametrize(
    "array,named",
    [
        (np.linspace(0, 1, 1000), ["float64"]),  # the dtype found
        (np.full(1000, 64), ["[64, 64]", "model.d_vocab = 64"]),  # the ids' span, the vocabulary
        (np.full(1000, -1), ["[-1, -1]", "model.d_vocab = 64"]),
    ],
    ids=["floats", "too-large", "negative"],
)
def test_bad_token_files_are_refused(tmp_path, array, named):
    np.save(tmp_path / "ids.npy", array)
    with pytest.raises(UserError) as caught:
        datasets.load(tokens_config(tmp_path), ModelConfig(n_ctx=20), seed=0, n_eval=4)
    assert caught.value.where.endswith("ids.npy")
    one_line(caught, *named)


def test_token_path_must_exist_inside_data_dir(tmp_path):
    with pytest.raises(UserError) as caught:
        datasets.load(tokens_config(tmp_path, "absent.npy"), MODEL, seed=0, n_eval=4)
    assert (caught.value.where, caught.value.value) == ("data.tokens.path", "absent.npy")
    one_line(caught, "data.dir")
    with pytest.raises(UserError) as caught:
        datasets.load(tokens_config(tmp_path, "../outside.npy"), MODEL, seed=0, n_eval=4)
    assert (caught.value.where, caught.value.value) == ("data.tokens.path", "../outside.npy")
    one_line(caught, "data.dir")


def test_an_unchecked_token_source_without_a_path_is_a_user_error():
    """The library refuses what config validation would have (a caller may skip `validate`)."""
    unchecked = DataConfig(source="tokens")  # tokens.path is None
    with pytest.raises(UserError) as caught:
        datasets.load(unchecked, ModelConfig(), seed=0, n_eval=4)
    assert caught.value.where == "data.tokens.path"
    one_line(caught, "data.source = 'tokens'")


def test_a_token_files_manifest_names_the_file_and_the_split(tmp_path):
    copies = CopiesConfig(rate=0.5, min_span=2, max_span=3, min_distance=2)
    ds = datasets.load(token_file(tmp_path, copies), SHORT_MODEL, seed=0, n_eval=64)
    path = tmp_path / "ids.npy"
    assert ds.manifest == {
        "source": "tokens",
        "dir": str(tmp_path),
        "files": [
            {
                "path": "ids.npy",
                "bytes": path.stat().st_size,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        ],
        "dtype": "uint16",
        "tokens": 200,
        "train_tokens": 180,
        "eval_tokens": 20,
        "copies": {"rate": 0.5, "min_span": 2, "max_span": 3, "min_distance": 2,
                   "anneal_start": 1.0, "anneal_end": 1.0},
    }  # fmt: skip
    # the [20, 10] array read as one stream: the held-out tail is ids 180..199 (mod 50)
    assert np.array_equal(ds.heldout, np.arange(180, 200) % 50)
    assert torch.equal(ds.eval, (torch.arange(180, 196) % 50).view(2, N_CTX))
    plain = datasets.load(token_file(tmp_path, CopiesConfig(rate=0.0)), SHORT_MODEL, seed=0, n_eval=64)
    assert "copies" not in plain.manifest and plain.manifest["eval_tokens"] == 20


def test_a_token_stream_writes_its_copies_into_training_windows(tmp_path):
    """rate 1, spans as long as the window, from distance 3: positions 3..7 of each window copy
    the token 3 back; 5 of its 8 tokens are copies."""
    copies = CopiesConfig(rate=1.0, min_span=N_CTX, max_span=N_CTX, min_distance=3)
    stream = datasets.load(token_file(tmp_path, copies), SHORT_MODEL, seed=0, n_eval=4).train
    assert stream.copies == copies
    batch = stream.batch(16, torch.Generator().manual_seed(0))
    assert torch.equal(batch[:, 3:], batch[:, :-3])
    assert (stream.tokens_drawn, stream.tokens_copied) == (16 * N_CTX, 16 * 5)


def test_evaluation_only_loading_builds_no_training_source(tmp_path):
    cfg = token_file(tmp_path, CopiesConfig(rate=0.0))
    assert datasets.load(cfg, SHORT_MODEL, seed=0, n_eval=4, need_train=False).train is None
    assert isinstance(datasets.load(cfg, SHORT_MODEL, seed=0, n_eval=4).train, datasets.Stream)
    tok = tmp_path / "tok"  # the tokenizer stage's output, written by hand
    io.write_npy(tok / "tokens.npy", np.arange(40, dtype=np.uint16))
    io.write_json(tok / "manifest.json", {"source": "text", "train_tokens": 30, "vocab": 40})
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    assert datasets.load(text, SHORT_MODEL, 0, 4, tokenized=tok, need_train=False).train is None
    assert isinstance(datasets.load(text, SHORT_MODEL, 0, 4, tokenized=tok).train, datasets.Stream)
    synthetic = DataConfig(n_train_sequences=20)
    assert datasets.load(synthetic, SHORT_MODEL, 0, 4, need_train=False).train is None
    assert isinstance(datasets.load(synthetic, SHORT_MODEL, 0, 4).train, datasets.Rows)


def test_the_probe_may_take_the_whole_held_out_stream_and_no_less():
    """A span of `length` needs length + 1 held-out tokens (the first token, then the span): with
    exactly that many every row is that stretch, span repeated; one fewer is refused by name."""
    gen = torch.Generator().manual_seed(0)
    probe = datasets.repeated_heldout_spans(np.arange(10, 15), 3, 4, gen)
    assert torch.equal(probe, torch.tensor([[10, 11, 12, 13, 14, 11, 12, 13, 14]] * 3))
    for short in (np.arange(4), np.arange(3)):
        with pytest.raises(UserError) as caught:
            datasets.repeated_heldout_spans(short, 3, 4, gen)
        assert caught.value.where == "held-out data"
        one_line(caught, f"{len(short)} tokens", "4")


def test_a_token_path_outside_data_dir_is_refused_with_the_path_as_given(tmp_path):
    """`..` may not climb out of data.dir: the message shows the relative path the config gave."""
    inside = tmp_path / "data"
    inside.mkdir()
    np.save(tmp_path / "outside.npy", np.arange(100, dtype=np.uint16))  # it exists: only its place is wrong
    cfg = DataConfig(source="tokens", dir=str(inside), tokens=TokensDataConfig(path="../outside.npy"))
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, SHORT_MODEL, seed=0, n_eval=4)
    assert (caught.value.where, caught.value.value) == ("data.tokens.path", "../outside.npy")
    one_line(caught, f"data.dir = {str(inside)!r}")


def test_one_training_window_and_one_held_out_window_are_enough():
    """n_ctx + 1 training tokens give one window and its next-token targets; n_ctx held-out tokens
    one evaluation window. One token fewer on either side is refused, naming both counts."""
    datasets._require_windows(9, 8, 8, "tokens.npy", "a hint")
    for n_train, n_held in ((8, 8), (9, 7)):
        with pytest.raises(UserError) as caught:
            datasets._require_windows(n_train, n_held, 8, "tokens.npy", "a hint")
        assert caught.value.where == "tokens.npy"
        one_line(caught, n_train, n_held, "n_ctx = 8", "a hint")


def test_text_source_at_the_edge_of_one_window_each_side(tmp_path):
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    write_tokenized(tmp_path / "tok", np.arange(17, dtype=np.uint16), 9)
    ds = datasets.load(text, SHORT_MODEL, 0, 4, tokenized=tmp_path / "tok")
    assert torch.equal(ds.eval, torch.arange(9, 17).view(1, N_CTX))
    windows = ds.train.batch(64, torch.Generator().manual_seed(0))
    assert {tuple(w) for w in windows.tolist()} == {tuple(range(8)), tuple(range(1, 9))}  # both starts
    write_tokenized(tmp_path / "tok", np.arange(16, dtype=np.uint16), 8)
    with pytest.raises(UserError) as caught:
        datasets.load(text, SHORT_MODEL, 0, 4, tokenized=tmp_path / "tok")
    assert caught.value.where == str(tmp_path / "tok" / "tokens.npy")
    one_line(caught, "8 training", "8 held-out", "n_ctx = 8", "model.n_ctx")  # the counts, and what to change


def test_an_unreadable_npy_is_named_with_the_first_200_characters_of_numpys_reason(tmp_path):
    tok = tmp_path / "tok"
    write_tokenized(tok, np.arange(17, dtype=np.uint16), 9)
    reason = npy_with_a_long_error(tok / "tokens.npy")
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    with pytest.raises(UserError) as caught:
        datasets.load(text, SHORT_MODEL, 0, 4, tokenized=tok)
    assert caught.value.where == str(tok / "tokens.npy")
    one_line(caught, f"({reason})")
    cfg = token_file(tmp_path, CopiesConfig(rate=0.0))
    npy_with_a_long_error(tmp_path / "ids.npy")
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, SHORT_MODEL, 0, 4)
    assert caught.value.where == str(tmp_path / "ids.npy")
    one_line(caught, f"({reason})")


def test_the_text_source_without_the_tokenizer_output_is_refused():
    text = DataConfig(source="text", copies=CopiesConfig(rate=0.0))
    with pytest.raises(UserError) as caught:
        datasets.load(text, SHORT_MODEL, seed=0, n_eval=4)
    assert (caught.value.where, caught.value.value) == ("data.source", "text")
    one_line(caught, "--tokenized")  # the argument that gives it


def test_synthetic_sequences_are_split_first_ones_held_out_with_a_manifest():
    """20 sequences, eval_fraction 0.05: one held out (at least one always is), 19 to train on;
    a single sequence leaves none to train on and is refused."""
    cfg = DataConfig(n_train_sequences=20)
    ds = datasets.load(cfg, SHORT_MODEL, seed=3, n_eval=4)
    assert ds.manifest == {
        "source": "synthetic", "seed": 3, "sequences": 20, "train_sequences": 19, "eval_sequences": 1,
        "synthetic": asdict(cfg.synthetic), "copies": asdict(cfg.copies),
    }  # fmt: skip
    assert ds.eval.shape == (1, N_CTX) and ds.train.rows.shape == (19, N_CTX) and ds.heldout is None
    with pytest.raises(UserError) as caught:
        datasets.load(DataConfig(n_train_sequences=1), SHORT_MODEL, seed=3, n_eval=4)
    assert (caught.value.where, caught.value.value) == ("data.n_train_sequences", 1)
    one_line(caught, "eval_fraction = 0.05")


def test_the_synthetic_probe_is_token_zero_then_a_random_span_twice():
    """[n, 1 + 2 * length]: a first token 0, then `length` uniform tokens, repeated."""
    probe = datasets.repeated_random_tokens(50, 6, 5, torch.Generator().manual_seed(0))
    assert probe.shape == (50, 13) and probe.dtype == torch.long
    assert torch.equal(probe[:, 0], torch.zeros(50, dtype=torch.long))
    assert torch.equal(probe[:, 1:7], probe[:, 7:])
    assert set(probe[:, 1:].unique().tolist()) == set(range(5))  # 300 draws reach each of 5 tokens
    synthetic = datasets.load(DataConfig(n_train_sequences=20), SHORT_MODEL, 0, 4, need_train=False)
    assert synthetic.heldout is None
    assert datasets.repeated_probe(synthetic, 50, 6, 5, seed=0).shape == (50, 13)


def test_token_ids_of_any_integer_dtype_come_back_as_int64():
    """uint16 (tokens.npy's dtype) in, torch.long / int64 out: the model's embedding takes long ids."""
    ids = (np.arange(40) % 7).astype(np.uint16).reshape(5, 8)
    rows = datasets.Rows(ids)
    assert rows.rows.dtype == torch.long and torch.equal(rows.rows, torch.from_numpy(ids.astype(np.int64)))
    assert rows.batch(3, torch.Generator().manual_seed(0)).dtype == torch.long
    copied, n = datasets.with_copies(ids, CopiesConfig(rate=0.0), np.random.default_rng(0))
    assert copied.dtype == np.int64 and np.array_equal(copied, ids) and n == 0


def test_a_token_file_too_short_for_a_held_out_window_is_refused_naming_the_file_and_eval_fraction(tmp_path):
    """200 tokens at eval_fraction 0.1: 180 to train on and 20 held out, one window of n_ctx 20
    each side (accepted), not of n_ctx 21 (refused, both counts and the fraction named)."""
    cfg = token_file(tmp_path, CopiesConfig(rate=0.0))
    ds = datasets.load(cfg, ModelConfig(n_ctx=20), seed=0, n_eval=4)
    assert torch.equal(ds.eval, (torch.arange(180, 200) % 50).view(1, 20))
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, ModelConfig(n_ctx=21), seed=0, n_eval=4)
    assert caught.value.where == str((tmp_path / "ids.npy").resolve())
    one_line(caught, "180 training", "20 held-out", "n_ctx = 21", "eval_fraction = 0.1")


def test_more_topics_than_the_vocabulary_is_refused_naming_both_values():
    """The library refuses it too (a caller may skip `validate`); as many topics as tokens is fine."""
    rng = np.random.default_rng(0)
    x = datasets.synthetic_sequences(
        3, SHORT_MODEL, DataConfig(synthetic=SyntheticDataConfig(topics=64)), rng
    )
    assert x.shape == (3, N_CTX) and x.dtype == np.int64
    with pytest.raises(UserError) as caught:
        datasets.synthetic_sequences(
            3, SHORT_MODEL, DataConfig(synthetic=SyntheticDataConfig(topics=65)), rng
        )
    assert (caught.value.where, caught.value.value) == ("data.synthetic.topics", 65)
    one_line(caught, "model.d_vocab = 64")


def test_a_stream_batch_with_copies_draws_everything_from_its_generator():
    """The windows' starts, then one 62-bit seed for the copies, both from the batch's generator
    (worked through here step by step); the global torch seed changes nothing."""
    copies = CopiesConfig(rate=0.5, min_span=2, max_span=3, min_distance=2)
    tokens = np.arange(200) % 50
    gen = torch.Generator().manual_seed(5)
    starts = torch.randint(0, 200 - N_CTX + 1, (16,), generator=gen).tolist()
    drawn = int(torch.randint(0, 2**62, (1,), generator=gen))
    windows = np.stack([tokens[s : s + N_CTX] for s in starts])
    expected, copied = datasets.with_copies(windows, copies, np.random.default_rng(drawn))
    assert copied > 0 and not np.array_equal(expected, windows)
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        stream = datasets.Stream(tokens, N_CTX, copies)
        batch = stream.batch(16, torch.Generator().manual_seed(5))
        assert torch.equal(batch, torch.from_numpy(expected))
        assert (stream.tokens_drawn, stream.tokens_copied) == (16 * N_CTX, copied)


def test_each_sequence_draws_its_own_copy_length():
    """Copies start in every sequence at the first position they may (rate 1 there, 0 after),
    all from min_distance 2 back: sequence i then copies exactly positions 2 .. 1 + L_i, where
    L_i, its own span length, is drawn per sequence from [1, 8]; over 400 sequences every length
    occurs (a length shared by all would be one value)."""
    n, T, d = 400, 16, 2
    copies = CopiesConfig(rate=1.0, min_span=1, max_span=8, min_distance=d)
    copier = datasets._Copier(n, copies, np.random.default_rng(0))
    x = np.zeros((n, T), dtype=np.int64)
    background = 1000 + np.arange(T)  # position t's own token, the same in every sequence
    counts = [copier.write(x, t, np.full(n, background[t]), 1.0 if t == d else 0.0) for t in range(T)]
    copied = x != background  # [n, T]: where a copied token was written
    lengths = copied.sum(axis=1)
    for row, length in zip(copied, lengths, strict=True):
        assert row.tolist() == [False] * d + [True] * length + [False] * (T - d - length)
    assert np.array_equal(x[:, d:][copied[:, d:]], x[:, :-d][copied[:, d:]])  # the token 2 back
    assert counts[:d] == [0] * d and sum(counts) == lengths.sum()
    assert sorted(set(lengths.tolist())) == list(range(1, 9))


def test_with_a_topic_per_token_each_background_segment_is_exactly_its_length_long():
    """As many topics as tokens puts each token in its own topic; with every background token
    on topic and no copies, a segment is one token repeated. Segments of exactly 3 positions then
    make positions 0-2, 3-5, 6-8, 9-11 each one token, a new topic drawn at 3, 6 and 9 (the same
    token again only when the draw repeats the topic, 1 in 64)."""
    n, T = 200, 12
    syn = SyntheticDataConfig(topics=64, min_segment=3, max_segment=3, topic_fraction=1.0)
    data = DataConfig(synthetic=syn, copies=CopiesConfig(rate=0.0))
    x = datasets.synthetic_sequences(n, ModelConfig(n_ctx=T), data, np.random.default_rng(0))
    starts = 3 * (np.arange(T) // 3)  # each position's segment start
    assert np.array_equal(x, x[:, starts])
    changed = x[:, [3, 6, 9]] != x[:, [2, 5, 8]]
    assert changed.mean() > 0.9


def test_each_sequence_draws_its_own_next_segment_length():
    """One token per topic (1024 of each), every background token on topic, no copies: a run of
    equal tokens is a segment, [1, 8] positions long. Sequences whose first segment has the same
    length start their second segment at the same position, and each draws its length itself:
    among each such group of about 50, the second segments take several lengths, and over all
    sequences every length 1 .. 8 occurs (one draw shared by a group would be one length)."""
    n, T = 400, 20
    syn = SyntheticDataConfig(topics=1024, min_segment=1, max_segment=8, topic_fraction=1.0)
    data = DataConfig(synthetic=syn, copies=CopiesConfig(rate=0.0))
    x = datasets.synthetic_sequences(n, ModelConfig(n_ctx=T, d_vocab=1024), data, np.random.default_rng(0))
    runs = [_runs(row) for row in x]
    second: dict[int, set[int]] = {}
    for r in runs:
        if r[0] <= 8 and r[1] <= 8:  # neither merged with the next segment (a repeated topic)
            second.setdefault(r[0], set()).add(r[1])
    assert sorted(second) == list(range(1, 9))
    assert all(len(lengths) >= 4 for lengths in second.values())
    assert sorted(set().union(*second.values())) == list(range(1, 9))


def test_a_stream_with_copies_at_rate_zero_takes_only_the_starts_from_its_generator():
    """Copies configured but at rate 0 (text and token streams' default) draw no seed for them: two
    batches are the first and second draws of starts, worked through here, and the generator is
    left exactly where those two draws leave it."""
    tokens = np.arange(200) % 50
    expected_gen = torch.Generator().manual_seed(7)
    first = torch.randint(0, 200 - N_CTX + 1, (4,), generator=expected_gen).tolist()
    second = torch.randint(0, 200 - N_CTX + 1, (4,), generator=expected_gen).tolist()
    gen = torch.Generator().manual_seed(7)
    stream = datasets.Stream(tokens, N_CTX, CopiesConfig(rate=0.0))
    for starts in (first, second):
        batch = stream.batch(4, gen)
        assert batch.tolist() == [[(s + i) % 50 for i in range(N_CTX)] for s in starts]
    assert torch.equal(gen.get_state(), expected_gen.get_state())
    assert (stream.tokens_drawn, stream.tokens_copied) == (2 * 4 * N_CTX, 0)


ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


@pytest.mark.parametrize("n_train, fraction, n", [(64, 0.05, 8), (64, 0.5, 8), (10, 0.05, 8), (1000, 0.1, 7)])
def test_held_out_sequences_are_the_datas(n_train, fraction, n):
    """The estimate's held-out batch has as many sequences as datasets.load gives the train and
    heads stages: at most the held-out part of the synthetic data."""
    cfg = cfg_of("setup=synthetic", f"data.n_train_sequences={n_train}", f"data.eval_fraction={fraction}")
    dataset = datasets.load(cfg.data, SMALL, 0, n, need_train=False)
    assert datasets.eval_count(cfg.data, n) == len(dataset.eval)


def test_a_token_files_held_out_sequences_are_at_most_the_estimates(tmp_path):
    """Text and token files: the estimate takes the `n` asked for, datasets.load gives at most that."""
    np.save(tmp_path / "tokens.npy", np.arange(2000) % SMALL.d_vocab)
    for fraction, n in [(0.05, 8), (0.5, 8), (0.05, 2)]:
        cfg = cfg_of(
            "data.source=tokens", f"data.dir={tmp_path}", "data.tokens.path=tokens.npy",
            f"data.eval_fraction={fraction}",
        )  # fmt: skip
        dataset = datasets.load(cfg.data, SMALL, 0, n, need_train=False)
        assert 0 < len(dataset.eval) <= datasets.eval_count(cfg.data, n) == n


def test_the_synthetic_data_is_every_sequence_and_the_generators_vectors_in_host_memory():
    """[N, n_ctx + 12] int64 and 3 vectors over the vocabulary; text and token files: nothing."""
    s = memory.Shape(SMALL)
    (term,) = datasets.synthetic_terms(s, DataConfig(n_train_sequences=64))
    assert term.bytes == 8 * (64 * (20 + 12) + 3 * 16) and term.host
    assert [x.key for x in term.sizes] == ["data.n_train_sequences", "model.n_ctx"]
    assert datasets.synthetic_terms(s, DataConfig(source="tokens")) == []
