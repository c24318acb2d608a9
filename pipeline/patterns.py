"""Per-head scores read off attention patterns: where each head attends.

Every function takes patterns `[batch, head, query_pos, key_pos]` (rows sum to 1)
and returns `[head]`: the attention mass on the named key, averaged over the
query positions where that key exists and over the batch. All are in [0, 1].
"""

from __future__ import annotations

import torch
from torch import Tensor


def _mean_on_diagonal(pattern: Tensor, offset: int, start: int = 0) -> Tensor:
    """Mean attention from query i to key i - offset, over queries i >= max(offset, start)."""
    diag = pattern.diagonal(offset=-offset, dim1=-2, dim2=-1)  # [batch, head, n_queries]
    first = max(start - offset, 0)
    return diag[..., first:].mean(dim=(0, -1))


def prev_token(pattern: Tensor) -> Tensor:
    """Attention i -> i-1."""
    return _mean_on_diagonal(pattern, 1)


def current_token(pattern: Tensor) -> Tensor:
    """Attention i -> i."""
    return _mean_on_diagonal(pattern, 0)


def first_token(pattern: Tensor) -> Tensor:
    """Attention i -> 0, over queries i >= 1."""
    return pattern[..., 1:, 0].mean(dim=(0, -1))


def recent_window(pattern: Tensor, k: int) -> Tensor:
    """Attention mass on keys i-k .. i-1, over queries i >= k."""
    return sum(_mean_on_diagonal(pattern, offset, start=k) for offset in range(1, k + 1))


def induction(pattern: Tensor, length: int) -> Tensor:
    """On [first, span, span] with `length`-token spans: from each query in the second
    copy to the token after the earlier copy of the query's token (key = query - length + 1)."""
    return _mean_on_diagonal(pattern, length - 1, start=length + 1)


def duplicate_token(pattern: Tensor, tokens: Tensor) -> Tensor:
    """Attention to earlier positions holding the same token, over queries that have one."""
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, query, key]
    earlier = torch.ones_like(same[0]).tril(-1)
    mask = (same & earlier).to(pattern.dtype)  # [batch, query, key]
    has = mask.sum(-1) > 0  # [batch, query]
    mass = (pattern * mask[:, None]).sum(-1)  # [batch, head, query]
    return (mass * has[:, None]).sum(dim=(0, -1)) / has.sum().clamp(min=1)
