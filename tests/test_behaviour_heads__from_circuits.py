"""pipeline/behaviour/heads.py's numerical guards, as a property of random models (hypothesis,
derandomized): attention scores in [0, 1], copying and qk_positivity in [-1, 1], undefined only
where the maths says so (duplicate_token on a batch without repeats, qk_positivity of layer 0),
every ablation effect finite."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import random_model

from pipeline.behaviour import heads
from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig, HeadsConfig
from pipeline.model.transformer import AttnOnlyTransformer

PROPERTY = settings(derandomize=True, max_examples=30, deadline=None)


N_CTX, LENGTH = 9, 4  # repeated sequences [first, span, span] of 1 + 2 x 4 tokens


COMPOSITION = CompositionConfig(baseline_samples=8, null_samples=8)


HEADS = HeadsConfig(eval_sequences=4, repeat_length=LENGTH, window_length=2)


@st.composite
def random_models(draw) -> AttnOnlyTransformer:
    """A random attention-only model in float64 of any small shape, every parameter (biases and
    LayerNorm too) drawn at one std from 0.05 to 3; one head may be dead (W_V = 0: OV = 0)."""
    n_heads, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = dict(
        n_layers=draw(st.integers(2, 3)), n_heads=n_heads, d_head=d_head,
        d_model=draw(st.integers(n_heads * d_head, 12)), n_ctx=N_CTX, d_vocab=draw(st.integers(2, 12)),
        positional_embedding_type=draw(st.sampled_from(["standard", "shortformer"])),
        normalization_type=draw(st.sampled_from([None, "LN"])),
    )  # fmt: skip
    seed, std = draw(st.integers(0, 2**31 - 1)), draw(st.floats(0.05, 3.0))
    model = random_model(seed=seed, init_range=std, bias_std=std, **shape)
    if draw(st.booleans()):
        layer, head = draw(st.integers(0, model.cfg.n_layers - 1)), draw(st.integers(0, n_heads - 1))
        with torch.no_grad():
            model.blocks[layer].attn.W_V[head] = 0.0
    return model


def head_weights(model: AttnOnlyTransformer) -> weights.HeadWeights:
    return weights.from_state_dict(model.state_dict())


@PROPERTY
@given(random_models(), st.integers(0, 2**31 - 1))
def test_head_scores_are_in_range_and_finite_where_defined(model, seed):
    gen = torch.Generator().manual_seed(seed)
    span = torch.randint(0, model.cfg.d_vocab, (4, LENGTH), generator=gen)
    repeated = torch.cat([torch.zeros(4, 1, dtype=torch.long), span, span], dim=1)  # [batch, 1 + 2 LENGTH]
    heldout = torch.randint(0, model.cfg.d_vocab, (4, N_CTX), generator=gen)
    hw = head_weights(model)
    scores = composition.composition_scores(hw, COMPOSITION, seed=1)
    result = heads.analyse_batches(model, hw, repeated, heldout, HEADS, scores)
    table = result.table
    fractions = table[list(heads.PATTERN_SCORES)].to_numpy()
    assert np.isfinite(fractions).all() and ((fractions >= 0) & (fractions <= 1 + 1e-12)).all()
    dup = table["duplicate_token"].to_numpy()
    assert (((dup >= 0) & (dup <= 1 + 1e-12)) | np.isnan(dup)).all()
    has_repeat = any(len(set(row.tolist())) < N_CTX for row in heldout)
    assert np.isnan(dup).all() != has_repeat  # undefined exactly when no query has an earlier copy
    for name in ("copying", "qk_positivity"):
        x = table[name].to_numpy()
        assert (((x >= -1 - 1e-12) & (x <= 1 + 1e-12)) | np.isnan(x)).all(), name
    assert np.isnan(table.loc[table["layer"] == 0, "qk_positivity"]).all()
    effects = result.ablation[["attn_effect", "loss_effect", "heldout_loss_effect"]].to_numpy()
    assert np.isfinite(effects).all()
    assert (result.ablation.loc[result.ablation["kind"] == "V", "attn_effect"] == 0).all()
