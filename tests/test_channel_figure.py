"""The channel figure: one heat map per discovered pair (K first), each showing its own table
(a planted one-channel table peaks at its channel; a real table is drawn as measured), capped
with the rest counted, the channel discoveries marked; and the figures stage draws it
byte-stably from the composition stage's files, refusing tables that do not match."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import synthetic_seeds as syn
from channel_tables import later_pairs, tables, write
from models import random_model

from pipeline import params
from pipeline.circuits import channels as ch
from pipeline.circuits.weights import from_state_dict
from pipeline.config import CompositionConfig
from pipeline.present.figures import channels as cf

ROOT = Path(__file__).resolve().parents[1]
# synthetic_seeds' true discoveries: K 1.0 <- 0.0, 1.1 <- 0.0, 1.0 <- 0.1; V 1.2 <- 0.2
FOUND = [("K", 0, 0, 1, 0), ("K", 0, 0, 1, 1), ("K", 0, 1, 1, 0), ("V", 0, 2, 1, 2)]


def panels(fig):
    """The heat-map axes (the colour bar's axes hold no image), in drawing order."""
    return [ax for ax in fig.axes if ax.images]


def test_planted_channels_peak_where_planted_and_only_discovered_pairs_are_drawn():
    planted = {pair: (k % 4, (k + 2) % 4) for k, pair in enumerate(FOUND)}
    planted[("Q", 0, 1, 1, 2)] = (3, 3)  # planted but not a discovery: not drawn
    frame, shares = tables(planted, FOUND, channel_discovery=[FOUND[1]])
    picked = cf.discovered(frame, shares, syn.scores())
    fig = cf.channel_maps(picked, shares)
    axes = panels(fig)
    assert len(axes) == len(FOUND) and picked.counts == {"K": 3, "Q": 0, "V": 1}
    for ax, pair in zip(axes, FOUND, strict=True):  # K first, then V
        kind, i, h, j, g = pair
        image = np.asarray(ax.images[0].get_array())
        assert image.shape == (4, 4)
        assert np.unravel_index(image.argmax(), image.shape) == planted[pair]
        assert ax.images[0].get_clim() == (0.0, 1.0)  # one scale for every panel
        title = ax.get_title()
        assert f"{kind} L{i}H{h} -> L{j}H{g}" in title and "top 1.00" in title and "eff. 1.0" in title
        assert title.startswith("★") == (pair == FOUND[1])
    assert axes[1].spines["left"].get_edgecolor() != axes[0].spines["left"].get_edgecolor()
    assert axes[-1].get_xlabel() == "reader channel j" and axes[0].get_ylabel() == "writer channel i"
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
    assert "20 of 30 shown (K 15, Q 0, V 15); 10 left out" in fig.get_suptitle()


def test_large_d_head_shows_the_leading_channels_widened_to_every_top_channel():
    pair = ("K", 0, 0, 1, 0)
    frame, shares = tables({pair: (20, 3)}, [pair, ("K", 0, 1, 1, 1)], d_head=64)
    picked = cf.discovered(frame, shares)
    assert (picked.d_head, picked.leading) == (64, 21)  # the planted channel 20 stays in view
    fig = cf.channel_maps(picked, shares)
    first, second = panels(fig)
    assert np.asarray(first.images[0].get_array()).shape == (21, 21)
    assert first.get_xlabel() == "reader channel j (leading 21 of 64)"
    assert "in view: 100%" in first.get_title() and f"in view: {21**2 / 64**2:.0%}" in second.get_title()
    frame, shares = tables({}, [pair], d_head=64)
    assert cf.discovered(frame, shares).leading == cf.LEADING


def test_no_discovered_pair_draws_a_figure_that_says_so():
    frame, shares = tables({("K", 0, 0, 1, 0): (0, 0)}, [])
    picked = cf.discovered(frame, shares)
    fig = cf.channel_maps(picked, shares)
    assert not panels(fig) and "No discovered pair" in fig.axes[0].texts[0].get_text()
    assert picked.facts()["shown"] == 0 and picked.facts()["discovered"] == {"K": 0, "Q": 0, "V": 0}


def test_a_real_table_is_drawn_as_measured():
    """From a random model's weights: each panel is its pair's normalised shares (float32)."""
    hw = from_state_dict(random_model(seed=3).state_dict())
    c = ch.channels(hw, "K")
    k = c.normalised()  # [L, H, L, H, d, d]
    summary = ch.channel_summary(k, c.s, c.t, CompositionConfig().channel_tolerance)
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
        assert f"at ({top[0]}, {top[1]})" in ax.get_title()


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
    assert "top 1.00 at (1-2, 0-2)" in first.get_title() and "top 1.00 at (3, 2)" in second.get_title()
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


# --- the figures stage -----------------------------------------------------------------


def stage_args(tmp_path: Path) -> list[str]:
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(["analysis.figures.dpi=40"])))
    syn.scores()[lambda f: f["variant"] != "invariant"].to_csv(tmp_path / "scores.csv", index=False)
    return ["--params", str(tmp_path / "params.yaml"), "--scores", str(tmp_path / "scores.csv")]


def test_figures_stage_draws_the_channel_figure_byte_stably(tmp_path):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    csv, st = write(tmp_path, *tables({FOUND[0]: (1, 2)}, FOUND, channel_discovery=[FOUND[0]]))
    channel_args = ["--channels", str(csv), "--channel-shares", str(st)]
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert figures_stage.main([*args, *channel_args, "--out", str(out)]) == 0
    names = {"channels.png", "channels.svg", "channels.json"}
    assert names <= {p.name for p in outs[0].iterdir()}
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    facts = json.loads((outs[0] / "channels.json").read_text())
    assert facts["discovered"] == {"K": 3, "Q": 0, "V": 1} and facts["channel_discoveries"] == 1
    # without the channel files, no channel figure (the other figures as before)
    assert figures_stage.main([*args, "--out", str(tmp_path / "c")]) == 0
    assert not {p.name for p in (tmp_path / "c").iterdir()} & names


def test_figures_stage_refuses_tables_that_do_not_match_the_csv(tmp_path, capsys):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    frame, shares = tables({}, FOUND)
    csv, st = write(tmp_path, frame, {**shares, "K": shares["K"][:-1]})
    out = tmp_path / "out"
    assert (
        figures_stage.main([*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)])
        != 0
    )
    err = capsys.readouterr().err
    assert "channels.safetensors" in err and "K: expected 9 pairs" in err
    assert not out.exists()  # every input is checked before anything is written
    # a top channel (a block of directions 2-4) beyond the file's d_head = 4
    wide = frame.assign(writer_channel=2, writer_block=frame["writer_block"].where(frame.index != 3, 3))
    csv, st = write(tmp_path, wide, shares)
    args_wide = [*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)]
    assert figures_stage.main(args_wide) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "channels.safetensors" in err and "d_head = 4" in err
    assert not out.exists()
    csv, st = write(tmp_path, frame, shares)
    assert figures_stage.main([*args, "--channels", str(csv), "--out", str(out)]) != 0
    assert "give both or neither" in capsys.readouterr().err
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    bad = ["--channels", str(csv), "--channel-shares", str(tmp_path / "bad.safetensors")]
    assert figures_stage.main([*args, *bad, "--out", str(out)]) != 0
    assert "not a channels file of the composition stage" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["Q", "V"])
def test_kinds_other_than_k_follow_it(kind):
    frame, shares = tables({}, [(kind, 0, 0, 1, 0), ("K", 0, 2, 1, 2)])
    assert list(cf.discovered(frame, shares).shown["kind"]) == ["K", kind]
