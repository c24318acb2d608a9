"""The compare stage's reader (pipeline/compare/read.py): a seed's files into their own fields."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import synthetic_seeds as syn


def test_a_seeds_files_are_read_into_their_own_fields(tmp_path):
    """synthetic_seeds' tables written where the stages write them, read back by the compare
    stage's reader: each file in its own field, invariant.csv's rows as variant "invariant"."""
    from pipeline.compare import read

    dirs = syn.write_stage_outputs(tmp_path, [1])
    got = read.read_seed(1, dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    want = syn.seed_inputs(1)

    def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b[list(a.columns)].reset_index(drop=True),
                                      check_dtype=False)  # fmt: skip

    order = ["variant", "kind", "src_head", "dst_head"]
    same(got.scores.sort_values(order), want.scores.sort_values(order))
    assert set(got.scores["variant"]) == set(syn.MEASURES)
    same(got.placebo, want.placebo)
    assert got.placebo["discovery"].sum() == 1 and (got.placebo["dst_layer"] == 0).all()
    same(got.heads, want.heads)
    same(got.curve, want.curve)
    same(got.steps, want.steps)
    assert got.agreement == json.loads(json.dumps(want.agreement))
    assert got.metrics == pytest.approx(want.metrics)
