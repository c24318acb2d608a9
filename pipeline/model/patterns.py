"""Per-head scores read off attention patterns: where each head attends.

Every function takes patterns `[batch, head, query_pos, key_pos]` (rows sum to 1)
and returns `[head]`: the attention mass on the named keys, averaged over the
queries where such a key exists, pooled over the batch (so a head that always
attends there scores 1, and the score does not depend on the batch's order).
All are in [0, 1].

TransformerLens's `detect_head(..., error_measure="mul")` scores the same kinds of
pattern differently normalised: per sequence it divides the mass by the number of
*all* query positions (the pattern's sum), then averages over sequences. Where the
marked keys coincide, TL = ours x (queries that have such a key) / seq_len: for
`prev_token` (seq_len - 1) / seq_len; for `duplicate_token` and `induction` on
`[first, span, span]` with distinct span tokens, length / (2 length + 1).
Its induction pattern marks the successor of *every* earlier copy of the query's
token; `induction` here marks only the copy one span back (the two agree when the
span's tokens are distinct). tests/test_model_patterns.py checks both against TL 3.9.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _mean_on_diagonal(pattern: Tensor, offset: int, start: int = 0) -> Tensor:
    """Mean attention from query i to key i - offset, over queries i >= max(offset, start)."""
    diag = pattern.diagonal(offset=-offset, dim1=-2, dim2=-1)  # [batch, head, n_queries]
    first = max(start - offset, 0)  # diag[..., m] is query m + offset
    return diag[..., first:].mean(dim=(0, -1))


def prev_token(pattern: Tensor) -> Tensor:
    """Attention i -> i-1, over queries i >= 1."""
    return _mean_on_diagonal(pattern, 1)


def current_token(pattern: Tensor) -> Tensor:
    """Attention i -> i, over all queries."""
    return _mean_on_diagonal(pattern, 0)


def first_token(pattern: Tensor) -> Tensor:
    """Attention i -> 0, over queries i >= 1 (query 0 has no other choice)."""
    return pattern[..., 1:, 0].mean(dim=(0, -1))


def recent_mass(pattern: Tensor, k: int) -> Tensor:
    """Attention mass on keys i-k .. i-1 together, over queries i >= k."""
    if not 1 <= k < pattern.shape[-1]:
        raise ValueError(f"recent window k = {k} must be in [1, seq_len - 1 = {pattern.shape[-1] - 1}]")
    return sum(_mean_on_diagonal(pattern, offset, start=k) for offset in range(1, k + 1))


def induction(pattern: Tensor, length: int) -> Tensor:
    """Prefix matching on `[first, span, span]` with `length`-token spans: from each query in
    the second copy to the token after the earlier copy of the query's token
    (key = query - length + 1), over the `length` queries of the second copy."""
    return _mean_on_diagonal(pattern, length - 1, start=length + 1)


def duplicate_token(pattern: Tensor, tokens: Tensor) -> Tensor:
    """Attention mass on earlier positions holding the query's token, over queries that have one.

    `tokens` [batch, pos]. Pooled: total mass over all such queries of the batch divided
    by their number (NaN if the batch has none).
    """
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch, query, key]
    earlier = torch.ones_like(same[0]).tril(-1)  # key < query
    mask = (same & earlier).to(pattern.dtype)  # [batch, query, key]
    has = mask.sum(-1) > 0  # [batch, query]
    mass = (pattern * mask[:, None]).sum(-1)  # [batch, head, query]
    n = has.sum()
    if n == 0:
        return torch.full(pattern.shape[1:2], float("nan"), dtype=pattern.dtype)
    return mass.sum(dim=(0, -1)) / n  # mass is 0 at queries without an earlier copy
