"""The head figures (pipeline/present/figures/heads.py) on tables built by hand: each attention
panel shows its own head's pattern under its role, the dotted line on the induction targets
worked out by hand, the copying vs QK scatter puts each defined head at its two scores in its
role's colour and names the undefined ones inside the axes, and the ablation panels plot
|effect| against score minus baseline, with tick labels that never overlap whatever the data's
range."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import planted
import pytest
from matplotlib.colors import to_rgba

from pipeline.circuits import weights
from pipeline.present.figures import heads as figures
from pipeline.tables import VARIANTS

L, H, T = 2, 2, 7  # a sequence [first, span of 3, span of 3]


def same_colour(a, b) -> bool:
    return to_rgba(a) == to_rgba(b)


def head_table(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["layer", "head", "role", "copying", "qk_positivity"])


ROLES = head_table(
    [
        (0, 0, "previous_token", math.nan, math.nan),
        (0, 1, "first_token", math.nan, math.nan),
        (1, 0, "induction", 0.9, 0.8),
    ]
)  # head 1.1 has no row: its role is "?"


@pytest.fixture
def patterns():
    pattern = np.random.default_rng(0).random((L, H, T, T)).astype(np.float32)
    fig = figures.attention_patterns(pattern, ROLES, repeat_length=3)
    yield pattern, fig
    plt.close(fig)


def test_each_panel_is_its_heads_pattern_titled_with_its_role_in_its_colour(patterns):
    pattern, fig = patterns
    assert len(fig.axes) == L * H
    expected = [
        ("0.0 previous token", "#1f77b4"),
        ("0.1 first token", "#7f7f7f"),
        ("1.0 induction", "#d62728"),
    ]
    expected.append(("1.1 ?", "black"))
    for ax, (layer, head), (title, colour) in zip(fig.axes, np.ndindex(L, H), expected, strict=True):
        (image,) = ax.images
        np.testing.assert_array_equal(image.get_array(), pattern[layer, head])
        assert image.get_clim() == (0.0, 1.0) and image.get_cmap().name == "Blues"
        assert ax.get_title() == title and same_colour(ax.title.get_color(), colour)
        assert ax.title.get_fontsize() == 8
        assert not ax.get_xticks().size and not ax.get_yticks().size
    assert tuple(fig.get_size_inches()) == pytest.approx((1.9 * H, 2.1 * L + 0.4))


def test_the_dotted_line_marks_key_equals_query_minus_repeat_length_plus_one(patterns):
    _, fig = patterns
    for ax in fig.axes:
        (line,) = ax.get_lines()
        # the second copy's queries 4, 5, 6 attend to the token after their first occurrence: 2, 3, 4
        assert list(line.get_ydata()) == [4, 5, 6]
        assert list(line.get_xdata()) == [2, 3, 4]
        assert line.get_linestyle() == ":" and same_colour(line.get_color(), "#d62728")
        assert line.get_linewidth() == 0.8


def test_without_a_repeat_length_no_line_is_drawn():
    fig = figures.attention_patterns(np.zeros((1, 1, 4, 4)), ROLES)
    assert not fig.axes[0].get_lines()
    plt.close(fig)


def test_rows_are_labelled_by_layer_and_the_figure_says_what_sequence_it_shows(patterns):
    _, fig = patterns
    assert [re.findall(r"\d+", ax.get_ylabel()) for ax in fig.axes] == [["0"], [], ["1"], []]  # its layer
    assert [bool(ax.get_xlabel()) for ax in fig.axes] == [False, False, True, True]  # the bottom row
    assert fig.axes[0].yaxis.get_label().get_fontsize() == 8
    assert fig.axes[-1].xaxis.get_label().get_fontsize() == 8
    assert fig._suptitle.get_text()


# --- copying vs QK ----------------------------------------------------------------------

LATER = head_table(
    [
        (0, 0, "previous_token", 0.5, 0.5),  # layer 0: never shown
        (1, 0, "induction", 0.9, 0.8),
        (1, 1, "previous_token", -0.2, 0.3),
        (1, 2, "induction", 0.7, 0.6),
        (1, 3, "mystery", 0.1, -0.1),  # a role with no colour: black
        (2, 0, "other", math.nan, 0.4),  # undefined copying
        (2, 1, "other", 0.2, math.inf),  # undefined QK term
    ]
)


@pytest.fixture
def scatter():
    fig = figures.copying_vs_qk(LATER)
    (ax,) = fig.axes
    yield fig, ax
    plt.close(fig)


def undefined(note) -> list[str]:
    """The heads a note names (layer.head), in its order."""
    return re.findall(r"\d+\.\d+", note.get_text())


def test_each_role_is_one_scatter_of_its_heads_scores_in_its_colour(scatter):
    _, ax = scatter
    groups = {
        "induction": ([[0.9, 0.8], [0.7, 0.6]], "#d62728"),
        "mystery": ([[0.1, -0.1]], "black"),
        "previous token": ([[-0.2, 0.3]], "#1f77b4"),
    }
    assert [c.get_label() for c in ax.collections] == list(groups)  # sorted by role
    for c, (points, colour) in zip(ax.collections, groups.values(), strict=True):
        np.testing.assert_array_equal(c.get_offsets(), points)
        assert [tuple(f) for f in c.get_facecolors()] == [to_rgba(colour)]
        assert list(c.get_sizes()) == [36]
    notes = {t.get_text(): t.xy for t in ax.texts if t.get_text()[0].isdigit()}
    assert notes == {"1.0": (0.9, 0.8), "1.1": (-0.2, 0.3), "1.2": (0.7, 0.6), "1.3": (0.1, -0.1)}


def test_the_dots_are_36_square_points_whatever_the_styles_marker_size():
    """matplotlib's default dot is lines.markersize squared (6 ** 2 = 36): the figure sets it, so a
    matplotlibrc or style with another marker size does not change it."""
    with plt.rc_context({"lines.markersize": 2.0}):
        fig = figures.copying_vs_qk(LATER)
    assert [list(c.get_sizes()) for c in fig.axes[0].collections] == [[36], [36], [36]]
    plt.close(fig)


def test_the_axes_cross_at_zero_in_light_grey_on_a_fixed_square(scatter):
    _, ax = scatter
    horizontal, vertical = ax.get_lines()
    assert list(horizontal.get_ydata()) == [0, 0] and list(vertical.get_xdata()) == [0, 0]
    for line in (horizontal, vertical):
        assert same_colour(line.get_color(), "0.8") and line.get_linewidth() == 0.8
    assert ax.get_xlim() == (-1.05, 1.05) and ax.get_ylim() == (-1.05, 1.05)
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


def test_the_legend_is_small_and_upper_left(scatter):
    fig, ax = scatter
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["induction", "mystery", "previous token"]
    assert [t.get_fontsize() for t in legend.get_texts()] == [7, 7, 7]
    fig.canvas.draw()
    box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert box.x0 - axes_box.x0 < 0.1 * axes_box.width and axes_box.y1 - box.y1 < 0.1 * axes_box.height


def test_the_legend_stays_upper_left_even_where_the_heads_crowd_that_corner():
    """loc="best" would move it off the dots (to the upper right): the figure pins it upper left."""
    crowded = head_table([(1, h, "induction", -0.95 + 0.05 * h, 0.95 - 0.05 * h) for h in range(6)])
    fig = figures.copying_vs_qk(crowded)
    (ax,) = fig.axes
    fig.canvas.draw()
    box, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert box.x0 - axes_box.x0 < 0.1 * axes_box.width and axes_box.y1 - box.y1 < 0.1 * axes_box.height
    plt.close(fig)


def test_undefined_heads_are_named_small_in_the_lower_right_corner_inside_the_axes(scatter):
    fig, ax = scatter
    (note,) = [t for t in ax.texts if not t.get_text()[0].isdigit()]  # not a defined head's name
    assert undefined(note) == ["2.0", "2.1"]
    assert note.get_fontsize() == 7
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("right", "bottom")
    fig.canvas.draw()
    box, axes_box = note.get_window_extent(), ax.get_window_extent()
    assert axes_box.x0 < box.x0 < box.x1 < axes_box.x1 and axes_box.y0 < box.y0 < box.y1 < axes_box.y1
    # the corner: right edge 1% of the width from the axes' right, bottom 1% of the height up
    assert box.x1 == pytest.approx(axes_box.x1 - 0.01 * axes_box.width, abs=1)
    assert box.y0 == pytest.approx(axes_box.y0 + 0.01 * axes_box.height, abs=1)


def test_with_no_defined_head_there_is_no_legend_and_every_head_is_named():
    fig = figures.copying_vs_qk(LATER[LATER["copying"].isna() | ~np.isfinite(LATER["qk_positivity"])])
    (ax,) = fig.axes
    assert ax.get_legend() is None and not ax.collections
    (note,) = ax.texts
    assert undefined(note) == ["2.0", "2.1"]
    plt.close(fig)


# --- ablation vs composition -----------------------------------------------------------

PAIR = {"src_layer": 0, "src_head": 0, "dst_layer": 1, "dst_head": 0}


def test_ablation_panels_plot_absolute_effect_against_score_minus_baseline():
    effects = pd.DataFrame(
        [
            {"kind": "K", **PAIR, "loss_effect": -0.3},
            {"kind": "K", **PAIR, "dst_head": 1, "loss_effect": 0.2},
            {"kind": "Q", **PAIR, "loss_effect": 0.5},
        ]
    )
    scores = pd.DataFrame(
        [
            {"kind": k, **PAIR, "dst_head": h, "variant": v, "score": s, "baseline_mean": 0.1}
            for k, h, s in (("K", 0, 0.4), ("K", 1, 0.2), ("Q", 0, math.nan))
            for v in VARIANTS
        ]
    )
    rho = {"K": {"true": 0.123, "errata_bcda": None}}
    fig = figures.ablation_vs_composition(effects, scores, rho=rho, kinds=("K", "Q"))
    assert len(fig.axes) == 2 * len(VARIANTS)
    assert tuple(fig.get_size_inches()) == pytest.approx((3.4 * len(VARIANTS), 2.9 * 2))
    k_row, q_row = fig.axes[: len(VARIANTS)], fig.axes[len(VARIANTS) :]
    for ax in k_row:
        np.testing.assert_allclose(ax.collections[0].get_offsets(), [[0.3, 0.3], [0.1, 0.2]])
        assert same_colour(ax.collections[0].get_facecolors()[0], "#444444")
        assert not ax.texts
    titles = [ax.get_title() for ax in k_row]
    assert all(title.startswith(f"K {v}") for title, v in zip(titles, VARIANTS, strict=True))
    assert re.findall(r"\d\.\d+", titles[0]) == ["0.12"]  # rho to two places
    undefined_rho = {title.removeprefix(f"K {v}") for title, v in zip(titles[1:], VARIANTS[1:], strict=True)}
    assert len(undefined_rho) == 1 and not re.search(r"\d", undefined_rho.pop())  # no number, said alike
    fig.canvas.draw()
    for ax in q_row:  # NaN scores: said small in the middle of the panel
        (note,) = ax.texts
        assert note.get_text() and note.get_fontsize() == 8
        assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("center", "center")
        box, panel_box = note.get_window_extent(), ax.get_window_extent()
        assert (box.x0 + box.x1) / 2 == pytest.approx((panel_box.x0 + panel_box.x1) / 2, abs=1)
        assert (box.y0 + box.y1) / 2 == pytest.approx((panel_box.y0 + panel_box.y1) / 2, abs=1)
        assert ax.get_xlabel() and ax.xaxis.get_label().get_fontsize() == 8
    assert [ax.get_ylabel() for ax in fig.axes] == [figures.EFFECT_LABELS["loss_effect"], "", "", "", ""] * 2
    assert fig.axes[0].yaxis.get_label().get_fontsize() == 8
    assert [ax.title.get_fontsize() for ax in fig.axes] == [8] * len(fig.axes)
    assert [ax.get_xlabel() for ax in k_row] == [""] * len(VARIANTS)
    assert "loss effect" in fig._suptitle.get_text()  # the effect drawn
    plt.close(fig)


def test_ablation_dots_are_twelve_square_points():
    effects = pd.DataFrame([{"kind": "K", **PAIR, "loss_effect": -0.3}])
    scores = pd.DataFrame(
        [{"kind": "K", **PAIR, "variant": v, "score": 0.4, "baseline_mean": 0.1} for v in VARIANTS]
    )
    fig = figures.ablation_vs_composition(effects, scores, kinds=("K",))
    assert [list(ax.collections[0].get_sizes()) for ax in fig.axes] == [[12]] * len(VARIANTS)
    plt.close(fig)


def test_ablation_panels_tick_labels_are_seven_points_on_both_axes():
    effects = pd.DataFrame([{"kind": "K", **PAIR, "loss_effect": -0.3}])
    scores = pd.DataFrame(
        [{"kind": "K", **PAIR, "variant": v, "score": 0.4, "baseline_mean": 0.1} for v in VARIANTS]
    )
    fig = figures.ablation_vs_composition(effects, scores, kinds=("K",))
    fig.canvas.draw()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_text()]
            assert labels and {t.get_fontsize() for t in labels} == {7}
    plt.close(fig)


def test_read_example_refuses_a_file_that_is_not_safetensors_naming_the_file_and_why(tmp_path):
    from pipeline.errors import UserError

    path = tmp_path / "patterns.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(UserError) as e:
        figures.read_example(path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    with pytest.raises(SafetensorError) as why:
        load_file(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: ") and len(message.splitlines()) == 1
    assert str(why.value).splitlines()[0] in message  # the library's reason


def test_read_example_refuses_a_pattern_that_is_not_layer_head_square_naming_its_shape(tmp_path):
    """A 3-d pattern, and a 4-d one whose last two axes differ (5 queries, 4 keys), are refused
    naming the file and the shape; a [1, 2, 3, 3] pattern is returned as it was saved."""
    from safetensors.numpy import save_file

    from pipeline.errors import UserError

    path = tmp_path / "patterns.safetensors"
    for shape in ([2, 3, 3], [1, 2, 5, 4]):
        save_file({"pattern": np.zeros(shape, dtype=np.float32)}, str(path))
        with pytest.raises(UserError) as e:
            figures.read_example(path)
        message = str(e.value)
        assert message.startswith(f"{path}: ") and str(shape) in message and len(message.splitlines()) == 1
    square = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    save_file({"pattern": square}, str(path))
    np.testing.assert_array_equal(figures.read_example(path), square)


# --- the heads summary's Spearman correlations ----------------------------------------------


def test_spearman_of_reads_each_effects_correlations_and_refuses_a_malformed_summary():
    from pipeline.errors import UserError

    summary = {"agreement": {"loss_effect": {"spearman": {"K": {"true": 0.5, "errata_bcda": None}}}}}
    assert figures.spearman_of(summary) == {"loss_effect": {"K": {"true": 0.5, "errata_bcda": None}}}
    assert figures.spearman_of({"agreement": {"loss_effect": {}}}) == {"loss_effect": {}}
    for bad in ([summary], {"agreement": []}, {"agreement": {"x": {"spearman": {"K": {"true": "0.5"}}}}}):
        with pytest.raises(UserError) as e:
            figures.spearman_of(bad, "heads/summary.json")
        message = str(e.value)
        assert message.startswith("heads/summary.json: agreement: ") and len(message.splitlines()) == 1


# --- tick labels that can be read ---------------------------------------------------------


def grid_inputs(x_range: tuple[float, float], y_range: tuple[float, float], n: int = 60):
    """Seeded ablation effects and scores whose excess spans `x_range` and effect `y_range`, every
    kind and variant (ranges like a trained model's: the report's ablation_pattern.png)."""
    rng = np.random.default_rng(0)
    keys = pd.DataFrame({
        "src_layer": 0, "src_head": np.arange(n) % 8, "dst_layer": 1, "dst_head": np.arange(n) // 8,
    })  # fmt: skip
    effects, scores = [], []
    for kind in ("Q", "K", "V"):
        pairs = keys.assign(kind=kind)
        effects.append(pairs.assign(pattern_effect=rng.uniform(*y_range, n)))
        for variant in VARIANTS:
            scores.append(pairs.assign(variant=variant, score=rng.uniform(*x_range, n), baseline_mean=0.0))
    return pd.concat(effects, ignore_index=True), pd.concat(scores, ignore_index=True)


GAP = 0.5  # the least space between two tick labels, in ems of their font (a space is ~0.3)


def overlapping_ticks(fig) -> list[str]:
    """`panel axis: label, label` for each pair of neighbouring tick labels closer than GAP once
    drawn (the report's grids had -0.150 and -0.125 0.3 em apart: they read as one number)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            pad = [GAP / 2 * t.get_fontsize() * fig.dpi / 72 for t in labels]
            boxes = [t.get_window_extent(renderer).padded(p) for t, p in zip(labels, pad, strict=True)]
            for i in range(len(labels) - 1):
                if boxes[i].overlaps(boxes[i + 1]):
                    pair = f"{labels[i].get_text()}, {labels[i + 1].get_text()}"
                    found.append(f"{ax.get_title()} {name}: {pair}")
    return found


@pytest.mark.parametrize(
    "x_range",
    [(-0.15, 0.025), (-0.0213, 0.0287), (-0.2, 3.1), (-1234.5, 2345.6), (0.000123, 0.000987)],
)
def test_the_ablation_grids_tick_labels_do_not_overlap(x_range):
    import matplotlib.pyplot as plt

    effects, scores = grid_inputs(x_range, (0.0183, 0.4712))
    fig = figures.ablation_vs_composition(effects, scores, "pattern_effect")
    try:
        assert overlapping_ticks(fig) == []
    finally:
        plt.close(fig)


def test_the_overlap_check_can_fail():
    """Ten long labels on a narrow axis overlap, and the check says so."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(np.linspace(0, 1, 10), [f"{v:.4f}" for v in np.linspace(-0.15, 0.025, 10)])
    try:
        assert overlapping_ticks(fig)
    finally:
        plt.close(fig)


LENGTH, CFG, PLANTED_ROLES, scores_of = planted.LENGTH, planted.HEADS, planted.ROLES, planted.scores_of


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


@pytest.fixture(scope="module")
def planted_result(planted_scores):
    return planted.analysed(planted_scores)


def test_attention_pattern_panels_are_titled_with_roles(planted_result):
    from pipeline.present.figures import heads as heads_figures

    pattern = planted_result.example["pattern"].numpy()
    fig = heads_figures.attention_patterns(pattern, planted_result.table, LENGTH)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"{l}.{h} {role.replace('_', ' ')}" for (l, h), role in PLANTED_ROLES.items()]
    first = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(first, pattern[0, 0])  # the pattern itself, not a copy of another head's


def test_copying_vs_qk_places_the_induction_head_top_right_and_names_undefined_heads(planted_result):
    from pipeline.present.figures import heads as heads_figures

    fig = heads_figures.copying_vs_qk(planted_result.table)
    (ax,) = fig.axes
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(points, [[1.0, 1.0]])  # only 1.0 has both scores defined
    (note,) = [t.get_text() for t in ax.texts if "1.1" in t.get_text()]
    assert "1.1, 1.2" in note  # the heads left out, named


def test_ablation_figure_shows_each_variants_rho(planted_result, planted_scores):
    from pipeline.present.figures import heads as heads_figures

    scores = planted_scores
    rho = {"K": {"true": 0.5, "errata_bcda": None}}
    fig = heads_figures.ablation_vs_composition(planted_result.ablation, scores, "attn_effect", rho, ("K",))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == len(VARIANTS) and titles[0].startswith("K true") and "0.50" in titles[0]
    for title, v in zip(titles[1:], VARIANTS[1:], strict=True):  # each variant's panel, its rho undefined
        assert title.startswith(f"K {v}:") and not any(c.isdigit() for c in title.split(":", 1)[1])
    k_true = fig.axes[0].collections[0].get_offsets()
    assert len(k_true) == 9 and k_true[:, 1].max() > 0.8  # 3 x 3 pairs; the planted edge's induction drop
