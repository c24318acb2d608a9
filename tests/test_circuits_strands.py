"""Strands: every factored computation equals the dense float64 one; trace and eigenvalues
survive cyclic rotation, the Frobenius norm does not (the errata's bug)."""

from __future__ import annotations

import math
from functools import reduce

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.circuits.strands as strands_module
from pipeline.circuits.strands import (
    Strand,
    all_pairs_norms,
    eigenvalues,
    fold_outer,
    gram_vector_length,
    gram_vectors,
    grams_are_cheaper,
    materialize,
    norm,
    rotate,
    shrink_left,
    trace,
    transpose,
)

PROPERTY = settings(derandomize=True, max_examples=50, deadline=None)


def random_strand(seed: int, dims: list[int], batch: tuple[int, ...] = ()) -> Strand:
    g = torch.Generator().manual_seed(seed)
    return Strand(
        tuple(
            torch.randn(*batch, a, b, generator=g, dtype=torch.float64)
            for a, b in zip(dims, dims[1:], strict=False)
        )
    )


def dense(s: Strand) -> torch.Tensor:
    return reduce(torch.matmul, s.factors)  # left to right, no cleverness


def scale(s: Strand) -> torch.Tensor:
    """prod ||A_i||: bounds every entry, norm and eigenvalue of the product."""
    return reduce(torch.mul, [torch.linalg.matrix_norm(f) for f in s.factors])


def nonzero_sorted(values: torch.Tensor, tol: float) -> list[complex]:
    kept = [complex(v) for v in values.tolist() if abs(v) > tol]
    return sorted(kept, key=lambda z: (round(z.real, 6), round(z.imag, 6)))


strands = st.builds(
    lambda seed, dims, batch: random_strand(seed, dims, batch),
    seed=st.integers(0, 2**31 - 1),
    dims=st.lists(st.integers(1, 7), min_size=3, max_size=5),  # 2 to 4 factors
    batch=st.sampled_from([(), (2,), (3,)]),
)
square_strands = st.builds(
    lambda seed, dims, batch: random_strand(seed, dims + [dims[0]], batch),
    seed=st.integers(0, 2**31 - 1),
    dims=st.lists(st.integers(1, 7), min_size=2, max_size=4),  # 2 to 4 factors
    batch=st.sampled_from([(), (2,)]),
)


@PROPERTY
@given(strands)
def test_materialize_and_norm_equal_dense(s: Strand) -> None:
    M = dense(s)
    torch.testing.assert_close(materialize(s), M, rtol=1e-10, atol=1e-10)
    atol = 1e-10 * float(scale(s).max())
    torch.testing.assert_close(norm(s), torch.linalg.matrix_norm(M), rtol=1e-9, atol=atol)


@PROPERTY
@given(strands)
def test_singular_values_equal_dense(s: Strand) -> None:
    ours = singular_values(s)
    theirs = torch.linalg.svdvals(dense(s))
    r = ours.shape[-1]
    atol = 1e-9 * float(scale(s).max())
    torch.testing.assert_close(ours, theirs[..., :r], rtol=1e-8, atol=atol)
    assert (theirs[..., r:].abs() <= atol).all()  # the ones the folded strand leaves out are zero
    torch.testing.assert_close(norm(fold_outer(s)), norm(s), rtol=1e-9, atol=atol)


