"""The figures across seeds (pipeline/present/figures/compare.py) on long tables built by hand:
each panel's column i shows selection i of the claims table (a dot per seed at i plus its fixed
offset), the stats table's mean as a bar and its interval as a red line beside it, and the
claim's threshold; the labels, titles and legends say which is which. Every selection gets its
own values, so a panel that reads the wrong one shows."""

from __future__ import annotations

import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import synthetic_seeds as syn
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_rgba

from pipeline.compare import stats as compare_stats
from pipeline.compare.claims import CLAIMS
from pipeline.config import CompareConfig
from pipeline.present.figures import compare
from pipeline.tables import HYPOTHESES, MEASURES, ROLES

SEEDS = (2, 0, 1)  # read back sorted: 0, 1, 2
OFFSETS = (-0.15, 0.0, 0.15)
DIMS = ("claim", "statistic", "hypothesis", "variant", "kind", "effect")


def tables(panels: list[list[dict]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Selection i of panel p: seed s has value 100 p + 10 i + s; its mean that + 1, its interval
    that +- 1 (so every dot, bar and interval says which selection it came from)."""
    claims, stats = [], []
    for p, columns in enumerate(panels):
        for i, where in enumerate(columns):
            row = dict.fromkeys(DIMS, "") | where
            base = 100 * p + 10 * i
            claims += [row | {"seed": s, "value": float(base + s)} for s in SEEDS]
            stats.append(row | {"n": 3, "mean": base + 1.0, "lo": base + 0.0, "hi": base + 2.0})
    return pd.DataFrame(claims), pd.DataFrame(stats)


def panel(ax) -> dict:
    """What one panel draws: the dots of each column, the bars, the intervals, the thresholds."""
    segments = [(c, c.get_segments()[0]) for c in ax.collections if isinstance(c, LineCollection)]
    return {
        "dots": [c.get_offsets().data.tolist() for c in ax.collections if isinstance(c, PathCollection)],
        "means": [(s[0][0], s[1][0], s[0][1]) for _, s in segments if s[0][1] == s[1][1]],
        "cis": [(s[0][0], s[0][1], s[1][1]) for _, s in segments if s[0][0] == s[1][0]],
        "thresholds": [line.get_ydata()[0] for line in ax.get_lines()],
        "ticks": [t.get_text() for t in ax.get_xticklabels()],
    }


def expected(p: int, n: int) -> dict:
    base = [100 * p + 10 * i for i in range(n)]
    return {
        "dots": [[[i + o, b + s] for s, o in enumerate(OFFSETS)] for i, b in enumerate(base)],
        "means": [pytest.approx((i - 0.28, i + 0.28, b + 1.0)) for i, b in enumerate(base)],
        "cis": [pytest.approx((i + 0.3, b + 0.0, b + 2.0)) for i, b in enumerate(base)],
    }


def same_colour(a, b) -> bool:
    return tuple(to_rgba(a)) == tuple(to_rgba(b))


def numbers(text: str) -> list[str]:
    """The numbers of a title, label or legend entry, as printed, without its words."""
    return re.findall(r"\d+(?:\.\d+)?%?", text)


def legend_levels(labels: list[str]) -> list[list[str]]:
    """Per legend entry (a seed's dot, the mean, the interval), the numbers it names: the
    interval's level, only."""
    assert len(labels) == 3 and all(labels), labels
    return [numbers(label) for label in labels]


# --- one panel ---------------------------------------------------------------------------


def test_dots_with_ci_draws_each_seed_the_mean_and_its_interval_at_each_column():
    claims, stats = tables([[{"claim": "x", "statistic": "x"}, {"claim": "y", "statistic": "y"}]])
    stats.loc[1, ["lo", "hi"]] = np.nan  # y: a mean without an interval
    claims = claims[~((claims["claim"] == "y") & (claims["seed"] == 1))]  # y: seed 1 missing
    fig, ax = plt.subplots()
    columns = [{"claim": "x", "statistic": "x"}, {"claim": "y", "statistic": "y"}]
    compare.dots_with_ci(ax, claims, stats, columns, ["x label", "y label"], threshold=1.5, ci=0.9)
    drawn = panel(ax)
    assert drawn["dots"][0] == [[-0.15, 0.0], [0.0, 1.0], [0.15, 2.0]]
    assert drawn["dots"][1][0] == [0.85, 10.0] and np.isnan(drawn["dots"][1][1][1])
    assert drawn["means"] == [pytest.approx((-0.28, 0.28, 1.0)), pytest.approx((0.72, 1.28, 11.0))]
    assert drawn["cis"] == [pytest.approx((0.3, 0.0, 2.0))]
    assert drawn["thresholds"] == [1.5] and ax.get_lines()[0].get_linestyle() == "--"
    assert same_colour(ax.get_lines()[0].get_color(), "0.6")
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    # the first column's dots are the legend's, the others are left out of it (a "_" label)
    assert not dots[0].get_label().startswith("_") and dots[1].get_label().startswith("_")
    assert all(same_colour(c.get_facecolors()[0], "0.45") and list(c.get_sizes()) == [18] for c in dots)
    handles, labels = ax.get_legend_handles_labels()
    assert legend_levels(labels) == [[], [], ["90%"]]
    mean, ci = handles[1], handles[2]
    assert same_colour(mean.get_colors()[0], "black") and list(mean.get_linewidths()) == [2]
    assert same_colour(ci.get_colors()[0], "#d62728") and list(ci.get_linewidths()) == [2]
    # the threshold below the dots, the mean and its interval above them
    assert [ax.get_lines()[0].get_zorder(), dots[0].get_zorder(), mean.get_zorder(), ci.get_zorder()] == [
        1,
        2,
        3,
        3,
    ]
    assert drawn["ticks"] == ["x label", "y label"]
    assert [t.get_fontsize() for t in ax.get_xticklabels()] == [7, 7]
    assert ax.get_xlim() == (-0.6, 1.6)
    assert not ax.texts
    plt.close(fig)


def test_a_panel_with_no_seeds_value_says_why_and_no_threshold_draws_no_line():
    claims, stats = tables([[{"claim": "x", "statistic": "x"}]])
    fig, ax = plt.subplots()
    compare.dots_with_ci(ax, claims, stats, [{"claim": "z", "statistic": "z"}], ["z"])
    (note,) = ax.texts
    assert note.get_text()  # why there is nothing to show (its words are the figure's)
    assert note.get_position() == (0.5, 0.5) and same_colour(note.get_color(), "0.4")
    assert (note.get_horizontalalignment(), note.get_verticalalignment()) == ("center", "center")
    fig.canvas.draw()
    box, panel_box = note.get_window_extent(), ax.get_window_extent()
    assert (box.x0 + box.x1) / 2 == pytest.approx((panel_box.x0 + panel_box.x1) / 2, abs=1)
    assert (box.y0 + box.y1) / 2 == pytest.approx((panel_box.y0 + panel_box.y1) / 2, abs=1)
    assert not ax.get_lines() and len(ax.collections) == 1  # the dots only, all NaN
    plt.close(fig)


def test_one_seed_sits_on_its_column():
    claims, stats = tables([[{"claim": "x", "statistic": "x"}]])
    fig, ax = plt.subplots()
    compare.dots_with_ci(ax, claims[claims["seed"] == 1], stats, [{"claim": "x", "statistic": "x"}], ["x"])
    assert panel(ax)["dots"] == [[[0.0, 1.0]]]
    plt.close(fig)


# --- the claims figure -------------------------------------------------------------------

ROTATIONS = HYPOTHESES["rotated"]
PANELS = [name for name, c in CLAIMS.items() if c.restates is None]  # the registry's own claims


def selections(name: str) -> list[dict]:
    """What panel `name` shows: each verdict side of the claim, then of each of its restatements."""
    whos = (name, *(n for n, c in CLAIMS.items() if c.restates == name))
    return [
        {"claim": who, "statistic": who, column: side} for who in whos for column, side in CLAIMS[who].sides()
    ]


CLAIM_PANELS = [selections(name) for name in PANELS]


@pytest.fixture
def claims_fig():
    fig = compare.claims_figure(*tables(CLAIM_PANELS), 0.95)
    yield fig
    plt.close(fig)


def test_claims_figure_shows_each_claims_selections_in_its_panel(claims_fig):
    """A panel per claim of the registry that is not a restatement, in the registry's order: its
    sides and its restatements' (each its own values), the claim's threshold dashed."""
    axes = claims_fig.axes
    for p, (name, columns) in enumerate(zip(PANELS, CLAIM_PANELS, strict=True)):
        drawn = panel(axes[p])
        assert {k: drawn[k] for k in ("dots", "means", "cis")} == expected(p, len(columns)), name
        assert not axes[p].texts
        threshold = CLAIMS[name].threshold
        assert drawn["thresholds"] == ([] if threshold is None else [threshold]), name
        assert len(drawn["ticks"]) == len(columns)


def test_claims_figure_titles_each_panel_with_its_registry_label_and_gives_the_next_to_the_legend(claims_fig):
    axes = claims_fig.axes
    titles = [" ".join(ax.get_title().split()) for ax in axes[: len(PANELS)]]
    assert titles == [" ".join(f"({name}) {CLAIMS[name].label}".split()) for name in PANELS]
    legend_cell = axes[len(PANELS)]
    assert not legend_cell.axison and legend_cell.get_legend() is not None
    assert legend_levels([t.get_text() for t in legend_cell.get_legend().get_texts()]) == [[], [], ["95%"]]
    assert all(not ax.axison and not ax.has_data() for ax in axes[len(PANELS) + 1 :])
    assert str(3) in claims_fig._suptitle.get_text()  # the seeds it shows


def test_claims_figure_labels_every_panels_interval_with_the_level_asked():
    """At ci = 0.9 each panel's interval, and so the legend, says 90% (not dots_with_ci's default 95%)."""
    fig = compare.claims_figure(*tables(CLAIM_PANELS), 0.9)
    axes = fig.axes
    n = len(PANELS)
    assert [legend_levels(ax.get_legend_handles_labels()[1]) for ax in axes[:n]] == [[[], [], ["90%"]]] * n
    assert legend_levels([t.get_text() for t in axes[n].get_legend().get_texts()]) == [[], [], ["90%"]]
    plt.close(fig)


# --- roles, curves, timing ----------------------------------------------------------------


def test_roles_figure_has_a_column_per_role_present_in_roles_order():
    present = [ROLES[2], ROLES[0]]  # given out of order
    claims, stats = tables([[{"claim": "roles", "statistic": r} for r in present]])
    fig = compare.roles_figure(claims, stats)
    (ax,) = fig.axes
    drawn = panel(ax)
    # ROLES order: ROLES[0] first, so column 0 shows selection 1's values (10 + seed)
    assert drawn["dots"] == [
        [[-0.15, 10.0], [0.0, 11.0], [0.15, 12.0]],
        [[0.85, 0.0], [1.0, 1.0], [1.15, 2.0]],
    ]
    assert drawn["ticks"] == [ROLES[0].replace("_", "\n"), ROLES[2].replace("_", "\n")]
    assert drawn["thresholds"] == []
    assert ax.get_ylabel() and numbers(ax.get_title()) == ["3"]  # the seeds it shows
    assert tuple(fig.get_size_inches()) == (9.0, 3.4)
    plt.close(fig)


def test_curves_figure_draws_a_thin_line_per_seed_and_the_mean_thick():
    columns = ("eval_loss", "induction", "prev_token")
    curves = pd.DataFrame(
        [
            {"seed": s, "tokens": t, **{c: 100 * k + 10 * s + t for k, c in enumerate(columns)}}
            for s in (1, 0)
            for t in (0, 1)
        ]
    )
    mean = pd.DataFrame(
        [{"tokens": t, **{c: 100 * k + 5 + t for k, c in enumerate(columns)}} for t in (0, 1)]
    )
    with plt.rc_context({"font.size": 7}):  # the sizes are the figure's own, not the machine's
        fig = compare.curves_figure(curves, mean)
    axes = fig.axes
    titles = [ax.get_title() for ax in axes]
    assert len(set(titles)) == 3 and all(titles)  # a panel per column, each named
    for k, ax in enumerate(axes):
        seed0, seed1, thick = ax.get_lines()
        assert [numbers(line.get_label()) for line in (seed0, seed1, thick)] == [["0"], ["1"], []]
        assert list(seed0.get_xdata()) == [0, 1] and list(seed0.get_ydata()) == [100 * k, 100 * k + 1]
        assert list(seed1.get_ydata()) == [100 * k + 10, 100 * k + 11]
        assert list(thick.get_xdata()) == [0, 1] and list(thick.get_ydata()) == [100 * k + 5, 100 * k + 6]
        assert (seed0.get_linewidth(), seed0.get_alpha()) == (0.8, 0.6)
        assert thick.get_linewidth() == 2 and same_colour(thick.get_color(), "black")
        assert ax.get_xlabel() and ax.title.get_fontsize() == 10
    legend = axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [line.get_label() for line in axes[0].get_lines()]
    assert [t.get_fontsize() for t in legend.get_texts()] == [8] * 3 and not legend.get_frame_on()
    assert axes[1].get_legend() is None
    assert tuple(fig.get_size_inches()) == (13.0, 3.4)
    plt.close(fig)


def test_timing_figure_shows_each_measures_lag_and_claim_t_per_rotation():
    lags = [{"claim": "t", "statistic": "lag", "variant": m} for m in MEASURES]
    per_rotation = [{"claim": "t", "statistic": "t", "variant": r} for r in ROTATIONS]
    fig = compare.timing_figure(*tables([lags, per_rotation]), 0.8)
    left, right = fig.axes
    for p, (ax, n) in enumerate(((left, len(MEASURES)), (right, len(ROTATIONS)))):
        drawn = panel(ax)
        assert {k: drawn[k] for k in ("dots", "means", "cis")} == expected(p, n)
        assert drawn["thresholds"] == [0.0]
        assert ax.get_ylabel() and ax.title.get_fontsize() == 9
    assert panel(left)["ticks"] == [compare.VARIANT_LABELS[m] for m in MEASURES]
    # each rotation by the first line of its label
    assert panel(right)["ticks"] == [compare.VARIANT_LABELS[r].split("\n")[0] for r in ROTATIONS]
    assert left.get_title() and right.get_title() and left.get_title() != right.get_title()
    assert right.get_title().startswith("(t)")  # claim (t)'s own number
    assert left.get_position().width == pytest.approx(3 * right.get_position().width, rel=1e-6)
    (legend,) = fig.legends
    assert legend_levels([t.get_text() for t in legend.get_texts()]) == [[], [], ["80%"]]
    assert legend._ncols == 3 and not legend.get_frame_on()
    fig.canvas.draw()
    box = legend.get_window_extent().transformed(fig.transFigure.inverted())
    assert box.y0 < 0.08 and box.x0 + box.x1 == pytest.approx(1.0, abs=0.01)  # lower centre
    assert numbers(fig._suptitle.get_text()) == ["3"]  # the seeds it shows
    assert tuple(fig.get_size_inches()) == (11.0, 3.6)
    plt.close(fig)


def test_a_panel_says_it_is_empty_only_when_every_column_lacks_every_seed():
    """Column x has its seeds' values, column z (the last) has none: the panel is not empty."""
    claims, stats = tables([[{"claim": "x", "statistic": "x"}]])
    fig, ax = plt.subplots()
    columns = [{"claim": "x", "statistic": "x"}, {"claim": "z", "statistic": "z"}]
    compare.dots_with_ci(ax, claims, stats, columns, ["x", "z"])
    assert not ax.texts
    assert panel(ax)["dots"][0] == [[-0.15, 0.0], [0.0, 1.0], [0.15, 2.0]]
    plt.close(fig)


def test_the_timing_figures_panels_fit_the_figure_above_its_legend():
    """tight_layout(rect=(0, 0.08, 1, 1)): both panels inside the figure's width, above its
    bottom 8%, where the legend goes."""
    lags = [{"claim": "t", "statistic": "lag", "variant": m} for m in MEASURES]
    per_rotation = [{"claim": "t", "statistic": "t", "variant": r} for r in ROTATIONS]
    fig = compare.timing_figure(*tables([lags, per_rotation]), 0.8)
    left, right = fig.axes
    fig.canvas.draw()
    inverse = fig.transFigure.inverted()
    for ax in (left, right):
        box = ax.get_tightbbox(fig.canvas.get_renderer()).transformed(inverse)
        assert 0.0 <= box.x0 and box.x1 <= 1.0 and box.y0 >= 0.08 - 1e-3 and box.y1 <= 1.0
    assert right.get_position().x1 > 0.9  # the right panel reaches close to the figure's right edge
    plt.close(fig)


CFG = CompareConfig()


FDR = 0.05


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def test_figures_show_every_seed():
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    inputs = [syn.seed_inputs(s) for s in (0, 1, 2)]
    inputs[2].agreement = json.loads(json.dumps(syn.AGREEMENT))
    inputs[2].agreement["pattern_effect"]["interaction"]["K"]["true"] = 0.9
    result = compare_stats.compare(inputs, CFG, EDGE, FDR)
    fig = compare_figures.claims_figure(result.claims, result.stats, 0.95)
    [c_axis] = [ax for ax in fig.axes if ax.get_title().startswith("(c)")]
    dots = [c.get_offsets()[:, 1].tolist() for c in c_axis.collections if isinstance(c, PathCollection)]
    # (c), (c_inv), (c_proj): a dot per seed; the corrected score's third seed at 0.9 - 0.2
    assert [sorted(d) for d in dots] == [
        pytest.approx([0.3, 0.3, 0.7]),
        pytest.approx([0.2] * 3),
        pytest.approx([0.1] * 3),
    ]
    import matplotlib.pyplot as plt

    plt.close(fig)


# --- the timing figure: every seed's lag where it belongs --------------------------------


def test_timing_figure_places_every_seeds_lag_and_mean():
    """Replaces test_compare's tick count: the points and means drawn are the lags.
    Seed 0 as synthetic_seeds (clear steps 400, 300, 200, 300, 300 for true, B C D A, D A B C,
    invariant and projection; phase step 300); seed 1's true z clears at step 300: lag 0, claim (t) 0."""
    inputs = [syn.seed_inputs(s) for s in (0, 1)]
    steps = inputs[1].steps
    steps.loc[steps["step"] == 300, ["z_true", "q_true"]] = [4.0, 0.01]
    result = compare_stats.compare(inputs, CompareConfig(), EDGE, FDR)
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    fig = compare_figures.timing_figure(result.claims, result.stats, 0.95)
    try:
        left, right = fig.axes[:2]
        lags = {  # (seed 0, seed 1)
            "true": (100, 0),
            "errata_bcda": (0, 0),
            "errata_dabc": (-100, -100),
            "errata_bcda_trueden": (0, 0),
            "errata_dabc_trueden": (-100, -100),
            "invariant": (0, 0),
            "projection": (0, 0),  # the invariant measure's steps
        }
        assert [t.get_text() for t in left.get_xticklabels()] == [
            compare_figures.VARIANT_LABELS[m] for m in syn.MEASURES
        ]
        want = [
            (i + dx, lag)
            for i, m in enumerate(syn.MEASURES)
            for dx, lag in zip((-0.15, 0.15), lags[m], strict=True)
        ]
        np.testing.assert_allclose(dots(left), sorted(want), atol=1e-12)
        # (t) against each rotation: B C D A (seed 0 +100, seed 1 0), D A B C (+200, +100)
        np.testing.assert_allclose(
            dots(right), [(-0.15, 100.0), (0.15, 0.0), (0.85, 200.0), (1.15, 100.0)], atol=1e-12
        )
        # the mean of each column: a horizontal bar at its height (the intervals are vertical)
        bars = [
            seg for c in left.collections if not isinstance(c, PathCollection) for seg in c.get_segments()
        ]
        means = sorted(seg[0][1] for seg in bars if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0])
        assert means == pytest.approx(sorted([np.mean(v) for v in lags.values()]))
    finally:
        plt.close(fig)
    # claim (t): seed 0 at +100 holds; seed 1 at exactly the threshold (0) neither holds nor fails
    t = result.summary["claims"]["t"]["errata_bcda"]
    assert (t["seeds_holding"], t["seeds_failing"], t["seeds_tested"]) == (1, 0, 2)
    assert t["per_seed"] == {"0": 100.0, "1": 0.0}


def dots(ax) -> list[tuple[float, float]]:
    """Every scattered point (x, y) of an axis, sorted."""
    from matplotlib.collections import PathCollection

    points = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    return sorted((float(x), float(y)) for x, y in points)
