"""pipeline/model/origin.py: where a run's model comes from, and refusals naming train.checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dvc_repo import TINY_TRAIN as TINY
from models import random_model
from refusals import one_line

from pipeline import params
from pipeline.config import ModelConfig, TrainConfig
from pipeline.errors import UserError
from pipeline.model import origin, tl_checkpoint
from stages import origin as origin_stage

ROOT = Path(__file__).resolve().parents[1]


STANDARD = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="standard", normalization_type=None,
)  # fmt: skip


def test_a_load_without_a_checkpoint_is_refused_naming_train_checkpoint():
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(replace(TrainConfig(), checkpoint=None), 0)
    assert caught.value.where == "train.checkpoint"
    one_line(caught, "train.source = 'load'")


def test_a_checkpoint_that_is_not_there_is_refused_naming_train_checkpoint_and_the_path_it_looked_at(
    tmp_path,
):
    t = replace(
        TrainConfig(), source="load", checkpoint_dir=str(tmp_path), checkpoint="s{seed}/m.safetensors"
    )
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(t, 3)
    assert (caught.value.where, caught.value.value) == ("train.checkpoint", "s{seed}/m.safetensors")
    one_line(caught, tmp_path / "s3" / "m.safetensors", f"train.checkpoint_dir = {str(tmp_path)!r}")


def test_a_snapshot_file_missing_from_the_hugging_face_cache_is_refused_with_the_download_command(
    tmp_path, monkeypatch
):
    """origin.json names a snapshot this machine's cache does not hold: one line naming the file
    where the cache would keep it and the `hf download` that fetches that commit."""
    monkeypatch.setattr(origin.hub, "cache_dir", lambda: tmp_path)
    snap = {"repo": "org/tiny", "revision": "main", "commit": "abc123"}
    chosen = {
        "source": "load",
        "hub": snap,
        "checkpoint": {"path": "model.safetensors", "sha256": "0" * 64},
        "config": {"path": "config.json", "sha256": "0" * 64},
    }
    with pytest.raises(UserError) as caught:
        origin.checked(chosen)
    where = tmp_path / "models--org--tiny" / "snapshots" / "abc123" / "model.safetensors"
    assert caught.value.where == str(where)
    one_line(caught, "`hf download org/tiny --revision abc123`")  # the command that fetches it


def test_load_refuses_missing_and_outside_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    cfg = params.from_dict(
        params.compose(
            [*TINY, "train=load", "train.checkpoint='seed{seed}/model.safetensors'"], conf_dir=ROOT / "conf"
        )
    )
    with pytest.raises(UserError) as caught:
        origin.choose(cfg.train, 3)
    assert caught.value.where == "train.checkpoint"
    one_line(caught, "checkpoints/seed3/model.safetensors")
    outside = replace(cfg.train, checkpoint="../elsewhere.safetensors")
    with pytest.raises(UserError) as caught:
        origin.choose(outside, 0)
    assert (caught.value.where, caught.value.value) == ("train.checkpoint", "../elsewhere.safetensors")
    one_line(caught, "train.checkpoint_dir")


def test_train_checkpoint_may_name_a_saved_models_directory(tmp_path):
    model = random_model(STANDARD)
    tl_checkpoint.write_bridge_checkpoint(tmp_path / "seed0", model.cfg, model.state_dict())
    (tmp_path / "empty").mkdir()
    t = TrainConfig(source="load", checkpoint="seed{seed}", checkpoint_dir=str(tmp_path))
    assert origin.checkpoint_path(t, 0) == tmp_path / "seed0" / "model.safetensors"
    chosen = origin.choose(t, 0)
    assert chosen["config"]["path"] == str(tmp_path / "seed0" / "config.json")
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(replace(t, checkpoint="empty"), 0)
    assert (caught.value.where, caught.value.value) == ("train.checkpoint", "empty")
    one_line(caught, tmp_path / "empty", "model.safetensors")


def test_a_bridge_directory_named_as_train_checkpoint_is_composed_recorded_and_loaded(tmp_path):
    """docs/public-models.md: `train.checkpoint` may name the directory holding a bridge's
    model.safetensors and config.json. `python -m pipeline.params` accepts it (its value and its
    files), the origin stage records the files in it, and the train stage loads the same model."""
    from dvc_repo import TINY

    from pipeline import params
    from stages import train as train_stage

    model = random_model(STANDARD, dtype=torch.float32)
    tl_checkpoint.write_bridge_checkpoint(tmp_path / "checkpoints" / "bridge", model.cfg, model.state_dict())
    load = ["train=load", "train.checkpoint=bridge", f"train.checkpoint_dir={tmp_path / 'checkpoints'}"]
    p = tmp_path / "params.yaml"
    assert params.main([*TINY, *load, "--conf", str(ROOT / "conf"), "--out", str(p)]) == 0
    assert origin_stage.main(["--params", str(p), "--seed", "0", "--out", str(tmp_path / "origin")]) == 0
    chosen = json.loads((tmp_path / "origin" / "origin.json").read_text())
    assert chosen["checkpoint"]["path"] == str(tmp_path / "checkpoints" / "bridge" / "model.safetensors")
    origin_json = str(tmp_path / "origin" / "origin.json")
    assert train_stage.main(["--params", str(p), "--seed", "0", "--origin", origin_json,
                             "--out", str(tmp_path / "train"), "--no-progress"]) == 0  # fmt: skip
    loaded = tl_checkpoint.load_model(
        tmp_path / "train" / "model.safetensors", tmp_path / "train" / "config.json"
    )
    tokens = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