@PROPERTY
@given(strands)
def test_transpose(s: Strand) -> None:
    torch.testing.assert_close(materialize(transpose(s)), dense(s).mT, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(norm(s.T), norm(s))


@PROPERTY
@given(square_strands)
def test_trace_and_eigenvalues_equal_dense_and_survive_rotation(s: Strand) -> None:
    M = dense(s)
    tol = 1e-7 * float(scale(s).max())
    for k in range(len(s)):
        r = rotate(s, k)
        torch.testing.assert_close(trace(r), torch.diagonal(M, dim1=-2, dim2=-1).sum(-1), rtol=1e-9, atol=tol)
        ours, theirs = eigenvalues(r), torch.linalg.eigvals(M)
        for mine, ref in zip(
            ours.reshape(-1, ours.shape[-1]), theirs.reshape(-1, theirs.shape[-1]), strict=True
        ):  # the batch
            a, b = nonzero_sorted(mine, tol), nonzero_sorted(ref, tol)
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                assert abs(x - y) <= 1e-6 * max(1.0, abs(y))


def singular_values(s: Strand) -> torch.Tensor:
    """Singular values [..., r] (descending) of the folded strand, r = min of its folded outer
    dims.

    They are the strand's largest r singular values; the rest are zero.
    """
    return torch.linalg.svdvals(materialize(fold_outer(s)))


def test_norm_is_not_invariant_under_rotation() -> None:
    # AB = [[1, 0], [1, 0]] has norm sqrt(2); BA = [1] has norm 1. Same trace (1) and eigenvalue.
    A = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    B = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    s = Strand((A, B))
    assert float(norm(s)) == pytest.approx(2**0.5, rel=1e-12)
    assert float(norm(rotate(s, 1))) == pytest.approx(1.0, rel=1e-12)
    assert float(trace(s)) == pytest.approx(float(trace(rotate(s, 1))), rel=1e-12)

    # the paper's K strand A B C D, shapes [d_model, d_head] ...: both rotations differ from it
    s = random_strand(0, [16, 2, 16, 2, 16])
    true, bcda, dabc = float(norm(s)), float(norm(rotate(s, 1))), float(norm(rotate(s, -1)))
    assert abs(bcda - true) > 0.1 * true and abs(dabc - true) > 0.1 * true
    assert bcda == pytest.approx(float(torch.linalg.matrix_norm(dense(rotate(s, 1)))), rel=1e-10)
    assert float(trace(rotate(s, 1))) == pytest.approx(float(trace(s)), rel=1e-9)


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    dims=st.lists(st.integers(1, 9), min_size=5, max_size=5),
    n_left=st.integers(1, 4),
    n_right=st.integers(1, 4),
)
def test_all_pairs_norms_equal_dense(seed: int, dims: list[int], n_left: int, n_right: int) -> None:
    m, r, n, s, p = dims
    left = random_strand(seed, [m, r, n], (n_left,))
    right = random_strand(seed + 1, [n, s, p], (n_right,))
    L, R = dense(left), dense(right)
    ref = torch.linalg.matrix_norm(L[:, None] @ R[None])  # [n_left, n_right]
    for method in ("factors", "grams", "auto"):
        ours = all_pairs_norms(left, right, max_block=7, method=method)  # tiny blocks: exercise the chunking
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9 * float(ref.max()))


def test_all_pairs_norms_keeps_batch_shapes() -> None:
    left = random_strand(1, [12, 3, 12], (2, 3))  # e.g. [layer, head]
    right = random_strand(2, [12, 3, 5, 3, 12], (4,))  # a longer strand
    ref = torch.linalg.matrix_norm(dense(left)[:, :, None] @ dense(right)[None, None])
    for method in ("factors", "grams"):
        ours = all_pairs_norms(left, right, method=method)
        assert ours.shape == (2, 3, 4)
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", [5, 300])  # one tile; several tiles, the last one short
def test_gram_vectors_dot_to_squared_norms(n: int) -> None:
    left, right = random_strand(3, [7, 2, n], (3,)), random_strand(4, [n, 3, 6], (2,))
    squares = gram_vectors(left, "left", max_block=n * n) @ gram_vectors(right, "right").T  # [3, 2]
    assert gram_vectors(left, "left").shape[:-1] == (3,)
    ref = torch.linalg.matrix_norm(dense(left)[:, None] @ dense(right)[None]).square()
    torch.testing.assert_close(squares, ref, rtol=1e-10, atol=1e-10)


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="columns"):
        Strand((torch.zeros(3, 4), torch.zeros(5, 3)))
    with pytest.raises(ValueError, match="square"):
        rotate(random_strand(0, [3, 2, 4]), 1)
    with pytest.raises(ValueError, match="square"):
        trace(random_strand(0, [3, 2, 4]))


