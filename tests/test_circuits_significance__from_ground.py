"""A discovery exactly at the FDR (pipeline/circuits/significance.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.circuits import significance

FDR = 0.05


# --- significance: a q exactly at the FDR -------------------------------------------------


def test_a_pair_whose_q_equals_the_fdr_is_a_discovery():
    # four later pairs into one reader; one stands beyond all 79 placebo pairs of its family, whose
    # top fifth is too thin for a tail (four values above zero: the conformal p alone), p = 1/80,
    # and as the first of its family's four, q = 4/80 = 0.05 exactly (scaling by 4 is exact in
    # binary). Another measure's four pairs are another family (pooled, q would be 8/80)
    real = pd.concat([
        pd.DataFrame({"kind": "K", "variant": variant, "src_layer": 0, "src_head": range(4),
                      "dst_layer": 1, "dst_head": 0, "z": z})
        for variant, z in (("true", [0.0, 1.0, 0.5, 100.0]), ("invariant", [0.0, 1.0, 0.5, 0.2]))
    ], ignore_index=True)  # fmt: skip
    z = np.r_[np.zeros(75), [1.0, 2.0, 3.0, 4.0]]
    placebo = pd.concat([
        pd.DataFrame({"kind": "K", "variant": variant, "src_layer": 1, "src_head": range(79),
                      "dst_layer": 1, "dst_head": 0, "z": z})
        for variant in ("true", "invariant")
    ], ignore_index=True)  # fmt: skip
    scores, _ = significance.calibrate(real, placebo, FDR)
    assert scores.loc[3, "p"] == 1 / 80 and scores.loc[3, "q"] == FDR
    assert scores["discovery"].tolist() == [False, False, False, True] + [False] * 4
