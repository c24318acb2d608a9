"""Token sequences for training and evaluation: synthetic, tokenized text, or a token file.

Three sources (`data.source`), all ending in the same `Dataset`: a training source
that samples `[batch, n_ctx]` batches from a seeded generator, held-out evaluation
windows, the held-out stream the induction probe draws from, and a manifest (what was
read, with sha256, or how it was generated).

- `synthetic`: seeded sequences (see `synthetic_sequences`).
- `text`: the tokenizer stage's output (`tokens.npy`, `manifest.json`): a corpus or
  local text files, BPE-tokenized; the tokenizer stage decides the held-out part.
- `tokens`: a `.npy` array of token ids under `data.dir`, memory-mapped (never
  loaded whole), for users with their own tokenizer; its last `data.eval_fraction` is
  held out.

For `text` and `tokens`, training windows may be given copies of earlier spans
(`data.copies.rate` > 0, the process the synthetic data uses): in a CPU's budget of
tokens, natural text alone repeats too rarely for induction heads to form
(docs/training.md, "Training on text"). Held-out windows and the probe are never changed.
`eval_sequences` gives the held-out sequences of any source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .. import io, memory, streams
from ..config import CopiesConfig, DataConfig, ModelConfig
from ..errors import UserError

# --- copies of earlier spans (synthetic and text) ----------------------------------
#
# Sequences are written left to right. While a copy is running, the token `distance`
# positions back is repeated; a copy starts at each free position with probability
# `copies.rate`, with a length in [min_span, max_span] and a distance drawn uniformly
# from [min_distance, position]. Copy distances are uniform over every earlier position,
# so no head attending to a fixed offset can predict a copy: only matching on content
# (induction) does; copies of copies make this common.


class _Copier:
    """The copy process over `n` sequences, one position at a time (same draws in every use)."""

    def __init__(self, n: int, copies: CopiesConfig, rng: np.random.Generator):
        self.copies, self.rng = copies, rng
        self.rows = np.arange(n)
        self.distance = np.zeros(n, dtype=np.int64)
        self.left = np.zeros(n, dtype=np.int64)  # tokens left to copy

    def write(self, x: np.ndarray, t: int, background: np.ndarray, rate: float | None = None) -> int:
        """x[:, t]: a copied token where a copy runs, else `background` [n]. Returns how many
        copied tokens it wrote. `rate`: instead of copies.rate (the annealed rate)."""
        c, rng, n = self.copies, self.rng, len(self.rows)
        start = (self.left <= 0) & (rng.random(n) < (c.rate if rate is None else rate))
        if t >= c.min_distance and start.any():
            span = t - c.min_distance + 1  # distances min_distance .. t
            self.distance = np.where(
                start, c.min_distance + (rng.random(n) * span).astype(np.int64), self.distance
            )
            self.left = np.where(start, rng.integers(c.min_span, c.max_span + 1, size=n), self.left)
        copying = self.left > 0
        x[:, t] = np.where(copying, x[self.rows, np.maximum(t - self.distance, 0)], background)
        self.left = self.left - copying
        return int(copying.sum())


def with_copies(
    windows: np.ndarray, copies: CopiesConfig, rng: np.random.Generator, rate: float | None = None
) -> tuple[np.ndarray, int]:
    """`windows` [n, n_ctx] with copies of earlier spans written over them (at `rate`, else
    copies.rate), and the number of copied tokens."""
    x = np.array(windows, dtype=np.int64)
    copier = _Copier(len(x), copies, rng)
    copied = sum(copier.write(x, t, x[:, t].copy(), rate) for t in range(x.shape[1]))
    return x, copied


def copy_rate(copies: CopiesConfig, step: int, steps: int) -> float:
    """The copy rate at training step `step` of `steps`: copies.rate until anneal_start x steps,
    falling linearly to 0 at anneal_end x steps, 0 after (a step function when the two agree)."""
    f = step / steps
    if f < copies.anneal_start:
        return copies.rate
    if f >= copies.anneal_end:
        return 0.0
    return copies.rate * (copies.anneal_end - f) / (copies.anneal_end - copies.anneal_start)


# --- synthetic ---------------------------------------------------------------------
#
# Each position is a copy (above) or background: "topics" (the vocabulary split at
# random into `topics` groups); the background runs in segments of [min_segment,
# max_segment] positions, each with one topic, and a background token is from the
# current topic with probability `topic_fraction`, else uniform.
# Why each head has a reason to form:
#   induction: a copied token is predicted by finding the earlier occurrence of the
#     current token and reading the token after it;
#   previous-token: the induction head's keys need "my previous token" (K-composition),
#     and distance-2 copies (x_t = x_{t-2}) reward it directly;
#   recent-window: the topic of the next background token is best read off the last
#     several tokens (one token is off-topic with probability 1 - topic_fraction).


def _topics(
    d_vocab: int, n_topics: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random partition of the vocabulary: members sorted by topic, each topic's offset and size."""
    topic_of = rng.permutation(d_vocab) % n_topics  # token -> topic
    order = np.argsort(topic_of, kind="stable")  # tokens grouped by topic
    sizes = np.bincount(topic_of, minlength=n_topics)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, offsets, sizes


