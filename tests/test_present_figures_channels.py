"""The channel figure's parts on hand-made tables (tests/channel_tables.py): a panel's title
worked out by hand, the ticks, frames, sizes and the suptitle's counts read back from the
artists, which pairs `discovered` picks and what it hands on, the discovery flags of a CSV cell,
and a channels file of the wrong shape named."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from channel_tables import tables
from matplotlib.colors import PowerNorm, to_rgba
from matplotlib.layout_engine import ConstrainedLayoutEngine

from pipeline.errors import UserError
from pipeline.present.figures import channels as cf

FOUND = [("K", 0, 0, 1, 0), ("K", 0, 1, 1, 2)]


def row(**values):
    base = {
        "kind": "K",
        "src_layer": 0,
        "src_head": 1,
        "dst_layer": 1,
        "dst_head": 2,
        "discovery": False,
        "top_share": 0.75,
        "writer_channel": 2,
        "reader_channel": 1,
        "writer_block": 1,
        "reader_block": 1,
        "effective_channels": 1.5,
    }
    return next(pd.DataFrame([base | values]).itertuples())


def test_a_panels_title_names_the_pair_its_top_channel_and_what_is_in_view():
    assert cf._pair_title(row(), 4, 4, 1.0) == "K L0H1 -> L1H2\ntop 0.75 at (2, 1), eff. 1.5"
    assert cf._pair_title(row(discovery=True), 4, 4, 1.0).startswith("★ K L0H1 -> L1H2\n")
    assert cf._pair_title(row(top_share=math.nan), 4, 4, 1.0) == "K L0H1 -> L1H2\ntop –, eff. 1.5"
    assert cf._pair_title(row(writer_channel=math.nan), 4, 4, 1.0).endswith("\ntop –, eff. 1.5")
    in_part = cf._pair_title(row(kind="V"), 64, 16, 0.5)
    assert in_part == "V L0H1 -> L1H2\ntop 0.75 at (2, 1), eff. 1.5\nin view: 50%"
    block = cf._pair_title(row(writer_block=2, reader_block=3), 8, 8, 1.0)  # directions 2-3 x 1-3
    assert block == "K L0H1 -> L1H2\ntop 0.75 at (2-3, 1-3), eff. 1.5"


def test_a_discovery_cell_is_true_only_when_it_says_so():
    cells = pd.Series([True, 1, "true", " TRUE ", 1.0, False, 0, "false", "", math.nan, None, "yes"])
    assert cf._flag(cells).tolist() == [True] * 5 + [False] * 7


def test_discovered_hands_on_the_rows_with_their_index_in_the_kinds_table():
    frame, shares = tables({}, FOUND, channel_discovery=[FOUND[1]])
    picked = cf.discovered(frame.set_index(frame.index + 100), shares)
    assert list(picked.shown.columns) == [*frame.columns, "row", "pair_z_cal"]
    assert list(picked.shown["row"]) == [0, 5]  # K's later pairs of 2 layers x 3 heads: 1.2 <- 0.1 is 6th
    assert list(picked.shown.index) == [0, 1]
    assert (picked.d_head, picked.leading) == (4, 4)
    one = cf.discovered(frame, shares, max_pairs=1)
    assert len(one.shown) == 1 and one.facts()["left_out"] == 1 and one.counts == {"K": 2, "Q": 0, "V": 0}
    none = cf.discovered(*tables({}, []))
    assert (none.d_head, none.leading) == (0, 0)  # nothing shown: no d_head to show


def test_a_pair_without_a_calibrated_z_ranks_as_the_lowest_and_ties_keep_the_csvs_order():
    found = [("K", 0, 0, 1, 0), ("K", 0, 1, 1, 0), ("K", 0, 2, 1, 0)]
    frame, shares = tables({}, found)
    keys = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
    scores = pd.DataFrame([(*p, "true", z) for p, z in zip(found[1:], (-math.inf, 2.0), strict=True)])
    scores.columns = [*keys, "variant", "z_cal"]  # 0.0 -> 1.0 has no row: its z is missing
    picked = cf.discovered(frame, shares, scores)
    assert list(picked.shown["src_head"]) == [2, 0, 1]  # z 2, then missing and -inf tied, in the csv's order


@pytest.fixture
def drawn():
    frame, shares = tables({FOUND[0]: (3, 1)}, FOUND, channel_discovery=[FOUND[1]])
    picked = cf.discovered(frame, shares)
    fig = cf.channel_maps(picked, shares)
    yield fig, [ax for ax in fig.axes if ax.images]
    plt.close(fig)


def test_each_panel_ticks_every_channel_and_a_channel_discovery_gets_a_red_frame(drawn):
    fig, (plain, found) = drawn
    for ax in (plain, found):
        assert list(ax.get_xticks()) == [0, 1, 2, 3] and list(ax.get_yticks()) == [0, 1, 2, 3]
        assert {t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()} == {6}
        assert ax.xaxis.get_major_ticks()[0].tick1line.get_markersize() == 2
        assert ax.title.get_fontsize() == 7
        assert ax.get_xlabel() == "reader channel j" and ax.xaxis.get_label().get_fontsize() == 7
    assert plain.yaxis.get_label().get_fontsize() == 7  # the writer label, like the reader's
    assert plain.get_title() == "K L0H0 -> L1H0\ntop 1.00 at (3, 1), eff. 1.0"
    assert found.get_title() == "★ K L0H1 -> L1H2\ntop 0.06 at (0, 0), eff. 16.0"
    assert plain.get_ylabel() == "writer channel i" and found.get_ylabel() == ""
    for spine in found.spines.values():
        assert to_rgba(spine.get_edgecolor()) == to_rgba(cf.MARK) and spine.get_linewidth() == 2.0
    assert all(to_rgba(s.get_edgecolor()) != to_rgba(cf.MARK) for s in plain.spines.values())


def test_the_figure_is_wide_enough_for_its_title_and_counts_what_it_shows(drawn):
    fig, panels = drawn
    assert tuple(fig.get_size_inches()) == pytest.approx((7.5, 2.5 + 1.4))  # 2 panels: at least 7.5 wide
    (bar,) = [ax for ax in fig.axes if not ax.images]
    assert bar.get_ylabel() == "share (square-root scale)" and bar.yaxis.get_label().get_fontsize() == 8
    assert fig.get_suptitle() == (
        "Composition channels of the discovered pairs: 2 of 2 shown (K 2, Q 0, V 0)\nshare (i, j): "
        "writer channel i into reader channel j, channels by descending singular value\nnear-equal "
        "singular values form a block, its share spread evenly over its cells; white outline: the top "
        "channel\n★ red frame: a channel discovery (the pair composes mainly through its top channel)"
    )
    assert fig._suptitle.get_fontsize() == 9


def test_the_panels_and_their_colour_bar_are_placed_by_constrained_layout(drawn):
    fig, _ = drawn
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)


def test_kinds_whose_tables_differ_in_d_head_are_refused_naming_the_file_and_both_sizes():
    frame, shares = tables({}, FOUND)
    shares["Q"] = np.full((len(shares["Q"]), 3, 3), 1 / 9)  # K and V 4 channels a side, Q 3
    with pytest.raises(UserError) as e:
        cf.discovered(frame, shares, source="seed0/channels.safetensors")
    assert str(e.value) == "seed0/channels.safetensors: the kinds' tables differ in d_head ([3, 4])"


def test_seven_panels_wrap_to_two_rows_of_six_and_a_capped_figure_says_how_many_were_left_out():
    found = [("K", 0, h, 1, g) for h in range(3) for g in range(3)]
    frame, shares = tables({}, found)
    fig = cf.channel_maps(cf.discovered(frame, shares, max_pairs=7), shares)
    assert tuple(fig.get_size_inches()) == pytest.approx((2.3 * 6 + 1.0, 2.5 * 2 + 1.4))
    panels = [ax for ax in fig.axes if ax.images]
    assert [bool(ax.get_xlabel()) for ax in panels] == [False] + [True] * 6  # none below them
    assert [bool(ax.get_ylabel()) for ax in panels] == [True] + [False] * 5 + [True]
    assert "7 of 9 shown (K 9, Q 0, V 0); 2 left out (the lowest calibrated z)\n" in fig.get_suptitle()
    assert sum(not ax.axison for ax in fig.axes) == 5  # the second row's empty places
    plt.close(fig)


def test_with_many_channels_every_third_is_ticked():
    pair = ("K", 0, 0, 1, 0)
    frame, shares = tables({pair: (20, 3)}, [pair], d_head=64)
    fig = cf.channel_maps(cf.discovered(frame, shares), shares)
    (panel,) = [ax for ax in fig.axes if ax.images]
    assert list(panel.get_xticks()) == list(range(0, 21, 3)) == list(panel.get_yticks())
    assert panel.get_xlabel() == "reader channel j (leading 21 of 64)"
    assert panel.get_ylabel() == "writer channel i (leading 21 of 64)"
    plt.close(fig)


def test_no_discovered_pair_says_so_in_the_middle_of_a_small_figure():
    frame, shares = tables({}, [])
    fig = cf.channel_maps(cf.discovered(frame, shares), shares)
    (ax,) = fig.axes
    (note,) = ax.texts
    assert note.get_text() == (
        "No discovered pair: no pair's corrected score is a discovery,\nso there is no channel table to show."
    )
    assert note.get_position() == (0.5, 0.5) and note.get_fontsize() == 10
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("center", "center")
    assert not ax.axison and tuple(fig.get_size_inches()) == (6.0, 1.6)
    assert fig.get_suptitle() == "Composition channels of the discovered pairs"
    assert fig._suptitle.get_fontsize() == 10
    plt.close(fig)


def test_a_channels_file_of_the_wrong_shape_is_named_with_its_kind(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "channels.safetensors"
    save_file({"K": np.zeros((2, 4, 4), np.float32), "V": np.zeros((2, 4, 3), np.float32)}, str(path))
    with pytest.raises(UserError) as e:
        cf.read_shares(path)
    assert str(e.value) == f"{path}: V: shape [2, 4, 3], expected [pairs, d_head, d_head]"
    save_file({"K": np.zeros((2, 4, 4), np.float32)}, str(path))
    assert list(cf.read_shares(path)) == ["K"]


def test_a_file_that_is_not_safetensors_is_refused_naming_the_file_and_why(tmp_path):
    """Seven bytes cannot hold safetensors' 8-byte header length: the file is named, and why."""
    path = tmp_path / "channels.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(UserError) as e:
        cf.read_shares(path)
    assert str(e.value) == (
        f"{path}: not a channels file of the composition stage "
        "(Error while deserializing header: header too small)"
    )