def test_matmul_chains_the_factors() -> None:
    a, b = random_strand(5, [4, 2, 6]), random_strand(6, [6, 3, 5, 2])
    ab = a @ b
    assert len(ab) == 5 and ab.dims == (4, 2, 6, 3, 5, 2)
    assert all(x is y for x, y in zip(ab.factors, a.factors + b.factors, strict=True))
    torch.testing.assert_close(materialize(ab), dense(a) @ dense(b), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(7, 3), (3, 7), (2, 5, 3)])  # tall, wide, batched tall
def test_fold_outer_of_one_factor_keeps_its_singular_values(shape: tuple[int, ...]) -> None:
    A = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    folded = fold_outer(Strand((A,)))
    assert len(folded) == 1
    (R,) = folded.factors
    m, r = shape[-2:]
    assert R.shape == (*shape[:-2], min(m, r), r)
    if m > r:
        assert (torch.tril(R, diagonal=-1) == 0).all()  # triangular
    else:
        assert R is A  # nothing to gain
    torch.testing.assert_close(R.mT @ R, A.mT @ A, rtol=1e-10, atol=1e-10)  # R^T R = A^T A
    torch.testing.assert_close(singular_values(Strand((A,))), torch.linalg.svdvals(A)[..., : min(m, r)])


@pytest.mark.parametrize("n", [1, 5, 128, 129, 300])
def test_gram_vector_length_counts_the_upper_tiles(n: int) -> None:
    # row i of G is kept from the first column of its 128-row tile on: n - 128 * (i // 128) entries
    assert gram_vector_length(n) == sum(n - 128 * (i // 128) for i in range(n))
    assert gram_vectors(random_strand(8, [3, 2, n]), "left").shape == (gram_vector_length(n),)


def test_gram_vector_length_known_values() -> None:
    assert gram_vector_length(5) == 25  # one tile: the whole 5 x 5 matrix
    assert gram_vector_length(300) == 128 * 300 + 128 * 172 + 44 * 44  # == 62352


def packed(G: torch.Tensor) -> torch.Tensor:
    """G [..., n, n] packed as `gram_vectors` documents: rows in tiles of 128, each from the
    tile's diagonal block to the right."""
    n = G.shape[-1]
    return torch.cat([G[..., p : p + 128, p:].reshape(*G.shape[:-2], -1) for p in range(0, n, 128)], -1)


def upper_weights(n: int) -> torch.Tensor:
    """2 above the diagonal, 1 on it, 0 below, [n, n]."""
    return torch.ones(n, n, dtype=torch.float64).triu(1) * 2 + torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize(
    ("dims", "batch"),
    [
        ([7, 2, 5], ()),  # unbatched, tall first factor: G through A_1^T A_1
        ([2, 3, 5], ()),  # unbatched, wide first factor: G of the product
        ([4, 4, 6], (2,)),  # square first factor
        ([7, 2, 3, 130], (3,)),  # three factors, two tiles
        ([5, 6], ()),  # one tall factor: G = A^T A
        ([2, 9], (2,)),  # one wide factor
    ],
)
def test_gram_vectors_pack_the_weighted_left_and_plain_right_gram_matrix(
    dims: list[int], batch: tuple[int, ...]
) -> None:
    s = random_strand(9, dims, batch)
    M = dense(s)
    n = M.shape[-1]
    left = gram_vectors(s, "left")
    assert left.shape == (*batch, gram_vector_length(n))
    torch.testing.assert_close(left, packed((M.mT @ M) * upper_weights(n)), rtol=1e-10, atol=1e-10)
    right = gram_vectors(s.T, "right")  # M^T as a right strand: M^T (M^T)^T = M^T M
    torch.testing.assert_close(right, packed(M.mT @ M), rtol=1e-10, atol=1e-10)  # no weights
    # out: filled in place, [prod(batch), N]
    out = torch.full((max(1, math.prod(batch)), left.shape[-1]), torch.nan, dtype=torch.float64)
    got = gram_vectors(s, "left", max_block=1, out=out)
    torch.testing.assert_close(got, left, rtol=1e-12, atol=1e-12)
    assert got.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("batch", [(), (2,)])
def test_gram_vectors_multiply_a_wide_outer_factor_before_squaring(batch: tuple[int, ...]) -> None:
    """A wide first factor A [2, 5] is multiplied into the strand before any sum of squares: at
    scales 1e-200 and 1e200 the product is of order 1, while A^T A alone would underflow to 0."""
    s = random_strand(10, [2, 5, 6], batch)
    s = Strand((s.factors[0] * 1e-200, s.factors[1] * 1e200))
    M = dense(s)
    assert M.abs().max() > 0.1
    want = packed((M.mT @ M) * upper_weights(6))
    torch.testing.assert_close(gram_vectors(s, "left"), want, rtol=1e-10, atol=1e-10)


def test_gram_vectors_name_a_bad_side() -> None:
    with pytest.raises(ValueError, match="'up'"):
        gram_vectors(random_strand(0, [3, 2, 4]), "up")


def test_grams_are_cheaper_counts_multiply_adds() -> None:
    """grams: (n_left r + n_right s) n^2 / 2 to form the Gram matrices, n (n + 1) / 2 per pair;
    factors: r s n per pair; grams is chosen only when strictly cheaper."""
    # grams (2 + 2) * 9 // 2 + 3 * 3 * 4 // 2 = 18 + 18 = 36; factors 3 * 2 * 2 * 3 = 36: a tie
    assert not grams_are_cheaper(1, 1, 3, 2, 3, 2)
    # grams (2 + 4) * 4 // 2 + 1 * 2 * 3 // 2 = 12 + 3 = 15; factors 1 * 2 * 4 * 2 = 16
    assert grams_are_cheaper(1, 1, 1, 2, 2, 4)
    # GPT-2-small heads (d_model 768, d_head 64, 144 x 144 pairs): ~0.3M against 3.1M per pair
    assert grams_are_cheaper(144, 144, 144 * 144, 64, 768, 64)
    # d_head^2 < d_model / 2: the factors' r s n per pair wins
    assert not grams_are_cheaper(144, 144, 144 * 144, 8, 512, 8)


def test_bad_strands_name_the_factor_and_shapes() -> None:
    with pytest.raises(ValueError, match="^[^\n]+$"):
        Strand(())
    with pytest.raises(ValueError, match=r"^factor 1 [^\n]*\[3\]"):
        Strand((torch.zeros(2, 3), torch.zeros(3)))
    with pytest.raises(ValueError, match=r"^factor 1 \[2, 3, 4\][^\n]*factor 2 \[5, 3\]"):
        Strand((torch.zeros(6, 3), torch.zeros(2, 3, 4), torch.zeros(5, 3)))
    with pytest.raises(ValueError, match=r"3 x 4$"):
        rotate(random_strand(0, [3, 2, 4]), 1)
    with pytest.raises(ValueError, match=r"3 x 4$"):
        eigenvalues(random_strand(0, [3, 2, 4]))
    with pytest.raises(ValueError, match=r"\[\.\., 3, 4\][^\n]*\[\.\., 5, 6\]$"):
        all_pairs_norms(random_strand(0, [3, 2, 4]), random_strand(1, [5, 2, 6]))
    with pytest.raises(ValueError, match="'dense'$"):
        all_pairs_norms(random_strand(0, [3, 2, 4]), random_strand(1, [4, 2, 6]), method="dense")


@pytest.mark.parametrize(
    ("dims", "k"), [([6, 2, 5, 6], 2), ([3, 7, 4, 3], 3), ([5, 4, 1, 5], 1), ([4, 4], 4)]
)
def test_eigenvalues_come_from_the_smallest_cyclic_dim(dims: list[int], k: int) -> None:
    """k eigenvalues, k the smallest boundary dim of the cycle; the d_0 x d_0 strand's others are zero."""
    s = random_strand(11, dims, (2,))
    ours, theirs = eigenvalues(s), torch.linalg.eigvals(dense(s))
    assert ours.shape == (2, k)
    for mine, ref in zip(ours, theirs, strict=True):
        ref = sorted(ref.tolist(), key=abs, reverse=True)
        assert all(abs(z) < 1e-9 for z in ref[k:])
        a, b = nonzero_sorted(mine, 1e-9), nonzero_sorted(torch.tensor(ref[:k], dtype=torch.complex128), 1e-9)
        assert len(a) == len(b) == k
        for x, y in zip(a, b, strict=True):
            assert abs(x - y) <= 1e-9 * max(1.0, abs(y))
    torch.testing.assert_close(trace(s), torch.diagonal(dense(s), dim1=-2, dim2=-1).sum(-1))


def test_norm_of_one_factor_is_its_frobenius_norm() -> None:
    A = torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 12.0]], dtype=torch.float64)  # 9 + 16 + 144 = 13^2
    assert norm(Strand((A,))).item() == 13.0
    assert norm(Strand((A[None].expand(2, 3, 2),))).tolist() == [13.0, 13.0]


