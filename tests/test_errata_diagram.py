"""The errata diagram draws both panels by one scale-free criterion (z against the null), so a
variant 30x larger in scale does not get more edges; the absolute threshold, kept as an
option, does count scale. Built on weights whose rotated denominators are ~30x smaller than
the true ones: the same numerators, a 30x larger score."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from test_composition import head_weights

from pipeline.circuits.composition import composition_scores
from pipeline.config import CompositionConfig
from pipeline.present.figures.composition import diagram_edges, errata_diagram
from pipeline.tables import excess

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
def scores() -> pd.DataFrame:
    g = torch.Generator().manual_seed(0)
    L, H, D, d = 2, 4, 32, 4
    W_Q, W_K = nearly_orthogonal(g, L, H, D, d)
    W_V, W_O_T = nearly_orthogonal(g, L, H, D, d)
    hw = head_weights(W_Q, W_K, W_V, W_O_T.mT.contiguous())
    return composition_scores(hw, CompositionConfig(baseline_samples=64, null_samples=64), seed=0)


def _variant(scores: pd.DataFrame, variant: str) -> pd.DataFrame:
    return scores[scores["variant"] == variant].reset_index(drop=True)


def test_the_two_denominators_differ_30x_in_scale(scores):
    rotated, true = _variant(scores, "errata_bcda"), _variant(scores, "errata_bcda_trueden")
    ratio = (rotated["score"] / true["score"]).median()
    assert ratio > 30
    assert excess(rotated).abs().max() > 30 * excess(true).abs().max() / 2  # the excess follows the scale
    pd.testing.assert_series_equal(rotated["z"], true["z"], rtol=1e-9, check_names=False)  # z does not


def test_edges_by_z_do_not_follow_the_scale(scores):
    edges = diagram_edges(scores, "z", edge_z=3.0, edge_threshold=0.05)
    by_variant = edges.groupby("variant").size()
    assert by_variant.get("errata_bcda", 0) == by_variant.get("errata_bcda_trueden", 0) > 0
    keys = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
    assert _variant(edges, "errata_bcda")[keys].equals(_variant(edges, "errata_bcda_trueden")[keys])


def test_an_absolute_threshold_counts_scale(scores):
    """The option kept for the paper's own plotting: one threshold on the excess draws many
    more edges for the 30x variant."""
    threshold = float(excess(_variant(scores, "errata_bcda_trueden")).quantile(0.9))
    edges = diagram_edges(scores, "excess", edge_z=3.0, edge_threshold=threshold)
    by_variant = edges.groupby("variant").size()
    assert by_variant["errata_bcda"] > 3 * by_variant["errata_bcda_trueden"]


def test_the_figure_titles_say_the_criterion_and_count_the_same_edges(scores):
    fig = errata_diagram(scores, "z", 3.0, 0.05, None, ("errata_bcda", "errata_bcda_trueden"))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].split("edges: ")[1] == titles[1].split("edges: ")[1]
    assert "raw z against the spectrum-preserving null > 3" in fig._suptitle.get_text()
    plt.close(fig)
    fig = errata_diagram(scores, "excess", 3.0, 0.05, None, ("errata_bcda", "errata_bcda_trueden"))
    assert "an absolute threshold" in fig._suptitle.get_text()
    plt.close(fig)


def test_the_default_draws_the_discoveries_and_says_so(scores):
    """`edges: fdr` (the default): exactly the pairs the calibration discovers, in both panels."""
    calibrated = scores.assign(z_cal=scores["z"], discovery=scores["z"] > 3.0)  # a stand-in calibration
    edges = diagram_edges(calibrated, "fdr", edge_z=99.0, edge_threshold=99.0)
    assert len(edges) == int(calibrated["discovery"].sum()) > 0
    assert (edges["strength"] == edges["z_cal"]).all()
    fig = errata_diagram(calibrated, "fdr", 3.0, 0.05, None, ("errata_bcda", "true"), fdr=0.05)
    assert "a discovery, FDR q < 0.05" in fig._suptitle.get_text()
    plt.close(fig)
