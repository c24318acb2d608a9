"""The channel figure (pipeline/present/figures/channels.py) on hand-made tables
(tests/channel_tables.py): one heat map per discovered pair (K first), each showing its own
table (a planted one-channel table peaks at its channel; a real table is drawn as measured),
capped with the rest counted, the channel discoveries marked; a panel's title's numbers worked
out by hand, the ticks, frames, sizes and the suptitle's counts read back from the artists,
which pairs `discovered` picks and what it hands on, the discovery flags of a CSV cell, a
channels file of the wrong shape named, and the caption's counts from the figure's facts."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import oracles
import pandas as pd
import pytest
import synthetic_seeds as syn
import torch
from channel_tables import later_pairs, tables
from matplotlib.colors import PowerNorm, to_rgba
from matplotlib.layout_engine import ConstrainedLayoutEngine
from models import random_model

from pipeline.circuits import channels as ch
from pipeline.circuits.scoring import ZERO_RTOL
from pipeline.circuits.weights import from_state_dict
from pipeline.config import CompositionConfig
from pipeline.errors import UserError
from pipeline.present.figures import channels as cf

FOUND = [("K", 0, 0, 1, 0), ("K", 0, 1, 1, 2)]
# a title's numbers as printed: a value, a span of directions (2-3), a percentage, or a dash
NUMBER = re.compile(r"–|\d+(?:\.\d+)?(?:-\d+)?%?")


def facts(text: str) -> list[list[str]]:
    """The numbers of each line of a title or label, as printed, without its words."""
    return [NUMBER.findall(line) for line in text.split("\n")]


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
    pair = ["0", "1", "1", "2"]  # L0H1 -> L1H2
    title = cf._pair_title(row(), 4, 4, 1.0)
    assert title.split()[0] == "K" and facts(title) == [pair, ["0.75", "2", "1", "1.5"]]
    starred = cf._pair_title(row(discovery=True), 4, 4, 1.0)
    assert starred.startswith("★") and facts(starred) == facts(title) and not title.startswith("★")
    assert facts(cf._pair_title(row(top_share=math.nan), 4, 4, 1.0)) == [pair, ["–", "1.5"]]
    assert facts(cf._pair_title(row(writer_channel=math.nan), 4, 4, 1.0))[1] == ["–", "1.5"]
    in_part = cf._pair_title(row(kind="V"), 64, 16, 0.5)
    assert in_part.split()[0] == "V" and facts(in_part) == [pair, ["0.75", "2", "1", "1.5"], ["50%"]]
    block = cf._pair_title(row(writer_block=2, reader_block=3), 8, 8, 1.0)  # directions 2-3 x 1-3
    assert facts(block) == [pair, ["0.75", "2-3", "1-3", "1.5"]]


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
        assert facts(ax.get_xlabel()) == [[]] and ax.xaxis.get_label().get_fontsize() == 7  # all in view
    assert plain.get_xlabel() == found.get_xlabel()
    assert plain.yaxis.get_label().get_fontsize() == 7  # the writer label, like the reader's
    assert facts(plain.get_title()) == [["0", "0", "1", "0"], ["1.00", "3", "1", "1.0"]]
    assert facts(found.get_title()) == [["0", "1", "1", "2"], ["0.06", "0", "0", "16.0"]]
    assert found.get_title().startswith("★") and not plain.get_title().startswith("★")
    assert plain.get_ylabel() and found.get_ylabel() == ""  # the writer axis labelled once a row
    for spine in found.spines.values():
        assert to_rgba(spine.get_edgecolor()) == to_rgba(cf.MARK) and spine.get_linewidth() == 2.0
    assert all(to_rgba(s.get_edgecolor()) != to_rgba(cf.MARK) for s in plain.spines.values())


def test_the_figure_is_wide_enough_for_its_title_and_counts_what_it_shows(drawn):
    fig, panels = drawn
    assert tuple(fig.get_size_inches()) == pytest.approx((7.5, 2.5 + 1.4))  # 2 panels: at least 7.5 wide
    (bar,) = [ax for ax in fig.axes if not ax.images]
    assert bar.get_ylabel() and bar.yaxis.get_label().get_fontsize() == 8
    assert facts(fig.get_suptitle())[0] == ["2", "2", "2", "0", "0"]  # shown of discovered, per kind
    assert "★" in fig.get_suptitle()  # the mark of a channel discovery, explained
    assert fig._suptitle.get_fontsize() == 9


def test_the_panels_and_their_colour_bar_are_placed_by_constrained_layout(drawn):
    fig, _ = drawn
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)


def test_kinds_whose_tables_differ_in_d_head_are_refused_naming_the_file_and_both_sizes():
    frame, shares = tables({}, FOUND)
    shares["Q"] = np.full((len(shares["Q"]), 3, 3), 1 / 9)  # K and V 4 channels a side, Q 3
    with pytest.raises(UserError) as e:
        cf.discovered(frame, shares, source="seed0/channels.safetensors")
    message = str(e.value)
    assert message.startswith("seed0/channels.safetensors: ") and "d_head" in message and "[3, 4]" in message
    assert len(message.splitlines()) == 1


def test_seven_panels_wrap_to_two_rows_of_six_and_a_capped_figure_says_how_many_were_left_out():
    found = [("K", 0, h, 1, g) for h in range(3) for g in range(3)]
    frame, shares = tables({}, found)
    fig = cf.channel_maps(cf.discovered(frame, shares, max_pairs=7), shares)
    assert tuple(fig.get_size_inches()) == pytest.approx((2.3 * 6 + 1.0, 2.5 * 2 + 1.4))
    panels = [ax for ax in fig.axes if ax.images]
    assert [bool(ax.get_xlabel()) for ax in panels] == [False] + [True] * 6  # none below them
    assert [bool(ax.get_ylabel()) for ax in panels] == [True] + [False] * 5 + [True]
    assert facts(fig.get_suptitle())[0] == ["7", "9", "9", "0", "0", "2"]  # 2 left out
    assert sum(not ax.axison for ax in fig.axes) == 5  # the second row's empty places
    plt.close(fig)


def test_with_many_channels_every_third_is_ticked():
    pair = ("K", 0, 0, 1, 0)
    frame, shares = tables({pair: (20, 3)}, [pair], d_head=64)
    fig = cf.channel_maps(cf.discovered(frame, shares), shares)
    (panel,) = [ax for ax in fig.axes if ax.images]
    assert list(panel.get_xticks()) == list(range(0, 21, 3)) == list(panel.get_yticks())
    assert facts(panel.get_xlabel()) == facts(panel.get_ylabel()) == [["21", "64"]]  # leading 21 of 64
    plt.close(fig)


def test_no_discovered_pair_says_so_in_the_middle_of_a_small_figure():
    frame, shares = tables({}, [])
    fig = cf.channel_maps(cf.discovered(frame, shares), shares)
    (ax,) = fig.axes
    (note,) = ax.texts
    assert note.get_text() and facts(note.get_text()) == [[]] * len(note.get_text().split("\n"))
    assert note.get_position() == (0.5, 0.5) and note.get_fontsize() == 10
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("center", "center")
    assert not ax.axison and tuple(fig.get_size_inches()) == (6.0, 1.6)
    assert fig.get_suptitle() and facts(fig.get_suptitle()) == [[]]  # nothing to count
    assert fig._suptitle.get_fontsize() == 10
    plt.close(fig)


def test_a_channels_file_of_the_wrong_shape_is_named_with_its_kind(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "channels.safetensors"
    save_file({"K": np.zeros((2, 4, 4), np.float32), "V": np.zeros((2, 4, 3), np.float32)}, str(path))
    with pytest.raises(UserError) as e:
        cf.read_shares(path)
    message = str(e.value)
    assert message.startswith(f"{path}: V: ") and "[2, 4, 3]" in message and len(message.splitlines()) == 1
    save_file({"K": np.zeros((2, 4, 4), np.float32)}, str(path))
    assert list(cf.read_shares(path)) == ["K"]


def test_a_file_that_is_not_safetensors_is_refused_naming_the_file_and_why(tmp_path):
    """Seven bytes cannot hold safetensors' 8-byte header length: the file is named, and why."""
    path = tmp_path / "channels.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(UserError) as e:
        cf.read_shares(path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    with pytest.raises(SafetensorError) as why:
        load_file(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: ") and len(message.splitlines()) == 1
    assert str(why.value).splitlines()[0] in message  # the library's reason


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


# --- panels of planted, capped and real tables ---------------------------------------------

# synthetic_seeds' true discoveries: K 1.0 <- 0.0, 1.1 <- 0.0, 1.0 <- 0.1; V 1.2 <- 0.2
SYN_FOUND = [("K", 0, 0, 1, 0), ("K", 0, 0, 1, 1), ("K", 0, 1, 1, 0), ("V", 0, 2, 1, 2)]


def panels(fig):
    """The heat-map axes (the colour bar's axes hold no image), in drawing order."""
    return [ax for ax in fig.axes if ax.images]


def test_planted_channels_peak_where_planted_and_only_discovered_pairs_are_drawn():
    planted = {pair: (k % 4, (k + 2) % 4) for k, pair in enumerate(SYN_FOUND)}
    planted[("Q", 0, 1, 1, 2)] = (3, 3)  # planted but not a discovery: not drawn
    frame, shares = tables(planted, SYN_FOUND, channel_discovery=[SYN_FOUND[1]])
    picked = cf.discovered(frame, shares, syn.scores())
    fig = cf.channel_maps(picked, shares)
    axes = panels(fig)
    assert len(axes) == len(SYN_FOUND) and picked.counts == {"K": 3, "Q": 0, "V": 1}
    for ax, pair in zip(axes, SYN_FOUND, strict=True):  # K first, then V
        kind, i, h, j, g = pair
        image = np.asarray(ax.images[0].get_array())
        assert image.shape == (4, 4)
        assert np.unravel_index(image.argmax(), image.shape) == planted[pair]
        assert ax.images[0].get_clim() == (0.0, 1.0)  # one scale for every panel
        title = ax.get_title()
        assert kind in title.split() and facts(title)[:2] == [
            [str(i), str(h), str(j), str(g)],
            ["1.00", *map(str, planted[pair]), "1.0"],
        ]
        assert title.startswith("★") == (pair == SYN_FOUND[1])
    assert axes[1].spines["left"].get_edgecolor() != axes[0].spines["left"].get_edgecolor()
    assert axes[-1].get_xlabel() and axes[0].get_ylabel()
    assert len(fig.axes) == len(axes) + 1  # one colour bar for all
    assert picked.facts() == {
        "discovered": {"K": 3, "Q": 0, "V": 1}, "shown": 4, "left_out": 0, "channel_discoveries": 1,
        "d_head": 4, "channels_shown": 4,
    }  # fmt: skip


def test_the_cap_keeps_k_first_then_the_highest_calibrated_z_and_says_how_many_were_left_out():
    n_layers, n_heads = 2, 6  # 36 later pairs a kind
    pairs = [(kind, *p) for kind in ("V", "K") for p in later_pairs(n_layers, n_heads)[:15]]
    frame, shares = tables({}, pairs, n_layers=n_layers, n_heads=n_heads)
    scores = frame[["kind", "src_layer", "src_head", "dst_layer", "dst_head"]].assign(
        variant="true", z_cal=np.arange(len(frame), dtype=float) % 7
    )
    picked = cf.discovered(frame, shares, scores, max_pairs=20)
    assert picked.counts == {"K": 15, "Q": 0, "V": 15} and len(picked.shown) == 20
    assert list(picked.shown["kind"]) == ["K"] * 15 + ["V"] * 5
    z = picked.shown["pair_z_cal"].to_numpy()
    assert (np.diff(z[:15]) <= 0).all() and (np.diff(z[15:]) <= 0).all()  # strongest first in each kind
    fig = cf.channel_maps(picked, shares)
    axes = panels(fig)  # rows of 6, 6, 6 and 2
    assert len(axes) == 20 and [bool(ax.get_xlabel()) for ax in axes] == [False] * 14 + [True] * 6
    # shown of discovered, each kind's count, left out
    assert facts(fig.get_suptitle())[0] == ["20", "30", "15", "0", "15", "10"]


def test_large_d_head_shows_the_leading_channels_widened_to_every_top_channel():
    pair = ("K", 0, 0, 1, 0)
    frame, shares = tables({pair: (20, 3)}, [pair, ("K", 0, 1, 1, 1)], d_head=64)
    picked = cf.discovered(frame, shares)
    assert (picked.d_head, picked.leading) == (64, 21)  # the planted channel 20 stays in view
    fig = cf.channel_maps(picked, shares)
    first, second = panels(fig)
    assert np.asarray(first.images[0].get_array()).shape == (21, 21)
    assert facts(first.get_xlabel()) == [["21", "64"]]  # the leading 21 of 64 channels
    assert facts(first.get_title())[-1] == ["100%"] and facts(second.get_title())[-1] == [
        f"{21**2 / 64**2:.0%}"
    ]
    frame, shares = tables({}, [pair], d_head=64)
    assert cf.discovered(frame, shares).leading == cf.LEADING


def test_no_discovered_pair_draws_a_figure_that_says_so():
    frame, shares = tables({("K", 0, 0, 1, 0): (0, 0)}, [])
    picked = cf.discovered(frame, shares)
    fig = cf.channel_maps(picked, shares)
    assert not panels(fig) and fig.axes[0].texts[0].get_text()
    assert picked.facts()["shown"] == 0 and picked.facts()["discovered"] == {"K": 0, "Q": 0, "V": 0}


def dense_channels(hw, kind: str):
    """A test oracle: every later pair's channel shares of one kind, normalised, on the dense
    [L, H, L, H, d, d] grid (NaN elsewhere, and where the pair's score is zero up to rounding),
    with the writers' and readers' singular values."""
    L, H, d = hw.n_layers, hw.n_heads, hw.d_head
    writer, reader = ch.writer_circuit(hw), ch.reader_circuit(hw, kind)
    shares = torch.full((L, H, L, H, d, d), torch.nan, dtype=hw.W_Q.dtype)
    for i in range(L - 1):
        cross = torch.einsum("ani,lbnj->albij", writer.writes[i], reader.reads[i + 1 :])  # [H, L', H, d, d]
        weighted = writer.s[i][:, None, None, :, None] * cross * reader.s[i + 1 :][None, :, :, None, :]
        shares[i, :, i + 1 :] = weighted.square()
    s, t = writer.s, reader.s
    norms = torch.linalg.vector_norm(s, dim=-1)[:, :, None, None] * torch.linalg.vector_norm(t, dim=-1)
    zero = shares.sum((-2, -1)).sqrt() / norms <= ZERO_RTOL  # [L, H, L, H]
    return ch.normalised(shares).masked_fill(zero[..., None, None], torch.nan), s, t


def test_a_real_table_is_drawn_as_measured():
    """From a random model's weights: each panel is its pair's normalised shares (float32)."""
    hw = from_state_dict(random_model(seed=3).state_dict())
    k, s, t = dense_channels(hw, "K")  # k [L, H, L, H, d, d]
    summary = oracles.channel_summary(k, s, t, CompositionConfig().channel_tolerance)
    found = [("K", *p) for p in later_pairs(hw.n_layers, hw.n_heads)[::4]]
    frame, shares = tables({}, found)
    frame = frame.reset_index(drop=True)
    k_rows = frame.index[frame["kind"] == "K"]
    for col in (
        "writer_channel",
        "reader_channel",
        "writer_block",
        "reader_block",
        "top_share",
        "effective_channels",
    ):
        frame.loc[k_rows, col] = summary[col].to_numpy()
    shares["K"] = np.stack([k[p].numpy() for p in later_pairs(hw.n_layers, hw.n_heads)]).astype(np.float32)
    picked = cf.discovered(frame, shares)
    for ax, row in zip(panels(cf.channel_maps(picked, shares)), picked.shown.itertuples(), strict=True):
        table = k[row.src_layer, row.src_head, row.dst_layer, row.dst_head].numpy()
        np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), table, rtol=1e-6, atol=1e-7)
        top = np.unravel_index(table.argmax(), table.shape)
        assert facts(ax.get_title())[1][1:3] == [str(top[0]), str(top[1])]  # the top channel's cell


