"""The errata's rotated strand of K-composition: what it keeps of the true score (claim (e)).

||B C D A|| against the true ||A B C D||, as claim (e)'s statistics. Maths only, no I/O. The
derivation: docs/maths.md, "Channels" (the errata's rotation).

In paper letters A = W_Q^b, B = W_K^bT, C = W_O^aT, D = W_V^aT, ||B C D A|| = ||W_Q^bT OV^a W_K^b||:
the writer's output meets the keys, as in the true score, but its input meets the queries. It
does not split into (writer channel, reader channel) shares (writer channels interfere with
either sign: `Rotated.writer_interaction`); it splits over the reader's factors' own SVDs,
W_Q^b = sum_m sigma_m q_m e_m^T and W_K^b = sum_n kappa_n k_n f_n^T:

    ||B C D A||^2 = sum_{m,n} sigma_m^2 kappa_n^2 (q_m^T OV^a k_n)^2

With M = OV^a W_K^b (the writer's output read by the keys) and P_Q the projector onto span(W_Q^b),

    rotated^2 / true^2 = alignment * anisotropy
    alignment  = tr(P_Q M M^T) / tr(M M^T)                      in [0, 1]
    anisotropy = gain_rotated / gain_true,  gain_true = <W_Q^bT W_Q^b, M^T M> / ||M||^2,
                 gain_rotated = <W_Q^b W_Q^bT, M M^T> / tr(P_Q M M^T)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .channels import circuit_svd
from .scoring import ZERO_RTOL
from .weights import HeadWeights


@dataclass(frozen=True)
class Rotated:
    """B C D A of one K pair against the true A B C D (module doc)."""

    true_sq: Tensor  # [..]: ||A B C D||^2 = ||OV^a W_K^b W_Q^bT||^2
    rotated_sq: Tensor  # [..]: ||B C D A||^2 = ||W_Q^bT OV^a W_K^b||^2
    shares: Tensor  # [.., d_head, d_head]: sigma_m^2 kappa_n^2 (q_m . OV^a k_n)^2, sum rotated_sq
    writer_interaction: Tensor  # [.., d_head, d_head]: signed (writer channel i, i'), sum rotated_sq
    alignment: Tensor  # [..]: tr(P_Q M M^T) / tr(M M^T), M = OV^a W_K^b, in [0, 1]
    gain_true: Tensor  # [..]: <W_Q^T W_Q, M^T M> / ||M||^2
    gain_rotated: Tensor  # [..]: <W_Q W_Q^T, M M^T> / tr(P_Q M M^T)

    @property
    def anisotropy(self) -> Tensor:
        """gain_rotated / gain_true: rotated_sq / true_sq = alignment * anisotropy."""
        return self.gain_rotated / self.gain_true


def rotated_channels(W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor) -> Rotated:
    """The errata's B C D A for the K-composition of writer a (W_V [.., d_model, d_head],
    W_O [.., d_head, d_model]) into reader b (W_Q, W_K [.., d_model, d_head]), in the small
    space: the writer's SVD, each reader factor's own SVD, and d_head x d_head crosses.
    P_Q projects onto W_Q's singular directions with sigma > scoring.ZERO_RTOL sigma_max (its
    span). When what the writer reads misses that span, alignment is 0 and gain_rotated a ratio
    of roundings (anisotropy with it); when M = OV^a W_K^b = 0 (the writer's output never reaches
    the keys) alignment and both gains are 0 / 0."""
    writer = circuit_svd(W_V, W_O.mT)  # OV^a = R diag(s) W^T: reads R, writes W
    eye = torch.eye(W_Q.shape[-1], dtype=W_Q.dtype)
    query = circuit_svd(W_Q, eye)  # W_Q = q diag(sigma) e^T  (q: reads, e: writes)
    key = circuit_svd(W_K, eye)  # W_K = k diag(kappa) f^T
    s = writer.s[..., :, None]  # [.., d_head (i), 1]
    q_R = query.reads.mT @ writer.reads  # q_m . r_i  [.., d_head (m), d_head (i)]
    W_k = writer.writes.mT @ key.reads  # w_i . k_n  [.., d_head (i), d_head (n)]
    shares = (query.s[..., :, None] * (q_R @ (s * W_k)) * key.s[..., None, :]).square()  # [.., m, n]
    # M = OV^a W_K = R M_R with M_R = diag(s) W^T W_K [.., d_head (i), d_head]: R only rotates
    M_R = s * (writer.writes.mT @ W_K)
    in_span = (query.s > ZERO_RTOL * query.s[..., :1]).to(W_Q.dtype)[..., :, None]  # [.., m, 1]
    trace_M = M_R.square().sum((-2, -1))  # tr(M M^T) = ||M||^2
    trace_PM = ((in_span * q_R) @ M_R).square().sum((-2, -1))  # tr(P_Q M M^T), P_Q = q q^T on the span
    true_sq = (M_R @ query.writes * query.s[..., None, :]).square().sum((-2, -1))  # W_Q^T W_Q = e S^2 e^T
    rotated_sq = shares.sum((-2, -1))
    gram_Q = q_R.mT @ (query.s[..., :, None].square() * q_R)  # R^T Gamma_Q R  [.., i, i']
    gram_K = W_k @ (key.s[..., :, None].square() * W_k.mT)  # W^T Gamma_K W  [.., i, i']
    return Rotated(
        true_sq=true_sq,
        rotated_sq=rotated_sq,
        shares=shares,
        writer_interaction=s * s.mT * gram_Q * gram_K,
        alignment=trace_PM / trace_M,
        gain_true=true_sq / trace_M,
        gain_rotated=rotated_sq / trace_PM,
    )


def rotation_statistics(hw: HeadWeights, pairs: tuple[Tensor, ...]) -> dict[str, Tensor]:
    """K pairs' errata statistics [n] (module doc): alignment and anisotropy (rotated^2 / true^2 =
    alignment x anisotropy, `rotated_channels`), the share of the writer's output (its channels
    weighted by s_i^2) inside the span of the reader's query input, output_query_share, and its
    chance value under a rotation of the writer, query_chance = rank(W_Q^b) / d_model. The pairs
    go a chunk at a time (`_PAIR_CHUNK`): each gathers its heads' [d_model, d_head] matrices, which
    for every pair of a 12 x 12-head model would be 3.7 GB each."""
    i, h, j, g = (torch.as_tensor(x) for x in pairs)
    step = max(1, _PAIR_CHUNK // (hw.d_model * hw.d_head))
    parts = [_rotation_statistics(hw, (i[a : a + step], h[a : a + step], j[a : a + step], g[a : a + step]))
             for a in range(0, len(i), step)]  # fmt: skip
    if len(parts) == 1:
        return parts[0]
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


_PAIR_CHUNK = 2**22  # elements of one gathered [pairs, d_model, d_head] head matrix (32 MB in float64)


def _rotation_statistics(hw: HeadWeights, pairs: tuple[Tensor, ...]) -> dict[str, Tensor]:
    i, h, j, g = pairs
    W_Q, W_K, W_V, W_O = hw.W_Q[j, g], hw.W_K[j, g], hw.W_V[i, h], hw.W_O[i, h]  # [n, d_model, d_head]..
    rotated = rotated_channels(W_Q, W_K, W_V, W_O)
    writer = circuit_svd(W_V, W_O.mT)
    query = circuit_svd(W_Q, torch.eye(hw.d_head, dtype=W_Q.dtype, device=W_Q.device))
    in_span = query.s > ZERO_RTOL * query.s[..., :1]  # [n, d_head]: W_Q's span
    q_w = (query.reads.mT @ writer.writes).square() * in_span[..., :, None]  # (q_m . w_i)^2 [n, m, i]
    s2 = writer.s.square()
    return {
        "alignment": rotated.alignment,
        "anisotropy": rotated.anisotropy,
        "output_query_share": (q_w.sum(-2) * s2).sum(-1) / s2.sum(-1),
        "query_chance": in_span.sum(-1).to(W_Q.dtype) / hw.d_model,
    }