def test_norm_of_an_exactly_zero_small_product_is_exactly_zero() -> None:
    """m p <= k^2: the product itself, so a product that cancels exactly stays 0 (the Gram route
    would leave rounding of order eps ||L||^2 ||R||^2 here: 0.1 and 0.3 are not exact)."""
    L = torch.tensor([[0.1, 0.3], [0.1, 0.3]], dtype=torch.float64)  # [m 2, k 2]
    R = torch.tensor([[0.3, 0.6], [-0.1, -0.2]], dtype=torch.float64)  # [k 2, p 2]
    assert (L @ R == 0).all()
    assert norm(Strand((L, R))).item() == 0.0
    assert norm(Strand((L, R, torch.eye(2, dtype=torch.float64)))).item() == 0.0


def test_norm_splits_at_the_smallest_inner_dim_and_forms_small_products() -> None:
    """Strands whose product vanishes exactly at the split the docstring names have norm exactly 0:
    split at the smallest inner dim k, then the product itself when m p <= k^2."""
    t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    a, b = 0.1, 0.3
    pick = t([[1, 0, 0], [0, 1, 0]])  # [2, 3]: the first two rows, exactly
    cases = {
        # dims (1, 2, 1, 1): k = 1 after A B = a b - b a = 0 (A (B C) is not 0: a (b c) != b (a c))
        "A B = 0 at k": (t([[a, b]]), t([[b], [-a]]), t([[0.1]])),
        # dims (2, 3, 2, 2): k = 2, m p = 4 <= k^2 (not d_1 p = 6)
        "m p = k^2": (pick, t([[a, b], [a, b], [0.5, 0.25]]), t([[b, 2 * b], [-a, -2 * a]])),
        # dims (2, 2, 3, 2): k = 2 after A, m p = 4 <= k^2 (not m d_2 = 6)
        "k first": (t([[a, b], [a, b]]), pick, t([[b, 2 * b], [-a, -2 * a], [0.5, 0.25]])),
    }
    for name, factors in cases.items():
        s = Strand(factors)
        assert (dense(s) == 0).all() or name == "A B = 0 at k", name
        assert norm(s).item() == 0.0, name


