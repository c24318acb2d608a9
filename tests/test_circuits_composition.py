"""pipeline/circuits/composition.py: known answers, the paper-order errata strands written out
densely, the null's rotation identity, baselines, determinism, the device given, TransformerLens 3.9
as oracle, and every score finite and in its range for random weights of any size."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import planted
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import head_weights, random_models

from pipeline import streams
from pipeline.behaviour import heads
from pipeline.circuits import composition, scoring, strands, weights
from pipeline.circuits import composition as comp
from pipeline.circuits.composition import COLUMNS, KINDS, VARIANTS, composition_scores, true_scores
from pipeline.circuits.scoring import summarize
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.cli import use_threads
from pipeline.config import CompositionConfig

FAST = CompositionConfig(baseline_samples=32, null_samples=16)
F64 = torch.float64


def random_heads(seed: int, L: int = 2, H: int = 3, D: int = 24, d: int = 4) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    return head_weights(r(L, H, D, d), r(L, H, D, d), r(L, H, D, d), r(L, H, d, D))


def rows(df: pd.DataFrame, kind: str, variant: str) -> pd.DataFrame:
    return df[(df["kind"] == kind) & (df["variant"] == variant)]


def no_warnings():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error")
    return ctx


# --- layout and determinism --------------------------------------------------------


def test_columns_row_count_and_order() -> None:
    L, H = 3, 2
    df = composition_scores(random_heads(0, L=L, H=H), FAST, seed=0)
    assert list(df.columns) == COLUMNS
    pairs = H * H * L * (L - 1) // 2
    assert len(df) == len(KINDS) * len(VARIANTS) * pairs == 180
    key = pd.DataFrame({
        "kind": df["kind"].map(KINDS.index), "variant": df["variant"].map(VARIANTS.index),
        **{c: df[c] for c in ("src_layer", "src_head", "dst_layer", "dst_head")},
    })  # fmt: skip
    assert key.equals(key.sort_values(list(key.columns)).reset_index(drop=True))
    assert (df["dst_layer"] > df["src_layer"]).all()
    assert not df.duplicated(["kind", "variant", "src_layer", "src_head", "dst_layer", "dst_head"]).any()


def test_deterministic_for_a_seed() -> None:
    hw = random_heads(1)
    a, b = composition_scores(hw, FAST, seed=7), composition_scores(hw, FAST, seed=7)
    pd.testing.assert_frame_equal(a, b)
    c = composition_scores(hw, FAST, seed=8)
    np.testing.assert_array_equal(a["score"].to_numpy(), c["score"].to_numpy())  # scores use no randomness
    assert not np.allclose(a["z"].to_numpy(), c["z"].to_numpy())  # the null does


def test_thread_count_changes_rounding_only() -> None:
    """analysis.threads (pipeline.cli.use_threads): one thread and two draw the same null and
    agree to rounding."""
    hw = random_heads(1, L=3, H=4, D=64, d=8)
    before = torch.get_num_threads()
    try:
        use_threads(1)
        assert torch.get_num_threads() == 1
        one = composition_scores(hw, FAST, seed=3)
        use_threads(2)
        assert torch.get_num_threads() == 2
        two = composition_scores(hw, FAST, seed=3)
        use_threads(None)  # None: left as it is
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    pd.testing.assert_frame_equal(one, two, rtol=1e-9, atol=1e-12)


def test_the_weights_and_the_null_draws_move_to_the_device_given(monkeypatch) -> None:
    """`device`: every head matrix and the null's Haar blocks are moved there (on a CPU-only machine
    the values cannot show it; the test above compares devices where CUDA is present)."""
    moved, to = [], torch.Tensor.to

    def spy(self, *args, **kwargs):
        if "cpu" in args or kwargs.get("device") == "cpu":
            moved.append(tuple(self.shape))
        return to(self, *args, **kwargs)

    hw = random_heads(2, L=2, H=2, D=8, d=2)
    monkeypatch.setattr(torch.Tensor, "to", spy)
    composition_scores(hw, FAST, seed=0, device="cpu")
    monkeypatch.undo()
    weights = sorted(tuple(getattr(hw, f.name).shape) for f in dataclasses.fields(hw))
    null = (FAST.null_samples, 4, 4)  # [S, k, k], k = min(d_model, 2 d_head)
    assert sorted(moved) == sorted([*weights, null])


# --- known answers -----------------------------------------------------------------


def test_orthogonal_write_and_read_scores_exactly_zero() -> None:
    # head a (layer 0) writes only into residual coords 0..3; head b (layer 1) reads only 4..7
    D, d = 16, 4
    g = torch.Generator().manual_seed(0)
    W = {n: torch.zeros(2, 1, D, d, dtype=F64) for n in ("W_Q", "W_K", "W_V")}
    W_O = torch.zeros(2, 1, d, D, dtype=F64)
    W["W_V"][0, 0] = torch.randn(D, d, generator=g, dtype=F64)
    W_O[0, 0, :, 0:4] = torch.randn(d, 4, generator=g, dtype=F64)
    for n in W:
        W[n][1, 0, 4:8] = torch.randn(4, d, generator=g, dtype=F64)
    W_O[1, 0] = torch.randn(d, D, generator=g, dtype=F64)
    hw = head_weights(W["W_Q"], W["W_K"], W["W_V"], W_O)
    df = composition_scores(hw, FAST, seed=0)
    for kind in KINDS:
        assert rows(df, kind, "true")["score"].tolist() == [0.0]
        for method in ("grams", "factors"):
            assert true_scores(hw, method=method)[kind][0, 0, 1, 0].item() == 0.0


def test_rank_one_write_read_along_the_same_direction_scores_one() -> None:
    # OV^a = u v^T writes along v; QK^b, QK^bT and OV^b all read along v: every kind scores 1
    D, d = 12, 3
    g = torch.Generator().manual_seed(1)
    u, v, w, x = (torch.randn(D, generator=g, dtype=F64) for _ in range(4))
    W_Q, W_K, W_V = (torch.zeros(2, 1, D, d, dtype=F64) for _ in range(3))
    W_O = torch.zeros(2, 1, d, D, dtype=F64)
    W_V[0, 0, :, 0], W_O[0, 0, 0] = u, v  # head a: OV = u v^T
    W_Q[1, 0, :, 1], W_K[1, 0, :, 1], W_V[1, 0, :, 1] = v, v, v  # head b reads along v
    W_Q[0, 0, :, 0], W_K[0, 0, :, 0] = w, x
    W_O[1, 0, 1] = w
    hw = head_weights(W_Q, W_K, W_V, W_O)
    df = composition_scores(hw, FAST, seed=0)
    for kind in KINDS:
        assert rows(df, kind, "true")["score"].item() == pytest.approx(1.0, abs=1e-12)
        for method in ("grams", "factors"):
            assert true_scores(hw, method=method)[kind][0, 0, 1, 0].item() == pytest.approx(1.0, abs=1e-12)


def test_zero_rotated_strand_gives_nan_without_crashing_or_warning() -> None:
    # head b's query and key read orthogonal subspaces, so ||W_K^bT W_Q^b|| = 0 exactly:
    # the errata's rotated denominator vanishes (QK^b itself does not); likewise W_O^b W_V^b = 0
    hw = random_heads(2, L=2, H=2, D=16, d=2)
    hw.W_Q[1, 0].zero_(), hw.W_K[1, 0].zero_(), hw.W_V[1, 0].zero_(), hw.W_O[1, 0].zero_()
    g = torch.Generator().manual_seed(3)
    hw.W_Q[1, 0, 0:4] = torch.randn(4, 2, generator=g, dtype=F64)
    hw.W_K[1, 0, 4:8] = torch.randn(4, 2, generator=g, dtype=F64)
    hw.W_V[1, 0, 8:12] = torch.randn(4, 2, generator=g, dtype=F64)
    hw.W_O[1, 0, :, 12:16] = torch.randn(2, 4, generator=g, dtype=F64)
    ctx = no_warnings()
    try:
        df = composition_scores(hw, FAST, seed=0)
        summary = summarize(df)
    finally:
        ctx.__exit__(None, None, None)
    to_b = df["dst_head"] == 0
    for kind in KINDS:
        for v in ("errata_bcda", "errata_dabc"):
            assert rows(df[to_b], kind, v)["score"].isna().all()
            assert rows(df[to_b], kind, v)["z"].isna().all()
            assert rows(df[~to_b], kind, v)["score"].notna().all()
        assert rows(df, kind, "true")["score"].notna().all()
        assert summary[kind]["errata_bcda"]["n_undefined"] == 2
    json.dumps(summary, allow_nan=False)
    # with the true denominators the errata scores are defined again
    for kind in KINDS:
        for v in ("errata_bcda_trueden", "errata_dabc_trueden"):
            assert rows(df, kind, v)["score"].notna().all()


@pytest.mark.parametrize(("x", "defined"), [(5e-8, True), (3.5e-8, False)])
def test_a_side_norm_is_undefined_at_1e_8_of_its_factors_norms(x: float, defined: bool) -> None:
    """P = [2; 0], Q = [x, 4]: ||P Q|| = ||P|| ||Q|| ~ 8, ||Q P|| = 2x, NaN unless above
    scoring.ZERO_RTOL ||P|| ||Q|| ~ 8e-8 (2x = 1e-7 is defined, 7e-8 is not)."""
    P = torch.tensor([[2.0], [0.0]], dtype=F64)
    Q = torch.tensor([[x, 4.0]], dtype=F64)
    bound = 2 * math.hypot(x, 4.0)
    norms = comp._side_norms(P, Q)
    assert set(norms) == {"true", "rotated"}
    assert norms["true"].item() == pytest.approx(bound, rel=1e-15)
    if defined:
        assert norms["rotated"].item() == pytest.approx(2 * x, rel=1e-15)
    else:
        assert math.isnan(norms["rotated"].item())
    assert set(comp._side_norms(P, Q, rotated=False)) == {"true"}


def assert_names(caught, *named: str) -> None:
    """The refusal is one line and names each of `named` (the argument, the value, the choices)."""
    message = str(caught.value)
    assert "\n" not in message and all(x in message for x in named), (message, named)


def test_reader_factors_name_a_bad_kind() -> None:
    W = torch.zeros(4, 2, dtype=F64)
    with pytest.raises(ValueError) as caught:
        comp.reader_factors(W, W, W, W.T, "O")
    assert_names(caught, "kind", "'O'", *KINDS)


# --- the errata strands, written out in the paper's order --------------------------


@pytest.mark.parametrize("placebo", [False, True])
def test_every_variant_equals_dense_paper_order(placebo: bool) -> None:
    """Every later pair (placebo: every pair that cannot compose, a head of the writer's layer but
    not itself or of an earlier one) of every kind and variant, written out densely."""
    hw = random_heads(4, L=3, H=2, D=10, d=3)
    df = composition_scores(hw, FAST, seed=0, placebo=placebo)
    pairs = scoring.placebo_pairs(3, 2) if placebo else scoring.later_pairs(3, 2)
    for (kind, variant), group in df.groupby(["kind", "variant"], sort=False):
        got = tuple(group[c].to_numpy() for c in ("src_layer", "src_head", "dst_layer", "dst_head"))
        assert all(np.array_equal(a, b) for a, b in zip(got, pairs, strict=True)), (kind, variant)
    # placebo: a writer of layer i is read by its layer's other head and the 2 i heads below: 2 (1 + 3 + 5)
    assert len(df) == len(KINDS) * len(VARIANTS) * (18 if placebo else 12)
    # the paper's column-vector matrices are the transposes of our row-vector ones
    Wq, Wk, Wv, Wo = hw.W_Q.mT, hw.W_K.mT, hw.W_V.mT, hw.W_O.mT  # [d_head, d_model] x3, [d_model, d_head]
    fro = lambda M: torch.linalg.matrix_norm(M).item()  # noqa: E731
    for r in df.itertuples():
        a, b = (r.src_layer, r.src_head), (r.dst_layer, r.dst_head)
        A, B = {  # the later head's two factors in paper order: A B C D
            "Q": (Wk[b].T, Wq[b]),  # W_K^bT W_Q^b
            "K": (Wq[b].T, Wk[b]),  # W_Q^bT W_K^b
            "V": (Wo[b], Wv[b]),  # W_O^b W_V^b
        }[r.kind]
        C, D = Wo[a], Wv[a]  # W_O^a W_V^a
        if r.variant == "true":
            want = fro(A @ B @ C @ D) / (fro(A @ B) * fro(C @ D))
        else:
            num = fro(B @ C @ D @ A) if r.variant.startswith("errata_bcda") else fro(D @ A @ B @ C)
            trueden = r.variant.endswith("_trueden")
            den = fro(A @ B) * fro(C @ D) if trueden else fro(B @ A) * fro(D @ C)
            want = num / den
        assert r.score == pytest.approx(want, rel=1e-10), r


@pytest.mark.parametrize("method", ["grams", "factors"])
def test_true_scores_fast_path_equals_dense_and_table(method: str) -> None:
    hw = random_heads(5, L=3, H=2, D=16, d=4)
    df = composition_scores(hw, FAST, seed=0)
    OV, QK = hw.W_V @ hw.W_O, hw.W_Q @ hw.W_K.mT  # [L, H, D, D]
    fast = true_scores(hw, method=method)
    for kind in KINDS:
        right = {"Q": QK, "K": QK.mT, "V": OV}[kind]
        ours = fast[kind]
        for r in rows(df, kind, "true").itertuples():
            a, b = (r.src_layer, r.src_head), (r.dst_layer, r.dst_head)
            n = torch.linalg.matrix_norm
            want = (n(OV[a] @ right[b]) / (n(OV[a]) * n(right[b]))).item()
            assert ours[a + b].item() == pytest.approx(want, rel=1e-10)
            assert r.score == pytest.approx(want, rel=1e-10)
        later = torch.arange(3)[:, None, None, None] < torch.arange(3)[None, None, :, None]
        assert torch.isnan(ours[~later.expand_as(ours)]).all()


@pytest.mark.parametrize("per_block", [1, 2, 3])
def test_true_scores_in_blocks_of_writer_layers_equal_one_block(monkeypatch, per_block: int) -> None:
    """Large models hold the writers' Gram vectors a few layers at a time: the same scores
    (each is one dot product of the same two vectors; only the GEMM's shape changes). Seven
    layers: blocks of 3 writer layers leave a second block (layers 3-5) with earlier readers."""
    hw = random_heads(9, L=7, H=2, D=12, d=4)
    whole = true_scores(hw, method="grams")
    n = strands.gram_vector_length(12)
    assert n == 12 * 12  # d_model < one tile (128 rows): the tile is the whole matrix
    monkeypatch.setattr(comp, "_GRAMS", per_block * 2 * n)  # per_block layers of 2 heads
    blocked = true_scores(hw, method="grams")
    for kind in KINDS:
        torch.testing.assert_close(blocked[kind], whole[kind], rtol=1e-14, atol=0, equal_nan=True)


def test_true_scores_name_a_bad_method() -> None:
    with pytest.raises(ValueError) as caught:
        true_scores(random_heads(0), method="dense")
    assert_names(caught, "method", "'dense'", "'auto'", "'grams'", "'factors'")


def dense_true_scores(hw: HeadWeights, kind: str) -> torch.Tensor:
    """||OV^a right^b|| / (||OV^a|| ||right^b||) for every pair, densely; NaN unless dst_layer > src_layer."""
    OV, QK = hw.W_V @ hw.W_O, hw.W_Q @ hw.W_K.mT  # [L, H, D, D]
    right = {"Q": QK, "K": QK.mT, "V": OV}[kind]
    n = torch.linalg.matrix_norm
    scores = n(OV[:, :, None, None] @ right[None, None]) / (n(OV)[:, :, None, None] * n(right)[None, None])
    L = hw.n_layers
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]
    return torch.where(later.expand_as(scores), scores, torch.nan)


@pytest.mark.parametrize(
    ("D", "d", "method", "kinds", "cheaper", "grams"),
    [
        # L 3, H 4: 8 writers; 4 * 4 * 3 = 48 pairs per kind
        (8, 4, "auto", "QKV", (8, 24, 144, 4, 8, 4), True),  # grams 9,280 < factors 18,432
        (64, 2, "auto", "QKV", (8, 24, 144, 2, 64, 2), False),  # grams 430,592 > factors 36,864
        (8, 4, "auto", "QK", (8, 16, 96, 4, 8, 4), True),  # two kinds: 2 x 8 readers, 2 x 48 pairs
        (64, 2, "grams", "QKV", None, True),  # named: no cost comparison
        (8, 4, "factors", "QKV", None, False),
    ],
)
def test_true_scores_take_the_named_or_cheaper_route(
    monkeypatch, D: int, d: int, method: str, kinds: str, cheaper: tuple | None, grams: bool
) -> None:
    """method "grams": packed Gram vectors (strands.gram_vectors); "factors": no Gram vector anywhere
    (strands.all_pairs_norms by its factors); "auto": the route grams_are_cheaper picks for
    (writers, kinds x readers, kinds x pairs, d_head, d_model, d_head). The same scores either way."""
    calls: dict[str, list] = {"cheaper": [], "grams": [], "pairs": []}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls[name].append((args, kwargs))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(comp, "grams_are_cheaper", spy("cheaper", strands.grams_are_cheaper))
    monkeypatch.setattr(comp, "all_pairs_norms", spy("pairs", strands.all_pairs_norms))
    monkeypatch.setattr(comp, "gram_vectors", spy("grams", strands.gram_vectors))
    monkeypatch.setattr(strands, "gram_vectors", spy("grams", strands.gram_vectors))  # all_pairs_norms'
    hw = random_heads(10, L=3, H=4, D=D, d=d)
    out = true_scores(hw, kinds=kinds, method=method)
    assert [args for args, _ in calls["cheaper"]] == ([cheaper] if cheaper else [])
    if cheaper:
        assert strands.grams_are_cheaper(*cheaper) is grams
    assert bool(calls["grams"]) is grams
    assert bool(calls["pairs"]) is not grams
    assert set(out) == set(kinds)
    for kind in kinds:
        torch.testing.assert_close(out[kind], dense_true_scores(hw, kind), rtol=1e-10, atol=0, equal_nan=True)


def test_kind_tensors_fill_the_later_pairs_or_the_placebo_layers() -> None:
    """NaN unless dst_layer > src_layer (the default), or (placebo) unless dst_layer <= src_layer."""
    hw = random_heads(4, L=3, H=2, D=10, d=3)
    Z = scoring.haar_blocks(4, 10, 6, torch.Generator().manual_seed(0))
    later = torch.arange(3)[:, None, None, None] < torch.arange(3)[None, None, :, None]
    for placebo, defined in ((None, later), (True, ~later)):
        args = () if placebo is None else (placebo,)
        for t in comp._kind_tensors(hw, "K", Z, *args)["true"]:  # score, null mean, null sd
            assert t.shape == (3, 2, 3, 2)
            assert torch.equal(~torch.isnan(t), defined.expand_as(t)), placebo


class Counter:
    """A stand-in for pipeline.cli.Progress: counts its updates."""

    def __init__(self) -> None:
        self.n = 0

    def update(self) -> None:
        self.n += 1


def test_blocks_of_reader_heads_give_the_same_scores_and_one_bar_step_each(monkeypatch) -> None:
    """_BLOCK bounds the null's memory by cutting the readers into blocks of `step` heads: with
    H S d_head^2 = 3 x 4 x 2^2 = 48 and _BLOCK 96, blocks of 2. Layer 0's six readers (more than
    d_model = 4) take 3 blocks, layer 1's three take 2: five bar steps, the same scores."""
    hw = random_heads(11, L=3, H=3, D=4, d=2)
    cfg = CompositionConfig(baseline_samples=8, null_samples=4)
    whole = composition_scores(hw, cfg, seed=1)
    Z = scoring.haar_blocks(4, 4, 4, torch.Generator().manual_seed(0))
    bar = Counter()
    comp._kind_tensors(hw, "Q", Z, False, bar)
    assert bar.n == 1 + 1  # one block per writer layer
    monkeypatch.setattr(comp, "_BLOCK", 96)
    assert [b[-1] for b in comp._reader_blocks(3, 3, 2, 4, False)] == [2, 2]
    totals, progress_bar = [], comp.progress_bar
    monkeypatch.setattr(
        comp, "progress_bar", lambda total, *a: totals.append(total) or progress_bar(total, *a)
    )
    blocked = composition_scores(hw, cfg, seed=1)
    pd.testing.assert_frame_equal(blocked, whole, rtol=1e-12, atol=1e-14)
    composition_scores(hw, cfg, seed=1, placebo=True)  # writer layer i: 3 (i + 1) readers, 2, 3, 5 blocks
    assert totals == [3 * (3 + 2), 3 * (2 + 3 + 5)]  # every kind
    bar = Counter()
    comp._kind_tensors(hw, "Q", Z, False, bar)
    assert bar.n == 3 + 2


