"""`python -m pipeline.restore`'s keeping rule: the workspace's run is kept before an experiment
only when params.yaml holds the values dvc.lock ran with. (Getting a failed experiment's run
back, with the real DVC: tests/test_experiments.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline import restore
from pipeline.errors import UserError

LOCK = {
    "schema": "2.0",
    "stages": {
        "train@0": {"cmd": "x", "params": {"params.yaml": {"train.lr": 0.01, "model": {"n_heads": 2}}}},
        "compare": {"cmd": "y", "params": {"params.yaml": {"seeds": [0]}}},
        "tokenizer": {"cmd": "z"},  # reads no params
    },
}
PARAMS = {"model": {"n_heads": 2}, "train": {"lr": 0.01, "steps": 20}, "seeds": [0]}


def test_params_that_dvc_lock_ran_with():
    assert restore.ran_with(PARAMS, LOCK)
    assert restore.ran_with({**PARAMS, "train": {"lr": 0.01, "steps": 99}}, LOCK)  # a key no stage read
    assert not restore.ran_with({**PARAMS, "train": {"lr": 0.02, "steps": 20}}, LOCK)
    assert not restore.ran_with({**PARAMS, "model": {"n_heads": 4}}, LOCK)  # a whole section read
    assert not restore.ran_with({**PARAMS, "seeds": [0, 1]}, LOCK)
    assert not restore.ran_with({"model": {"n_heads": 2}, "seeds": [0]}, LOCK)  # train.lr missing
    assert restore.ran_with(PARAMS, {"schema": "2.0"})  # nothing has run: nothing disagrees


def workspace(root: Path, params: dict) -> Path:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/outputs/*\n!/outputs/summary.json\n")
    (root / "outputs").mkdir()
    (root / "outputs" / "summary.json").write_text('{"loss": 1}')
    (root / "outputs" / "model.bin").write_bytes(b"cached by DVC, not kept")
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    (root / "dvc.lock").write_text(yaml.safe_dump(LOCK))
    return root


def test_a_run_is_kept_whole_and_never_replaced_by_a_workspace_it_did_not_run(tmp_path):
    root = workspace(tmp_path, PARAMS)
    assert restore.keep(root)
    kept = root / restore.KEPT
    files = json.loads((kept / restore.MANIFEST).read_text())["files"]
    assert files == ["params.yaml", "dvc.lock", "outputs/summary.json"]
    assert all((kept / f).read_bytes() == (root / f).read_bytes() for f in files)
    # an experiment's params.yaml, written before it failed: not what dvc.lock ran with
    (root / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {"lr": 1e30, "steps": 20}}))
    (root / "outputs" / "summary.json").write_text('{"loss": 2}')
    assert not restore.keep(root)
    assert (kept / "outputs" / "summary.json").read_text() == '{"loss": 1}'
    assert yaml.safe_load((kept / "params.yaml").read_text()) == PARAMS


def test_nothing_to_keep_before_a_first_run_and_nothing_to_restore(tmp_path):
    root = workspace(tmp_path, PARAMS)
    (root / "dvc.lock").unlink()
    assert not restore.keep(root)
    with pytest.raises(UserError, match=rf"^{restore.KEPT}: "):
        restore.restore(root)
