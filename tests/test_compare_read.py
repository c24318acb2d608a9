"""pipeline/compare/read.py: reading one seed's stage outputs for the compare stage.

Each table and summary entry read or refused naming the file and the key, and the seed
directories of seeds not listed."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import synthetic_seeds as syn
from refusals import one_line

from pipeline.compare import read
from pipeline.errors import UserError

PATH = Path("outputs/heads/seed0/summary.json")


def test_stale_seed_dirs(tmp_path):
    for name in ("seed0", "seed1", "seed10", "seedX"):
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "train" / "seed3").write_text("a file, not a seed directory")
    stale = read.stale_seed_dirs([tmp_path / "train", tmp_path / "missing"], [0])
    assert [p.name for p in stale] == ["seed1", "seed10"]


def test_channel_ablation_entry_is_read_or_refused_by_name():
    assert read._channel_ablation({}, PATH) == {}
    assert read._channel_ablation({"channel_ablation": {}}, PATH) == {}
    entry = {"pairs": [], "median_causal_share": 0.5}
    assert read._channel_ablation({"channel_ablation": entry}, PATH) is entry
    for bad in ({"pairs": "none"}, {"median_causal_share": 0.5}, [1, 2], "pairs"):
        with pytest.raises(UserError) as caught:
            read._channel_ablation({"channel_ablation": bad}, PATH)
        assert caught.value.where == f"{PATH}: channel_ablation"
        one_line(caught, "pairs", "median_causal_share")  # the keys it must hold


def test_every_table_of_a_seed_must_have_a_row(tmp_path):
    """A stage's table always has a row: each of the seven, cut to its header, is refused by path."""

    dirs = syn.write_stage_outputs(tmp_path, [1])
    tables = [dirs["train"] / "seed1" / "curve.tsv", dirs["heads"] / "seed1" / "heads.csv",
              dirs["dynamics"] / "seed1" / "steps.tsv"] + [
        dirs["composition"] / "seed1" / name
        for name in ("scores.csv", "invariant.csv", "placebo.csv", "channels.csv")
    ]  # fmt: skip
    args = (dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    read.read_seed(1, *args)
    for path in tables:
        whole = path.read_text()
        path.write_text(whole.splitlines(keepends=True)[0])
        with pytest.raises(UserError) as caught:
            read.read_seed(1, *args)
        assert caught.value.where == str(path)
        one_line(caught)
        path.write_text(whole)


def test_a_heads_summary_or_metrics_without_what_compare_reads_is_refused_by_name(tmp_path):
    import synthetic_seeds as syn

    dirs = syn.write_stage_outputs(tmp_path, [1])
    args = (dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    summary_path = dirs["heads"] / "seed1" / "summary.json"
    whole = json.loads(summary_path.read_text())
    roles = ("heldout_loss_effect", "probe_loss_effect", "placebo_p", "placebo_p_lower", "serves_heldout")
    roles += ("induction", "previous_token")  # each role's keys, and the roles read
    no_placebo = {
        r: {k: v for k, v in s.items() if k != "placebo_p"} for r, s in whole["role_ablation"].items()
    }
    for changed, key, named in (
        ({"agreement": None}, "agreement", ("spearman", "top_source")),
        ({"role_ablation": no_placebo}, "role_ablation", roles),
        ({"role_ablation": []}, "role_ablation", roles),
    ):
        summary_path.write_text(json.dumps({**whole, **changed}))
        with pytest.raises(UserError) as caught:
            read.read_seed(1, *args)
        assert caught.value.where == f"{summary_path}: {key}"
        one_line(caught, *named)
    summary_path.write_text(json.dumps(whole))
    metrics_path = dirs["train"] / "seed1" / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics_path.write_text(json.dumps({k: v for k, v in metrics.items() if k != "prev_token"}))
    with pytest.raises(UserError) as caught:
        read.read_seed(1, *args)
    assert caught.value.where == f"{metrics_path}: prev_token"
    one_line(caught)


def test_a_placebo_table_without_a_column_of_scores_csv_is_refused_by_name(tmp_path):
    """placebo.csv has scores.csv's columns: one without its `z` column is refused in one line
    naming the file, the column and the columns it has."""
    import synthetic_seeds as syn

    dirs = syn.write_stage_outputs(tmp_path, [1])
    args = (dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    path = dirs["composition"] / "seed1" / "placebo.csv"
    placebo = pd.read_csv(path).drop(columns="z")
    placebo.to_csv(path, index=False)
    with pytest.raises(UserError) as caught:
        read.read_seed(1, *args)
    assert caught.value.where == str(path)
    one_line(caught, "'z'", ", ".join(placebo.columns))  # the column missing, and the columns there are


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