def test_float32_weights_are_scored_in_float64() -> None:
    hw = random_heads(12, L=2, H=2, D=12, d=3)
    hw32 = hw.to(torch.float32)
    assert hw32.W_Q.dtype == torch.float32
    want = composition_scores(hw32.to(F64), FAST, seed=0)
    pd.testing.assert_frame_equal(composition_scores(hw32, FAST, seed=0), want, rtol=1e-12, atol=1e-14)


# --- the null ------------------------------------------------------------------------


def test_null_samples_equal_literally_rotating_the_writer() -> None:
    """With Z = U^T R V the small-space null equals W_O^a -> W_O^a R, W_V^a -> R^T W_V^a, densely."""
    D, d = 10, 3
    g = torch.Generator().manual_seed(6)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    W_V, W_O, W_Q, W_K = r(1, D, d), r(1, d, D), r(1, D, d), r(1, D, d)
    Rs = [torch.linalg.qr(r(D, D)).Q for _ in range(3)]  # any orthogonal matrices
    C, Dm = comp.writer_factors(W_V, W_O)
    A, B = comp.reader_factors(W_Q, W_K, W_V, W_O, "K")
    U = torch.linalg.qr(torch.cat([C, Dm.mT], -1)).Q[0]  # [D, k]
    V = torch.linalg.qr(torch.cat([B.mT, A], -1)).Q[0]
    Z = torch.stack([U.T @ R @ V for R in Rs])  # [S, k, k]
    null = comp._null_numerators(comp._Writers.of(C, Dm, Z), comp._Readers.of(A, B, Z))
    fro = lambda M: torch.linalg.matrix_norm(M).item()  # noqa: E731
    for s, R in enumerate(Rs):
        Cr, Dr = R.T @ C[0], Dm[0] @ R  # C = W_O^T -> R^T W_O^T, D = W_V^T -> W_V^T R
        a, b = A[0], B[0]
        assert null["true"][0, 0, s].item() == pytest.approx(fro(a @ b @ Cr @ Dr), rel=1e-9)
        assert null["bcda"][0, 0, s].item() == pytest.approx(fro(b @ Cr @ Dr @ a), rel=1e-9)
        assert null["dabc"][0, 0, s].item() == pytest.approx(fro(Dr @ a @ b @ Cr), rel=1e-9)
    # the rotation keeps the head's own spectrum: OV^a -> R^T OV^a R
    OV, OVr = W_V[0] @ W_O[0], (Rs[0].T @ W_V[0]) @ (W_O[0] @ Rs[0])
    torch.testing.assert_close(torch.linalg.svdvals(OV), torch.linalg.svdvals(OVr))


