"""Token sequences for training and evaluation, generated from a seed.

`synthetic`: a sparse random Markov chain over the vocabulary (local structure),
in which a fraction of sequences repeat a random span at a random offset: the
second copy is predictable only by finding the first (induction). Spans are
random tokens, not chain samples, so only in-context copying predicts them.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import DataConfig, ModelConfig


def markov_chain(d_vocab: int, branching: int, rng: np.random.Generator) -> np.ndarray:
    """Transition matrix [d_vocab, d_vocab]: each token has `branching` successors."""
    P = np.zeros((d_vocab, d_vocab))
    for tok in range(d_vocab):
        successors = rng.choice(d_vocab, size=min(branching, d_vocab), replace=False)
        P[tok, successors] = rng.dirichlet(np.ones(len(successors)))
    return P


def synthetic_sequences(n: int, model: ModelConfig, data: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """`n` sequences [n, n_ctx] of token ids (int64)."""
    syn = data.synthetic
    V, T = model.d_vocab, model.n_ctx
    P = markov_chain(V, syn.branching, rng)
    cum = P.cumsum(axis=1)
    seqs = np.empty((n, T), dtype=np.int64)
    seqs[:, 0] = rng.integers(V, size=n)
    u = rng.random((n, T))
    for t in range(1, T):  # vectorised over sequences: inverse-CDF sample of each successor
        seqs[:, t] = (u[:, t, None] > cum[seqs[:, t - 1]]).sum(axis=1).clip(max=V - 1)
    max_span = min(syn.max_span, (T - 1) // 2)
    for i in np.flatnonzero(rng.random(n) < syn.repeat_fraction):
        span = int(rng.integers(min(syn.min_span, max_span), max_span + 1))
        start = int(rng.integers(0, T - 2 * span + 1))
        gap = int(rng.integers(0, T - 2 * span - start + 1))
        seqs[i, start : start + span] = rng.integers(V, size=span)
        seqs[i, start + span + gap : start + 2 * span + gap] = seqs[i, start : start + span]
    return seqs


def repeated_random_tokens(n: int, length: int, d_vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[n, 1 + 2 * length]: a first token, then a random span of `length` tokens twice.

    The evaluation input for induction (DESIGN.md): in the second copy, position
    i's induction target is i - length + 1 (the token after the earlier copy of i's token).
    """
    first = torch.zeros(n, 1, dtype=torch.long)
    span = torch.randint(0, d_vocab, (n, length), generator=generator)
    return torch.cat([first, span, span], dim=1)
