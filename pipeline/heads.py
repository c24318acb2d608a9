"""Classify every head by where it attends and what it copies.

Two seeded evaluation batches of `analysis.heads.eval_sequences` sequences each:

- repeated random tokens `[first, span, span]` (`repeat_length`-token spans): the
  `induction` score, and the causal path ablation (`pipeline.ablation`);
- held-out training data (the evaluation split the train stage never trained on):
  where heads attend on the model's own distribution, `prev_token`, `current_token`,
  `first_token`, `recent_window` and `duplicate_token` (definitions in `pipeline.patterns`).

Two scores read from the analysis-ready weights (`pipeline.weights.HeadWeights`):

- `copying` = sum(lambda) / sum(|lambda|) over the eigenvalues of the head's OV circuit in
  token space, W_E W_V W_O W_U [d_vocab, d_vocab] (row vectors: token t's embedding, through
  the head, onto the logits). 1: every eigenvalue positive (the head raises the logit of the
  token it attends to); -1: all negative. Its non-zero eigenvalues are those of the cyclic
  rotation W_O W_U W_E W_V [d_head, d_head] (`strands.eigenvalues`). NaN if all are zero.
- `qk_positivity` (heads in layer >= 1): the paper's induction check. With a the earlier
  head that K-composes most with b (true score), the QK term in token space
  W_E W_Q^b W_K^bT (W_V^a W_O^a)^T W_E^T [d_vocab, d_vocab]: entry (t, s) is how much a query
  holding token t attends to a key to which head a moved token s. Summarised the same way,
  sum(lambda) / sum(|lambda|): 1 for an induction head reading a previous-token head
  (query token t seeks keys whose previous token is t). NaN for layer 0.

Roles: a head takes each role whose score reaches its threshold
(`analysis.heads.thresholds`; flags `is_<role>`). Its primary `role` is previous_token or
induction if it takes one (in that order: `FIRST`), else the role it takes with the
highest score, else "other".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from pipeline import ablation, composition, data, patterns, strands
from pipeline.config import DataConfig, HeadsConfig, RoleThresholds
from pipeline.errors import UserError
from pipeline.model import AttnOnlyTransformer
from pipeline.tables import KINDS, ROLES, VARIANTS
from pipeline.weights import HeadWeights, power_of_two_scaled

# The primary role. Some scores nest: a previous-token head also fills the recent window,
# and an induction head attends to the first token where nothing matches (measured on the
# other batch, so the two scores do not compete). Those two roles come first, in this
# order; among the other roles a head takes, the one with the highest score wins (all are
# fractions of attention mass), so a duplicate-token head in repetitive text, which also
# puts mass in the recent window, stays a duplicate-token head.
FIRST = ("previous_token", "induction")
ROLE_SCORE = {
    "previous_token": "prev_token",
    "recent_window": "recent_window",
    "induction": "induction",
    "duplicate_token": "duplicate_token",
    "current_token": "current_token",
    "first_token": "first_token",
}
SCORES = (
    "prev_token",
    "current_token",
    "first_token",
    "recent_window",
    "duplicate_token",
    "induction",
    "copying",
    "qk_positivity",
)
PATTERN_SCORES = (
    "prev_token",
    "current_token",
    "first_token",
    "recent_window",
    "induction",
)  # finite for any model
FLAGS = tuple(f"is_{role}" for role in ROLE_SCORE)
COLUMNS = ["layer", "head", "role", *SCORES, *FLAGS]


@dataclass
class HeadsResult:
    table: pd.DataFrame  # heads.csv: COLUMNS, one row per head
    ablation: pd.DataFrame  # ablation.csv: ablation.COLUMNS
    example: dict[
        str, Tensor
    ]  # one repeated sequence: tokens [pos], pattern [layer, head, query_pos, key_pos]


# --- evaluation batches ------------------------------------------------------------


def repeated_tokens(cfg: HeadsConfig, d_vocab: int, seed: int) -> Tensor:
    """[eval_sequences, 1 + 2 repeat_length] repeated random tokens, from the seed."""
    gen = torch.Generator().manual_seed(seed)
    return data.repeated_random_tokens(cfg.eval_sequences, cfg.repeat_length, d_vocab, gen)


def heldout_tokens(model: AttnOnlyTransformer, data_cfg: DataConfig, n: int, seed: int) -> Tensor:
    """Up to `n` held-out sequences [batch, n_ctx] of the training data of this seed (any source)."""
    return data.eval_sequences(data_cfg, model.cfg, seed, n)


# --- scores ------------------------------------------------------------------------


def _positivity(eigenvalues: Tensor) -> Tensor:
    """sum(lambda) / sum(|lambda|) over the last dim (complex eigenvalues); NaN when all are zero."""
    total = eigenvalues.sum(-1).real  # complex ones come in conjugate pairs: the sum is real
    size = eigenvalues.abs().sum(-1)
    return torch.where(size > 0, total / size, torch.nan)


def copying(hw: HeadWeights) -> Tensor:
    """[layer, head]: positivity of the eigenvalues of W_E W_V W_O W_U (module doc)."""
    hw = power_of_two_scaled(
        hw
    )  # exact; the eigenvalues' signs and ratios are unchanged, and nothing overflows
    OV_tokens = strands.Strand((hw.W_E, hw.W_V, hw.W_O, hw.W_U))  # [L, H] x [d_vocab, d_vocab]
    return _positivity(strands.eigenvalues(OV_tokens))


def qk_positivity(hw: HeadWeights) -> tuple[Tensor, Tensor]:
    """[layer, head] positivity of the K-composition QK term in token space with the best
    K-composing earlier head (module doc), and that head's (layer, head) [layer, head, 2].
    NaN (and -1) for layer 0, or where every earlier head's score is undefined."""
    hw = power_of_two_scaled(
        hw
    )  # exact; the eigenvalues' signs and ratios are unchanged, and nothing overflows
    L, H = hw.n_layers, hw.n_heads
    K = composition.true_scores(hw, "K")["K"]  # [src_layer, src_head, dst_layer, dst_head]
    out = torch.full((L, H), torch.nan, dtype=hw.W_Q.dtype)
    source = torch.full((L, H, 2), -1, dtype=torch.long)
    for j in range(1, L):
        for b in range(H):
            col = K[:j, :, j, b].reshape(-1)  # every earlier head, [j * H]
            if torch.isnan(col).all():
                continue
            i, a = divmod(int(torch.nan_to_num(col, nan=-math.inf).argmax()), H)
            term = strands.Strand(
                (hw.W_E, hw.W_Q[j, b], hw.W_K[j, b].mT, hw.W_O[i, a].mT, hw.W_V[i, a].mT, hw.W_E.mT)
            )  # [d_vocab, d_vocab]: query token x token head a moved into the key
            out[j, b] = _positivity(strands.eigenvalues(term))
            source[j, b] = torch.tensor([i, a])
    return out, source