def test_planted_composition_z_equals_explicitly_rotated_writers() -> None:
    """z of the planted pair (head b's query reads exactly what head a writes), from the writer
    rotated by hand: W_O^a -> W_O^a R, W_V^a -> R^T W_V^a. With d_model = 2 d_head each null draw
    Z = U^T R V is a whole Haar matrix (U, V the orthonormal frames of [C | D^T] and [B^T | A],
    square here), so R = U Z V^T exactly, from the same draws composition_scores makes."""
    D, d = 8, 4
    hw = random_heads(7, L=2, H=3, D=D, d=d)
    hw.W_Q[1, 2] = hw.W_O[0, 1].T.clone()
    cfg = CompositionConfig(baseline_samples=32, null_samples=64)
    df = composition_scores(hw, cfg, seed=0)
    gen = torch.Generator().manual_seed(streams.seed_of(0, "composition.null"))  # the null's stream
    Z = scoring.haar_blocks(cfg.null_samples, D, D, gen)  # [S, D, D]
    W_V, W_O = hw.W_V[0, 1], hw.W_O[0, 1]
    C, Dm = comp.writer_factors(W_V, W_O)
    A, B = comp.reader_factors(hw.W_Q[1, 2], hw.W_K[1, 2], hw.W_V[1, 2], hw.W_O[1, 2], "Q")
    U = torch.linalg.qr(torch.cat([C, Dm.mT], -1)).Q  # [D, D]
    V = torch.linalg.qr(torch.cat([B.mT, A], -1)).Q
    QK = hw.W_Q[1, 2] @ hw.W_K[1, 2].T
    n = torch.linalg.matrix_norm

    def q_score(W_V: torch.Tensor, W_O: torch.Tensor) -> float:
        OV = W_V @ W_O
        return (n(OV @ QK) / (n(OV) * n(QK))).item()

    rotations = [U @ z @ V.T for z in Z]
    torch.testing.assert_close(rotations[0] @ rotations[0].T, torch.eye(D, dtype=F64))
    null = torch.tensor([q_score(R.T @ W_V, W_O @ R) for R in rotations], dtype=F64)
    score = q_score(W_V, W_O)
    z = (score - null.mean().item()) / null.std().item()  # sample sd (n - 1), as the null's
    q = rows(df, "Q", "true").set_index(["src_layer", "src_head", "dst_layer", "dst_head"])
    assert q.loc[(0, 1, 1, 2), "score"] == pytest.approx(score, rel=1e-12)
    assert q.loc[(0, 1, 1, 2), "z"] == pytest.approx(z, rel=1e-9)
    assert z > 3 and q.loc[(0, 1, 1, 2), "score"] == q["score"].max()
    assert summarize(df)["Q"]["true"]["max_pair"] == "L0H1->L1H2"


