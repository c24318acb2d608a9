"""The composition figures on a scores table built by hand (two layers of two heads): the
heatmap's cells are score minus baseline at [later head, earlier head] on a symmetric colour
scale, and the errata diagram draws each head where its layer and index put it, labelled with
its role, and each chosen pair as an edge in its kind's colour, as wide as its strength."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from pipeline.present.figures import composition as figures

ORIGINAL, CORRECTED = "errata_bcda_trueden", "true"


def same_colour(a, b) -> bool:
    return tuple(to_rgba(a)) == tuple(to_rgba(b))


def scores_table() -> pd.DataFrame:
    """Every layer-0 -> layer-1 pair, kinds K and Q, both variants; score 0.1 + 0.01 (2 src + dst)
    over a baseline of 0.1 (so excess 0.01 (2 src + dst)), z = 10 x excess, discoveries by hand."""
    rows = []
    for kind in ("K", "Q"):
        for variant in (ORIGINAL, CORRECTED):
            for src in (0, 1):
                for dst in (0, 1):
                    e = 0.01 * (2 * src + dst) * (1 if kind == "K" else -1)
                    rows.append(
                        {
                            "kind": kind,
                            "variant": variant,
                            "src_layer": 0,
                            "src_head": src,
                            "dst_layer": 1,
                            "dst_head": dst,
                            "score": 0.1 + e,
                            "baseline_mean": 0.1,
                            "z": 1000 * e,
                            "z_cal": 500 * e,
                            "discovery": kind == "K" and variant == CORRECTED and src == 1,
                        }
                    )
    return pd.DataFrame(rows)


ROLES = pd.DataFrame(
    [(0, 0, "previous_token"), (0, 1, "other"), (1, 0, "induction")], columns=["layer", "head", "role"]
)  # head 1.1 has no row


def test_head_labels_add_the_role_but_not_other_or_a_missing_one():
    labels = [figures._head_label(layer, head, ROLES) for layer in (0, 1) for head in (0, 1)]
    assert labels == ["0.0 previous-token", "0.1", "1.0 induction", "1.1"]
    assert figures._head_label(1, 0, None) == "1.0"
    assert figures._head_label(1, 0, ROLES.drop(columns="role")) == "1.0"
    # an empty role cell (NaN as read from a CSV, or None) is no role: not "1.1 nan"
    empty = pd.DataFrame({"layer": [1, 1], "head": [1, 0], "role": [float("nan"), None]})
    assert [figures._head_label(1, head, empty) for head in (1, 0)] == ["1.1", "1.0"]
    assert figures._head_label(1, 1, ROLES.astype({"role": object})) == "1.1"


def test_diagram_edges_by_each_criterion():
    scores = scores_table()
    fdr = figures.diagram_edges(scores, "fdr", 3.0, 0.05)
    assert list(zip(fdr["kind"], fdr["src_head"], fdr["dst_head"], strict=True)) == [("K", 1, 0), ("K", 1, 1)]
    assert fdr["strength"].tolist() == pytest.approx([10.0, 15.0])  # z_cal
    z = figures.diagram_edges(scores, "z", 15.0, 0.05)  # z > 15: excess 0.02 and 0.03 of K
    assert z["strength"].tolist() == pytest.approx([20.0, 30.0] * 2)
    assert set(z["kind"]) == {"K"}
    absolute = figures.diagram_edges(scores, "excess", 3.0, 0.015)
    assert absolute["strength"].tolist() == pytest.approx([0.02, 0.03] * 2)
    with pytest.raises(ValueError, match="criterion must be 'fdr', 'z' or 'excess', not 'Z'"):
        figures.diagram_edges(scores, "Z", 3.0, 0.05)


@pytest.fixture
def diagram():
    fig = figures.errata_diagram(scores_table(), "z", edge_z=5.0, roles=ROLES)
    yield fig
    plt.close(fig)


def test_the_diagram_draws_each_head_at_its_layer_and_index_with_its_label(diagram):
    for ax in diagram.axes:
        dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
        assert [(line.get_xdata()[0], line.get_ydata()[0]) for line in dots] == [
            (0, 1),
            (0, 0),
            (1, 1),
            (1, 0),
        ]
        assert all(same_colour(d.get_color(), "0.2") and d.get_markersize() == 6 for d in dots)
        labels = [(t.get_text(), t.get_position(), t.get_horizontalalignment()) for t in ax.texts]
        assert labels == [
            ("0.0 previous-token", (-0.06, 1), "right"),
            ("0.1", (-0.06, 0), "right"),
            ("1.0 induction", (1.06, 1), "left"),
            ("1.1", (1.06, 0), "left"),
        ]
        assert {(t.get_verticalalignment(), t.get_fontsize()) for t in ax.texts} == {("center", 7)}
        assert ax.get_xlim() == pytest.approx((-0.8, 1.8)) and ax.get_ylim() == pytest.approx((-0.8, 1.8))
        assert [t.get_text() for t in ax.get_xticklabels()] == ["layer 0", "layer 1"]
        assert not ax.spines["left"].get_visible() and ax.spines["bottom"].get_visible()


def test_the_diagram_draws_each_edge_in_its_kinds_colour_as_wide_as_its_strength(diagram):
    # z > 5: K pairs of excess 0.01, 0.02, 0.03 (z 10, 20, 30) in both panels; widest is z 30
    expected = {  # (src head, dst head): (middle y, width)
        (0, 1): (0.5, 0.5 + 4.5 * 10 / 30),
        (1, 0): (0.5, 0.5 + 4.5 * 20 / 30),
        (1, 1): (0.0, 0.5 + 4.5 * 30 / 30),
    }
    for ax in diagram.axes:
        edges = [line for line in ax.get_lines() if line.get_marker() != "o"]
        assert len(edges) == 3
        for line, ((src, dst), (mid, width)) in zip(edges, expected.items(), strict=True):
            assert list(line.get_xdata()) == [0, 0.5, 1]
            assert list(line.get_ydata()) == pytest.approx([1 - src, mid, 1 - dst])
            assert line.get_linewidth() == pytest.approx(width)
            assert same_colour(line.get_color(), figures.KIND_COLORS["K"]) and line.get_alpha() == 0.8


def test_the_diagrams_titles_count_the_edges_and_the_suptitle_says_the_criterion(diagram):
    assert [ax.get_title() for ax in diagram.axes] == [
        "original (B C D A, true denominators)\nedges: Q 0, K 3, V 0",
        "corrected (true Frobenius norm)\nedges: Q 0, K 3, V 0",
    ]
    (legend,) = diagram.legends
    assert [t.get_text() for t in legend.get_texts()] == ["Q-composition", "K-composition", "V-composition"]
    for handle, kind in zip(legend.legend_handles, "QKV", strict=True):
        assert same_colour(handle.get_color(), figures.KIND_COLORS[kind]) and handle.get_linewidth() == 3
    assert diagram._suptitle.get_text() == (
        "Head composition. Edge: raw z against the spectrum-preserving null > 5, uncalibrated "
        "(width: z, max 30.0)"
    )
    assert tuple(diagram.get_size_inches()) == pytest.approx((9.2, 0.45 * 2 + 1.8))


def test_the_diagrams_panel_titles_are_nine_point(diagram):
    assert [ax.title.get_fontsize() for ax in diagram.axes] == [9, 9]


def test_the_diagram_with_one_variant_and_the_other_criteria():
    fig = figures.errata_diagram(scores_table(), variants=(CORRECTED,), fdr=0.1)
    (ax,) = fig.axes
    assert ax.get_title() == "corrected (true Frobenius norm)\nedges: Q 0, K 2, V 0"
    assert fig._suptitle.get_text() == (
        "Head composition. Edge: a discovery, FDR q < 0.1\n(Benjamini-Hochberg against the model's own "
        "empirical null; width: calibrated z, max 15.0)"
    )
    plt.close(fig)
    fig = figures.errata_diagram(scores_table(), "excess", edge_threshold=0.025)
    assert fig._suptitle.get_text() == (
        "Head composition. Edge: score - baseline > 0.025, an absolute threshold (width: excess, max 0.030)"
    )
    assert [ax.get_title().split("\n")[1] for ax in fig.axes] == ["edges: Q 0, K 1, V 0"] * 2
    plt.close(fig)


def test_the_heatmap_shows_excess_at_later_head_by_earlier_head_on_a_symmetric_scale():
    scores = scores_table()
    fig = figures.composition_heatmap(scores, "Q", (CORRECTED, "errata_dabc", ORIGINAL))
    panels = [ax for ax in fig.axes if ax.images]  # the colour bars are axes too
    assert len(panels) == 2  # errata_dabc is not in the table
    for ax, variant in zip(panels, (CORRECTED, ORIGINAL), strict=True):
        (image,) = ax.images
        np.testing.assert_allclose(image.get_array(), [[0.0, -0.02], [-0.01, -0.03]], atol=1e-12)
        assert image.get_clim() == pytest.approx((-0.03, 0.03))
        assert image.get_cmap().name == "RdBu_r"
        assert list(ax.get_xticks()) == [0, 1] and list(ax.get_yticks()) == [0, 1]
        assert ax.get_xlabel() == "layer 0 head (writes)" and ax.get_ylabel() == "layer 1 head (reads)"
        assert ax.get_title() == figures.VARIANT_TITLES[variant] and ax.title.get_fontsize() == 9
    bars = [ax for ax in fig.axes if not ax.images]
    assert [bar.get_ylabel() for bar in bars] == ["score - baseline"] * 2
    assert fig._suptitle.get_text() == "Q-composition"
    assert tuple(fig.get_size_inches()) == pytest.approx((3.8 + 0.8, 3.2 * 2))
    plt.close(fig)


def test_an_all_zero_heatmap_keeps_a_unit_scale():
    scores = scores_table().assign(score=0.1)
    fig = figures.composition_heatmap(scores, "K", (CORRECTED,))
    assert fig.axes[0].images[0].get_clim() == (-1.0, 1.0)
    plt.close(fig)


def test_the_diagrams_legend_is_eight_point_three_across_at_the_bottom_without_a_frame(diagram):
    (legend,) = diagram.legends
    assert [t.get_fontsize() for t in legend.get_texts()] == [8, 8, 8]
    assert legend._ncols == 3 and not legend.get_frame_on() and legend._loc == 8  # lower center
