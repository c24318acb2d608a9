"""pipeline/data/tokenizer.py: training or reading a tokenizer and splitting the tokens.

Learned from the training part alone and byte-stable, a pretrained tokenizer's size and failures,
a window on each side of the split, the manifest's counts."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace

import numpy as np
import pytest
from hub_cache import add_snapshot, word_level_tokenizer
from huggingface_hub import constants
from refusals import one_line

from pipeline.config import (
    DataConfig,
    TextDataConfig,
    TokenizerConfig,
)
from pipeline.data import corpus, tokenizer
from pipeline.errors import UserError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub reads in this process."""
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def tokenized_result(n_tokens: int, train_tokens: int) -> tokenizer.Tokenized:
    return tokenizer.Tokenized("{}", np.zeros(n_tokens, dtype=np.uint16), train_tokens, 0, 256)


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


class EncodeSpy:
    """A tokenizer that records how many lines each `encode_batch` call is given."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def encode_batch(self, lines, add_special_tokens):
        self.calls.append(len(lines))
        return self.tok.encode_batch(lines, add_special_tokens=add_special_tokens)

    def encode(self, line, add_special_tokens):
        return self.tok.encode(line, add_special_tokens=add_special_tokens)


class _FailsOnZ:
    """A stand-in tokenizer whose `encode` fails on any line containing 'z'."""

    def encode(self, line, add_special_tokens=True):
        if "z" in line:
            raise ValueError("\n")
        return line


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


def test_a_pretrained_tokenizer_of_65536_tokens_fits_and_65537_do_not(cache):
    words = [f"w{i}" for i in range(65537)]
    add_snapshot(cache, "org/full", {"tokenizer.json": word_level_tokenizer(words[:65536])})
    add_snapshot(cache, "org/over", {"tokenizer.json": word_level_tokenizer(words)})
    tok, record = tokenizer.pretrained("hf:org/full")
    assert tok.get_vocab_size() == 65536 and record["repo"] == "org/full"
    with pytest.raises(UserError) as caught:
        tokenizer.pretrained("hf:org/over")
    assert (caught.value.where, caught.value.value) == ("data.tokenizer.pretrained", "hf:org/over")
    one_line(caught, "65537", "65536")  # its size and the most that fit


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
    assert caught.value.where == str(path)
    one_line(caught, f"({reason})")  # the library's reason, its first 200 characters


def test_the_tokenizer_stage_requires_a_window_on_each_side_of_the_split():
    tokenizer.require_heldout(tokenized_result(17, 9), 0.1, 8)  # 9 training, 8 held-out: just enough
    refusals = {  # (tokens, training tokens): the numbers the refusal names
        (16, 8): ("8 tokens", "model.n_ctx + 1 = 9"),  # the training part, one training window
        (16, 9): ("7 tokens", "model.n_ctx = 8"),  # the held-out part, one evaluation window
        (9, 9): ("90%",),  # nothing after the split, and where the split falls
    }
    for (n, train_tokens), named in refusals.items():
        with pytest.raises(UserError) as caught:
            tokenizer.require_heldout(tokenized_result(n, train_tokens), 0.1, 8)
        assert (caught.value.where, caught.value.value) == ("data.eval_fraction", 0.1)
        one_line(caught, *named)


def test_the_written_tokenizer_json_is_pretty_printed():
    """tokenizer.json as the tokenizers library pretty-prints it (indented, a key a line)."""
    from tokenizers import Tokenizer

    result = tokenizer.tokenize("in the beginning\ngod created\nthe heaven\n", 256, 0.3)
    assert result.tokenizer_json == Tokenizer.from_str(result.tokenizer_json).to_str(pretty=True)
    assert result.tokenizer_json.count("\n") > 10


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


def test_a_pretrained_tokenizers_failing_line_is_shown_stripped_and_cut_at_60_characters():
    from tokenizers import Tokenizer

    words = ["in", "the", "beginning", "god", "created", "and", "earth"]
    tok = Tokenizer.from_str(word_level_tokenizer(words).decode())
    line = "   in the beginning god created the heaven and the earth and the earth\n"
    shown = "in the beginning god created the heaven and the earth and th"
    assert len(shown) == 60
    with pytest.raises(UserError) as caught:
        tokenizer.encode(tok, ["in the beginning\n", line, "heaven\n"], "hf:org/words")
    assert (caught.value.where, caught.value.value) == ("data.tokenizer.pretrained", "hf:org/words")
    assert one_line(caught, f"(on the line {shown!r})").endswith(f"{shown!r})")  # stripped, 60 characters


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
    assert (caught.value.where, caught.value.value) == ("data.text.glob", "*.txt")
    one_line(caught)
    monkeypatch.setattr(corpus, "read_corpus", lambda name: (" \n \n", {"corpus": name}))
    named = DataConfig(source="text", text=TextDataConfig(corpus="kjv"))
    with pytest.raises(UserError) as caught:
        tokenizer.from_config(named, n_ctx=8)
    assert (caught.value.where, caught.value.value) == ("data.text.corpus", "kjv")
    one_line(caught)


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
    assert (caught.value.where, caught.value.value) == ("data.tokenizer.pretrained", "hf:org/a")
    one_line(caught, "(on the line 'b')")  # a held-out line, found before any training line is encoded
    assert spy.calls == [200, 60]


def test_a_pretrained_tokenizer_failing_with_an_empty_message_is_named_by_the_errors_type():
    """tokenizers' message is blank ("\\n"): the reason is the exception's type name, ValueError,
    then the first failing line, stripped."""
    error = tokenizer._cannot_encode(
        _FailsOnZ(), ["ok\n", " zebra \n", "zz\n"], "hf:org/name", ValueError("\n")
    )
    assert (error.where, error.value) == ("data.tokenizer.pretrained", "hf:org/name")
    one_line(error, "ValueError", "(on the line 'zebra')")  # the error's type where it says nothing
