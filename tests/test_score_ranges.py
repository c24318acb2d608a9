"""Numerical guards, as properties of random models (hypothesis, derandomized: the same
examples every run): every score is finite where it is defined and lies in its
mathematical range, in float64, for weights of any size.

    composition, true        [0, 1]     ||A B C D|| <= ||A B|| ||C D|| (submultiplicative)
    composition, errata_*    [0, inf)   a rotated strand's norm is not bounded by the rotated
                                        denominators (nor by the true ones): > 1 happens
    attention scores         [0, 1]     fractions of attention mass
    copying, qk_positivity   [-1, 1]    sum(lambda) / sum(|lambda|)
    undefined (NaN) only where the maths says so: a zero OV or QK circuit, duplicate_token on a
    batch without repeats, qk_positivity of layer 0

Scores are scale-free in each head matrix, and the analysis divides each by an exact power of
two first (`weights.power_of_two_scaled`): so scaling any head's W_Q, W_K, W_V or W_O (or W_E,
W_U) by 2^k, for k up to +-900, changes no score by a single bit, where without it the products
of four to six such matrices overflow or underflow float64 (inf, 0 or NaN, silently).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import random_model

from pipeline import checkpoint
from pipeline.behaviour import heads
from pipeline.circuits import composition, weights
from pipeline.config import CompositionConfig, HeadsConfig
from pipeline.model import tl_checkpoint
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


def frobenius(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(t)


def zero_circuits(hw: weights.HeadWeights, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: is the writer's OV zero; is the reader's QK (kinds Q, K) or OV (kind V) zero."""
    OV = frobenius(hw.W_V @ hw.W_O).numpy()  # [layer, head]
    QK = frobenius(hw.W_Q @ hw.W_K.mT).numpy()
    src = frame["src_layer"].to_numpy(), frame["src_head"].to_numpy()
    dst = frame["dst_layer"].to_numpy(), frame["dst_head"].to_numpy()
    return OV[src] == 0, np.where(frame["kind"] == "V", OV[dst], QK[dst]) == 0


@PROPERTY
@given(random_models())
def test_composition_scores_are_in_range_and_undefined_only_for_zero_circuits(model):
    hw = head_weights(model)
    frame = composition.composition_scores(
        hw.to(torch.float32), COMPOSITION, seed=0
    )  # float32 in, float64 out
    assert all(frame[c].dtype == np.float64 for c in ("score", "baseline_mean", "baseline_std", "z"))
    score = frame["score"].to_numpy()
    true = (frame["variant"] == "true").to_numpy()
    writer_zero, reader_zero = zero_circuits(hw, frame)
    assert np.array_equal(np.isnan(score[true]), (writer_zero | reader_zero)[true])
    assert (((score >= 0) & (score <= 1 + 1e-12)) | np.isnan(score))[true].all()
    assert (((score >= 0) & np.isfinite(score)) | np.isnan(score))[~true].all()  # errata: no upper bound
    assert np.isnan(score[~true & writer_zero]).all()  # its rotated denominator ||W_V^T W_O^T|| is 0 too
    assert np.isfinite(frame[["baseline_mean", "baseline_std"]].to_numpy()).all()
    z = frame["z"].to_numpy()
    assert np.isnan(z[np.isnan(score)]).all() and not np.isinf(z).any()


@st.composite
def exponents(draw, shape: tuple[int, ...]) -> torch.Tensor:
    flat = draw(st.lists(st.integers(-900, 900), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return torch.tensor(flat, dtype=torch.float64).reshape(shape)


@PROPERTY
@given(random_models(), st.data())
def test_scaling_any_head_matrix_by_a_power_of_two_changes_no_score(model, data):
    """Weights from 2^-900 to 2^900 times normal: the same scores, bit for bit."""
    hw = head_weights(model)
    L, H = hw.n_layers, hw.n_heads
    per_head = {name: torch.pow(2.0, data.draw(exponents((L, H, 1, 1)))) for name in weights.HEAD_MATRICES}
    scaled = replace(
        hw,
        W_E=hw.W_E * 2.0 ** data.draw(st.integers(-900, 900)),
        W_U=hw.W_U * 2.0 ** data.draw(st.integers(-900, 900)),
        **{name: getattr(hw, name) * factor for name, factor in per_head.items()},
    )
    pd.testing.assert_frame_equal(
        composition.composition_scores(scaled, COMPOSITION, seed=1),
        composition.composition_scores(hw, COMPOSITION, seed=1),
        check_exact=True,
    )
    assert torch.equal(heads.copying(scaled).nan_to_num(7.0), heads.copying(hw).nan_to_num(7.0))
    sources = heads.best_sources(composition.composition_scores(hw, COMPOSITION, seed=1))
    assert torch.equal(
        heads.qk_positivity(scaled, sources).nan_to_num(7.0), heads.qk_positivity(hw, sources).nan_to_num(7.0)
    )


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


def test_the_analysis_reads_float64_checkpoints_unrounded(tmp_path):
    """The heads stage loads the model in float64 (not through float32), and heads.safetensors
    is read in float64: a value float32 cannot hold arrives exactly."""
    model = random_model()  # float64
    cfg, state = model.cfg, {k: v.clone() for k, v in model.state_dict().items()}
    state["blocks.1.attn.W_Q"][0, 0, 0] = 1 + 2**-40  # rounds to 1.0 in float32
    checkpoint.save_state(tmp_path / "model.safetensors", state)
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(cfg)))
    model = tl_checkpoint.load_model(
        tmp_path / "model.safetensors", tmp_path / "config.json", dtype=torch.float64
    )
    assert model.blocks[1].attn.W_Q[0, 0, 0].item() == 1 + 2**-40
    hw, _ = weights.load(tmp_path / "model.safetensors")
    assert hw.W_Q.dtype == torch.float64 and hw.W_Q[1, 0, 0, 0].item() == 1 + 2**-40
