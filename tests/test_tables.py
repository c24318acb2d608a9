"""pipeline.tables on tables built by hand: the excess over the baseline, the joined measures and
their split, and read_csv's one-line refusals naming the file."""

from __future__ import annotations

import pandas as pd
import pytest
from refusals import refused

from pipeline import tables
from pipeline.errors import UserError


def raw_rows(variant: str | None, scores: list[float]) -> pd.DataFrame:
    rows = {c: [0] * len(scores) for c in tables.RAW_SCORES_COLUMNS if c != "variant"}
    rows["score"] = scores
    frame = pd.DataFrame(rows)
    return frame.assign(variant=variant)[list(tables.RAW_SCORES_COLUMNS)] if variant else frame


def test_excess_is_the_score_less_its_baseline():
    frame = pd.DataFrame({"score": [0.5, 0.25], "baseline_mean": [0.125, 0.5]})
    assert tables.excess(frame).tolist() == [0.375, -0.25]


def test_joined_measures_are_the_scores_then_the_others_in_their_order_numbered_afresh():
    scores = raw_rows("errata", [0.1, 0.2]).set_axis([5, 7])
    invariant = raw_rows(None, [0.3]).set_axis([5])
    projection = raw_rows(None, [0.4, 0.5])
    joined = tables.join_measures(scores, {tables.PROJECTION: projection, tables.INVARIANT: invariant})
    assert joined.index.tolist() == [0, 1, 2, 3, 4]
    assert joined["variant"].tolist() == [
        "errata",
        "errata",
        tables.INVARIANT,
        tables.PROJECTION,
        tables.PROJECTION,
    ]
    assert joined["score"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5]
    back_scores, back = tables.split_measures(joined)
    assert back_scores["score"].tolist() == [0.1, 0.2] and list(back) == [tables.INVARIANT, tables.PROJECTION]
    assert back[tables.INVARIANT]["score"].tolist() == [0.3] and "variant" not in back[tables.PROJECTION]
    assert tables.split_measures(tables.join_measures(scores, {}))[1] == {}


def test_read_csv_refuses_in_one_line_naming_the_file(tmp_path):
    path = tmp_path / "scores.csv"
    path.write_text("kind,score\nQ,0.5\n")
    assert tables.read_csv(path, ["kind", "score"])["score"].tolist() == [0.5]
    with pytest.raises(UserError) as caught:
        tables.read_csv(path, ["kind", "variant"])
    assert "'variant'" in refused(caught, path)  # the column it lacks
    path.write_text("kind,score\n")
    assert tables.read_csv(path, ["kind"]).empty  # a header alone is a table, unless refused
    with pytest.raises(UserError) as caught:
        tables.read_csv(path, ["kind"], empty_ok=False)
    refused(caught, path)
    path.write_text("")
    with pytest.raises(UserError) as caught:
        tables.read_csv(path)
    refused(caught, path)


def test_read_csv_refuses_a_missing_file_naming_it_whole(tmp_path):
    path = tmp_path / "absent.csv"
    with pytest.raises(UserError) as caught:
        tables.read_csv(path)
    refused(caught, path)


def test_read_csv_names_the_first_missing_column_of_a_tsv(tmp_path):
    path = tmp_path / "steps.tsv"
    path.write_text("step\ttokens\n0\t0\n")
    with pytest.raises(UserError) as caught:
        tables.read_csv(path, ["step", "eval_loss", "induction"], sep="\t")
    assert "'eval_loss'" in refused(caught, path) and "'induction'" not in str(caught.value)


def test_read_csv_refuses_a_last_row_cut_short_naming_the_file(tmp_path):
    """pandas reads a row cut short as one with empty cells: a table must end with a line end,
    its last row with every field of the header."""
    path = tmp_path / "scores.csv"
    whole = "kind,src_layer,score\nQ,0,0.5\nK,1,0.25\n"
    for cut in (whole[:-3], whole[:-7] + "\n"):  # no line end; a line end after 2 of 3 fields
        path.write_text(cut)
        with pytest.raises(UserError) as caught:
            tables.read_csv(path, ["kind", "score"])
        refused(caught, path)
    path.write_text(whole)
    assert tables.read_csv(path, ["kind", "src_layer", "score"])["score"].tolist() == [0.5, 0.25]


@pytest.mark.parametrize(
    "column,cells,shown",
    [  # the column, its cells, the bad cell as the refusal shows it (text quoted; empty: none)
        ("src_layer", ["0", "x"], "'x'"),
        ("src_layer", ["0", ""], None),
        ("src_layer", ["0", "1.5"], "1.5"),
        ("score", ["0.5", "0.2.5"], "'0.2.5'"),
        ("discovery", ["True", "Tru"], "'Tru'"),
    ],
)
def test_read_csv_checks_each_column_it_is_asked_for_by_its_kind(tmp_path, column, cells, shown):
    """An index (integers, never empty), a number (empty where undefined), a flag: the first bad
    cell is named by its line; a column not asked for is not checked."""
    path = tmp_path / "t.csv"
    path.write_text(f"{column},other\n" + "".join(f"{cell},?\n" for cell in cells))
    with pytest.raises(UserError) as caught:
        tables.read_csv(path, [column])
    message = refused(caught, f"{path}: {column}")
    assert shown is None or shown in message
    assert len(tables.read_csv(path, ["other"])) == 2
    good = {"src_layer": "3", "score": "", "discovery": "True"}[column]  # an empty number: undefined
    path.write_text(f"{column},other\n{good},?\n")
    assert len(tables.read_csv(path, [column])) == 1