# --- baselines -------------------------------------------------------------------------


def test_baselines_are_the_scores_of_gaussian_factors_drawn_from_the_seed() -> None:
    """Every variant's baseline mean and sd, recomputed densely in the paper's order from the same
    draws (A, B, C, D, in that order, from the seed's generator): one baseline per variant, the
    same for every kind; rotated denominators sit far above the true baseline (~1/sqrt(d_head) against
    ~1/sqrt(d_model)), true denominators far below (~sqrt(d_head)/d_model)."""
    D, d, S = 64, 8, 200
    cfg = CompositionConfig(baseline_samples=S, null_samples=4)
    df = composition_scores(random_heads(8, L=2, H=1, D=D, d=d), cfg, seed=0)
    base = df.groupby(["kind", "variant"])[["baseline_mean", "baseline_std"]].first()
    assert base.groupby(level="variant").nunique().eq(1).all().all()  # the kinds share one
    gen = torch.Generator().manual_seed(streams.seed_of(0, "composition.baseline"))
    A, B, C, Dm = (
        torch.randn(S, *shape, generator=gen, dtype=F64) for shape in ((D, d), (d, D), (D, d), (d, D))
    )
    n = torch.linalg.matrix_norm
    true_den, rotated_den = n(A @ B) * n(C @ Dm), n(B @ A) * n(Dm @ C)
    bcda, dabc = n(B @ C @ Dm @ A), n(Dm @ A @ B @ C)
    want = {
        "true": n(A @ B @ C @ Dm) / true_den,
        "errata_bcda": bcda / rotated_den,
        "errata_dabc": dabc / rotated_den,
        "errata_bcda_trueden": bcda / true_den,
        "errata_dabc_trueden": dabc / true_den,
    }
    for v, scores in want.items():
        row = base.loc[("K", v)]
        assert row["baseline_mean"] == pytest.approx(scores.mean().item(), rel=1e-10), v
        assert row["baseline_std"] == pytest.approx(scores.std().item(), rel=1e-10), v
    mean = base.xs("K")["baseline_mean"]
    assert mean["true"] == pytest.approx(1 / math.sqrt(D), rel=0.1)
    assert mean["errata_bcda"] > 2 * mean["true"] > 4 * mean["errata_bcda_trueden"]


