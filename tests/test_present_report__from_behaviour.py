"""pipeline/present/report.py: every statistic of the compare stage is described."""

from __future__ import annotations

import synthetic_seeds as syn

from pipeline.compare import stats as compare
from pipeline.config import CompareConfig

CFG = CompareConfig()


FDR = 0.05


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def test_report_describes_every_statistic():
    from pipeline.present import report

    result = compare.compare([syn.seed_inputs(0)], CFG, EDGE, FDR)
    pairs = result.claims[["claim", "statistic"]].drop_duplicates()
    assert all(report.describe(c, s) for c, s in zip(pairs["claim"], pairs["statistic"], strict=True))
