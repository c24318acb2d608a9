"""Train a model from a seed: AdamW, linear warmup then cosine decay, gradient clipping.

Deterministic on one machine: data, initialisation and batch order all come from
the seed, and torch runs with deterministic algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from pipeline import data, patterns
from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.model import AttnOnlyTransformer, next_token_loss

CURVE_COLUMNS = ["step", "tokens", "train_loss", "eval_loss", "induction", "prev_token", "icl"]


@dataclass
class TrainResult:
    model: AttnOnlyTransformer
    curve: pd.DataFrame  # one row per evaluation, CURVE_COLUMNS
    metrics: dict  # the last row's values, and the device


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device", "CUDA is not available on this machine", name)
    return torch.device(name)


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup to `lr`, then cosine decay to 10% of it."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: AttnOnlyTransformer, eval_tokens: torch.Tensor, probe: torch.Tensor, probe_length: int) -> dict:
    """Held-out loss, in-context learning score, and the best induction / previous-token head."""
    model.eval()
    loss = next_token_loss(model(eval_tokens), eval_tokens, reduce=False)  # [batch, pos - 1]
    T = loss.shape[1]
    icl = loss[:, int(0.8 * T) :].mean() - loss[:, : max(1, int(0.2 * T))].mean()
    _, cache = model.run_with_cache(probe)
    induction = max(patterns.induction(p, probe_length).max().item() for p in cache.pattern[1:])
    prev = max(patterns.prev_token(p).max().item() for p in cache.pattern[:-1])
    model.train()
    return {"eval_loss": loss.mean().item(), "icl": icl.item(), "induction": induction, "prev_token": prev}


def train(cfg: Config, seed: int, progress: bool = True) -> TrainResult:
    """Train one model on seeded synthetic data; evaluate every `train.eval_every` steps."""
    t = cfg.train
    if t.threads is not None:
        torch.set_num_threads(t.threads)
    torch.use_deterministic_algorithms(True)
    device = resolve_device(t.device)
    rng = np.random.default_rng(seed)
    seqs = torch.from_numpy(data.synthetic_sequences(cfg.data.n_train_sequences, cfg.model, cfg.data, rng))
    n_eval = max(1, int(len(seqs) * cfg.data.eval_fraction))
    train_seqs, eval_seqs = seqs[n_eval:].to(device), seqs[: min(n_eval, t.eval_batch_size)].to(device)
    gen = torch.Generator().manual_seed(seed)
    length = t.probe_length
    probe = data.repeated_random_tokens(t.eval_batch_size, length, cfg.model.d_vocab, gen).to(device)

    torch.manual_seed(seed)
    model = AttnOnlyTransformer(cfg.model).to(device)
    decay = [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1].startswith("W_")]
    rest = [p for n, p in model.named_parameters() if not n.rsplit(".", 1)[-1].startswith("W_")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=t.lr,
        betas=tuple(t.betas),
    )
    rows, recent = [], []  # recent: training losses since the last evaluation
    batch_order = torch.Generator().manual_seed(seed + 1)
    for step in tqdm(range(t.steps + 1), desc=f"train seed {seed}", disable=not progress, mininterval=1.0):
        if step % t.eval_every == 0 or step == t.steps:
            train_loss = float(np.mean(recent)) if recent else float("nan")
            tokens = step * t.batch_size * cfg.model.n_ctx
            rows.append({"step": step, "tokens": tokens, "train_loss": train_loss, **evaluate(model, eval_seqs, probe, length)})
            recent = []
        if step == t.steps:
            break
        idx = torch.randint(0, len(train_seqs), (t.batch_size,), generator=batch_order).to(device)
        batch = train_seqs[idx]  # [batch, pos]
        loss = next_token_loss(model(batch), batch)
        if not torch.isfinite(loss):
            raise UserError("train", f"loss became {loss.item()} at step {step}: lower train.lr or raise train.warmup_steps")
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        recent.append(loss.item())
    curve = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    metrics = {k: float(curve.iloc[-1][k]) for k in CURVE_COLUMNS[2:]}
    metrics.update(step=int(curve.iloc[-1]["step"]), tokens=int(curve.iloc[-1]["tokens"]))
    return TrainResult(model.cpu(), curve, metrics)
