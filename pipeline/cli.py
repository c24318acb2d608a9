"""What every stage's `main` shares: common arguments and the error boundary.

A `UserError` becomes one line on stderr and exit code 2; `--debug` re-raises it
with its traceback. Other exceptions are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import UserError

EXIT_USER_ERROR = 2
# A stage that fails under DVC (which sets DVC_STAGE): DVC deleted its outputs before running it.
# Said on the error's own line, how to get back the last run, which is this machine's own: its
# outputs are in the local DVC cache, where the committed run's need not be (another CPU gives
# other bytes from training on).
# - `dvc repro`: params.yaml is as the user left it; put back, DVC's run cache restores every
#   stage of the last run, its metrics and plots files too, without running it again.
# - `dvc exp run` in the workspace (DVC_EXP_NAME set; every stage runs in the repository's root,
#   DVC_ROOT): it also rewrote params.yaml and dvc.lock; `python -m pipeline.restore` puts back
#   the run kept when the experiment started.
# - a queued or `--temp` experiment runs in a copy of the repository (under .dvc/tmp/exps/, while
#   DVC_ROOT names the workspace): the workspace is untouched.
AFTER_REPRO = (
    " (your last run comes back when params.yaml is as it was: `dvc repro` then restores its "
    "outputs from DVC's run cache without running them)"
)
AFTER_EXPERIMENT = " (`python -m pipeline.restore` brings back your run from before this experiment)"
AFTER_COPY = " (this experiment ran in a copy of the repository: your workspace is unchanged)"


def how_to_get_back() -> str:
    """What a stage's error line adds under DVC: how to get the last run back; '' outside DVC."""
    if not os.environ.get("DVC_STAGE"):
        return ""
    if not os.environ.get("DVC_EXP_NAME"):
        return AFTER_REPRO
    root = os.environ.get("DVC_ROOT")
    if root and Path.cwd().resolve() != Path(root).resolve():
        return AFTER_COPY
    return AFTER_EXPERIMENT


def stage_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A parser with the arguments every stage takes: --params and --debug. `description`, the
    stage's docstring, is its help: the first paragraph above the options, the rest below them
    (each printed once, line breaks kept)."""
    first, rest = split_doc(description)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=first,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--params", default="params.yaml", help="The composed config to read (default: params.yaml)."
    )
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")
    return parser


def split_doc(doc: str | None) -> tuple[str | None, str | None]:
    """A docstring's first paragraph and the rest (an example's indent kept); None for an empty
    part."""
    import inspect

    text = inspect.cleandoc(doc or "")
    first, _, rest = text.partition("\n\n")
    return first.strip() or None, rest.strip("\n") or None


def progress_mode(hidden: bool = False) -> str | None:
    """How a long stage (train, dynamics) shows its progress: "bar", a tqdm bar, where stderr is
    a terminal; "lines", one plain line to stderr per evaluation or checkpoint, where it is not
    (DVC runs stages without a terminal: a bar there is nothing or a wall of carriage returns,
    and without lines `dvc repro` says `Running stage 'train@0'` and then nothing for minutes);
    None with --no-progress (hidden): nothing."""
    if hidden:
        return None
    return "bar" if sys.stderr.isatty() else "lines"


def progress_line(desc: str, done: int, total: int, started: float, what: str = "") -> None:
    """One plain progress line on stderr: `desc: done/total what, elapsed, about N s left`."""
    import time

    elapsed = time.perf_counter() - started
    left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
    print(f"{desc}: {done}/{total}{what}, {elapsed:.0f} s{left}", file=sys.stderr, flush=True)


def with_progress(items: Sequence, desc: str, mode: str | None, unit: str, label=None) -> Iterator:
    """`items` as they are (mode None), under a tqdm bar ("bar"), or with a plain line after
    each item is done ("lines"; `label(item)` adds to it, e.g. the checkpoint's step)."""
    if mode == "bar":
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, unit=unit)
        return
    if mode is None:
        yield from items
        return
    import time

    started = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item  # the loop's body runs here; the line follows it
        progress_line(desc, done, len(items), started, f" {unit}s" + (label(item) if label else ""))


# How the library's long calls show their progress (`progress_bar`): "bar", "lines" or None, as
# `progress_mode` says; "auto" where no stage set it (a notebook or a script: `_auto_mode`).
_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("progress", default="auto")
LINE_EVERY = 10.0  # seconds between two plain lines ("lines": under DVC, no terminal)