def test_factors_are_kept_as_a_tuple() -> None:
    A, B = torch.ones(2, 3), torch.ones(3, 4)
    for s in (Strand([A, B]), Strand(f for f in (A, B))):
        assert isinstance(s.factors, tuple) and len(s) == 2 and s.dims == (2, 3, 4)
        assert (s @ Strand((B.T,))).dims == (2, 3, 4, 3)


def test_rotate_defaults_to_one_step() -> None:
    s = random_strand(14, [3, 2, 4, 3])
    assert rotate(s).factors == s.factors[1:] + s.factors[:1]
    assert rotate(s, -1).factors == s.factors[2:] + s.factors[:2]


def test_shrink_left_keeps_a_square_or_wide_factor() -> None:
    for shape in ((3, 3), (2, 3), (2, 3, 3)):
        A = torch.randn(*shape, dtype=torch.float64)
        assert shrink_left(A) is A


def test_materialize_orders_the_chain_by_the_factors_own_dims(monkeypatch) -> None:
    """The cheapest order is chosen from (d_0, d_1, ..., d_n), never the batch dims."""
    asked, chain_order = [], strands_module._chain_order

    def spy(dims):
        asked.append(dims)
        return chain_order(dims)

    monkeypatch.setattr(strands_module, "_chain_order", spy)
    s = random_strand(15, [5, 2, 7, 3], (4,))  # factors [4, 5, 2], [4, 2, 7], [4, 7, 3]
    torch.testing.assert_close(materialize(s), dense(s), rtol=1e-10, atol=1e-10)
    assert asked == [(5, 2, 7, 3)]