def test_a_block_top_channel_is_outlined_over_its_cells_and_named_by_its_directions():
    """A planted block pair, writer directions 1-2 x reader directions 0-2: its cells hold the
    share spread evenly and sum to the top share; the panel outlines exactly those cells and its
    title names both spans; a one-direction top channel is outlined on its one cell."""
    block, single = ("K", 0, 0, 1, 0), ("K", 0, 1, 1, 1)
    frame, shares = tables({block: (1, 0, 2, 3), single: (3, 2)}, [block, single])
    picked = cf.discovered(frame, shares)
    first, second = panels(cf.channel_maps(picked, shares))
    image = np.asarray(first.images[0].get_array())
    assert image[1:3, 0:3].sum() == pytest.approx(picked.shown.loc[0, "top_share"], rel=1e-6)
    assert np.unique(image[1:3, 0:3]).tolist() == pytest.approx([1 / 6])
    assert facts(first.get_title())[1][:3] == ["1.00", "1-2", "0-2"]
    assert facts(second.get_title())[1][:3] == ["1.00", "3", "2"]
    for ax, (rows, columns) in ((first, (1, 0)), (second, (3, 2))):
        (outline,) = [p for p in ax.patches if not p.get_fill()]
        x, y = outline.get_xy()
        spans = outline.get_height(), outline.get_width()
        assert (y + 0.5, x + 0.5) == (rows, columns)  # the top-left cell: (writer, reader)
        want = (2, 3) if ax is first else (1, 1)
        assert spans == want


