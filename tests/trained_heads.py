"""The synthetic setup's trained model as the composition stage reads it, for the calibration and
power tests of pipeline/circuits/significance.py and channel_null.py."""

from __future__ import annotations

from pipeline.circuits import weights


def trained_weights(synthetic_seed0):
    """The synthetic setup's model (8 heads x 8, d_model 64), seed 0: layer-0 previous-token and
    layer-1 induction heads (test_train), as the composition stage reads it, with its config
    (trained once a run: conftest's synthetic_seed0): (head weights, analysis.composition)."""
    cfg, trained_model = synthetic_seed0
    model = trained_model()
    hw, _ = weights.prepare(model.state_dict(), model.cfg)
    return hw, cfg.analysis.composition
