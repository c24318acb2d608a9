"""Train a model from a seed (AdamW, linear warmup then cosine decay, gradient
clipping), or load a checkpoint trained elsewhere; both end in a `TrainResult`.

Deterministic on one machine: data, initialisation and batch order all come from
the seed, torch runs with deterministic algorithms, and `train.threads` fixes the
number of CPU threads (a different count may change float rounding).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from .. import memory, streams
from ..cli import progress_line, resolve_device
from ..config import Config, ModelConfig, TrainConfig
from ..data import datasets
from ..errors import UserError
from ..tables import CURVE_COLUMNS, INDUCTION_THRESHOLD
from . import origin, patterns, tl_checkpoint, transformer
from .transformer import Transformer, next_token_loss

# called with (step, tokens seen, state dict on the CPU) at each of train.checkpoint_steps()
SaveCheckpoint = Callable[[int, int, dict[str, torch.Tensor]], None]


@dataclass
class TrainResult:
    model: Transformer
    curve: pd.DataFrame  # one row per evaluation, CURVE_COLUMNS
    metrics: dict  # the last row's values, and when induction first reached the threshold
    manifest: dict = field(default_factory=dict)  # data inputs (sha256) or generator, checkpoint read
    seconds: float = 0.0  # wall time of the training loop (not written: it is not reproducible)
    eval_seconds: list[float] = field(default_factory=list)  # wall time at each curve row, likewise


def lr_at(step: int, t: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to 10% of it at the last step."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# elements of one chunk of held-out logits (`_chunked_loss`; its memory term, `_heldout_loss`)
LOSS_CHUNK = 1 << 24


def loss_chunk(n_ctx: int, d_vocab: int) -> int:
    """Sequences per chunk of the held-out loss: their logits [chunk, n_ctx, d_vocab] stay under
    LOSS_CHUNK elements (a large vocabulary's would not fit at once), at least one. The loss
    chunks by it and its memory term (`_heldout_loss`) estimates by it: one rule."""
    return max(1, LOSS_CHUNK // max(1, n_ctx * d_vocab))


def _chunked_loss(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Per-position loss `[batch, pos - 1]`, a few sequences at a time so that a large
    vocabulary's logits stay small (~64 MB per chunk; `loss_chunk`, as estimated)."""
    B, T = tokens.shape
    chunk = loss_chunk(T, model.cfg.d_vocab)
    return torch.cat(
        [
            next_token_loss(model(tokens[i : i + chunk]), tokens[i : i + chunk], reduce=False)
            for i in range(0, B, chunk)
        ]
    )


@torch.no_grad()
def evaluate(model: Transformer, eval_tokens: torch.Tensor, probe: torch.Tensor, probe_length: int) -> dict:
    """Held-out loss; in-context learning (mean loss over the last fifth of positions minus
    the first fifth: negative when later tokens are predicted better); the best induction
    head of layers >= 1 and the best previous-token head of the layers before the last,
    both on the repeated-random-token probe."""
    was_training = model.training
    model.eval()
    loss = _chunked_loss(model, eval_tokens)  # [batch, pos - 1]
    T = loss.shape[1]
    fifth = max(1, T // 5)
    icl = loss[:, T - fifth :].mean() - loss[:, :fifth].mean()
    _, cache = model.run_with_cache(probe)
    late, early = cache.pattern[1:] or cache.pattern, cache.pattern[:-1] or cache.pattern
    induction = max(patterns.induction(p, probe_length).max().item() for p in late)
    prev = max(patterns.prev_token(p).max().item() for p in early)
    model.train(was_training)
    return {"eval_loss": loss.mean().item(), "icl": icl.item(), "induction": induction, "prev_token": prev}


def _summary(curve: pd.DataFrame) -> dict:
    last = curve.iloc[-1]
    metrics = {k: float(last[k]) for k in CURVE_COLUMNS[2:]}
    metrics.update(step=int(last["step"]), tokens=int(last["tokens"]))
    reached = curve.loc[curve["induction"] >= INDUCTION_THRESHOLD]
    metrics["induction_step"] = int(reached.iloc[0]["step"]) if len(reached) else None
    metrics["induction_tokens"] = int(reached.iloc[0]["tokens"]) if len(reached) else None
    return metrics


def _setup(t: TrainConfig) -> torch.device:
    """Threads, determinism and precision for a run; its device.

    The CPU is deterministic: same config and seed, same bytes. On CUDA, cuBLAS is made
    deterministic (CUBLAS_WORKSPACE_CONFIG, set before CUDA starts unless the user set it),
    but the fused attention's backward (`model.causal_attention`) has no deterministic kernel:
    there determinism is asked for with warn_only, and runs agree to rounding, not to the bit.
    tf32 and bf16 trade precision for speed on CUDA only; the weights stay float32."""
    if t.threads is not None:
        torch.set_num_threads(t.threads)
    device = resolve_device(t.device, "train.device")
    if t.precision != "float32" and device.type != "cuda":
        problem = f"runs on CUDA only (this run's device is {device.type}): use float32 on the CPU"
        raise UserError("train.precision", problem, t.precision)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = t.precision == "tf32"
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    # deterministic mode also fills every new tensor with NaN (to expose reads of
    # uninitialised memory): ~14% of a training step here, and nothing reads one
    torch.utils.deterministic.fill_uninitialized_memory = False
    return device


def require_memory(estimate: memory.Estimate, device: torch.device) -> None:
    """Refuse, naming the key, a run whose tensors cannot fit (before any is allocated): on a
    GPU its free memory holds the model's tensors, the host's the synthetic data."""
    gpu = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    memory.require_fits(estimate, memory.available_bytes(), gpu)


def cpu_state(model: Transformer) -> dict[str, torch.Tensor]:
    """A copy of the weights on the CPU (what a checkpoint holds; training goes on changing them)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train(
    cfg: Config,
    seed: int,
    tokenized: str | Path | None = None,
    progress: bool | str | None = True,
    save: SaveCheckpoint | None = None,
) -> TrainResult:
    """Train one model on the configured data; evaluate every `train.eval_every` steps and
    hand the weights to `save` at every step of `train.checkpoint_steps()` (before that
    step's update: step s holds the weights after s updates; the last is the final model).
    `tokenized`: the tokenizer stage's output (data.source = text). `progress`: "bar" (or
    True), a tqdm bar; "lines", a plain line on stderr per evaluation (under DVC, which runs
    stages without a terminal: `pipeline.cli.progress_mode`); None or False, nothing."""
    t = cfg.train
    device = _setup(t)
    require_memory(training_estimate(cfg), device)
    dataset = datasets.load(cfg.data, cfg.model, seed, n_eval=t.eval_batch_size, tokenized=tokenized)
    assert dataset.train is not None  # need_train (the default): every source gives one, whatever the input
    eval_seqs = dataset.eval.to(device)
    probe = datasets.repeated_probe(dataset, t.eval_batch_size, t.probe_length, cfg.model.d_vocab, seed).to(
        device
    )

    torch.manual_seed(streams.seed_of(seed, "init"))
    model = Transformer(cfg.model).to(device)
    decay, rest = model.weight_matrices()  # weight decay on the matrices; not on biases, LN
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(t.betas[0], t.betas[1]),
    )
    batches = torch.Generator().manual_seed(streams.seed_of(seed, "batches"))
    saved = set(t.checkpoint_steps()) if save is not None else set()
    rows: list[dict] = []
    eval_seconds: list[float] = []
    losses: list[
        torch.Tensor
    ] = []  # training losses since the last evaluation (no .item(): no sync per step)
    last_quarter = (0, 0)  # the stream's (drawn, copied) counts when the last quarter of the steps begins
    start = time.perf_counter()
    mode = "bar" if progress is True else progress or None
    # counted by hand: a bar iterated over range(steps + 1) stops one short at the `break` below
    # (tqdm counts an item when the next is asked for), ending at 12/13 where the run is done
    bar = tqdm(
        total=t.steps + 1, desc=f"train seed {seed}", disable=mode != "bar", mininterval=1.0, unit="step"
    )
    for step in range(t.steps + 1):
        if step % t.eval_every == 0 or step == t.steps:
            train_loss = torch.stack(losses).mean().item() if losses else float("nan")
            if losses and not math.isfinite(train_loss):
                _diverged(torch.stack(losses), step - len(losses), t)
            row = {"step": step, "tokens": step * t.batch_size * cfg.model.n_ctx, "train_loss": train_loss}
            row.update(evaluate(model, eval_seqs, probe, t.probe_length))
            rows.append(row)
            eval_seconds.append(time.perf_counter() - start)
            bar.set_postfix(
                loss=f"{row['eval_loss']:.3f}",
                induction=f"{row['induction']:.2f}",
                prev=f"{row['prev_token']:.2f}",
                refresh=False,
            )
            if not math.isfinite(row["eval_loss"]):
                raise UserError(
                    "train.lr", f"the held-out loss became {row['eval_loss']} at step {step}: {_ADVICE}", t.lr
                )
            if mode == "lines":
                scores = f", eval_loss {row['eval_loss']:.3f}, induction {row['induction']:.2f}"
                progress_line(f"train seed {seed}", step, t.steps, start, f" steps{scores}")
            losses = []
        if step in saved:  # nothing here draws a random number: the run is the same without it
            save(step, step * t.batch_size * cfg.model.n_ctx, cpu_state(model))
        if step == t.steps:
            bar.update()
            break
        if step == t.steps - t.steps // 4 and isinstance(dataset.train, datasets.Stream):
            last_quarter = (dataset.train.tokens_drawn, dataset.train.tokens_copied)
        rate = datasets.copy_rate(cfg.data.copies, step, t.steps)  # annealed to 0 where configured
        batch = dataset.train.batch(t.batch_size, batches, rate).to(device)  # [batch, n_ctx]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16"):
            loss = next_token_loss(model(batch), batch)  # bf16 matmuls; the loss in float32
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        losses.append(loss.detach())
        bar.update()
    bar.close()
    seconds = time.perf_counter() - start
    curve = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    metrics = _summary(curve)
    if isinstance(dataset.train, datasets.Stream):  # text and token streams: copies counted as written
        metrics.update(_copy_shares(dataset.train, last_quarter))
    return TrainResult(model.cpu(), curve, metrics, dataset.manifest, seconds, eval_seconds)


def _copy_shares(stream: datasets.Stream, last_quarter: tuple[int, int]) -> dict:
    """The share of the training tokens that were copies, over the run and over its last quarter
    (`last_quarter`: the stream's counts when that quarter began)."""
    drawn, copied = stream.tokens_drawn, stream.tokens_copied
    late_drawn, late_copied = drawn - last_quarter[0], copied - last_quarter[1]
    return {
        "copy_share": copied / drawn if drawn else 0.0,
        "copy_share_last_quarter": late_copied / late_drawn if late_drawn else 0.0,
    }


_ADVICE = "lower it, raise train.warmup_steps or lower train.grad_clip"


def _diverged(losses: torch.Tensor, first_step: int, t: TrainConfig) -> None:
    """Stop training: the losses of steps first_step, first_step + 1, ... include NaN or inf."""
    bad = (~torch.isfinite(losses)).nonzero()
    step, value = (first_step + int(bad[0]), losses[bad[0]].item()) if len(bad) else (first_step, math.inf)
    raise UserError("train.lr", f"the training loss became {value} at step {step}: {_ADVICE}", t.lr)


def _fits(shape: ModelConfig, cfg: Config, source: str, device: torch.device) -> None:
    cfg.train.require_probe_fits(shape.n_ctx, f"n_ctx of {source}")
    require_memory(loading_estimate(shape, cfg, source), device)


def load(cfg: Config, seed: int, chosen: dict, tokenized: str | Path | None = None) -> TrainResult:
    """A checkpoint trained elsewhere and its config.json (beside it), evaluated like a trained
    model; `chosen` is the origin stage's record of them (`pipeline.model.origin`).

    `cfg.model` is not used: the shape comes from config.json. The curve has one row (step 0).
    """
    t = cfg.train
    device = _setup(t)
    path, config = origin.checked(chosen)
    if isinstance(config, Path):  # config.json: checked before the checkpoint is read or built
        _fits(tl_checkpoint.read_tl_config(config), cfg, str(config), device)
        model = tl_checkpoint.load_model(path, config).to(device)
    else:  # a repository without config.json (pipeline.hub.KNOWN): the shapes are in the weights
        shape, state = tl_checkpoint.read_checkpoint(path, config)
        _fits(shape, cfg, f"the shapes in {path}", device)
        model = tl_checkpoint.build_model(shape, state).to(device)
    dataset = datasets.load(cfg.data, model.cfg, seed, t.eval_batch_size, tokenized, need_train=False)
    probe = datasets.repeated_probe(dataset, t.eval_batch_size, t.probe_length, model.cfg.d_vocab, seed).to(
        device
    )
    row = {"step": 0, "tokens": 0, "train_loss": float("nan")}
    row.update(evaluate(model, dataset.eval.to(device), probe, t.probe_length))
    if not math.isfinite(row["eval_loss"]):  # its weights are finite (check_state), but too large for float32
        raise UserError(str(path), f"the held-out loss is {row['eval_loss']}: its weights overflow float32")
    curve = pd.DataFrame([row], columns=CURVE_COLUMNS)
    manifest = {key: chosen[key] for key in ("hub", "checkpoint", "config") if key in chosen}
    manifest["eval_data"] = dataset.manifest
    return TrainResult(model.cpu(), curve, _summary(curve), manifest)


def run(
    cfg: Config,
    seed: int,
    chosen: dict,
    tokenized: str | Path | None = None,
    progress: bool | str | None = True,
    save: SaveCheckpoint | None = None,
) -> TrainResult:
    """Train a new model, or load the checkpoint the origin stage chose (`chosen`); a loaded
    model is its own only checkpoint (step 0)."""
    if chosen["source"] == "load":
        result = load(cfg, seed, chosen, tokenized)
        if save is not None:
            save(0, 0, cpu_state(result.model))
        return result
    return train(cfg, seed, tokenized, progress, save)


# --- memory: what training and evaluation allocate, for pipeline/memory.py's check ----------

# AdamW keeps two moments per parameter and its foreach step one temporary: with the weights
# and their gradients, five float32 copies of every parameter while training
TRAINING_COPIES = 5


def _training_step(s: memory.Shape, batch: memory.Size) -> list[memory.Term]:
    """One step's forward and backward pass on [batch, n_ctx] (float32): what autograd keeps
    and the gradients of it. The fused attention keeps each layer's pattern; everything else
    is [batch, n_ctx, d_model or n_heads x d_head] per layer (~4 + 5 with LayerNorm, and 8 of
    q, k, v, their reshaped copies, the outputs and the gradients of the kernel)."""
    m, B, T = s.m, batch.value, s.m.n_ctx
    ln = 5 * (m.normalization_type == "LN")
    streams = m.n_layers * ((4 + ln) * m.d_model + 8 * m.n_heads * m.d_head) + 4 * m.d_model
    F32, I64 = memory.FLOAT32, memory.INT64
    return [
        memory.Term(
            "the attention patterns of a training batch, [batch, n_heads, n_ctx, n_ctx] float32 per layer",
            F32 * m.n_layers * B * m.n_heads * T * T,
            (batch, s.n_heads, s.n_ctx),
        ),
        memory.Term(
            "the logits of a training batch, [batch, n_ctx, d_vocab] float32: a copy, their log-softmax "
            "and the gradients",
            4 * F32 * B * T * m.d_vocab,
            (batch, s.n_ctx, s.d_vocab),
        ),
        memory.Term(
            "the residual streams, queries, keys and values of a training batch, and their gradients",
            2 * F32 * B * T * streams + 2 * I64 * B * T,
            (batch, s.n_ctx, s.d_model),
        ),
    ]


def _heldout_loss(s: memory.Shape, n_eval: int) -> memory.Term:
    """`_chunked_loss`: a chunk of sequences at a time (logits, their copy and log-softmax, the
    fused attention's pattern), never fewer than one sequence."""
    m, T = s.m, s.m.n_ctx
    chunk = min(n_eval, loss_chunk(T, m.d_vocab))
    per_sequence = T * (3 * m.d_vocab + m.n_heads * T + 4 * m.d_model + 4 * m.n_heads * m.d_head) + T
    return memory.Term(
        "the held-out loss, a chunk of sequences at a time",
        memory.FLOAT32 * chunk * per_sequence,
        (s.d_vocab, s.n_ctx),
    )


def _evaluation(s: memory.Shape, t: TrainConfig, n_eval: int) -> list[memory.Term]:
    """`evaluate`: the held-out loss, then the induction probe's cached pass."""
    probe = memory.Batch(
        memory.size("train.eval_batch_size", t.eval_batch_size),
        memory.size("train.probe_length", t.probe_length),
        1 + 2 * t.probe_length,
        "the induction probe",
        ("eval_batch_size", "1 + 2 probe_length"),
    )
    F32 = memory.FLOAT32
    cached = [*transformer.cache_terms(s, probe, F32), *transformer.forward_terms(s, probe, F32)]
    return memory.larger([_heldout_loss(s, n_eval)], cached)


def training_estimate(cfg: Config) -> memory.Estimate:
    """`train` on a new model (float32 on train.device):

    - every parameter five times: weights, gradients, AdamW's two moments, the step's temporary;
    - the larger of a training step (`_training_step`: patterns, logits, residual streams and
      their gradients) and an evaluation (`_evaluation`: held-out loss chunks, the probe's
      cached pass);
    - the synthetic data generated up front (host memory; `datasets.synthetic_terms`).
    """
    s, t = memory.Shape(cfg.model), cfg.train
    step = _training_step(s, memory.size("train.batch_size", t.batch_size))
    evaluation = _evaluation(s, t, datasets.eval_count(cfg.data, t.eval_batch_size))
    terms = [
        *transformer.weight_terms(
            s, TRAINING_COPIES * memory.FLOAT32, "weights, gradients and AdamW's moments"
        ),
        *memory.larger(step, evaluation),
        *datasets.synthetic_terms(s, cfg.data),
    ]
    return memory.Estimate("the model, its optimizer and the largest buffers", tuple(terms))


def loading_estimate(model: ModelConfig, cfg: Config, source: str) -> memory.Estimate:
    """Loading a checkpoint of shape `model` (its config.json, `source`) and evaluating it: the
    checkpoint's tensors and the model built from them (float32), one evaluation, and the
    synthetic data (generated whole even when only evaluating)."""
    s = memory.Shape(model, source)
    terms = [
        *transformer.weight_terms(s, 2 * memory.FLOAT32, "the checkpoint's tensors and the model's"),
        *_evaluation(s, cfg.train, datasets.eval_count(cfg.data, cfg.train.eval_batch_size)),
        *datasets.synthetic_terms(s, cfg.data),
    ]
    return memory.Estimate("the checkpoint and the largest evaluation buffers", tuple(terms))