def test_large_d_head_widens_the_view_to_the_end_of_every_top_block():
    pair = ("K", 0, 0, 1, 0)
    frame, shares = tables({pair: (18, 3, 3, 1)}, [pair], d_head=64)  # writer directions 18-20
    assert cf.discovered(frame, shares).leading == 21


@pytest.mark.parametrize("kind", ["Q", "V"])
def test_kinds_other_than_k_follow_it(kind):
    frame, shares = tables({}, [(kind, 0, 0, 1, 0), ("K", 0, 2, 1, 2)])
    assert list(cf.discovered(frame, shares).shown["kind"]) == ["K", kind]


# --- the caption, from the facts the figures stage writes ------------------------------------

CAPTION_FACTS = {
    "discovered": {"K": 20, "Q": 3, "V": 7}, "shown": 24, "left_out": 6, "channel_discoveries": 5,
    "d_head": 64, "channels_shown": 16,
}  # fmt: skip


def test_the_channel_caption_gives_the_counts_of_its_facts_and_says_when_nothing_was_found():
    caption = cf.caption(CAPTION_FACTS)
    for number in ("24", "30", "K 20, Q 3, V 7", "6", "16", "64", "5"):
        assert number in caption, number
    none = {**CAPTION_FACTS, "discovered": {"K": 0, "Q": 0, "V": 0}, "shown": 0, "left_out": 0}
    assert not any(c.isdigit() for c in cf.caption(none))  # nothing to count
    every = cf.caption({**CAPTION_FACTS, "shown": 30, "left_out": 0, "channels_shown": 64})
    assert "24" not in every and "30" in every
