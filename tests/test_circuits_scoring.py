"""What the two composition measures share (pipeline/circuits/scoring.py): the pairs scored, the
random draws, the raw-scores table and its summary, and the surrogate null, each pinned by a
known answer or an invariant."""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from models import random_model
from test_circuits_composition import random_heads

from pipeline.circuits import scoring, weights
from pipeline.circuits.composition import KINDS, composition_scores
from pipeline.config import CompositionConfig
from pipeline.tables import RAW_SCORES_COLUMNS, VARIANTS

# --- undefined scores ----------------------------------------------------------------------


def test_nan_if_zero_is_nan_at_or_below_the_relative_tolerance_and_keeps_the_dtype():
    n = torch.tensor([0.0, 1e-8, 1.5e-8, 3e-8, 1.0], dtype=torch.float64)
    bound = torch.tensor([1.0, 1.0, 2.0, 2.0, 1e9], dtype=torch.float64)
    # 1e-8 = ZERO_RTOL x 1 counts as zero; 1.5e-8 <= 2e-8 too; 3e-8 > 2e-8 and 1 > 10 do not
    got = scoring.nan_if_zero(n, bound)
    assert torch.isnan(got).tolist() == [True, True, True, False, True]
    assert got[3] == 3e-8
    assert scoring.nan_if_zero(torch.ones(2, dtype=torch.float32), torch.ones(2)).dtype == torch.float32


# --- the pairs scored ----------------------------------------------------------------------


def test_later_and_placebo_pairs_are_every_such_pair_sorted():
    layers, heads = 3, 2  # unequal: a swapped meshgrid or argument would show
    every = list(itertools.product(range(layers), range(heads), repeat=2))  # lexicographic = sorted
    later = list(zip(*scoring.later_pairs(layers, heads), strict=True))
    assert (
        later == [(i, h, j, g) for i, h, j, g in every if j > i] and len(later) == 3 * 4
    )  # layer pairs x head pairs
    placebo = list(zip(*scoring.placebo_pairs(layers, heads), strict=True))
    assert placebo == [(i, h, j, g) for i, h, j, g in every if j < i or (j == i and g != h)]
    assert len(placebo) == 3 * 2 + 3 * 4  # same layer, other head: 3 x 2; an earlier reader: 3 x 4
    assert later[:2] == [(0, 0, 1, 0), (0, 0, 1, 1)] and placebo[:2] == [(0, 0, 0, 1), (0, 1, 0, 0)]


# --- random draws --------------------------------------------------------------------------


