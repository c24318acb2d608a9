"""pipeline/present/figures/compare.py: the claims figure shows a dot per seed."""

from __future__ import annotations

import json

import pytest
import synthetic_seeds as syn

from pipeline.compare import stats as compare
from pipeline.config import CompareConfig

CFG = CompareConfig()


FDR = 0.05


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def test_figures_show_every_seed():
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    inputs = [syn.seed_inputs(s) for s in (0, 1, 2)]
    inputs[2].agreement = json.loads(json.dumps(syn.AGREEMENT))
    inputs[2].agreement["pattern_effect"]["interaction"]["K"]["true"] = 0.9
    result = compare.compare(inputs, CFG, EDGE, FDR)
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