# --- summary ---------------------------------------------------------------------------


# --- the oracle ---------------------------------------------------------------------------


@pytest.mark.interop
def test_true_scores_equal_transformer_lens() -> None:
    tl = pytest.importorskip("transformer_lens")
    cfg = tl.HookedTransformerConfig(
        n_layers=3, n_heads=4, d_model=32, d_head=8, n_ctx=8, d_vocab=16,
        attn_only=True, normalization_type=None, seed=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = tl.HookedTransformer(cfg)
    hw = from_state_dict(model.state_dict())
    df = composition_scores(hw, FAST, seed=0)
    L = cfg.n_layers
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]  # [L1, 1, L2, 1]
    for kind in KINDS:
        with torch.no_grad():
            theirs = model.all_composition_scores(kind).to(F64)  # [L1, H1, L2, H2], 0 unless L2 > L1
        ours = true_scores(hw)[kind]
        mask = later.expand_as(ours)
        torch.testing.assert_close(ours[mask], theirs[mask], rtol=0, atol=1e-5)
        assert (theirs[~mask] == 0).all()
        table = rows(df, kind, "true")
        index = tuple(table[c].to_numpy() for c in ("src_layer", "src_head", "dst_layer", "dst_head"))
        np.testing.assert_allclose(table["score"].to_numpy(), theirs.numpy()[index], rtol=0, atol=1e-5)


