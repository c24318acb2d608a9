"""Memory estimates, checked before a stage allocates anything: a config whose tensors cannot
fit (an enormous `model.d_vocab` or `model.n_ctx`) is refused in one line instead of running
for minutes, swapping, before it fails.

An estimate is a list of `Term`s: the bytes of one kind of buffer and the sizes it grows
with. Each is a rough upper estimate of what the code allocates at its peak (the right
order of magnitude, not exact: allocator slack, Python objects and the libraries' own
memory are left out). `require_fits` compares the sum with the memory available
(`available_bytes`: MemAvailable of /proc/meminfo; where that cannot be read, other
operating systems, nothing is checked) and names the key that makes the largest term
large: among that term's sizes, the one furthest above its schema default (config.py).

Torch-free and pure but for `available_bytes`, so config-level code can import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .config import Config, DataConfig, HeadsConfig, ModelConfig, TrainConfig
from .errors import UserError

FLOAT32, FLOAT64, INT64 = 4, 8, 8
DTYPES = {FLOAT32: "float32", FLOAT64: "float64"}
# The chunk sizes of the code that allocates, defined here (torch-free, the lower module) and
# imported there, so that the estimate and the allocation cannot drift apart:
# pipeline/behaviour/ablation.py's _CHUNK, elements of one stacked attention result or batch of logits
ABLATION_CHUNK = 2**24
# elements of one chunk of held-out logits (pipeline/model/train.py's held-out loss: `loss_chunk`)
LOSS_CHUNK = 1 << 24
# the synthetic generator's per-position vectors of one int64 or float64 per sequence
# (topic, segment lengths, draws, the copier's state), and its partition of the vocabulary
# into topics (a permutation, its order, the topic of each token): pipeline/data/datasets.py
GENERATOR_VECTORS = 12
VOCABULARY_VECTORS = 3
# AdamW keeps two moments per parameter and its foreach step one temporary: with the weights
# and their gradients, five float32 copies of every parameter while training
TRAINING_COPIES = 5


def _defaults(schema: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(schema)}


REFERENCE = {
    **{f"model.{k}": v for k, v in _defaults(ModelConfig).items()},
    **{f"train.{k}": v for k, v in _defaults(TrainConfig).items()},
    **{f"analysis.heads.{k}": v for k, v in _defaults(HeadsConfig).items()},
    "data.n_train_sequences": _defaults(DataConfig)["n_train_sequences"],
}  # schema defaults: how unusual a size is


@dataclass(frozen=True)
class Size:
    """One size a term grows with: its key (as the user would change it) and value."""

    key: str
    value: int
    reference: int  # its schema default

    @property
    def ratio(self) -> float:
        return self.value / max(1, self.reference)


@dataclass(frozen=True)
class Term:
    what: str  # what the bytes are, in words
    bytes: int
    sizes: tuple[Size, ...]  # what it grows with
    host: bool = False  # in host memory whatever the device (the synthetic data)


@dataclass(frozen=True)
class Estimate:
    what: str  # "the model, its optimizer and the largest buffers"
    terms: tuple[Term, ...]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


class _Shape:
    """A model's sizes as `Size`s, keyed for the user: `model.d_vocab` from params.yaml, or
    `<config.json>: d_vocab` for a checkpoint's shape (params' model.* are not used then)."""

    def __init__(self, m: ModelConfig, source: str | None = None):
        self.m = m
        for name in ("n_layers", "n_heads", "d_head", "d_model", "n_ctx", "d_vocab"):
            key = f"model.{name}" if source is None else f"{source}: {name}"
            setattr(self, name, Size(key, getattr(m, name), REFERENCE[f"model.{name}"]))


def _size(key: str, value: int) -> Size:
    return Size(key, value, REFERENCE[key])  # type: ignore[arg-type]


# --- the model's parameters --------------------------------------------------------


def parameter_count(m: ModelConfig) -> int:
    """Trainable parameters of `AttnOnlyTransformer(m)` (without bias: the biases are buffers)."""
    return sum(_parameter_groups(m).values())


def _parameter_groups(m: ModelConfig) -> dict[str, int]:
    """Parameters of the embeddings, the positional embedding and the layers."""
    ln = m.normalization_type == "LN"
    heads = 4 * m.n_heads * m.d_model * m.d_head + (3 * m.n_heads * m.d_head + m.d_model) * m.use_bias
    return {
        "embeddings": 2 * m.d_vocab * m.d_model + m.d_vocab * m.use_bias,  # W_E, W_U, b_U
        "positions": m.n_ctx * m.d_model,  # W_pos
        "layers": m.n_layers * (heads + 2 * m.d_model * ln) + 2 * m.d_model * ln,  # heads, ln1, ln_final
    }


def _weights(s: _Shape, per_parameter: int, what: str) -> list[Term]:
    """`per_parameter` bytes for every parameter and buffer (biases without use_bias too)."""
    full = _parameter_groups(replace(s.m, use_bias=True))
    return [
        Term(f"the embeddings W_E, W_U ({what})", per_parameter * full["embeddings"], (s.d_vocab, s.d_model)),
        Term(
            f"the positional embedding W_pos ({what})",
            per_parameter * full["positions"],
            (s.n_ctx, s.d_model),
        ),
        Term(
            f"the attention weights ({what})",
            per_parameter * full["layers"],
            (s.n_layers, s.n_heads, s.d_head, s.d_model),
        ),
    ]


# --- activations ---------------------------------------------------------------------


def _training_step(s: _Shape, batch: Size) -> list[Term]:
    """One step's forward and backward pass on [batch, n_ctx] (float32): what autograd keeps
    and the gradients of it. The fused attention keeps each layer's pattern; everything else
    is [batch, n_ctx, d_model or n_heads x d_head] per layer (~4 + 5 with LayerNorm, and 8 of
    q, k, v, their reshaped copies, the outputs and the gradients of the kernel)."""
    m, B, T = s.m, batch.value, s.m.n_ctx
    ln = 5 * (m.normalization_type == "LN")
    streams = m.n_layers * ((4 + ln) * m.d_model + 8 * m.n_heads * m.d_head) + 4 * m.d_model
    return [
        Term(
            "the attention patterns of a training batch, [batch, n_heads, n_ctx, n_ctx] float32 per layer",
            FLOAT32 * m.n_layers * B * m.n_heads * T * T,
            (batch, s.n_heads, s.n_ctx),
        ),
        Term(
            "the logits of a training batch, [batch, n_ctx, d_vocab] float32: a copy, their log-softmax "
            "and the gradients",
            4 * FLOAT32 * B * T * m.d_vocab,
            (batch, s.n_ctx, s.d_vocab),
        ),
        Term(
            "the residual streams, queries, keys and values of a training batch, and their gradients",
            2 * FLOAT32 * B * T * streams + 2 * INT64 * B * T,
            (batch, s.n_ctx, s.d_model),
        ),
    ]


@dataclass(frozen=True)
class _Batch:
    """An evaluation batch [n, pos] and the sizes that set it."""

    n: Size
    length: Size  # what sets pos: model.n_ctx or a probe's span length
    pos: int
    where: str  # its name in messages
    dims: tuple[str, str]  # the names of n and pos in messages: ("eval_sequences", "n_ctx")


def _kept(s: _Shape, b: _Batch, dtype: int) -> list[Term]:
    """`run_with_cache`'s cache: every layer's pattern, head results and residual stream."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    return [
        Term(
            f"the attention patterns of {b.where}, [{n_}, n_heads, {pos_}, {pos_}] {DTYPES[dtype]} per layer",
            dtype * m.n_layers * n * m.n_heads * T * T,
            (b.n, s.n_heads, b.length),
        ),
        Term(
            f"the cached head results of {b.where}, [{n_}, {pos_}, n_heads, d_model] per layer",
            dtype * m.n_layers * n * T * (m.n_heads + 1) * m.d_model,
            (b.n, b.length, s.d_model),
        ),
    ]


