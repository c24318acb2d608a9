"""Memory estimates added up and checked before a stage allocates anything.

A config whose tensors cannot fit (an enormous `model.d_vocab` or `model.n_ctx`) is refused in one
line instead of running for minutes, swapping, before it fails.

An estimate is a list of `Term`s: the bytes of one kind of buffer and the sizes it grows
with. Each allocating module reports its own, beside the code that allocates (a rough upper
estimate of its peak: the right order of magnitude, not exact; allocator slack, Python objects
and the libraries' own memory are left out): the model's weights and passes
(pipeline/model/transformer.py), training and evaluation (pipeline/model/train.py), the
synthetic data (pipeline/data/datasets.py), the path ablation (pipeline/behaviour/ablation.py).
Here only what they share: the sizes keyed for the user (`Size`, `Shape`, `Batch`), the sum
(`Estimate`) and the check. `require_fits` compares the sum with the memory available
(`available_bytes`: MemAvailable of /proc/meminfo; where that cannot be read, other operating
systems, nothing is checked) and names the key that makes the largest term large: among that
term's sizes, the one furthest above its schema default (config.py).

Torch-free and pure but for `available_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from .config import DataConfig, HeadsConfig, ModelConfig, TrainConfig
from .errors import UserError

FLOAT32, FLOAT64, INT64 = 4, 8, 8
DTYPES = {FLOAT32: "float32", FLOAT64: "float64"}


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


class Shape:
    """A model's sizes as `Size`s, keyed for the user: `model.d_vocab` from params.yaml, or
    `<config.json>: d_vocab` for a checkpoint's shape (params' model.* are not used then)."""

    def __init__(self, m: ModelConfig, source: str | None = None):
        self.m = m
        for name in ("n_layers", "n_heads", "d_head", "d_model", "n_ctx", "d_vocab"):
            key = f"model.{name}" if source is None else f"{source}: {name}"
            setattr(self, name, Size(key, getattr(m, name), REFERENCE[f"model.{name}"]))


def size(key: str, value: int) -> Size:
    """A config key's size, against its schema default."""
    return Size(key, value, REFERENCE[key])  # type: ignore[arg-type]


@dataclass(frozen=True)
class Batch:
    """An evaluation batch [n, pos] and the sizes that set it."""

    n: Size
    length: Size  # what sets pos: model.n_ctx or a probe's span length
    pos: int
    where: str  # its name in messages
    dims: tuple[str, str]  # the names of n and pos in messages: ("eval_sequences", "n_ctx")


def larger(*groups: list[Term]) -> list[Term]:
    """The group of buffers with the largest total: they are not alive at the same time."""
    return max(groups, key=lambda g: sum(t.bytes for t in g))


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