def test_haar_blocks_are_qr_with_a_positive_diagonal_of_their_generators_draw():
    """k = d_model: the whole matrix, Q of G = Q R with R's diagonal positive (what makes Q Haar),
    G the float64 draw of the generator; k < d_model: a [k, k] block of such a Q (a contraction)."""
    n, d = 200, 5
    torch.manual_seed(1)
    Q = scoring.haar_blocks(n, d, d, torch.Generator().manual_seed(3))
    torch.manual_seed(2)  # the global seed plays no part
    assert torch.equal(Q, scoring.haar_blocks(n, d, d, torch.Generator().manual_seed(3)))
    G = torch.randn(n, d, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert Q.dtype == torch.float64 and Q.shape == (n, d, d)
    assert torch.allclose(Q.mT @ Q, torch.eye(d, dtype=torch.float64).expand(n, d, d), atol=1e-12)
    R = Q.mT @ G
    assert torch.allclose(torch.tril(R, -1), torch.zeros_like(R), atol=1e-12)
    diag = torch.diagonal(R, dim1=-2, dim2=-1)
    assert (diag > 0).all() and (diag < 1).any()  # |R_dd| ~ chi(1): many below 1
    block = scoring.haar_blocks(n, d, 2, torch.Generator().manual_seed(3))
    assert block.shape == (n, 2, 2) and (torch.linalg.svdvals(block) <= 1 + 1e-12).all()


def test_mean_std_is_the_sample_sd_and_zero_for_one_sample():
    x = torch.tensor([[1.0, 2.0, 4.0], [3.0, 6.0, 4.0]], dtype=torch.float64)
    mean, std = scoring.mean_std(x, 0)
    assert mean.tolist() == [2.0, 4.0, 4.0] and std.tolist() == pytest.approx(
        [math.sqrt(2), math.sqrt(8), 0.0]
    )
    mean, std = scoring.mean_std(x, 1)  # (1, 2, 4): mean 7/3, sd with n - 1 = 2
    assert mean.tolist() == pytest.approx([7 / 3, 13 / 3])
    assert std.tolist() == pytest.approx([math.sqrt((16 + 1 + 25) / 9 / 2), math.sqrt((16 + 25 + 1) / 9 / 2)])
    mean, std = scoring.mean_std(x[:1], 0)  # one sample: sd 0, not NaN
    assert mean.tolist() == [1.0, 2.0, 4.0] and std.tolist() == [0.0, 0.0, 0.0]


def test_baseline_scores_four_gaussian_factors_drawn_in_order_from_its_generator():
    seen = []

    def scores(A, B, C, D):
        seen.append((A, B, C, D))
        return {"first": A[:, 0, 0], "last": D[:, -1, -1]}

    torch.manual_seed(0)
    got = scoring.baseline(scores, (2, 3, 4, 5), 6, 7, torch.Generator().manual_seed(11))
    ((A, B, C, D),) = seen
    assert [tuple(x.shape) for x in (A, B, C, D)] == [(7, 2, 6), (7, 6, 3), (7, 4, 6), (7, 6, 5)]
    assert all(x.dtype == torch.float64 for x in (A, B, C, D))
    gen = torch.Generator().manual_seed(11)  # the same draws in the same order, whatever the global seed
    for x in (A, B, C, D):
        assert torch.equal(x, torch.randn(x.shape, generator=gen, dtype=torch.float64))
    assert list(got) == ["first", "last"]
    for name, s in (("first", A[:, 0, 0]), ("last", D[:, -1, -1])):
        assert got[name] == (pytest.approx(float(s.mean())), pytest.approx(float(s.std())))
        assert all(type(v) is float for v in got[name])


# --- the raw-scores table --------------------------------------------------------------------


def _stats(seed: int, L: int = 2, H: int = 2, **kw) -> scoring.PairStats:
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(L, H, L, H, generator=g, dtype=torch.float64)  # noqa: E731
    return scoring.PairStats(score=r(), null_mean=r(), null_std=r().abs(), **{
        "baseline_mean": 0.25, "baseline_std": 0.5, **kw
    })  # fmt: skip


def test_raw_scores_table_rows_per_measure_and_pair_with_z():
    a = _stats(0)
    a.null_std[0, 1, 1, 0] = 0.0  # no null spread: z NaN
    a.score[0, 0, 1, 1] = math.nan  # undefined: z NaN
    a.null_std[0, 0, 1, 0] = 0.0
    a.score[0, 0, 1, 0] = a.null_mean[0, 0, 1, 0]  # 0 / 0: NaN, quietly
    base = torch.arange(16, dtype=torch.float64).reshape(2, 2, 2, 2)
    b = _stats(1, baseline_mean=base, baseline_std=base + 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = scoring.raw_scores_table({("K", "true"): a, ("V", "errata_bcda"): b}, RAW_SCORES_COLUMNS)
    assert list(frame.columns) == list(RAW_SCORES_COLUMNS) and frame.index.equals(pd.RangeIndex(8))
    assert frame["kind"].tolist() == ["K"] * 4 + ["V"] * 4
    assert frame["variant"].tolist() == ["true"] * 4 + ["errata_bcda"] * 4
    pairs = [(0, 0, 1, 0), (0, 0, 1, 1), (0, 1, 1, 0), (0, 1, 1, 1)] * 2  # later_pairs(2, 2), per measure
    got = list(zip(*(frame[c] for c in ("src_layer", "src_head", "dst_layer", "dst_head")), strict=True))
    assert got == pairs
    assert all(frame[c].dtype == np.int64 for c in ("src_layer", "src_head", "dst_layer", "dst_head"))
    for row, (m, p) in enumerate(zip([a] * 4 + [b] * 4, pairs, strict=True)):
        score, mean, std = (float(getattr(m, x)[p]) for x in ("score", "null_mean", "null_std"))
        assert frame.loc[row, "score"] == pytest.approx(score, nan_ok=True)
        z = (score - mean) / std if std > 0 else math.nan
        assert frame.loc[row, "z"] == pytest.approx(z, nan_ok=True), row
    assert np.isnan(frame.loc[:2, "z"]).tolist() == [True, True, True]
    assert frame.loc[:3, ["baseline_mean", "baseline_std"]].to_numpy().tolist() == [[0.25, 0.5]] * 4
    assert frame.loc[4:, "baseline_mean"].tolist() == [float(base[p]) for p in pairs[:4]]
    assert frame.loc[4:, "baseline_std"].tolist() == [float(base[p]) + 100 for p in pairs[:4]]


def test_raw_scores_table_of_placebo_pairs_and_without_variant():
    a = _stats(2, L=3, H=2)
    columns = [c for c in RAW_SCORES_COLUMNS if c != "variant"]  # invariant.csv's: kind alone
    frame = scoring.raw_scores_table({("Q",): a}, columns, placebo=True)
    assert list(frame.columns) == columns and frame["kind"].tolist() == ["Q"] * len(frame)
    i, h, j, g = scoring.placebo_pairs(3, 2)
    assert frame["src_layer"].tolist() == i.tolist() and frame["dst_head"].tolist() == g.tolist()
    assert frame["score"].tolist() == a.score.numpy()[i, h, j, g].tolist()
    assert (
        scoring.raw_scores_table({("Q",): a}, columns)["src_layer"].tolist()
        == scoring.later_pairs(3, 2)[0].tolist()
    )
    with pytest.raises(ValueError):  # a key must name exactly the label columns
        scoring.raw_scores_table({("Q", "true"): a}, columns)


def test_pair_label_names_heads_as_transformer_lens():
    row = pd.Series({"src_layer": 0, "src_head": 3, "dst_layer": 2, "dst_head": 5, "score": 1.0})
    assert scoring.pair_label(row) == "L0H3->L2H5"


# --- surrogates -----------------------------------------------------------------------


def _hw(shape: str = "three_layers", dtype: torch.dtype = torch.float64, **overrides) -> weights.HeadWeights:
    state = random_model(shape, seed=5, dtype=dtype, **overrides).state_dict()
    return weights.from_state_dict(state, dtype=dtype)


def _as_right(w: weights.HeadWeights, name: str, layer: int) -> torch.Tensor:
    """The right factor of a circuit: W_K transposed (QK = W_Q W_K^T), W_O as it is (OV = W_V W_O)."""
    return getattr(w, name)[layer].mT if name == "W_K" else getattr(w, name)[layer]


def test_a_surrogate_rotates_every_later_layer_as_a_whole_and_keeps_layer_0_and_the_rest():
    """Layer l >= 1 reads x R_l and writes back through R_l^T: each head's own QK and OV circuits
    become R_l C R_l^T (trace, spectrum and norm kept, the matrix moved), the output bias b_O R_l^T
    is what the layer's own queries read as before, and nothing outside the heads changes."""
    hw = _hw()
    fake = scoring.surrogate(hw, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):  # layer 0 as it was
        assert torch.equal(getattr(fake, name)[0], getattr(hw, name)[0]), name
    for name in ("b_Q", "b_K", "b_V", "W_E", "W_pos", "W_U", "b_U"):  # not touched
        assert torch.equal(getattr(fake, name), getattr(hw, name)), name
    for layer in (1, 2):
        for left, right in (("W_Q", "W_K"), ("W_V", "W_O")):  # QK, OV: [head, d_model, d_model]
            a, b = (getattr(w, left)[layer] @ _as_right(w, right, layer) for w in (hw, fake))
            # R C R^T, not R C or C: the same trace (a rotation of one side alone changes it)
            assert torch.allclose(torch.diagonal(b, dim1=-2, dim2=-1).sum(-1),
                                  torch.diagonal(a, dim1=-2, dim2=-1).sum(-1), atol=1e-12)  # fmt: skip
            assert torch.allclose(torch.linalg.eigvals(b).abs().sort().values,
                                  torch.linalg.eigvals(a).abs().sort().values, atol=1e-10)  # fmt: skip
            assert not torch.allclose(a, b)
        # each input matrix keeps its Gram matrix (R orthogonal), and W_O its row Gram matrix
        for name in ("W_Q", "W_K", "W_V"):
            a, b = getattr(hw, name)[layer], getattr(fake, name)[layer]
            assert torch.allclose(b.mT @ b, a.mT @ a, atol=1e-12) and not torch.allclose(a, b), name
        a, b = hw.W_O[layer], fake.W_O[layer]
        assert torch.allclose(b @ b.mT, a @ a.mT, atol=1e-12) and not torch.allclose(a, b)
        # b_O R^T: its norm kept, moved, and read by the layer's own queries exactly as before
        a, b = hw.b_O[layer], fake.b_O[layer]
        assert torch.linalg.norm(b) == pytest.approx(float(torch.linalg.norm(a)), rel=1e-12)
        assert not torch.allclose(a, b)
        assert torch.allclose(b @ fake.W_Q[layer], a @ hw.W_Q[layer], atol=1e-12)
    # the alignment between layers is what moves: layer 0's output read by layer 1's queries
    assert not torch.allclose(fake.W_O[0] @ fake.W_Q[1, 0], hw.W_O[0] @ hw.W_Q[1, 0], atol=1e-3)


def test_a_surrogate_is_drawn_from_its_generator_alone():
    """The same generator seed gives the same surrogate whatever torch's global seed; another seed
    gives another one."""
    hw = _hw()
    torch.manual_seed(1)
    a = scoring.surrogate(hw, torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = scoring.surrogate(hw, torch.Generator().manual_seed(7))
    c = scoring.surrogate(hw, torch.Generator().manual_seed(8))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name)[1:], getattr(c, name)[1:]), name


def test_a_surrogate_of_one_layer_is_the_model_itself():
    """Nothing comes after layer 0: no rotation is drawn, every weight is kept."""
    hw = _hw("tiny", n_layers=1)
    fake = scoring.surrogate(hw, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        assert torch.equal(getattr(fake, name), getattr(hw, name)), name


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_a_surrogate_keeps_float32_weights_float32_whatever_the_default_dtype(default):
    """float32 weights give a float32 surrogate (rotated by the float64 draw rounded once), also
    when torch's default dtype is float64."""
    hw32 = _hw(dtype=torch.float32)
    hw64 = hw32.to(torch.float64)
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        fake32 = scoring.surrogate(hw32, torch.Generator().manual_seed(0))
    finally:
        torch.set_default_dtype(before)
    fake64 = scoring.surrogate(hw64, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        got = getattr(fake32, name)
        assert got.dtype == torch.float32, name
        assert torch.allclose(got.double(), getattr(fake64, name), rtol=1e-5, atol=1e-6), name


def test_summarize_counts_per_kind_and_measure():
    pairs = {
        "src_layer": [0, 0, 0, 0],
        "src_head": [0, 1, 2, 2],
        "dst_layer": [1, 1, 1, 2],
        "dst_head": [1, 0, 2, 0],
    }
    values = {
        "score": [0.1, np.nan, 0.3, 0.2],
        "z": [4.0, np.nan, 3.0, 1.0],
        "discovery": [True, False, False, False],
    }
    k = pd.DataFrame({"kind": "K", "variant": "true", **pairs, **values})
    one = {"src_layer": [0], "src_head": [1], "dst_layer": [1], "dst_head": [1], "score": [0.5], "z": [3.5]}
    q = pd.DataFrame({"kind": "Q", "variant": "invariant", **one, "discovery": [True]})
    scores = pd.concat([k, q], ignore_index=True)
    placebo = scores.assign(z=[1.0, np.nan, np.nan, 2.0, 9.0], discovery=[True, True, False, False, False])
    out = scoring.summarize(scores, placebo)  # K true: z = 3 is not above 3; a NaN z is not a placebo pair
    assert list(out) == ["Q", "K", "V"]
    assert all(list(out[kind]) == [*VARIANTS, "invariant"] for kind in out)  # invariant: in the table
    assert out["K"]["true"] == {
        "n_pairs": 4,
        "n_undefined": 1,
        "max_score": 0.3,
        "max_pair": "L0H2->L1H2",
        "n_z_above_3": 1,
        "n_discoveries": 1,
        "placebo_pairs": 2,
        "placebo_discoveries": 2,
    }  # fmt: skip
    assert out["Q"]["invariant"] == {
        "n_pairs": 1, "n_undefined": 0, "max_score": 0.5, "max_pair": "L0H1->L1H1",
        "n_z_above_3": 1, "n_discoveries": 1, "placebo_pairs": 1, "placebo_discoveries": 0,
    }  # fmt: skip
    for kind, v in (("K", "invariant"), ("Q", "true"), ("V", "errata_bcda")):
        assert out[kind][v] == {
            "n_pairs": 0, "n_undefined": 0, "max_score": None, "max_pair": None,
            "n_z_above_3": 0, "n_discoveries": 0, "placebo_pairs": 0, "placebo_discoveries": 0,
        }, (kind, v)  # fmt: skip
    # raw tables: no discoveries, no placebo, no invariant rows: the five variants alone
    raw = scoring.summarize(k.drop(columns="discovery"))
    assert list(raw["V"]) == list(VARIANTS)
    assert raw["K"]["true"] == {
        "n_pairs": 4, "n_undefined": 1, "max_score": 0.3, "max_pair": "L0H2->L1H2", "n_z_above_3": 1,
    }  # fmt: skip


def test_a_surrogate_keeps_each_layers_own_circuits_and_breaks_the_alignment_between_them():
    hw = weights.from_state_dict(random_model("tiny", seed=3).state_dict())
    fake = scoring.surrogate(hw, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O"):  # layer 0 as it was
        assert torch.equal(getattr(fake, name)[0], getattr(hw, name)[0])
    QK = lambda w: w.W_Q[1] @ w.W_K[1].mT  # noqa: E731  [head, d_model, d_model]
    OV = lambda w: w.W_V[1] @ w.W_O[1]  # noqa: E731
    for circuit in (QK, OV):  # R QK R^T: the same spectrum, norms and relations between layer-1 heads
        a, b = circuit(hw), circuit(fake)
        assert torch.linalg.svdvals(b) == pytest.approx(torch.linalg.svdvals(a), rel=1e-10, abs=1e-12)
        assert (b[0] * b[1]).sum() == pytest.approx(float((a[0] * a[1]).sum()), rel=1e-10)
    k_numerator = lambda w: (w.W_V[0, 0] @ w.W_O[0, 0] @ w.W_K[1, 0] @ w.W_Q[1, 0].mT).norm()  # noqa: E731
    assert abs(float(k_numerator(fake) / k_numerator(hw)) - 1) > 1e-3


def test_haar_blocks_have_the_right_second_moment() -> None:
    Z = scoring.haar_blocks(4000, 16, 4, torch.Generator().manual_seed(0))
    assert Z.shape == (4000, 4, 4)
    # each entry of a Haar d x d matrix has mean 0 and variance 1/d
    assert Z.square().mean().item() == pytest.approx(1 / 16, rel=0.05)
    assert abs(Z.mean().item()) < 0.01


FAST = CompositionConfig(baseline_samples=32, null_samples=16)


def rows(df: pd.DataFrame, kind: str, variant: str) -> pd.DataFrame:
    return df[(df["kind"] == kind) & (df["variant"] == variant)]


def test_summary_is_json_and_counts() -> None:
    df = composition_scores(random_heads(9), FAST, seed=0)
    s = scoring.summarize(df)
    json.dumps(s, allow_nan=False)
    for kind in KINDS:
        for v in VARIANTS:
            sub = rows(df, kind, v)
            assert s[kind][v]["max_score"] == pytest.approx(sub["score"].max())
            assert s[kind][v]["n_z_above_3"] == int((sub["z"] > 3).sum())
            assert s[kind][v]["n_pairs"] == len(sub)
    empty = scoring.summarize(df.iloc[:0])
    assert empty["Q"]["true"] == {
        "n_pairs": 0,
        "n_undefined": 0,
        "max_score": None,
        "max_pair": None,
        "n_z_above_3": 0,
    }