def _computing(s: _Shape, b: _Batch, dtype: int) -> list[Term]:
    """Beside the cache while `run_with_cache` runs: one layer's scores and masked scores and
    its queries, keys and values; then the logits (the matmul's output and the bias added)."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    return [
        Term(
            f"one layer's attention scores on {b.where}",
            dtype * n * (2 * m.n_heads * T * T + 3 * T * m.n_heads * m.d_head),
            (b.n, s.n_heads, b.length),
        ),
        Term(
            f"the logits of {b.where}, [{n_}, {pos_}, d_vocab]",
            dtype * 2 * n * T * m.d_vocab,
            (b.n, b.length, s.d_vocab),
        ),
    ]


def loss_chunk(n_ctx: int, d_vocab: int) -> int:
    """Sequences per chunk of train.py's held-out loss: their logits [chunk, n_ctx, d_vocab]
    stay under LOSS_CHUNK elements (a large vocabulary's would not fit at once), at least one.
    Train chunks by it and `_heldout_loss` estimates by it: one rule."""
    return max(1, LOSS_CHUNK // max(1, n_ctx * d_vocab))


def _heldout_loss(s: _Shape, n_eval: int) -> Term:
    """train.py's held-out loss: a chunk of sequences at a time (logits, their copy and
    log-softmax, the fused attention's pattern), never fewer than one sequence."""
    m, T = s.m, s.m.n_ctx
    chunk = min(n_eval, loss_chunk(T, m.d_vocab))
    per_sequence = T * (3 * m.d_vocab + m.n_heads * T + 4 * m.d_model + 4 * m.n_heads * m.d_head) + T
    return Term(
        "the held-out loss, a chunk of sequences at a time",
        FLOAT32 * chunk * per_sequence,
        (s.d_vocab, s.n_ctx),
    )


def _evaluation(s: _Shape, t: TrainConfig, n_eval: int) -> list[Term]:
    """train.py's `evaluate`: the held-out loss, then the induction probe's cached pass."""
    probe = _Batch(
        _size("train.eval_batch_size", t.eval_batch_size),
        _size("train.probe_length", t.probe_length),
        1 + 2 * t.probe_length,
        "the induction probe",
        ("eval_batch_size", "1 + 2 probe_length"),
    )
    return _larger([_heldout_loss(s, n_eval)], [*_kept(s, probe, FLOAT32), *_computing(s, probe, FLOAT32)])


def _synthetic_data(s: _Shape, data: DataConfig) -> list[Term]:
    """data.source = synthetic: every sequence generated up front, [n_train_sequences, n_ctx]
    int64, with the generator's vectors (text and token files are memory-mapped: nothing)."""
    if data.source != "synthetic":
        return []
    N = _size("data.n_train_sequences", data.n_train_sequences)
    return [
        Term(
            "the synthetic data, [n_train_sequences, n_ctx] int64 generated up front",
            INT64 * (N.value * (s.m.n_ctx + GENERATOR_VECTORS) + VOCABULARY_VECTORS * s.m.d_vocab),
            (N, s.n_ctx),
            host=True,
        )
    ]


def _n_eval(data: DataConfig, n: int) -> int:
    """How many held-out sequences data.load gives when asked for `n` (synthetic: at most the
    held-out part; text and token files: at most `n` windows)."""
    if data.source == "synthetic":
        return min(n, max(1, int(data.n_train_sequences * data.eval_fraction)))
    return n


def _larger(*groups: list[Term]) -> list[Term]:
    """The group of buffers with the largest total: they are not alive at the same time."""
    return max(groups, key=lambda g: sum(t.bytes for t in g))


# --- the stages ----------------------------------------------------------------------


def training(cfg: Config) -> Estimate:
    """The train stage training a new model (float32 on train.device):

    - every parameter five times: weights, gradients, AdamW's two moments, the step's temporary;
    - the larger of a training step (`_training_step`: patterns, logits, residual streams and
      their gradients) and an evaluation (`_evaluation`: held-out loss chunks, the probe's
      cached pass);
    - the synthetic data generated up front (host memory; `_synthetic_data`).
    """
    s, t = _Shape(cfg.model), cfg.train
    step = _training_step(s, _size("train.batch_size", t.batch_size))
    evaluation = _evaluation(s, t, _n_eval(cfg.data, t.eval_batch_size))
    terms = [
        *_weights(s, TRAINING_COPIES * FLOAT32, "weights, gradients and AdamW's moments"),
        *_larger(step, evaluation),
        *_synthetic_data(s, cfg.data),
    ]
    return Estimate("the model, its optimizer and the largest buffers", tuple(terms))


def loading(model: ModelConfig, cfg: Config, source: str) -> Estimate:
    """The train stage loading a checkpoint of shape `model` (its config.json, `source`) and
    evaluating it: the checkpoint's tensors and the model built from them (float32), one
    evaluation, and the synthetic data (generated whole even when only evaluating)."""
    s = _Shape(model, source)
    terms = [
        *_weights(s, 2 * FLOAT32, "the checkpoint's tensors and the model's"),
        *_evaluation(s, cfg.train, _n_eval(cfg.data, cfg.train.eval_batch_size)),
        *_synthetic_data(s, cfg.data),
    ]
    return Estimate("the checkpoint and the largest evaluation buffers", tuple(terms))


def _ablation(s: _Shape, b: _Batch) -> list[Term]:
    """ablation.path_ablation on batch `b` (float64): its cached pass and the clean logits,
    kept throughout, and one chunk of stacked source heads (at most ABLATION_CHUNK elements of
    head results, but never fewer than one head): the previous block call's results, deltas
    and patterns stay bound while the next call computes its own (scores, masked scores,
    patterns, the einsum's result and its copy, the streams and q, k, v), or while the later
    heads' loss passes run (streams, logits with their copy and log-softmax, the fused
    attention's patterns; at most ABLATION_CHUNK elements of logits, at least one head). The
    pattern effect's one buffer of pattern differences [sources x n, n_heads, pos, pos] lives
    between a block call and the loss passes, beside that call's outputs only, so below the
    call's own peak (its scores, masked scores and patterns): no term of its own."""
    m, n, T = s.m, b.n.value, b.pos
    n_, pos_ = b.dims
    H, D, V = m.n_heads, m.d_model, m.d_vocab
    sources = min(H, max(1, ABLATION_CHUNK // max(1, n * T * H * D)))
    losses = min(H, max(1, ABLATION_CHUNK // max(1, n * T * V)))
    outputs = sources * n * (2 * T * H * D + H * T * T)  # result, delta, pattern
    block_call = sources * n * (3 * H * T * T + 2 * T * H * D + 6 * T * D)
    loss_passes = losses * n * T * (4 * V + 2 * D + H * T)
    vocab = loss_passes > block_call
    chunk = Term(
        f"one chunk of the path ablation on {b.where}",
        FLOAT64 * (outputs + max(block_call, loss_passes)),
        (b.n, b.length, s.d_vocab) if vocab else (b.n, b.length, s.n_heads, s.d_model),
    )
    logits = Term(
        f"the logits of {b.where}, [{n_}, {pos_}, d_vocab], with their copy and log-softmax",
        FLOAT64 * 3 * n * T * V,
        (b.n, b.length, s.d_vocab),
    )
    return [*_kept(s, b, FLOAT64), logits, chunk]


def heads_stage(model: ModelConfig, h: HeadsConfig, data: DataConfig, source: str) -> Estimate:
    """The heads stage on a checkpoint of shape `model` (its config.json, `source`), on the CPU
    in float64:

    - every parameter 3 x 8 bytes: the model and the head weights in float64, and the copy
      power_of_two_scaled makes (the checkpoint's float32 tensors are freed by then);
    - the largest of: `pattern_scores` (the caches of the probe [eval_sequences,
      1 + 2 repeat_length] and of the held-out batch [eval_sequences, n_ctx], both kept, and
      what computing either needs beside them) and the path ablation of either batch
      (`_ablation`);
    - the synthetic data generated up front (`_synthetic_data`).
    """
    s = _Shape(model, source)
    E = _size("analysis.heads.eval_sequences", h.eval_sequences)
    probe = _Batch(
        E,
        _size("analysis.heads.repeat_length", h.repeat_length),
        1 + 2 * h.repeat_length,
        "the probe",
        ("eval_sequences", "1 + 2 repeat_length"),
    )
    held = _Batch(
        Size(E.key, _n_eval(data, h.eval_sequences), E.reference),
        s.n_ctx,
        model.n_ctx,
        "the held-out batch",
        ("eval_sequences", "n_ctx"),
    )
    scores = [
        *_kept(s, probe, FLOAT64),
        *_kept(s, held, FLOAT64),
        *_larger(_computing(s, probe, FLOAT64), _computing(s, held, FLOAT64)),
    ]
    terms = [
        *_weights(s, 3 * FLOAT64, "the model and the head weights in float64, and a copy"),
        *_larger(scores, _ablation(s, probe), _ablation(s, held)),
        *_synthetic_data(s, data),
    ]
    return Estimate("the model, its weights and the largest analysis buffers", tuple(terms))


# --- the check -----------------------------------------------------------------------

MEMINFO = Path("/proc/meminfo")


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of /proc/meminfo (Linux): memory new allocations can get without swapping.
    None where it cannot be read (other operating systems): the check is then skipped."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == "MemAvailable":
                value, *unit = rest.split()
                return int(value) * (1024 if unit == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def human(n: float) -> str:
    """Bytes in decimal units, one decimal: 12.0 TB."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} YB"


def culprit(terms: Iterable[Term]) -> Size:
    """The size that makes the largest term large: the one furthest above its schema default."""
    return max(max(terms, key=lambda t: t.bytes).sizes, key=lambda s: s.ratio)


def require_fits(estimate: Estimate, available: int | None, device_available: int | None = None) -> None:
    """Refuse, naming the key, an estimate above the memory available; nothing is checked when
    `available` is None. With `device_available` (training on a GPU: its free memory), only the
    host terms (the synthetic data) are held against `available`, the rest against it."""
    if device_available is None:
        _require(estimate.what, estimate.terms, available, "of memory available")
        return
    _require(estimate.what, [t for t in estimate.terms if not t.host], device_available, "of GPU memory free")
    _require(estimate.what, [t for t in estimate.terms if t.host], available, "of memory available")


def _require(what: str, terms: list[Term] | tuple[Term, ...], available: int | None, of: str) -> None:
    need = sum(t.bytes for t in terms)
    if available is None or not terms or need <= available:
        return
    size, largest = culprit(terms), max(terms, key=lambda t: t.bytes)
    needs = f"{largest.what} needs" if len(terms) == 1 else f"{what} need"
    most = "" if len(terms) == 1 else f" (most of it {largest.what})"
    problem = f"{needs} about {human(need)}{most}, more than the {human(available)} {of}"
    raise UserError(size.key, problem, size.value)
