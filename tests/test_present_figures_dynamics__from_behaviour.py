"""pipeline/present/figures/dynamics.py: the per-seed figure marks the phase change."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import tiny_chain

from pipeline import tables


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict[str, Path]:
    return tiny_chain.run(tmp_path_factory.mktemp("dynamics"))


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
