"""stages/composition.py and stages/weights.py: the composition stage writes invariant.csv and its
summary for a planted model; the weights stage records every step and writes byte-identical
files when run again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import planted
from models import random_model

from pipeline import checkpoint
from pipeline.circuits import weights
from pipeline.circuits.invariant import COLUMNS
from pipeline.model import tl_checkpoint
from pipeline.tables import SIGNIFICANCE_COLUMNS


def test_stage_writes_invariant_csv_and_its_summary(tmp_path):
    from pipeline import params
    from stages import composition as stage

    ROOT = Path(__file__).resolve().parents[1]
    (tmp_path / "params.yaml").write_text(
        params.dump(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"))
    )
    hw = weights.from_state_dict(planted.state_dict())
    weights.save(
        tmp_path / "heads.safetensors",
        hw,
        {"config": json.dumps({"positional_embedding_type": "shortformer"})},
    )
    out = tmp_path / "out"
    args = ["--params", str(tmp_path / "params.yaml"), "--weights", str(tmp_path / "heads.safetensors")]
    assert stage.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "invariant.csv")
    assert list(table.columns) == [*COLUMNS, *SIGNIFICANCE_COLUMNS] and len(table) == 27
    summary = json.loads((out / "summary.json").read_text())
    assert summary["K"]["invariant"]["max_pair"] == "L0H0->L1H0" and "true" in summary["K"]


def test_weights_stage_records_every_step(tmp_path):
    from stages import weights as stage

    model = random_model("layernorm", positional_embedding_type="shortformer")
    checkpoint.save_state(tmp_path / "model.safetensors", model.float().state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(model.cfg)))
    params = tmp_path / "params.yaml"
    from pipeline import params as params_mod

    params.write_text(
        params_mod.dump(params_mod.compose(conf_dir=Path(__file__).resolve().parents[1] / "conf"))
    )
    for out in ("out", "again"):
        code = stage.main(
            [
                "--model",
                str(tmp_path / "model.safetensors"),
                "--config",
                str(tmp_path / "config.json"),
                "--out",
                str(tmp_path / out),
                "--params",
                str(params),
            ]
        )
        assert code == 0
    for name in ("heads.safetensors", "summary.json"):  # byte-identical when run again
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    hw, meta = weights.load(tmp_path / "out" / "heads.safetensors")
    assert json.loads(meta["steps"]) == summary["steps"] and len(summary["steps"]) >= 4
    state, _ = checkpoint.load_state(tmp_path / "out" / "heads.safetensors")
    assert "blocks.0.attn.pos_Q" in state and hw.n_heads == model.cfg.n_heads
