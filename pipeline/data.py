"""Token sequences for training and evaluation: synthetic, local text, or a token file.

Three sources (`data.source`), all ending in the same `Dataset`: a training source
that samples `[batch, n_ctx]` batches from a seeded generator, a held-out evaluation
batch, and a manifest (what was read, with sha256, or how it was generated).

- `synthetic`: seeded sequences (see `synthetic_sequences`).
- `text`: local files matched by `data.text.glob` under `data.dir`, read as bytes:
  token = byte value (d_vocab >= 256). Files are concatenated in sorted path order.
- `tokens`: a `.npy` array of token ids under `data.dir`, memory-mapped (never
  loaded whole), for users with their own tokenizer.

For `text` and `tokens` the last `data.eval_fraction` of the token stream is held
out; training windows are drawn only from the rest. For `synthetic` the first
`data.eval_fraction` of the `data.n_train_sequences` generated sequences are held out.
`eval_sequences` gives the held-out sequences of any source.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.config import DataConfig, ModelConfig
from pipeline.errors import UserError

BYTE_VOCAB = 256


# --- synthetic ---------------------------------------------------------------------
#
# Sequences are written left to right. Each position is either
#   - a copy: while a copy is running, the token `distance` positions back is repeated;
#     a copy starts at each free position with probability `copy_rate`, with a length in
#     [min_span, max_span] and a distance drawn uniformly from [min_distance, position];
#   - or background: "topics" (the vocabulary split at random into `topics` groups);
#     the background runs in segments of [min_segment, max_segment] positions, each with one
#     topic, and a background token is from the current topic with probability
#     `topic_fraction`, else uniform.
# Why each head has a reason to form:
#   induction: a copied token is predicted by finding the earlier occurrence of the
#     current token and reading the token after it; copies of copies make this common;
#   previous-token: the induction head's keys need "my previous token" (K-composition),
#     and distance-2 copies (x_t = x_{t-2}) reward it directly;
#   recent-window: the topic of the next background token is best read off the last
#     several tokens (one token is off-topic with probability 1 - topic_fraction).
# Copy distances are uniform over every earlier position, so no head attending to a
# fixed offset can predict a copy: only matching on content (induction) does.


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
    rows = np.arange(n)
    x = np.empty((n, T), dtype=np.int64)
    topic = rng.integers(syn.topics, size=n)
    topic_left = rng.integers(syn.min_segment, syn.max_segment + 1, size=n)  # positions left in the segment
    distance = np.zeros(n, dtype=np.int64)
    copy_left = np.zeros(n, dtype=np.int64)  # tokens left to copy
    for t in range(T):
        new_topic = topic_left <= 0
        topic = np.where(new_topic, rng.integers(syn.topics, size=n), topic)
        topic_left = (
            np.where(new_topic, rng.integers(syn.min_segment, syn.max_segment + 1, size=n), topic_left) - 1
        )
        in_topic = members[offsets[topic] + (rng.random(n) * sizes[topic]).astype(np.int64)]
        background = np.where(rng.random(n) < syn.topic_fraction, in_topic, rng.integers(V, size=n))
        start = (copy_left <= 0) & (rng.random(n) < syn.copy_rate)
        if t >= syn.min_distance and start.any():
            span = t - syn.min_distance + 1  # distances min_distance .. t
            distance = np.where(start, syn.min_distance + (rng.random(n) * span).astype(np.int64), distance)
            copy_left = np.where(start, rng.integers(syn.min_span, syn.max_span + 1, size=n), copy_left)
        copying = copy_left > 0
        x[:, t] = np.where(copying, x[rows, np.maximum(t - distance, 0)], background)
        copy_left = copy_left - copying
    return x


# --- evaluation probe --------------------------------------------------------------


def repeated_random_tokens(n: int, length: int, d_vocab: int, generator: torch.Generator) -> torch.Tensor:
    """[n, 1 + 2 * length]: a first token, then a random span of `length` tokens twice.

    The evaluation input for induction (DESIGN.md): in the second copy, position
    i's induction target is i - length + 1 (the token after the earlier copy of i's token).
    """
    first = torch.zeros(n, 1, dtype=torch.long)
    span = torch.randint(0, d_vocab, (n, length), generator=generator)
    return torch.cat([first, span, span], dim=1)


# --- sources -----------------------------------------------------------------------


class Rows:
    """Training sequences held as rows `[n, n_ctx]`; a batch is rows drawn with replacement."""

    def __init__(self, rows: np.ndarray):
        self.rows = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        idx = torch.randint(0, len(self.rows), (size,), generator=generator)
        return self.rows[idx]  # [batch, n_ctx]


class Stream:
    """A 1-D token stream (array or memmap); a batch is `size` windows at random starts."""

    def __init__(self, tokens: np.ndarray, n_ctx: int):
        self.tokens, self.n_ctx = tokens, n_ctx

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(self.tokens) - self.n_ctx + 1, (size,), generator=generator).tolist()
        windows = np.stack([np.asarray(self.tokens[s : s + self.n_ctx]) for s in starts])
        return torch.from_numpy(windows.astype(np.int64))  # [batch, n_ctx]


@dataclass
class Dataset:
    train: Rows | Stream | None  # None when only evaluating (train.source = load)
    eval: torch.Tensor  # [n_eval, n_ctx] held-out sequences
    manifest: dict  # inputs and their sha256, or the generator's parameters


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _resolve(root: Path, relative: str, key: str) -> Path:
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise UserError(key, f"must stay inside data.dir = {str(root)!r}", relative)
    return path


def _split_stream(tokens: np.ndarray, n_ctx: int, data: DataConfig, n_eval: int, where: str):
    """Train part and evaluation windows `[<=n_eval, n_ctx]` from the held-out tail."""
    n_held = int(len(tokens) * data.eval_fraction)
    if len(tokens) - n_held < n_ctx + 1 or n_held < n_ctx:
        need = int(np.ceil(n_ctx / min(data.eval_fraction, 1 - data.eval_fraction))) + n_ctx
        raise UserError(
            where,
            f"{len(tokens)} tokens: too few for n_ctx = {n_ctx} windows with eval_fraction = "
            f"{data.eval_fraction} (need about {need})",
        )
    cut = len(tokens) - n_held
    n_windows = min(n_eval, n_held // n_ctx)
    eval_rows = np.stack(
        [np.asarray(tokens[cut + i * n_ctx : cut + (i + 1) * n_ctx]) for i in range(n_windows)]
    )
    return tokens[:cut], torch.from_numpy(eval_rows.astype(np.int64)), cut


def load_text(data: DataConfig, model: ModelConfig, n_eval: int, need_train: bool = True) -> Dataset:
    """Local text files as bytes (token = byte), sorted by path, concatenated."""
    if model.d_vocab < BYTE_VOCAB:
        raise UserError(
            "model.d_vocab",
            f"data.source = 'text' uses byte tokens: needs d_vocab >= {BYTE_VOCAB}",
            model.d_vocab,
        )
    root = Path(data.dir)
    pattern = data.text.glob
    assert pattern is not None  # DataConfig.check requires it
    if not root.is_dir():
        raise UserError("data.dir", "directory not found", data.dir)
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    for path in files:  # a symlink under data.dir must not lead outside it (DVC tracks data.dir only)
        _resolve(root, path.relative_to(root).as_posix(), "data.text.glob")
    if not files:
        raise UserError("data.text.glob", f"matches no files under data.dir = {data.dir!r}", pattern)
    chunks, listed = [], []
    for path in files:
        raw = path.read_bytes()
        chunks.append(np.frombuffer(raw, dtype=np.uint8))
        listed.append(
            {
                "path": path.relative_to(root).as_posix(),
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    tokens = np.concatenate(chunks)
    train, eval_rows, cut = _split_stream(tokens, model.n_ctx, data, n_eval, f"data.text.glob = {pattern!r}")
    manifest = {
        "source": "text",
        "dir": data.dir,
        "glob": pattern,
        "files": listed,
        "tokens": int(len(tokens)),
        "train_tokens": int(cut),
        "eval_tokens": int(len(tokens) - cut),
    }
    return Dataset(Stream(train, model.n_ctx) if need_train else None, eval_rows, manifest)


def load_tokens(data: DataConfig, model: ModelConfig, n_eval: int, need_train: bool = True) -> Dataset:
    """A `.npy` array of integer token ids, memory-mapped and flattened to one stream."""
    relative = data.tokens.path
    assert relative is not None  # DataConfig.check requires it
    root = Path(data.dir)
    path = _resolve(root, relative, "data.tokens.path")
    if not path.is_file():
        raise UserError("data.tokens.path", f"file not found under data.dir = {data.dir!r}", relative)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(str(path), f"not a readable .npy array ({str(e).splitlines()[0][:200]})") from None
    if array.dtype.kind not in "iu":
        raise UserError(str(path), f"token ids must be integers, got dtype {array.dtype}")
    tokens = array.reshape(-1)
    if len(tokens):
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= model.d_vocab:
            raise UserError(
                str(path), f"token ids span [{lo}, {hi}]: must lie in [0, model.d_vocab = {model.d_vocab})"
            )
    train, eval_rows, cut = _split_stream(tokens, model.n_ctx, data, n_eval, str(path))
    manifest = {
        "source": "tokens",
        "dir": data.dir,
        "files": [
            {"path": Path(relative).as_posix(), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        ],
        "dtype": str(array.dtype),
        "tokens": int(len(tokens)),
        "train_tokens": int(cut),
        "eval_tokens": int(len(tokens) - cut),
    }
    return Dataset(Stream(train, model.n_ctx) if need_train else None, eval_rows, manifest)


def load_synthetic(
    data: DataConfig, model: ModelConfig, n_eval: int, seed: int, need_train: bool = True
) -> Dataset:
    """`data.n_train_sequences` seeded sequences; the first `eval_fraction` of them are held out."""
    rows = synthetic_sequences(data.n_train_sequences, model, data, np.random.default_rng(seed))
    n_held = max(1, int(len(rows) * data.eval_fraction))
    if len(rows) - n_held < 1:
        raise UserError(
            "data.n_train_sequences",
            f"leaves no training sequences after holding out eval_fraction = {data.eval_fraction}",
            data.n_train_sequences,
        )
    manifest = {
        "source": "synthetic",
        "seed": seed,
        "sequences": int(len(rows)),
        "train_sequences": int(len(rows) - n_held),
        "eval_sequences": n_held,
        "synthetic": asdict(data.synthetic),
    }
    train = Rows(rows[n_held:]) if need_train else None
    return Dataset(train, torch.from_numpy(rows[: min(n_eval, n_held)].copy()), manifest)


def load(data: DataConfig, model: ModelConfig, seed: int, n_eval: int, need_train: bool = True) -> Dataset:
    """The configured source as a `Dataset` (`need_train=False`: evaluation rows only)."""
    if data.source == "text":
        return load_text(data, model, n_eval, need_train)
    if data.source == "tokens":
        return load_tokens(data, model, n_eval, need_train)
    return load_synthetic(data, model, n_eval, seed, need_train)


def eval_sequences(data: DataConfig, model: ModelConfig, seed: int, n: int) -> torch.Tensor:
    """Up to `n` held-out sequences `[n, n_ctx]` of any source: those the train stage
    evaluates on and never trains on (for the same seed and config)."""
    return load(data, model, seed, n_eval=n, need_train=False).eval