@pytest.mark.parametrize(
    ("left_dims", "right_dims", "method", "cheaper", "grams"),
    [
        # 6 left strands [2, 3, 40] (folded to r = 2 rows), 4 right [40, 5, 3] (s = 3 columns)
        ([2, 3, 40], [40, 5, 3], "auto", (6, 4, 24, 2, 40, 3), False),  # grams 19,200 + 19,680 > 5,760
        # [6, 5, 4] folds to r = 5 rows, [4, 7, 6] to s = 6 columns
        ([6, 5, 4], [4, 7, 6], "auto", (6, 4, 24, 5, 4, 6), True),  # grams 432 + 240 < 2,880
        ([2, 3, 40], [40, 5, 3], "grams", None, True),
        ([6, 5, 4], [4, 7, 6], "factors", None, False),
    ],
)
def test_all_pairs_norms_take_the_named_or_cheaper_route(
    monkeypatch, left_dims: list[int], right_dims: list[int], method: str, cheaper: tuple | None, grams: bool
) -> None:
    """ "auto" asks grams_are_cheaper(left strands, right strands, pairs, r, n, s) with r and s the
    folded outer dims; "grams" packs Gram vectors, "factors" never does. The same norms either way."""
    asked, packed_sides = [], []

    def spy_cheaper(*args):
        asked.append(args)
        return grams_are_cheaper(*args)

    def spy_grams(s, side, max_block=2**22, out=None):
        packed_sides.append((side, max_block))
        return gram_vectors(s, side, max_block, out)

    monkeypatch.setattr(strands_module, "grams_are_cheaper", spy_cheaper)
    monkeypatch.setattr(strands_module, "gram_vectors", spy_grams)
    left, right = random_strand(12, left_dims, (2, 3)), random_strand(13, right_dims, (4,))
    ours = all_pairs_norms(left, right) if method == "auto" else all_pairs_norms(left, right, method=method)
    assert asked == ([cheaper] if cheaper else [])
    if cheaper:
        assert grams_are_cheaper(*cheaper) is grams
    assert packed_sides == ([("left", 2**22), ("right", 2**22)] if grams else [])
    packed_sides.clear()
    all_pairs_norms(left, right, max_block=1000, method=method)  # max_block reaches the Gram vectors
    assert packed_sides == ([("left", 1000), ("right", 1000)] if grams else [])
    ref = torch.linalg.matrix_norm(dense(left)[:, :, None] @ dense(right)[None, None])
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
