"""pipeline/api.py on a TransformerLens 4.x bridge (`interop4`, in .venv-tl4): the notebook API's
tables and summary equal the weights and composition stages' files, byte for byte."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from models import random_model
from tl_oracle import bridge_of

from pipeline import checkpoint, io, params
from pipeline.model import tl_checkpoint
from stages import composition as composition_stage
from stages import weights as weights_stage

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@pytest.mark.interop4
def test_the_api_on_a_bridge_equals_the_composition_stages_files(tmp_path, bridge_class):
    """The same weights through the weights and composition stages (their entry points, on
    params.yaml's analysis settings) and through `api.composition` on a bridge holding them:
    every table and the summary written by the same writer, byte for byte."""
    from pipeline import api  # the notebook API's module, imported where it is tested

    model = random_model(replace(random_model("tiny").cfg, positional_embedding_type="standard"), seed=7)
    model = model.float()
    train = tmp_path / "train"
    checkpoint.save_state(io.ensure_dir(train) / "model.safetensors", model.state_dict())
    io.write_json(train / "config.json", tl_checkpoint.tl_config(model.cfg))
    argv = ["--params", str(PARAMS), "--model", str(train / "model.safetensors")]
    argv += ["--config", str(train / "config.json")]
    assert weights_stage.main([*argv, "--out", str(tmp_path / "weights")]) == 0
    heads = str(tmp_path / "weights" / "heads.safetensors")
    stage = tmp_path / "composition"
    assert (
        composition_stage.main(
            ["--params", str(PARAMS), "--weights", heads, "--seed", "3", "--out", str(stage)]
        )
        == 0
    )

    result = api.composition(bridge_of(bridge_class, model), seed=3, config=params.load(PARAMS))
    mine = tmp_path / "api"
    for name in ("scores", "invariant", "projection", "placebo", "channels", "channels_placebo"):
        io.write_csv(mine / f"{name}.csv", getattr(result, name))
        assert (mine / f"{name}.csv").read_bytes() == (stage / f"{name}.csv").read_bytes(), name
    io.write_json(mine / "summary.json", result.summary)
    assert (mine / "summary.json").read_bytes() == (stage / "summary.json").read_bytes()
