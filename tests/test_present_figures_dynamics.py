"""The dynamics figure (pipeline/present/figures/dynamics.py) on a steps table built by hand: every
line carries the column it names, in its measure's colour and style, the discovery line sits at
-log10(FDR), the phase change is marked where induction first reaches the threshold, and the
text is sized as drawn. And `read_summary` on hand-written summaries, good and bad."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from pipeline import tables
from pipeline.errors import UserError
from pipeline.present.figures import dynamics
from pipeline.tables import INDUCTION_THRESHOLD, MEASURES

PAIR = {"src": [0, 1], "dst": [1, 0]}
Q = [1.0, 0.1, 0.001]  # -log10: 0, 1, 3


def steps_table(induction=(0.1, 0.6, 0.7)) -> pd.DataFrame:
    table = {
        "step": [0, 10, 20],
        "tokens": [0, 1000, 2000],
        "induction": list(induction),
        "prev_token": [0.2, 0.3, 0.4],
        "eval_loss": [5.0, 4.0, 3.0],
    }
    # each measure its own q, so that a line drawn from another measure's column shows
    return pd.DataFrame(table | {f"q_{m}": [q ** (k + 1) for q in Q] for k, m in enumerate(MEASURES)})


@pytest.fixture
def drawn():
    fig = dynamics.dynamics_figure(steps_table(), PAIR, 0.05)
    top, bottom, loss = fig.axes  # the two panels, then the loss axis twinned on the top one
    yield fig, top, bottom, loss
    plt.close(fig)


def same_colour(a, b) -> bool:
    return to_rgba(a) == to_rgba(b)


def numbers(text: str) -> list[str]:
    """The numbers of a title or label, as printed, without its words."""
    return re.findall(r"\d+(?:\.\d+)?", text)


def test_figure_is_eight_by_six_point_two_inches_with_a_shared_step_axis(drawn):
    fig, top, bottom, loss = drawn
    assert tuple(fig.get_size_inches()) == (8.0, 6.2)
    assert top.get_shared_x_axes().joined(top, bottom)
    assert loss.get_shared_x_axes().joined(loss, top)


def test_top_panel_draws_induction_and_previous_token_scores_and_the_threshold(drawn):
    _, top, _, _ = drawn
    induction, prev, threshold = top.get_lines()[:3]
    assert list(induction.get_xdata()) == [0, 1000, 2000]
    assert list(induction.get_ydata()) == [0.1, 0.6, 0.7]
    assert same_colour(induction.get_color(), "#d62728") and induction.get_marker() == "."
    assert list(prev.get_ydata()) == [0.2, 0.3, 0.4]
    assert same_colour(prev.get_color(), "#9467bd") and prev.get_marker() == "."
    assert list(threshold.get_ydata()) == [INDUCTION_THRESHOLD, INDUCTION_THRESHOLD]
    assert same_colour(threshold.get_color(), "0.7") and threshold.get_linestyle() == ":"
    assert threshold.get_linewidth() == 0.8
    assert top.get_ylim() == (-0.02, 1.02)
    assert top.get_ylabel()


def test_loss_is_dashed_on_its_own_axis_and_every_top_line_is_in_one_legend(drawn):
    _, top, _, loss = drawn
    (line,) = loss.get_lines()
    assert list(line.get_ydata()) == [5.0, 4.0, 3.0]
    assert line.get_linestyle() == "--" and line.get_linewidth() == 1
    assert same_colour(line.get_color(), "0.35")
    assert loss.get_ylabel()
    legend = top.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [line.get_label() for line in (*top.get_lines()[:2], line)]  # both axes' lines
    assert [t.get_fontsize() for t in legend.get_texts()] == [8, 8, 8]
    assert not legend.get_frame_on()


def test_bottom_panel_draws_minus_log10_q_of_each_measure_in_its_style(drawn):
    _, _, bottom, _ = drawn
    lines = [line for line in bottom.get_lines() if line.get_marker() == "."]
    assert [line.get_label() for line in lines] == [dynamics.MEASURE_STYLE[m][0] for m in MEASURES]
    for k, (m, line) in enumerate(zip(MEASURES, lines, strict=True)):
        _, color, style = dynamics.MEASURE_STYLE[m]
        np.testing.assert_allclose(line.get_ydata(), [0.0, 1.0 * (k + 1), 3.0 * (k + 1)])
        assert same_colour(line.get_color(), color) and line.get_linestyle() == style
        assert line.get_linewidth() == 1.3
    fdr_line = [line for line in bottom.get_lines() if list(line.get_ydata()) == [-math.log10(0.05)] * 2]
    assert len(fdr_line) == 1 and fdr_line[0].get_linestyle() == "--"
    assert same_colour(fdr_line[0].get_color(), "0.6")
    legend = bottom.get_legend()
    assert [t.get_fontsize() for t in legend.get_texts()] == [7] * len(MEASURES)
    assert not legend.get_frame_on()


def test_bottom_panel_labels_name_the_fdr_and_the_pair(drawn):
    _, top, bottom, _ = drawn
    ylabel = bottom.yaxis.get_label()
    assert numbers(ylabel.get_text())[-1] == "0.05"  # the FDR of the discovery line
    assert ylabel.get_fontsize() == 8
    assert bottom.get_xlabel()
    assert numbers(bottom.get_title()) == ["1", "0", "0", "1"]  # L1H0 <- L0H1: reader, then writer
    assert bottom.title.get_fontsize() == 9
    assert top.get_title() and top.title.get_fontsize() == 10


def test_phase_change_is_marked_on_both_panels_at_the_first_step_that_reaches_the_threshold(drawn):
    _, top, bottom, _ = drawn
    for ax in (top, bottom):
        marks = [line for line in ax.get_lines() if list(line.get_xdata()) == [1000, 1000]]
        assert len(marks) == 1  # induction 0.6 >= 0.5 first at step 10, 1000 tokens
        assert same_colour(marks[0].get_color(), "#d62728") and marks[0].get_alpha() == 0.7
    (note,) = top.texts
    assert numbers(note.get_text()) == [str(INDUCTION_THRESHOLD), "10"]  # the threshold, the step
    assert note.xy == (1000, 1.0)
    assert note.get_fontsize() == 7
    assert same_colour(note.get_color(), "#d62728")


def test_the_phase_note_sits_three_points_right_of_its_mark_at_the_same_height(drawn):
    _, top, _, _ = drawn
    (note,) = top.texts
    assert note.xyann == (3, 0)
    assert note.anncoords == "offset points"
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("left", "top")


def test_without_a_phase_change_or_a_pair_nothing_is_marked_or_titled():
    fig = dynamics.dynamics_figure(steps_table(induction=(0.1, 0.2, 0.3)), None, 0.1)
    top, bottom, _ = fig.axes
    assert not top.texts
    assert not [line for line in bottom.get_lines() if len(set(line.get_xdata())) == 1]
    assert bottom.get_title() == ""
    assert numbers(bottom.get_ylabel())[-1] == "0.1"
    plt.close(fig)


# --- read_summary -----------------------------------------------------------------------


def write(tmp_path, summary) -> str:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    return str(path)


def test_read_summary_returns_the_pair_and_the_fdr_as_a_float(tmp_path):
    pair, fdr = dynamics.read_summary(write(tmp_path, {"pair": PAIR, "fdr": 1}))
    assert pair == PAIR and fdr == 1.0 and isinstance(fdr, float)


@pytest.mark.parametrize(
    "summary",
    [
        [PAIR, 0.05],  # not an object at all
        {"fdr": 0.05},
        {"pair": {"src": [0, 1]}, "fdr": 0.05},
        {"pair": {"src": [0, 1], "dst": [1]}, "fdr": 0.05},
        {"pair": {"src": [0, 1], "dst": [1, 0.5]}, "fdr": 0.05},
    ],
)
def test_read_summary_names_a_missing_or_malformed_pair(tmp_path, summary):
    path = write(tmp_path, summary)
    with pytest.raises(UserError) as e:
        dynamics.read_summary(path)
    message = str(e.value)
    assert message.startswith(f"{path}: pair: ") and len(message.splitlines()) == 1  # names the key


@pytest.mark.parametrize("fdr", [None, "0.05", True])
def test_read_summary_names_a_missing_fdr(tmp_path, fdr):
    summary = {"pair": PAIR} | ({} if fdr is None else {"fdr": fdr})
    path = write(tmp_path, summary)
    with pytest.raises(UserError) as e:
        dynamics.read_summary(path)
    message = str(e.value)
    assert message.startswith(f"{path}: fdr = {fdr!r}: ") and len(message.splitlines()) == 1  # key, value


@pytest.fixture(scope="module")
def chain(tiny_run) -> dict[str, Path]:
    return tiny_run


def test_figure_marks_the_phase_change(chain):
    from pipeline.present.figures import dynamics as figure

    steps = pd.read_csv(chain["dynamics"] / "steps.tsv", sep="\t").assign(induction=[0.1, 0.6, 0.7])
    pair, z = figure.read_summary(str(chain["dynamics"] / "summary.json"))
    fig = figure.dynamics_figure(steps, pair, z)
    top, bottom = fig.axes[0], fig.axes[1]
    at = steps["tokens"].iloc[1]  # induction first reaches 0.5 at step 10
    assert any(list(line.get_xdata()) == [at, at] for line in bottom.get_lines())
    assert len([line for line in bottom.get_lines() if line.get_marker() == "."]) == len(tables.MEASURES)
    assert "induction" in top.get_legend_handles_labels()[1][0]
    import matplotlib.pyplot as plt

    plt.close(fig)
