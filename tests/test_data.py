"""Data sources: the synthetic process has the structure it promises (known answers,
and induction predicts it far better than any fixed offset); text and token files are
read as documented, with sha256 manifests and a held-out tail; bad inputs name the key."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline import data
from pipeline.config import DataConfig, ModelConfig, SyntheticDataConfig, TextDataConfig, TokensDataConfig
from pipeline.errors import UserError

MODEL = ModelConfig()  # 64 tokens of context, 64-token vocabulary


def synthetic(n: int = 2000, seed: int = 0, model: ModelConfig = MODEL, **changes) -> np.ndarray:
    cfg = DataConfig(synthetic=replace(SyntheticDataConfig(), **changes))
    return data.synthetic_sequences(n, model, cfg, np.random.default_rng(seed))


def test_synthetic_is_seeded_and_in_range():
    a, b, c = synthetic(seed=0), synthetic(seed=0), synthetic(seed=1)
    assert a.shape == (2000, 64) and a.dtype == np.int64
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 64


def test_copies_repeat_the_token_distance_back():
    """copy_rate 1, spans as long as the context: from position min_distance on, one copy
    runs whose distance can only be min_distance (the first position it may start)."""
    x = synthetic(n=50, copy_rate=1.0, min_span=64, max_span=64, min_distance=3)
    assert np.array_equal(x[:, 3:], x[:, :-3])


def test_background_tokens_come_from_the_segment_topic():
    """No copies, one segment per sequence, always on topic: each sequence uses one topic."""
    x = synthetic(n=200, seed=5, copy_rate=0.0, min_segment=64, max_segment=64, topic_fraction=1.0, topics=8)
    members, offsets, sizes = data._topics(64, 8, np.random.default_rng(5))  # the generator's first draw
    assert sorted(members.tolist()) == list(range(64)) and sizes.tolist() == [8] * 8
    topic_of = np.empty(64, dtype=int)
    for t, (o, n) in enumerate(zip(offsets, sizes)):
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
    ds = data.load(cfg, MODEL, seed=3, n_eval=64)
    rows = data.synthetic_sequences(400, MODEL, cfg, np.random.default_rng(3))
    assert torch.equal(ds.eval, torch.from_numpy(rows[:20]))  # 5% of 400, fewer than n_eval
    assert torch.equal(ds.train.rows, torch.from_numpy(rows[20:]))
    assert torch.equal(data.eval_sequences(cfg, MODEL, seed=3, n=8), ds.eval[:8])
    assert ds.manifest["source"] == "synthetic" and ds.manifest["train_sequences"] == 380


def test_batches_are_seeded_rows():
    source = data.Rows(np.arange(40).reshape(10, 4))
    a = source.batch(6, torch.Generator().manual_seed(0))
    assert torch.equal(a, source.batch(6, torch.Generator().manual_seed(0)))
    assert a.shape == (6, 4) and torch.equal(a[:, 1] - a[:, 0], torch.ones(6, dtype=torch.long))


def text_config(tmp_path, glob: str = "**/*.txt", eval_fraction: float = 0.25) -> DataConfig:
    return DataConfig(
        source="text", dir=str(tmp_path), eval_fraction=eval_fraction, text=TextDataConfig(glob=glob)
    )


def test_text_is_bytes_in_sorted_file_order_with_a_sha256_manifest(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.txt").write_bytes(bytes(range(100, 200)))
    (tmp_path / "a.txt").write_bytes(bytes(range(0, 100)))
    (tmp_path / "skip.md").write_text("not matched")
    model = ModelConfig(d_vocab=256, n_ctx=16)
    ds = data.load(text_config(tmp_path), model, seed=0, n_eval=64)
    assert [f["path"] for f in ds.manifest["files"]] == ["a.txt", "b/two.txt"]
    assert ds.manifest["files"][0]["sha256"] == hashlib.sha256(bytes(range(100))).hexdigest()
    assert ds.manifest["tokens"] == 200 and ds.manifest["eval_tokens"] == 50
    assert torch.equal(ds.eval[0], torch.arange(150, 166))  # the held-out tail, in windows of n_ctx
    assert ds.eval.shape == (3, 16)
    batch = ds.train.batch(32, torch.Generator().manual_seed(0))
    assert batch.shape == (32, 16) and batch.max() < 150  # training never sees the tail
    assert torch.equal(batch[:, 1:] - batch[:, :-1], torch.ones(32, 15, dtype=torch.long))


def test_text_needs_a_byte_vocabulary_and_matching_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 100)
    with pytest.raises(UserError, match="model.d_vocab = 64"):
        data.load(text_config(tmp_path), MODEL, seed=0, n_eval=4)
    with pytest.raises(UserError, match=r"data.text.glob = '\*.md': matches no files"):
        data.load(text_config(tmp_path, "*.md"), ModelConfig(d_vocab=256, n_ctx=16), seed=0, n_eval=4)
    with pytest.raises(UserError, match="too few for n_ctx = 64"):
        data.load(text_config(tmp_path), ModelConfig(d_vocab=256), seed=0, n_eval=4)


def tokens_config(tmp_path, name: str = "ids.npy") -> DataConfig:
    return DataConfig(
        source="tokens", dir=str(tmp_path), eval_fraction=0.1, tokens=TokensDataConfig(path=name)
    )


def test_tokens_file_is_memory_mapped_with_a_manifest(tmp_path):
    ids = (np.arange(1000) % 50).astype(np.uint16)
    np.save(tmp_path / "ids.npy", ids)
    ds = data.load(tokens_config(tmp_path), ModelConfig(n_ctx=20), seed=0, n_eval=64)
    assert isinstance(ds.train.tokens, np.memmap)
    assert (
        ds.manifest["files"][0]["sha256"] == hashlib.sha256((tmp_path / "ids.npy").read_bytes()).hexdigest()
    )
    assert ds.manifest["train_tokens"] == 900 and ds.eval.shape == (5, 20)
    assert torch.equal(ds.eval[0], torch.from_numpy(ids[900:920].astype(np.int64)))
    assert ds.train.batch(4, torch.Generator().manual_seed(1)).dtype == torch.long


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
        data.load(tokens_config(tmp_path), ModelConfig(n_ctx=20), seed=0, n_eval=4)


def test_token_path_must_exist_inside_data_dir(tmp_path):
    with pytest.raises(UserError, match="data.tokens.path"):
        data.load(tokens_config(tmp_path, "absent.npy"), MODEL, seed=0, n_eval=4)
    with pytest.raises(UserError, match="inside data.dir"):
        data.load(tokens_config(tmp_path, "../outside.npy"), MODEL, seed=0, n_eval=4)


def test_too_many_topics_is_refused():
    with pytest.raises(UserError, match="data.synthetic.topics"):
        synthetic(n=2, topics=65)
