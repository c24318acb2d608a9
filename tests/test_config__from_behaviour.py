"""pipeline/config.py: the training schedule's checkpoint steps and the train group's checks."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from refusals import one_line

from pipeline import params
from pipeline.config import TrainConfig
from pipeline.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_steps_are_the_periodic_the_listed_and_the_last():
    t = TrainConfig(steps=25, save_every=10, save_steps=[3, 10, 17])
    assert t.checkpoint_steps() == [0, 3, 10, 17, 20, 25]
    assert TrainConfig(steps=25, save_every=0, save_steps=[]).checkpoint_steps() == [25]  # the final model
    assert TrainConfig(steps=20, save_every=10).checkpoint_steps() == [0, 10, 20]  # the last only once


def test_the_shipped_schedules_are_denser_where_induction_forms():
    shipped = ((["setup=synthetic"], (200, 900)), (["setup=code"], (300, 1400)), ([], (950, 1750)))
    for overrides, dense in shipped:
        t = params.compose(overrides, conf_dir=ROOT / "conf")["train"]
        steps = TrainConfig(steps=t["steps"], save_every=t["save_every"], save_steps=t["save_steps"])
        gaps = pd.Series(steps.checkpoint_steps()).diff().dropna()
        inside = [s for s in steps.checkpoint_steps() if dense[0] <= s <= dense[1]]
        assert gaps.max() == t["save_every"] and pd.Series(inside).diff().dropna().eq(50).all()


def test_checkpoint_suffix_is_validated():
    with pytest.raises(UserError) as caught:
        params.from_dict(
            params.compose(["train=load", "train.checkpoint=model.ckpt"], conf_dir=ROOT / "conf")
        )
    one_line(caught, "train.checkpoint", "'model.ckpt'")  # the override's key and value


def test_an_unknown_precision_is_refused_by_the_config():
    with pytest.raises(UserError) as caught:
        TrainConfig(precision="fp16").validate()
    assert (caught.value.where, caught.value.value) == ("precision", "fp16")
    one_line(caught, "float32, tf32, bf16")  # the choices