def pattern_scores(
    model: AttnOnlyTransformer, repeated: Tensor, heldout: Tensor, length: int, k: int
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each attention score [layer, head] (induction on `repeated`, the rest on `heldout`),
    and the first repeated sequence with its patterns (tokens [pos], pattern [layer, head, q, k])."""
    _, rep = model.run_with_cache(repeated)
    _, held = model.run_with_cache(heldout)
    scores: dict[str, list[Tensor]] = {name: [] for name in SCORES[:6]}
    for p_rep, p_held in zip(rep.pattern, held.pattern):  # [batch, head, query_pos, key_pos]
        scores["prev_token"].append(patterns.prev_token(p_held))
        scores["current_token"].append(patterns.current_token(p_held))
        scores["first_token"].append(patterns.first_token(p_held))
        scores["recent_window"].append(patterns.recent_window(p_held, k))
        scores["duplicate_token"].append(patterns.duplicate_token(p_held, heldout))
        scores["induction"].append(patterns.induction(p_rep, length))
    example = {
        "tokens": repeated[0].clone(),
        "pattern": torch.stack([p[0] for p in rep.pattern]).contiguous(),
    }
    return {name: torch.stack(v) for name, v in scores.items()}, example


def classify(table: pd.DataFrame, thresholds: RoleThresholds) -> pd.DataFrame:
    """`table` with `role` and the `is_<role>` flags set from its scores (NaN takes no role)."""
    table = table.copy()
    taken = pd.DataFrame(
        index=table.index
    )  # [head, role]: the role's score where the head takes it, else NaN
    for name, score in ROLE_SCORE.items():
        flag = table[score].ge(getattr(thresholds, name)).fillna(False).astype(bool)
        table[f"is_{name}"] = flag
        taken[name] = table[score].where(flag)
    rest = taken.drop(columns=list(FIRST))
    role = rest.fillna(-1.0).idxmax(axis=1).where(rest.notna().any(axis=1), "other")  # ties: ROLES order
    for name in reversed(FIRST):
        role = role.mask(taken[name].notna(), name)
    table["role"] = role
    return table[COLUMNS]


@torch.no_grad()
def analyse(
    model: AttnOnlyTransformer,
    hw: HeadWeights,
    data_cfg: DataConfig,
    cfg: HeadsConfig,
    seed: int,
    source: str = "model",
) -> HeadsResult:
    """Scores, roles and the path ablation of every head, on batches drawn from `seed`;
    `source` names the model in errors."""
    n_ctx = model.cfg.n_ctx  # the checkpoint's (config.json), not necessarily params.yaml's model.n_ctx
    need = 1 + 2 * cfg.repeat_length
    if need > n_ctx:
        raise UserError(
            "analysis.heads.repeat_length",
            f"a repeated sequence (1 + 2 x {cfg.repeat_length} = {need} tokens) "
            f"does not fit in the model's n_ctx = {n_ctx}",
            cfg.repeat_length,
        )
    if cfg.recent_window >= n_ctx:
        raise UserError(
            "analysis.heads.recent_window", f"must be < the model's n_ctx = {n_ctx}", cfg.recent_window
        )
    repeated = repeated_tokens(cfg, model.cfg.d_vocab, seed)
    heldout = heldout_tokens(model, data_cfg, cfg.eval_sequences, seed)
    return analyse_batches(model, hw, repeated, heldout, cfg, source)


@torch.no_grad()
def analyse_batches(
    model: AttnOnlyTransformer,
    hw: HeadWeights,
    repeated: Tensor,
    heldout: Tensor,
    cfg: HeadsConfig,
    source: str = "model",
) -> HeadsResult:
    """`analyse` on given batches: `repeated` [batch, 1 + 2 repeat_length], `heldout` [batch, pos]."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if (L, H) != (hw.n_layers, hw.n_heads):
        raise ValueError(f"model has {L} x {H} heads but the weights {hw.n_layers} x {hw.n_heads}")
    scores, example = pattern_scores(model, repeated, heldout, cfg.repeat_length, cfg.recent_window)
    scores["copying"] = copying(hw)
    scores["qk_positivity"], _ = qk_positivity(hw)
    layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    table = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
    for name in SCORES:
        table[name] = scores[name].to(torch.float64).reshape(-1).numpy()
    table = classify(table, cfg.thresholds)
    effects = ablation.path_ablation(model, repeated, cfg.repeat_length)
    # finite weights can still overflow a forward pass; a NaN here would silently take no role
    must_be_finite = [
        table[list(PATTERN_SCORES)].to_numpy(),
        effects[["attn_effect", "loss_effect"]].to_numpy(),
    ]
    if not all(np.isfinite(x).all() for x in must_be_finite):
        raise UserError(
            source,
            "attention patterns or losses are not finite on the evaluation batches: weights too large for float64",
        )
    return HeadsResult(table, effects, example)


# --- summary -----------------------------------------------------------------------


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def spearman(effects: pd.DataFrame, scores: pd.DataFrame, effect: str) -> dict[str, dict[str, float | None]]:
    """{kind: {variant: rho}}: Spearman rank correlation between |effect| and the composition
    score, over the pairs where both are defined; None where it is undefined (fewer than
    3 pairs, or a constant effect or score). |effect|: dependence in either direction.
    Ties get average ranks (as scipy.stats.spearmanr; pandas computes it without scipy)."""
    keys = ["kind", "src_layer", "src_head", "dst_layer", "dst_head"]
    merged = effects.merge(scores, on=keys, how="inner")
    out: dict[str, dict[str, float | None]] = {}
    for kind in KINDS:
        for variant in VARIANTS:
            rows = merged[(merged["kind"] == kind) & (merged["variant"] == variant)]
            x, y = rows[effect].abs().to_numpy(float), rows["score"].to_numpy(float)
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            rho = float("nan")
            if len(x) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
                rho = pd.Series(x).corr(pd.Series(y), method="spearman")
            out.setdefault(kind, {})[variant] = _finite(rho)
    return out


def summarize(result: HeadsResult, scores: pd.DataFrame) -> dict:
    """Role counts, the heads of each role, the best scores, and the Spearman correlations of
    the ablation effects with each composition variant (`scores`: the composition stage's
    scores.csv). `spearman` uses the loss effect (defined for Q, K and V); `spearman_attn`
    the induction-score effect (None for V: values cannot change a pattern)."""
    table = result.table
    label = [f"{l}.{h}" for l, h in zip(table["layer"], table["head"])]
    return {
        "n_heads": len(table),
        "roles": {role: int((table["role"] == role).sum()) for role in ROLES},
        "heads_by_role": {role: [x for x, r in zip(label, table["role"]) if r == role] for role in ROLES},
        "max": {name: _finite(table[name].max()) for name in SCORES},
        "spearman": spearman(result.ablation, scores, "loss_effect"),
        "spearman_attn": spearman(result.ablation, scores, "attn_effect"),
    }
