"""Strands: every factored computation equals the dense float64 one; trace and eigenvalues
survive cyclic rotation, the Frobenius norm does not (the errata's bug)."""

from __future__ import annotations

from functools import reduce

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.circuits.strands import (
    Strand,
    all_pairs_norms,
    eigenvalues,
    fold_outer,
    gram_vectors,
    materialize,
    norm,
    rotate,
    singular_values,
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
