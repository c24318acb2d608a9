"""Classify heads by where they attend, on seeded evaluation batches.

Scores per head (definitions in `pipeline.patterns`), measured on repeated random
tokens `[first, span, span]` (`analysis.heads.repeat_length`-token spans).
"""

from __future__ import annotations

import pandas as pd
import torch

from pipeline import data, patterns
from pipeline.config import HeadsConfig
from pipeline.model import AttnOnlyTransformer


@torch.no_grad()
def head_scores(model: AttnOnlyTransformer, cfg: HeadsConfig, seed: int) -> pd.DataFrame:
    """One row per head: layer, head, then each score."""
    gen = torch.Generator().manual_seed(seed)
    tokens = data.repeated_random_tokens(cfg.eval_sequences, cfg.repeat_length, model.cfg.d_vocab, gen)
    _, cache = model.run_with_cache(tokens)
    rows = []
    for layer, pattern in enumerate(cache.pattern):  # [batch, head, query_pos, key_pos]
        scores = {
            "prev_token": patterns.prev_token(pattern),
            "induction": patterns.induction(pattern, cfg.repeat_length),
        }
        for head in range(pattern.shape[1]):
            rows.append({"layer": layer, "head": head, **{k: float(v[head]) for k, v in scores.items()}})
    return pd.DataFrame(rows)
