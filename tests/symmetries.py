"""Changes of head weights that keep their circuits (a rotation of the residual stream, a change of
a head's d_head basis), and the paper's letters A, B, C, D of a pair, for the tests of
pipeline/circuits/channels.py and rotated.py."""

from __future__ import annotations

import torch
from models import head_weights

from pipeline.circuits.weights import HeadWeights

F64 = torch.float64


def paper_letters(hw: HeadWeights, kind: str, a: tuple[int, int], b: tuple[int, int]):
    """A, B, C, D as composition.py's table defines them (paper = our transposes)."""
    Wq, Wk, Wv, Wo = hw.W_Q.mT, hw.W_K.mT, hw.W_V.mT, hw.W_O.mT  # the paper's column-vector matrices
    A, B = {"Q": (Wk[b].T, Wq[b]), "K": (Wq[b].T, Wk[b]), "V": (Wo[b], Wv[b])}[kind]
    return A, B, Wo[a], Wv[a]


def orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64)).Q


def invertible(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """[*shape, n, n]: U diag(e^x) V^T, x uniform in [-0.5, 0.5]: condition number <= e."""
    *batch, n = shape
    U, V = (torch.linalg.qr(torch.randn(*batch, n, n, generator=g, dtype=F64)).Q for _ in range(2))
    return U @ torch.diag_embed(torch.rand(*batch, n, generator=g, dtype=F64).sub(0.5).exp()) @ V.mT


def rotate_residual(hw: HeadWeights, R: torch.Tensor) -> HeadWeights:
    return head_weights(R @ hw.W_Q, R @ hw.W_K, R @ hw.W_V, hw.W_O @ R.mT)


def change_head_bases(hw: HeadWeights, G_QK: torch.Tensor, G_OV: torch.Tensor) -> HeadWeights:
    """W_Q G, W_K G^-T (QK kept) and W_V G', G'^-1 W_O (OV kept), per head."""
    inv = torch.linalg.inv
    return head_weights(hw.W_Q @ G_QK, hw.W_K @ inv(G_QK).mT, hw.W_V @ G_OV, inv(G_OV) @ hw.W_O)


def assert_same_table(a: torch.Tensor, b: torch.Tensor) -> None:
    total = a.sum((-2, -1), keepdim=True)
    torch.testing.assert_close(a / total, b / total, rtol=0, atol=1e-10, equal_nan=True)
