"""The composition figures (pipeline/present/figures/composition.py) on a scores table built by
hand (two layers of two heads): the heatmap's cells are score minus baseline at [later head,
earlier head] on a symmetric colour scale, its heads labelled legibly at any count, and the
errata diagram draws each head where its layer and index put it, labelled with its role, and
each chosen pair as an edge in its kind's colour, as wide as its strength.

And the diagram's criterion on weights whose rotated denominators are ~30x smaller than the
true ones (the same numerators, a 30x larger score): by z against the null (scale-free) both
panels get the same edges; the absolute threshold, kept as an option, counts scale."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.colors import to_rgba
from models import head_weights
from test_present_figures_heads import overlapping_ticks

from pipeline.circuits.composition import composition_scores
from pipeline.config import CompositionConfig
from pipeline.present.figures import composition as figures
from pipeline.tables import VARIANTS, excess

ORIGINAL, CORRECTED = "errata_bcda_trueden", "true"


def numbers(text: str) -> list[str]:
    """The numbers of a title or label, as printed, without its words."""
    return re.findall(r"\d+(?:\.\d+)?", text)


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
    with pytest.raises(ValueError) as e:
        figures.diagram_edges(scores, "Z", 3.0, 0.05)
    assert all(repr(c) in str(e.value) for c in ("Z", "fdr", "z", "excess"))  # the value and the choices


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
        assert [numbers(t.get_text()) for t in ax.get_xticklabels()] == [["0"], ["1"]]  # a tick a layer
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


def titled(ax, variant: str, counts: list[str]) -> bool:
    """A panel titled with its variant's words (VARIANT_TITLES) and its edges per kind (Q, K, V)."""
    first, second = ax.get_title().split("\n")
    return first == figures.VARIANT_TITLES[variant] and numbers(second) == counts


def test_the_diagrams_titles_count_the_edges_and_the_suptitle_says_the_criterion(diagram):
    for ax, variant in zip(diagram.axes, (ORIGINAL, CORRECTED), strict=True):
        assert titled(ax, variant, ["0", "3", "0"])
    (legend,) = diagram.legends
    assert [t.get_text().split("-")[0] for t in legend.get_texts()] == ["Q", "K", "V"]
    for handle, kind in zip(legend.legend_handles, "QKV", strict=True):
        assert same_colour(handle.get_color(), figures.KIND_COLORS[kind]) and handle.get_linewidth() == 3
    assert numbers(diagram._suptitle.get_text()) == ["5", "30.0"]  # edge z > 5; the widest edge's z
    assert tuple(diagram.get_size_inches()) == pytest.approx((9.2, 0.45 * 2 + 1.8))


def test_the_diagrams_panel_titles_are_nine_point(diagram):
    assert [ax.title.get_fontsize() for ax in diagram.axes] == [9, 9]


def test_the_diagram_with_one_variant_and_the_other_criteria():
    fig = figures.errata_diagram(scores_table(), variants=(CORRECTED,), fdr=0.1)
    (ax,) = fig.axes
    assert titled(ax, CORRECTED, ["0", "2", "0"])
    by_fdr = fig._suptitle.get_text()
    assert numbers(by_fdr) == ["0.1", "15.0"]  # the FDR asked; the widest edge's calibrated z
    plt.close(fig)
    fig = figures.errata_diagram(scores_table(), "excess", edge_threshold=0.025)
    by_excess = fig._suptitle.get_text()
    assert numbers(by_excess) == ["0.025", "0.030"]  # the threshold; the widest edge's excess
    for ax, variant in zip(fig.axes, (ORIGINAL, CORRECTED), strict=True):
        assert titled(ax, variant, ["0", "1", "0"])
    plt.close(fig)
    z = figures.errata_diagram(scores_table(), "z", edge_z=5.0)
    assert len({by_fdr, by_excess, z._suptitle.get_text()}) == 3  # each criterion says which it is
    plt.close(z)


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
        assert numbers(ax.get_xlabel()) == ["0"] and numbers(ax.get_ylabel()) == ["1"]  # writer, reader layer
        assert ax.get_title() == figures.VARIANT_TITLES[variant] and ax.title.get_fontsize() == 9
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(bars) == 2 and all(bar.get_ylabel() for bar in bars)
    assert fig._suptitle.get_text().split("-")[0] == "Q"  # its kind
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