def synthetic_sequences(n: int, model: ModelConfig, data: DataConfig, rng: np.random.Generator) -> np.ndarray:
    """`n` sequences [n, n_ctx] of token ids (int64), vectorised over sequences (see above)."""
    syn = data.synthetic
    V, T = model.d_vocab, model.n_ctx
    if syn.topics > V:
        raise UserError("data.synthetic.topics", f"must be <= model.d_vocab = {V}", syn.topics)
    members, offsets, sizes = _topics(V, syn.topics, rng)
    x = np.empty((n, T), dtype=np.int64)
    topic = rng.integers(syn.topics, size=n)
    topic_left = rng.integers(syn.min_segment, syn.max_segment + 1, size=n)  # positions left in the segment
    copier = _Copier(n, data.copies, rng)
    for t in range(T):
        new_topic = topic_left <= 0
        topic = np.where(new_topic, rng.integers(syn.topics, size=n), topic)
        new_left = rng.integers(syn.min_segment, syn.max_segment + 1, size=n)
        topic_left = np.where(new_topic, new_left, topic_left) - 1
        in_topic = members[offsets[topic] + (rng.random(n) * sizes[topic]).astype(np.int64)]
        background = np.where(rng.random(n) < syn.topic_fraction, in_topic, rng.integers(V, size=n))
        copier.write(x, t, background)
    return x


# --- the induction probe -----------------------------------------------------------


