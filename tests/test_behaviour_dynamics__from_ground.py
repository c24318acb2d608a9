"""dynamics.run refuses a checkpoint's shape whose analysis cannot fit before it reads the
checkpoints or the data (pipeline/behaviour/dynamics.py, through heads.require_shape_fits); the
pair it follows through training."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from pipeline import checkpoint, memory, params
from pipeline.behaviour import dynamics
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)


def test_the_dynamics_library_refuses_a_shape_before_reading_checkpoints_or_data(tmp_path, monkeypatch):
    """dynamics.run checks the shape as the heads stage does, after the index and before the
    checkpoints (an empty file here: reading it would fail otherwise) and the data."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    (tmp_path / checkpoint.step_file(0)).write_bytes(b"")
    index = {"checkpoints": [{"step": 0, "tokens": 0, "file": checkpoint.step_file(0)}]}
    (tmp_path / checkpoint.INDEX).write_text(json.dumps(index))
    config = tmp_path / "config.json"  # a model whose analysis needs terabytes (its n_ctx)
    config.write_text(json.dumps(tl_checkpoint.tl_config(replace(SMALL, n_ctx=10**7))))
    cfg = params.from_dict(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"), "params.yaml")
    with pytest.raises(UserError) as e:
        dynamics.run(tmp_path, config, cfg, seed=0)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7
    assert memory.human(8e9) in str(e.value) and "\n" not in str(e.value)  # against the memory given


# --- dynamics: the pair followed through training -----------------------------------------


def test_the_top_pairs_source_is_in_an_earlier_layer():
    """The best induction head of layers >= 1 (1.1), and the best previous-token head of the layers
    before it: 0.1, although 1.0's previous-token score is higher."""
    from pipeline.behaviour import dynamics

    final = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "prev_token": [0.2, 0.6, 0.9, 0.0],
                          "induction": [0.9, 0.0, 0.1, 0.8]})  # fmt: skip
    assert dynamics.top_pair(final) == {"src": [0, 1], "dst": [1, 1]}