@pytest.mark.parametrize("n_heads", [3, 8, 12, 32])
def test_the_composition_heatmaps_label_heads_legibly(n_heads):
    """Every head labelled up to eight a side, every second (fourth, ..) beyond: no overlap."""
    rng = np.random.default_rng(n_heads)
    heads = np.arange(n_heads)
    src, dst = np.meshgrid(heads, heads)
    scores = pd.concat(
        pd.DataFrame(
            {
                "kind": "K",
                "variant": v,
                "src_layer": 0,
                "src_head": src.ravel(),
                "dst_layer": 1,
                "dst_head": dst.ravel(),
                "score": rng.normal(size=src.size),
                "baseline_mean": 0.0,
            }
        )  # fmt: skip
        for v in VARIANTS
    )
    fig = figures.composition_heatmap(scores, "K")
    try:
        assert overlapping_ticks(fig) == []
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        step = -(-n_heads // 8)  # ceil
        assert labels == [str(h) for h in range(0, n_heads, step)] and len(labels) <= 8
    finally:
        plt.close(fig)


# --- the criterion, on weights 30x apart in scale -----------------------------------------------

F64 = torch.float64
EPS = 1 / 30  # how much of each head's query (value) subspace its key (output) reuses


def nearly_orthogonal(
    g: torch.Generator, L: int, H: int, D: int, d: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """P [L, H, D, d] and Q [L, H, D, d] with Q = EPS P + (orthogonal to P): ||Q^T P|| is EPS of
    what it would be, ||P Q^T|| is not, so a head's rotated two-factor norm is ~EPS of its true one."""
    P = torch.randn(L, H, D, d, generator=g, dtype=F64)
    other = torch.randn(L, H, D, d, generator=g, dtype=F64)
    basis = torch.linalg.qr(P).Q  # [L, H, D, d]
    other = other - basis @ (basis.mT @ other)  # the part of `other` orthogonal to P's columns
    return P, EPS * P + other


@pytest.fixture(scope="module")
def scaled() -> pd.DataFrame:
    g = torch.Generator().manual_seed(0)
    L, H, D, d = 2, 4, 32, 4
    W_Q, W_K = nearly_orthogonal(g, L, H, D, d)
    W_V, W_O_T = nearly_orthogonal(g, L, H, D, d)
    hw = head_weights(W_Q, W_K, W_V, W_O_T.mT.contiguous())
    return composition_scores(hw, CompositionConfig(baseline_samples=64, null_samples=64), seed=0)


def _variant(scaled: pd.DataFrame, variant: str) -> pd.DataFrame:
    return scaled[scaled["variant"] == variant].reset_index(drop=True)


def test_the_two_denominators_differ_30x_in_scale(scaled):
    rotated, true = _variant(scaled, "errata_bcda"), _variant(scaled, "errata_bcda_trueden")
    ratio = (rotated["score"] / true["score"]).median()
    assert ratio > 30
    assert excess(rotated).abs().max() > 30 * excess(true).abs().max() / 2  # the excess follows the scale
    pd.testing.assert_series_equal(rotated["z"], true["z"], rtol=1e-9, check_names=False)  # z does not


def test_edges_by_z_do_not_follow_the_scale(scaled):
    edges = figures.diagram_edges(scaled, "z", edge_z=3.0, edge_threshold=0.05)
    by_variant = edges.groupby("variant").size()
    assert by_variant.get("errata_bcda", 0) == by_variant.get("errata_bcda_trueden", 0) > 0
    keys = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
    assert _variant(edges, "errata_bcda")[keys].equals(_variant(edges, "errata_bcda_trueden")[keys])


def test_an_absolute_threshold_counts_scale(scaled):
    """The option kept for the paper's own plotting: one threshold on the excess draws many
    more edges for the 30x variant."""
    threshold = float(excess(_variant(scaled, "errata_bcda_trueden")).quantile(0.9))
    edges = figures.diagram_edges(scaled, "excess", edge_z=3.0, edge_threshold=threshold)
    by_variant = edges.groupby("variant").size()
    assert by_variant["errata_bcda"] > 3 * by_variant["errata_bcda_trueden"]


def test_the_figure_titles_say_the_criterion_and_count_the_same_edges(scaled):
    fig = figures.errata_diagram(scaled, "z", 3.0, 0.05, None, ("errata_bcda", "errata_bcda_trueden"))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].split("edges: ")[1] == titles[1].split("edges: ")[1]
    by_z = fig._suptitle.get_text()
    assert numbers(by_z)[0] == "3"  # edge z > 3
    plt.close(fig)
    fig = figures.errata_diagram(scaled, "excess", 3.0, 0.05, None, ("errata_bcda", "errata_bcda_trueden"))
    assert numbers(fig._suptitle.get_text())[0] == "0.05" and fig._suptitle.get_text() != by_z
    plt.close(fig)


def test_the_default_draws_the_discoveries_and_says_so(scaled):
    """`edges: fdr` (the default): exactly the pairs the calibration discovers, in both panels."""
    calibrated = scaled.assign(z_cal=scaled["z"], discovery=scaled["z"] > 3.0)  # a stand-in calibration
    edges = figures.diagram_edges(calibrated, "fdr", edge_z=99.0, edge_threshold=99.0)
    assert len(edges) == int(calibrated["discovery"].sum()) > 0
    assert (edges["strength"] == edges["z_cal"]).all()
    fig = figures.errata_diagram(calibrated, "fdr", 3.0, 0.05, None, ("errata_bcda", "true"), fdr=0.05)
    assert numbers(fig._suptitle.get_text())[0] == "0.05"  # the FDR asked
    plt.close(fig)


def test_the_discoveries_map_puts_each_pairs_calibrated_z_at_its_later_and_earlier_head():
    """Three layers of two heads: each panel's [6, 6] grid holds z_cal at (later head, earlier
    head) in (layer, head) order, nothing where a pair cannot compose, and a dot on each discovery."""
    rows = []
    for kind in ("Q", "K", "V"):
        for variant in (ORIGINAL, CORRECTED):
            for a, b in ((0, 1), (0, 2), (1, 2)):
                for h in range(2):
                    for g in range(2):
                        z = 10 * a + 5 * b + 2 * h + g + (0.5 if variant == CORRECTED else 0)
                        found = (kind, variant, a, h, b, g) == ("K", CORRECTED, 0, 1, 2, 0)
                        rows.append((kind, variant, a, h, b, g, z, found))
    columns = ["kind", "variant", "src_layer", "src_head", "dst_layer", "dst_head", "z_cal", "discovery"]
    scores = pd.DataFrame(rows, columns=columns)
    fig = figures.discoveries_map(scores, (ORIGINAL, CORRECTED))
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6  # a row per kind, a column per variant
    for ax, (kind, variant) in zip(
        panels, [(k, v) for k in ("Q", "K", "V") for v in (ORIGINAL, CORRECTED)], strict=True
    ):
        grid = ax.images[0].get_array().filled(np.nan)
        assert grid.shape == (6, 6)
        for row in scores[(scores["kind"] == kind) & (scores["variant"] == variant)].itertuples():
            assert grid[row.dst_layer * 2 + row.dst_head, row.src_layer * 2 + row.src_head] == row.z_cal
        assert np.isnan(grid).sum() == 36 - 12  # 12 later pairs; the rest cannot compose
        dots = (
            np.concatenate([c.get_offsets() for c in ax.collections]) if ax.collections else np.zeros((0, 2))
        )
        assert dots.tolist() == ([[1.0, 4.0]] if (kind, variant) == ("K", CORRECTED) else [])
    plt.close(fig)
