"""pipeline/behaviour/channel_check.py: the heads stage's cut of a degenerate block's named top channel
(the whole block pair) has the same effects whatever directions the SVD chose within the block,
while cutting one direction of it moves with them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from block_models import EXACT, NAMED, PAIR, block_model, heads_of, rows_and_tables, turn
from models import F64

from pipeline.behaviour import ablation, channel_check
from pipeline.circuits.weights import HeadWeights
from pipeline.tables import CHANNELS_COLUMNS


@pytest.fixture(scope="module")
def text() -> torch.Tensor:
    return torch.randint(0, 20, (32, 16), generator=torch.Generator().manual_seed(3))


def channels_csv(hw: HeadWeights) -> pd.DataFrame:
    """channels.csv's rows of the weights with 0.0 -> 1.0 (K) the one discovered pair."""
    rows, _ = rows_and_tables(hw)
    rows["pair_discovery"] = (rows["kind"] == "K") & (rows[PAIR] == [0, 0, 1, 0]).all(axis=1)
    for column in CHANNELS_COLUMNS:
        rows[column] = rows[column] if column in rows else np.nan
    return rows[list(CHANNELS_COLUMNS)]


def test_the_channel_ablation_of_a_degenerate_block_is_the_same_whatever_its_directions(text) -> None:
    """The heads stage's cut of the named top channel (`channel_check.cuts`: the whole block pair),
    from the weights and from the weights turned within the blocks: the same effects to float64
    precision; cutting one direction of the block instead moves with the turn."""
    d = 4
    models = [
        block_model(EXACT, torch.eye(d, dtype=F64), torch.eye(d, dtype=F64)),
        block_model(EXACT, turn(d, 0, 0.7), turn(d, 1, 1.1)),
    ]
    effects, single = [], []
    for model in models:
        hw = heads_of(model)
        pairs = channel_check.discovered(channels_csv(hw))
        assert pairs[NAMED].values.tolist() == [[0, 0, 2, 1]]
        (cut,) = channel_check.cuts(hw, pairs)
        assert tuple(cut.w.shape) == (hw.d_model, 2) and tuple(cut.k.shape) == (hw.d_model, 1)
        effects.append(ablation.channel_ablation(model, text, [cut], None).iloc[0])
        one = ablation.ChannelCut(cut.src, cut.dst, cut.w[:, 0], cut.k[:, 0])  # direction 0 of the block
        single.append(ablation.channel_ablation(model, text, [one], None).iloc[0])
    assert effects[0]["pattern_effect"] > 1e-3
    for column in ("loss_effect", "pattern_effect"):
        assert effects[1][column] == pytest.approx(effects[0][column], rel=1e-10, abs=1e-14)
    assert (
        abs(single[1]["pattern_effect"] - single[0]["pattern_effect"]) > 1e-3 * effects[0]["pattern_effect"]
    )