@contextlib.contextmanager
def showing_progress(mode: str | None) -> Iterator[None]:
    """Show the progress of the library's long calls inside as `mode` says ("bar", "lines" or
    None: `progress_mode`); a stage sets it once around its work, from --no-progress."""
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def _auto_mode() -> str | None:
    """A call outside any stage: a bar where someone watches (stderr is a terminal, or a Jupyter
    kernel: tqdm.auto draws a widget there), plain lines under DVC, else (a test, a pipe) nothing."""
    if sys.stderr.isatty() or "ipykernel" in sys.modules:
        return "bar"
    return "lines" if os.environ.get("DVC_STAGE") else None


class Progress:
    """A long call's progress over `total` steps, with its time estimate: a tqdm.auto bar on
    stderr (a widget in a notebook), or a plain line at most every `LINE_EVERY` seconds, or
    nothing (`showing_progress`). Never stdout, and it reads nothing the call computes, so no result
    changes; its cost is a clock read per `update`.

        with progress_bar(total, "composition K", "block") as bar:
            for ...: ...; bar.update()
    """

    def __init__(self, total: int, desc: str, unit: str):
        import time

        self.mode = _MODE.get()
        self.mode = _auto_mode() if self.mode == "auto" else self.mode
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.started = self.last = time.perf_counter()
        self.bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            # leave=None: a finished bar stays (its total and time) unless nested in another (dynamics)
            self.bar = tqdm(
                total=total, desc=desc, unit=unit, file=sys.stderr, leave=None, dynamic_ncols=True
            )

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.mode == "lines":
            import time

            now = time.perf_counter()
            if now - self.last >= LINE_EVERY or (self.done >= self.total and self.last > self.started):
                self.last = now  # a last line at the end only after an earlier one: quick calls stay quiet
                progress_line(self.desc, self.done, self.total, self.started, f" {self.unit}s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int, desc: str, unit: str = "step") -> Progress:
    """The progress of a long call of the library (`Progress`): the composition null's products,
    the channel tables, the path, channel and role ablations."""
    return Progress(total, desc, unit)


def use_threads(threads: int | None) -> None:
    """Run torch's CPU kernels on `threads` threads (`analysis.threads`, `train.threads`); None
    leaves torch's default, one per physical core. Imported lazily: not every stage needs torch."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep what is freed, for a stage that loops over
    large temporaries (the path ablation's logits: 134 MB a chunk at d_vocab 2,048). glibc gives
    every allocation over 32 MB a fresh mmap and unmaps it on free, so each chunk page-faults its
    memory in again: most of the heads stage's time went to the kernel (207 s wall, 220 s of
    system time; 73 s with this, outputs byte-identical; the dynamics stage 34 s -> 23 s; the full
    composition analysis of 12 x 12 heads on 2 threads 124 s -> 99 s, peak memory +2.5%; training
    gains nothing). Changes no value. True where libc is glibc and took the settings; elsewhere a
    no-op."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def resolve_device(name, key: str):
    """The torch device `name` ("auto": CUDA when present; "cpu", "cuda", "cuda:1", or a
    torch.device) of config key or argument `key` (`train.device`, `analysis.device`, the API's
    `device`); a UserError naming the key when the name is no device or this machine lacks it.
    Imported lazily, as in `use_threads`."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shown = str(name)
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(key, "not a torch device (cpu, cuda, cuda:N, ...)", shown) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(key, "CUDA is not available on this machine", shown)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(key, f"this machine has {torch.cuda.device_count()} CUDA device(s)", shown)
    if device.type == "meta":
        raise UserError(key, "the meta device holds no values: name one that computes (cpu, cuda)", shown)
    if device.type not in ("cpu", "cuda"):  # mps, xpu, ...: whether this torch and machine have it
        try:
            torch.empty(0, device=device)
        except Exception as e:  # each backend fails its own way (RuntimeError, AssertionError, ...)
            reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise UserError(key, f"not available on this machine ({reason})", shown) from None
    return device


def run_cli(
    parser: argparse.ArgumentParser,
    body: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse `argv`, run `body(args)`; turn a `UserError` into one line and exit code 2."""
    args = parser.parse_args(argv)
    try:
        return body(args) or 0
    except UserError as e:
        if getattr(args, "debug", False):
            raise
        print(f"error: {e}{how_to_get_back()}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
