"""Strands: products of factor matrices kept factored (the paper's "Working with Low-Rank Matrices").

A strand is the product A_1 A_2 ... A_n of factors of shapes [..., d_0, d_1],
[..., d_1, d_2], ..., [..., d_{n-1}, d_n], batched over any leading dims (they
broadcast like `torch.matmul`). Head circuits are strands whose inner dims are small:

    OV = Strand((W_V, W_O))        # [d_model, d_head] [d_head, d_model]: rank <= d_head
    QK = Strand((W_Q, W_K.mT))

Everything here is exact (no sampling, no truncation) and works in the smallest
space the identities allow:

    trace, non-zero eigenvalues   invariant under cyclic rotation: tr(AB) = tr(BA), so
                                  rotate the strand until its outer dim is the smallest
    Frobenius norm                ||LR||^2 = tr((L^T L)(R R^T)), Gram matrices in the
                                  smallest inner dim k (or the product itself, if smaller)
    singular values               A_1 = Q R with Q's columns orthonormal leaves them
                                  unchanged: fold the outer factors to their R factors

The Frobenius norm and singular values are NOT invariant under rotation: the errata's
bug. `pipeline.circuits.composition` reproduces it on purpose by taking the norm of the rotated
factor orders; `rotate` serves the invariant quantities above (trace, eigenvalues).
Use float64 for analysis; nothing here changes dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Strand:
    """The product factors[0] @ factors[1] @ ... (never formed unless asked)."""

    factors: tuple[Tensor, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "factors", tuple(self.factors))
        if not self.factors:
            raise ValueError("a strand needs at least one factor")
        for i, f in enumerate(self.factors):
            if f.ndim < 2:
                raise ValueError(
                    f"factor {i} has shape {list(f.shape)}: a factor is a matrix [..., rows, cols]"
                )
        for i, (x, y) in enumerate(zip(self.factors, self.factors[1:], strict=False)):
            if x.shape[-1] != y.shape[-2]:
                raise ValueError(
                    f"factor {i} {list(x.shape)} has {x.shape[-1]} columns but factor {i + 1} "
                    f"{list(y.shape)} has {y.shape[-2]} rows"
                )

    @property
    def dims(self) -> tuple[int, ...]:
        """(d_0, d_1, ..., d_n): the outer dims d_0, d_n and the inner dims between factors."""
        return (self.factors[0].shape[-2],) + tuple(f.shape[-1] for f in self.factors)

    @property
    def batch_shape(self) -> torch.Size:
        return torch.broadcast_shapes(*(f.shape[:-2] for f in self.factors))

    @property
    def shape(self) -> torch.Size:
        return self.batch_shape + (self.dims[0], self.dims[-1])

    @property
    def T(self) -> Strand:
        return transpose(self)

    def __matmul__(self, other: Strand) -> Strand:
        return Strand(self.factors + other.factors)

    def __len__(self) -> int:
        return len(self.factors)


# --- structure ---------------------------------------------------------------------


def transpose(s: Strand) -> Strand:
    """(A_1 ... A_n)^T = A_n^T ... A_1^T."""
    return Strand(tuple(f.mT for f in reversed(s.factors)))


def rotate(s: Strand, k: int = 1) -> Strand:
    """Cyclic rotation: rotate(A B C D, 1) = B C D A, rotate(A B C D, -1) = D A B C.

    Same trace and non-zero eigenvalues; a different norm and singular values in general.
    Only a square strand (d_0 = d_n) can be rotated.
    """
    if s.dims[0] != s.dims[-1]:
        raise ValueError(f"only a square strand can be rotated; this one is {s.dims[0]} x {s.dims[-1]}")
    k %= len(s)
    return Strand(s.factors[k:] + s.factors[:k])


@cache
def _chain_order(dims: tuple[int, ...]) -> object:
    """Cheapest parenthesisation of a matrix chain with these boundary dims (classic DP).

    Returns a nested tuple of factor indices, e.g. ((0, 1), 2). A strand has a handful of
    factors, so the O(n^3) search is free; what it saves is never forming a
    [d_model, d_model] intermediate when a [d_head, d_head] one will do.
    """
    n = len(dims) - 1
    cost = {(i, i): 0 for i in range(n)}
    best: dict[tuple[int, int], object] = {(i, i): i for i in range(n)}
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            cost[i, j], split = min(
                (cost[i, m] + cost[m + 1, j] + dims[i] * dims[m + 1] * dims[j + 1], m) for m in range(i, j)
            )
            best[i, j] = (best[i, split], best[split + 1, j])
    return best[0, n - 1]


def _product(factors: tuple[Tensor, ...]) -> Tensor:
    dims = (factors[0].shape[-2],) + tuple(f.shape[-1] for f in factors)

    def build(order) -> Tensor:
        if isinstance(order, int):
            return factors[order]
        return build(order[0]) @ build(order[1])

    return build(_chain_order(dims))


def materialize(s: Strand) -> Tensor:
    """The dense product [..., d_0, d_n], multiplied in the cheapest order."""
    return _product(s.factors)


# --- invariants of cyclic rotation: trace and eigenvalues --------------------------


def _smallest_cycle(s: Strand) -> Tensor:
    """The square strand rotated to start at its smallest boundary dim k, multiplied out: [..., k, k]."""
    if s.dims[0] != s.dims[-1]:
        raise ValueError(
            f"trace and eigenvalues need a square strand; this one is {s.dims[0]} x {s.dims[-1]}"
        )
    cut = min(range(len(s)), key=lambda i: s.dims[i])  # boundary d_cut sits before factor `cut`
    return materialize(rotate(s, cut))


def trace(s: Strand) -> Tensor:
    """tr(A_1 ... A_n) [...], computed in the smallest cyclic dim."""
    return torch.diagonal(_smallest_cycle(s), dim1=-2, dim2=-1).sum(-1)


def eigenvalues(s: Strand) -> Tensor:
    """The k eigenvalues [..., k] (complex) of the rotated k x k product, k the smallest cyclic dim.

    They contain every non-zero eigenvalue of the d_0 x d_0 strand (with multiplicity);
    its other d_0 - k eigenvalues are zero.
    """
    return torch.linalg.eigvals(_smallest_cycle(s))


# --- norm and singular values ------------------------------------------------------


def norm(s: Strand) -> Tensor:
    """Frobenius norm [...]: split at the smallest inner dim k into L [m, k] and R [k, p], then

        ||L R||^2 = tr((L^T L)(R R^T)) = sum((L^T L) * (R R^T))   (both Gram matrices symmetric)

    When the product itself is no bigger than a Gram matrix (m p <= k^2, e.g. a d_head x
    d_head strand) it is formed directly instead: cheaper, and an exactly-zero product
    stays exactly zero (the Gram route squares first, so its rounding is ~eps relative
    to ||L||^2 ||R||^2 rather than to ||LR||^2).
    """
    if len(s) == 1:
        return torch.linalg.matrix_norm(s.factors[0])
    inner = s.dims[1:-1]
    cut = min(range(len(inner)), key=lambda i: inner[i]) + 1  # L = factors[:cut], R = factors[cut:]
    k, m, p = s.dims[cut], s.dims[0], s.dims[-1]
    L, R = _product(s.factors[:cut]), _product(s.factors[cut:])
    if m * p <= k * k:
        return torch.linalg.matrix_norm(L @ R)
    gram_L = L.mT @ L  # [..., k, k]
    gram_R = R @ R.mT  # [..., k, k]
    return (gram_L * gram_R).sum((-2, -1)).clamp_min(0).sqrt()


def shrink_left(A: Tensor) -> Tensor:
    """R with A = Q R, Q's columns orthonormal: ||A M|| = ||R M|| and svd(A M) = svd(R M) for any M.

    A [..., m, r] -> R [..., min(m, r), r]; A itself when m <= r (nothing to gain).
    R^T R = A^T A: this is the Gram matrix of A, kept as its triangular square root so
    that sums of squares are taken after multiplying, not before.
    """
    if A.shape[-2] <= A.shape[-1]:
        return A
    return torch.linalg.qr(A, mode="r").R


def shrink_right(D: Tensor) -> Tensor:
    """R' with D = R' Q^T, Q's columns orthonormal: ||M D|| = ||M R'||.

    D [..., r, p] -> [..., r, min(r, p)]."""
    return shrink_left(D.mT).mT


def fold_outer(s: Strand) -> Strand:
    """The same norm and singular values, with the outer factors replaced by small triangular ones."""
    if len(s) == 1:
        return Strand((shrink_left(s.factors[0]),))
    return Strand((shrink_left(s.factors[0]),) + s.factors[1:-1] + (shrink_right(s.factors[-1]),))


# --- all pairs -------------------------------------------------------------------------
#
# ||X_a Y_b||_F for every a in a batch of left strands and every b in a batch of right
# strands. Fold the outer factors first (X_a = Q R_a ..., `shrink_left/right`), so that
# X_a is [r, n] and Y_b is [n, s] with r, s <= d_head for head circuits. Two exact routes:
#
#   factors  C_ab = X_a Y_b [r, s], one GEMM over all pairs, then a sum of squares:
#            r s n per pair. With left = OV^a, right = QK^b this is
#            ||W_V^a W_O^a W_Q^b W_K^bT||^2 = tr((W_V^aT W_V^a) C (W_K^bT W_K^b) C^T),
#            C = W_O^a W_Q^b, with the d_head x d_head Gram matrices kept as their
#            triangular square roots R (so nothing is squared before the products).
#   grams    ||X_a Y_b||^2 = <X_a^T X_a, Y_b Y_b^T>: one dot product of packed n x n Gram
#            matrices per pair, ~n^2 / 2 per pair plus ~n^2 r / 2 per strand to form them.
#
# For heads, n = d_model and r = s = d_head: "grams" wins once d_head^2 > d_model / 2 and
# there are many pairs (GPT-2-small shapes: ~0.3M vs 3.1M per pair). Neither route ever
# broadcasts the pairs into copies of their factors.


def _folded_left(s: Strand) -> Tensor:
    """X [*batch, r, n] with X^T X = M^T M for the strand M [m, n] (r = min(m, inner dim))."""
    X = _product((shrink_left(s.factors[0]),) + s.factors[1:])
    return X.expand(*s.batch_shape, *X.shape[-2:])


def _folded_right(s: Strand) -> Tensor:
    """Y [*batch, n, s] with Y Y^T = M M^T for the strand M [n, p]."""
    Y = _product(s.factors[:-1] + (shrink_right(s.factors[-1]),))
    return Y.expand(*s.batch_shape, *Y.shape[-2:])


_TILE = 128  # rows per tile of a packed Gram matrix


def gram_vector_length(n: int) -> int:
    """N, the length of one packed n x n Gram matrix from `gram_vectors` (about n^2 / 2)."""
    return sum(min(_TILE, n - p) * (n - p) for p in range(0, n, _TILE))


def _upper_tiles_weight(n: int, dtype: torch.dtype) -> Tensor:
    """Weights of the entries `gram_vectors` keeps: 2 above the diagonal, 1 on it, 0 below."""
    parts = []
    for p in range(0, n, _TILE):
        i = torch.arange(p, min(p + _TILE, n))[:, None]  # rows of this tile
        j = torch.arange(p, n)[None, :]  # columns from the diagonal on
        parts.append(((j > i).to(dtype) * 2 + (j == i).to(dtype)).reshape(-1))
    return torch.cat(parts)


def gram_vectors(s: Strand, side: str, max_block: int = 2**22, out: Tensor | None = None) -> Tensor:
    """Each strand's Gram matrix G [n, n], packed into a vector [*batch, N], N ~ n^2 / 2.

    side="left": G = M^T M for M [m, n] (M will multiply from the left); side="right":
    G = M M^T for M [n, p]. G is symmetric, so only its upper part is formed: rows in tiles
    of 128, each from the diagonal to the right (about 55% of the multiply-adds of G, and
    no gather). Left vectors carry weights 2 above the diagonal, 1 on it, 0 below, so that

        gram_vectors(L, "left")[a] . gram_vectors(R, "right")[b] = <L_a^T L_a, R_b R_b^T>_F
                                                                 = ||L_a R_b||_F^2.

    `max_block` bounds the elements of one block of strands' Gram matrices (memory); `out`,
    [prod(batch), N], is filled instead of a new tensor (reused buffers keep the heap compact).
    """
    if side == "right":
        s = transpose(s)  # M M^T = (M^T)^T (M^T)
    elif side != "left":
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")
    batch, n = s.batch_shape, s.dims[-1]
    first, rest = s.factors[0], s.factors[1:]
    if rest and first.shape[-2] >= first.shape[-1]:
        # M = A_1 F: G = F^T (A_1^T A_1) F, the tall outer factor only through its small Gram
        inner = first.mT @ first  # [*, r, r]
        F = _product(rest)  # [*, r, n]
    else:
        inner, F = None, materialize(s)  # [*, m, n] with m small: G = F^T F
    F = F.expand(*batch, *F.shape[-2:]).reshape(-1, *F.shape[-2:])
    if inner is not None:
        inner = inner.expand(*batch, *inner.shape[-2:]).reshape(-1, *inner.shape[-2:])
    tiles = [(p, min(_TILE, n - p) * (n - p)) for p in range(0, n, _TILE)]  # (first row, entries)
    offsets = [sum(size for _, size in tiles[:t]) for t in range(len(tiles) + 1)]
    out = F.new_empty(F.shape[0], offsets[-1]) if out is None else out
    step = max(1, max_block // (n * n))
    for start in range(0, F.shape[0], step):
        F_b = F[start : start + step]  # [b, r, n]
        G_b = F_b if inner is None else inner[start : start + step] @ F_b  # G = F_b^T G_b
        for t, (p, _) in enumerate(tiles):
            tile = F_b[:, :, p : p + _TILE].mT @ G_b[:, :, p:]  # rows p.. of G, from column p on
            out[start : start + step, offsets[t] : offsets[t + 1]] = tile.reshape(F_b.shape[0], -1)
    if side == "left":
        out *= _upper_tiles_weight(n, F.dtype)
    return out.reshape(*batch, -1)


def grams_are_cheaper(n_left: int, n_right: int, n_pairs: int, r: int, n: int, s: int) -> bool:
    """Multiply-adds of the "grams" route below those of the "factors" route (see above)?"""
    grams = (n_left * r + n_right * s) * n * n // 2 + n_pairs * n * (n + 1) // 2
    return grams < n_pairs * r * s * n


def all_pairs_norms(left: Strand, right: Strand, max_block: int = 2**22, method: str = "auto") -> Tensor:
    """||left_a right_b||_F for every a in left's batch [*A] and b in right's batch [*B]: [*A, *B].

    left: outer dims [m, n]; right: [n, p]. method: "factors", "grams" or "auto" (the
    cheaper by multiply-adds; see the comment above). Exact either way; `max_block` bounds
    the elements of one intermediate block (memory).
    """
    if left.dims[-1] != right.dims[0]:
        raise ValueError(
            f"left is [.., {left.dims[0]}, {left.dims[-1]}] "
            f"but right is [.., {right.dims[0]}, {right.dims[-1]}]"
        )
    if method not in ("auto", "factors", "grams"):
        raise ValueError(f"method must be 'auto', 'factors' or 'grams', not {method!r}")
    A_shape, B_shape = left.batch_shape, right.batch_shape
    n_a, n_b = A_shape.numel(), B_shape.numel()
    r = min(left.dims[0], left.dims[1])  # rows of the folded left strand
    s = min(right.dims[-1], right.dims[-2])  # columns of the folded right strand
    if method == "grams" or (
        method == "auto" and grams_are_cheaper(n_a, n_b, n_a * n_b, r, left.dims[-1], s)
    ):
        L = gram_vectors(left, "left", max_block).reshape(n_a, -1)  # [A, N]
        R = gram_vectors(right, "right", max_block).reshape(n_b, -1)  # [B, N]
        squares = L @ R.T
        return squares.clamp_min(0).sqrt().reshape(*A_shape, *B_shape)
    X = _folded_left(left).reshape(n_a, r, -1)  # [A, r, n]
    Y = _folded_right(right).reshape(n_b, -1, s)  # [B, n, s]
    out = X.new_empty(n_a, n_b)
    step = max(1, max_block // max(1, r * n_b * s))
    for start in range(0, n_a, step):
        block = torch.einsum("arn,bns->arbs", X[start : start + step], Y)  # [a, r, b, s]: one GEMM
        out[start : start + step] = block.square().sum((1, 3)).sqrt()
    return out.reshape(*A_shape, *B_shape)