@pytest.mark.interop
@pytest.mark.parametrize(
    "block",
    [{}, {"parallel_attn_mlp": True, "positional_embedding_type": "rotary", "rotary_dim": 4}],
    ids=["gpt2-shaped", "pythia-shaped"],
)
def test_scores_of_a_model_with_mlps_and_layernorm_equal_transformer_lens_after_its_folding(block) -> None:
    """A GPT-2-shaped random HookedTransformer (LayerNorm, GELU MLPs, standard positions; three
    layers) and a Pythia-shaped one (its MLPs beside attention, rotary positions on half of each
    head's dimensions): our scores of the weights stage's analysis-ready weights (`weights.prepare`
    of its raw state dict) equal TransformerLens's all_composition_scores after its own fold_ln and
    centring, for every later pair: the MLPs are in neither, and a rotary model's Q and K scores
    are both of the query-key circuit at relative offset 0 (W_Q and W_K unturned)."""
    tl = pytest.importorskip("transformer_lens")
    from pipeline.model import tl_checkpoint

    cfg = tl.HookedTransformerConfig(
        n_layers=3, n_heads=4, d_model=32, d_head=8, n_ctx=8, d_vocab=16, d_mlp=128, act_fn="gelu_new",
        normalization_type="LN", **{"positional_embedding_type": "standard", **block}, seed=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = tl.HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # LayerNorm weights away from 1 and 0, so that folding them matters
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("w", "b"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    ours_cfg = tl_checkpoint.from_tl_config(json.loads(json.dumps(model.cfg.to_dict(), default=str)))
    assert ours_cfg.d_mlp == 128 and ours_cfg.parallel_attn_mlp == block.get("parallel_attn_mlp", False)
    hw, _ = weights.prepare(model.state_dict(), ours_cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    later = torch.arange(3)[:, None, None, None] < torch.arange(3)[None, None, :, None]  # [L1, 1, L2, 1]
    for kind in KINDS:
        with torch.no_grad():
            theirs = model.all_composition_scores(kind).to(F64)  # [L1, H1, L2, H2]
        ours = true_scores(hw)[kind]
        mask = later.expand_as(ours)
        torch.testing.assert_close(ours[mask], theirs[mask], rtol=0, atol=1e-5)


# --- numerical guards, as properties of random models (hypothesis, derandomized: the same examples
# every run): every score is finite where it is defined and lies in its range, for weights of any size:
# true scores in [0, 1] (||A B C D|| <= ||A B|| ||C D||), a rotated strand's in [0, inf); NaN only for
# a zero OV or QK circuit. Scores are scale-free in each head matrix and the analysis divides each by
# an exact power of two first (`weights.power_of_two_scaled`), so scaling any head matrix (or W_E, W_U)
# by 2^k, |k| <= 900, changes no score by a single bit.

PROPERTY = settings(derandomize=True, max_examples=30, deadline=None)
SMALL = CompositionConfig(baseline_samples=8, null_samples=8)


N_CTX, LENGTH = 9, 4  # repeated sequences [first, span, span] of 1 + 2 x 4 tokens


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
@given(random_models(N_CTX))
def test_composition_scores_are_in_range_and_undefined_only_for_zero_circuits(model):
    hw = weights.from_state_dict(model.state_dict())
    frame = composition.composition_scores(hw.to(torch.float32), SMALL, seed=0)  # float32 in, float64 out
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
@given(random_models(N_CTX), st.data())
def test_scaling_any_head_matrix_by_a_power_of_two_changes_no_score(model, data):
    """Weights from 2^-900 to 2^900 times normal: the same scores, bit for bit."""
    hw = weights.from_state_dict(model.state_dict())
    L, H = hw.n_layers, hw.n_heads
    per_head = {name: torch.pow(2.0, data.draw(exponents((L, H, 1, 1)))) for name in weights.HEAD_MATRICES}
    scaled = replace(
        hw,
        W_E=hw.W_E * 2.0 ** data.draw(st.integers(-900, 900)),
        W_U=hw.W_U * 2.0 ** data.draw(st.integers(-900, 900)),
        **{name: getattr(hw, name) * factor for name, factor in per_head.items()},
    )
    pd.testing.assert_frame_equal(
        composition.composition_scores(scaled, SMALL, seed=1),
        composition.composition_scores(hw, SMALL, seed=1),
        check_exact=True,
    )
    assert torch.equal(heads.copying(scaled).nan_to_num(7.0), heads.copying(hw).nan_to_num(7.0))
    sources = heads.best_sources(composition.composition_scores(hw, SMALL, seed=1))
    assert torch.equal(
        heads.qk_positivity(scaled, sources).nan_to_num(7.0), heads.qk_positivity(hw, sources).nan_to_num(7.0)
    )


def scores_of(hw: weights.HeadWeights) -> pd.DataFrame:
    return composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


def test_planted_pair_has_the_largest_true_k_composition(planted_scores):
    scores = planted_scores
    true_k = scores[(scores["kind"] == "K") & (scores["variant"] == "true")]
    best = true_k.loc[true_k["score"].idxmax()]
    assert (best["src_layer"], best["src_head"], best["dst_layer"], best["dst_head"]) == (0, 0, 1, 0)
    assert best["score"] == pytest.approx(0.25)  # two rank-16 isometries: 1 / sqrt(16)
    others = true_k.drop(best.name)["score"].dropna()
    assert len(others) > 0 and others.abs().max() < 1e-12
