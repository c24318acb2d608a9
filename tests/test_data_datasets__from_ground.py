"""The data's memory term and held-out count (pipeline/data/datasets.py, `synthetic_terms`,
`eval_count`): as many held-out sequences as `load` gives, the synthetic data's bytes and keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline import memory, params
from pipeline.config import DataConfig, ModelConfig
from pipeline.data import datasets

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