def test_every_panel_and_the_colour_bar_share_one_square_root_scale_from_0_to_1(drawn):
    """A panel whose top share is 1.00 beside one whose top is 0.06: one colour means one share
    everywhere, on PowerNorm(0.5) over [0, 1], not each panel stretched to its own range."""
    fig, panels = drawn
    norms = [ax.images[0].norm for ax in panels]
    for norm in norms:
        assert isinstance(norm, PowerNorm)
        assert (norm.gamma, norm.vmin, norm.vmax) == (0.5, 0.0, 1.0)
    assert norms[0] is norms[1]
    assert norms[1](0.25) == pytest.approx(0.5)  # the square-root scale: a quarter share is half way
    (bar,) = [ax for ax in fig.axes if not ax.images]
    assert bar.get_ylim() == (0.0, 1.0)


def test_the_colour_bar_stands_right_of_every_panel_centred_on_the_whole_grid():
    """Two rows of panels: the one colour bar belongs to all of them, so it sits right of the
    rightmost column and halfway between the top row's top and the bottom row's bottom, not
    beside the last panel alone."""
    found = [("K", 0, h, 1, g) for h in range(3) for g in range(3)]
    frame, shares = tables({}, found)
    fig = cf.channel_maps(cf.discovered(frame, shares, max_pairs=7), shares)
    fig.draw_without_rendering()
    boxes = [ax.get_position() for ax in fig.axes if ax.images]
    (bar,) = [ax.get_position() for ax in fig.axes if not ax.images and ax.axison]
    assert bar.x0 > max(box.x1 for box in boxes)
    grid_middle = (min(box.y0 for box in boxes) + max(box.y1 for box in boxes)) / 2
    assert (bar.y0 + bar.y1) / 2 == pytest.approx(grid_middle, abs=0.01)
    plt.close(fig)