def repeated_random_tokens(n: int, length: int, d_vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[n, 1 + 2 * length]: a first token (0), then a uniformly random span of `length` tokens twice."""
    first = torch.zeros(n, 1, dtype=torch.long)
    span = torch.randint(0, d_vocab, (n, length), generator=generator)
    return torch.cat([first, span, span], dim=1)


def repeated_heldout_spans(
    heldout: np.ndarray, n: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """[n, 1 + 2 * length]: a held-out token, then the `length` held-out tokens after it, twice."""
    if len(heldout) < length + 1:
        raise UserError("held-out data", f"{len(heldout)} tokens: too few for a probe span of {length}")
    starts = torch.randint(0, len(heldout) - length, (n,), generator=generator).tolist()
    windows = np.stack([np.asarray(heldout[s : s + length + 1]) for s in starts]).astype(np.int64)
    windows = torch.from_numpy(windows)  # [n, 1 + length]: first, span
    return torch.cat([windows, windows[:, 1:]], dim=1)


def repeated_probe(
    dataset: Dataset, n: int, length: int, d_vocab: int, seed: int, batch: int = 0
) -> torch.Tensor:
    """The induction probe `[first, span, span]`, [n, 1 + 2 * length]: evaluation batch `batch`
    of run `seed`, drawn from its stream (`streams`: "probe", batch).

    In the second copy, position i's induction target is i - length + 1 (the token after
    the earlier copy of i's token). Text and token sources: spans of held-out data, so the
    tokens are in the distribution the model learned (a uniformly random token of a large
    vocabulary is often one it never saw); synthetic: uniformly random tokens. The train
    stage's curve and the heads stage both use this one function.
    """
    gen = torch.Generator().manual_seed(streams.seed_of(seed, "probe", batch))
    if dataset.heldout is None:
        return repeated_random_tokens(n, length, d_vocab, gen)
    return repeated_heldout_spans(dataset.heldout, n, length, gen)


# --- sources -----------------------------------------------------------------------


class Rows:
    """Training sequences held as rows `[n, n_ctx]`; a batch is rows drawn with replacement."""

    def __init__(self, rows: np.ndarray):
        self.rows = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    def batch(self, size: int, generator: torch.Generator, rate: float | None = None) -> torch.Tensor:
        """`rate` is not used: these sequences were written, copies and all, before training."""
        idx = torch.randint(0, len(self.rows), (size,), generator=generator)
        return self.rows[idx]  # [batch, n_ctx]


class Stream:
    """A 1-D token stream (array or memmap); a batch is `size` windows at random starts,
    with copies of earlier spans written over them when `copies.rate` > 0."""

    def __init__(self, tokens: np.ndarray, n_ctx: int, copies: CopiesConfig | None = None):
        self.tokens, self.n_ctx, self.copies = tokens, n_ctx, copies
        self.tokens_drawn = self.tokens_copied = 0  # over every batch so far: the copies' share

    def batch(self, size: int, generator: torch.Generator, rate: float | None = None) -> torch.Tensor:
        """`rate`: the copy rate for this batch (the annealed one), else copies.rate. The same
        draws are taken from `generator` whatever the rate, so a schedule changes no window."""
        starts = torch.randint(0, len(self.tokens) - self.n_ctx + 1, (size,), generator=generator).tolist()
        windows = np.stack([np.asarray(self.tokens[s : s + self.n_ctx]) for s in starts]).astype(np.int64)
        if self.copies is not None and self.copies.rate > 0:
            drawn = int(torch.randint(0, 2**62, (1,), generator=generator))  # from the batches stream
            windows, copied = with_copies(windows, self.copies, np.random.default_rng(drawn), rate)
            self.tokens_copied += copied
        self.tokens_drawn += windows.size
        return torch.from_numpy(windows)  # [batch, n_ctx]


@dataclass
class Dataset:
    train: Rows | Stream | None  # None when only evaluating (train.source = load)
    eval: torch.Tensor  # [n_eval, n_ctx] held-out sequences
    heldout: np.ndarray | None  # the held-out token stream (text, tokens); None for synthetic
    manifest: dict  # inputs and their sha256, or the generator's parameters


def _resolve(root: Path, relative: str, key: str) -> Path:
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise UserError(key, f"must stay inside data.dir = {str(root)!r}", relative)
    return path


def _eval_windows(heldout: np.ndarray, n_ctx: int, n_eval: int) -> torch.Tensor:
    """Up to `n_eval` consecutive, non-overlapping windows [n, n_ctx] from the held-out stream."""
    n = min(n_eval, len(heldout) // n_ctx)
    rows = np.stack([np.asarray(heldout[i * n_ctx : (i + 1) * n_ctx]) for i in range(n)])
    return torch.from_numpy(rows.astype(np.int64))


def _require_windows(n_train: int, n_held: int, n_ctx: int, where: str, hint: str) -> None:
    if n_train < n_ctx + 1 or n_held < n_ctx:
        raise UserError(
            where,
            f"{n_train} training and {n_held} held-out tokens: too few for n_ctx = {n_ctx} windows ({hint})",
        )


def _check_ids(tokens: np.ndarray, d_vocab: int, where: str) -> None:
    if len(tokens):
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= d_vocab:
            raise UserError(where, f"token ids span [{lo}, {hi}]: must lie in [0, model.d_vocab = {d_vocab})")


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def load_text(
    directory: Path, data: DataConfig, model: ModelConfig, n_eval: int, need_train: bool
) -> Dataset:
    """The tokenizer stage's `tokens.npy` (memory-mapped) and `manifest.json` in `directory`."""
    manifest = io.read_json(directory / "manifest.json")
    if (
        not isinstance(manifest, dict)
        or manifest.get("source") != "text"
        or not all(_is_count(manifest.get(k)) for k in ("train_tokens", "vocab"))
    ):
        raise UserError(
            str(directory / "manifest.json"), "not the tokenizer stage's output for data.source = text"
        )
    path = directory / "tokens.npy"
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
        raise UserError(str(path), f"not a readable .npy array ({str(e).splitlines()[0][:200]})") from None
    if manifest["vocab"] > model.d_vocab:
        problem = f"the tokenizer ({directory}) has {manifest['vocab']} tokens: must be at least that"
        raise UserError("model.d_vocab", problem, model.d_vocab)
    cut = int(manifest["train_tokens"])
    _require_windows(cut, len(tokens) - cut, model.n_ctx, str(path), "more text, or a smaller model.n_ctx")
    heldout = tokens[cut:]
    train = Stream(tokens[:cut], model.n_ctx, data.copies) if need_train else None
    copies = {"copies": asdict(data.copies)} if data.copies.rate > 0 else {}
    return Dataset(train, _eval_windows(heldout, model.n_ctx, n_eval), heldout, manifest | copies)


def load_tokens(data: DataConfig, model: ModelConfig, n_eval: int, need_train: bool) -> Dataset:
    """A `.npy` array of integer token ids, memory-mapped and flattened to one stream."""
    relative = data.tokens.path
    if relative is None:  # DataConfig.check requires it; a caller of the library may pass an unchecked config
        raise UserError("data.tokens.path", "is required when data.source = 'tokens'")
    root = Path(data.dir)
    path = _resolve(root, relative, "data.tokens.path")
    if not path.is_file():
        raise UserError("data.tokens.path", f"file not found under data.dir = {data.dir!r}", relative)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
        raise UserError(str(path), f"not a readable .npy array ({str(e).splitlines()[0][:200]})") from None
    if array.dtype.kind not in "iu":
        raise UserError(str(path), f"token ids must be integers, got dtype {array.dtype}")
    tokens = array.reshape(-1)
    _check_ids(tokens, model.d_vocab, str(path))
    cut = len(tokens) - int(len(tokens) * data.eval_fraction)
    _require_windows(cut, len(tokens) - cut, model.n_ctx, str(path), f"eval_fraction = {data.eval_fraction}")
    entry = {"path": Path(relative).as_posix(), "bytes": path.stat().st_size, "sha256": io.sha256_file(path)}
    manifest = {
        "source": "tokens", "dir": data.dir, "files": [entry], "dtype": str(array.dtype),
        "tokens": int(len(tokens)), "train_tokens": int(cut), "eval_tokens": int(len(tokens) - cut),
    }  # fmt: skip
    if data.copies.rate > 0:
        manifest["copies"] = asdict(data.copies)
    heldout = tokens[cut:]
    train = Stream(tokens[:cut], model.n_ctx, data.copies) if need_train else None
    return Dataset(train, _eval_windows(heldout, model.n_ctx, n_eval), heldout, manifest)


def load_synthetic(data: DataConfig, model: ModelConfig, n_eval: int, seed: int, need_train: bool) -> Dataset:
    """`data.n_train_sequences` seeded sequences; the first `eval_fraction` of them are held out."""
    rows = synthetic_sequences(
        data.n_train_sequences, model, data, np.random.default_rng(streams.seed_of(seed, "data"))
    )
    n_held = max(1, int(len(rows) * data.eval_fraction))
    if len(rows) - n_held < 1:
        problem = f"leaves no training sequences after holding out eval_fraction = {data.eval_fraction}"
        raise UserError("data.n_train_sequences", problem, data.n_train_sequences)
    manifest = {
        "source": "synthetic", "seed": seed, "sequences": int(len(rows)),
        "train_sequences": int(len(rows) - n_held), "eval_sequences": n_held,
        "synthetic": asdict(data.synthetic), "copies": asdict(data.copies),
    }  # fmt: skip
    train = Rows(rows[n_held:]) if need_train else None
    return Dataset(train, torch.from_numpy(rows[: min(n_eval, n_held)].copy()), None, manifest)


def load(
    data: DataConfig,
    model: ModelConfig,
    seed: int,
    n_eval: int,
    tokenized: str | Path | None = None,
    need_train: bool = True,
) -> Dataset:
    """The configured source as a `Dataset` (`need_train=False`: evaluation data only).

    `tokenized`: the tokenizer stage's output directory, which data.source = text reads.
    """
    if data.source == "text":
        if tokenized is None:
            raise UserError("data.source", "text needs the tokenizer stage's output (--tokenized)", "text")
        return load_text(Path(tokenized), data, model, n_eval, need_train)
    if data.source == "tokens":
        return load_tokens(data, model, n_eval, need_train)
    return load_synthetic(data, model, n_eval, seed, need_train)


# --- memory: what loading the data allocates, for pipeline/memory.py's check ---------------

# synthetic_sequences' per-position vectors of one int64 or float64 per sequence (topic, segment
# lengths, draws, the copier's state), and _topics' partition of the vocabulary (a permutation,
# its order, the topic of each token)
GENERATOR_VECTORS = 12
VOCABULARY_VECTORS = 3


def synthetic_terms(s: memory.Shape, data: DataConfig) -> list[memory.Term]:
    """data.source = synthetic: every sequence generated up front, [n_train_sequences, n_ctx]
    int64, with the generator's vectors (text and token files are memory-mapped: nothing)."""
    if data.source != "synthetic":
        return []
    N = memory.size("data.n_train_sequences", data.n_train_sequences)
    return [
        memory.Term(
            "the synthetic data, [n_train_sequences, n_ctx] int64 generated up front",
            memory.INT64 * (N.value * (s.m.n_ctx + GENERATOR_VECTORS) + VOCABULARY_VECTORS * s.m.d_vocab),
            (N, s.n_ctx),
            host=True,
        )
    ]


def eval_count(data: DataConfig, n: int) -> int:
    """At most how many held-out sequences `load` gives when asked for `n` (synthetic: at most
    the held-out part; text and token files: at most `n` windows)."""
    if data.source == "synthetic":
        return min(n, max(1, int(data.n_train_sequences * data.eval_fraction)))
    return n
