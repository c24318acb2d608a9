"""pipeline.cli, in-process: the error boundary (`run_cli`: one line and exit code 2, or the
traceback under --debug), the stages' parser, and `keep_freed_memory` as its docstring says: on
glibc, a large allocation comes from the heap and its memory stays there when freed (read back
with glibc's own `mallinfo2`); without libc.so.6 the call is a no-op that says so."""

from __future__ import annotations

import ctypes
import io
import platform
import re

import pytest

from pipeline import cli
from pipeline.errors import UserError

MB = 2**20


class Mallinfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33)
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]  # fmt: skip


def glibc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's allocator only")
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc < 2.33 has no mallinfo2")
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def test_a_freed_large_allocation_stays_in_the_heap():
    libc = glibc()
    assert cli.keep_freed_memory() is True
    before = libc.mallinfo2()
    size = before.fordblks + 64 * MB  # more than the heap holds free: the heap must grow by it
    block = libc.malloc(size)
    assert block
    grown = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    assert grown.hblkhd == before.hblkhd  # from the heap, not a fresh mmap of its own
    assert 64 * MB <= grown.arena - before.arena <= size + 16 * MB  # the heap grew by about the block
    assert after.arena == grown.arena  # and freeing it gave nothing back to the system


def test_without_libc_so_6_it_is_a_no_op(monkeypatch):
    """Windows' ctypes, say: no libc.so.6 to load (and, as there, a library is named by a string)."""

    def cdll(name, *args, **kwargs):
        if not isinstance(name, str):
            raise TypeError(f"LoadLibrary() argument 1 must be str, not {type(name).__name__}")
        raise FileNotFoundError(f"Could not find module {name!r}")

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert cli.keep_freed_memory() is False


def refusing(args) -> int:
    raise UserError("model.n_heads", "must be > 0", 0)


def test_a_user_error_is_one_line_and_exit_2_and_debug_shows_its_traceback(capsys, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    parser = cli.stage_parser("python -m stages.x", None)
    assert cli.run_cli(parser, refusing, []) == cli.EXIT_USER_ERROR == 2
    assert capsys.readouterr().err == "error: model.n_heads = 0: must be > 0\n"
    with pytest.raises(UserError, match=r"^model\.n_heads = 0: must be > 0$"):
        cli.run_cli(parser, refusing, ["--debug"])
    assert capsys.readouterr().err == ""


def test_a_stage_parser_takes_its_docstrings_first_paragraph_as_its_description_and_the_rest_below():
    parser = cli.stage_parser("python -m stages.x", "Do one thing,\nwell.\n\nAt length.\n")
    assert (parser.prog, parser.description) == ("python -m stages.x", "Do one thing,\nwell.")
    assert parser.epilog == "At length."
    bare = cli.stage_parser("python -m stages.y", None)
    assert (bare.description, bare.epilog) == (None, None)
    assert vars(bare.parse_args([])) == {"params": "params.yaml", "debug": False}


def test_progress_lines_follow_the_mode_a_stage_set(capsys, monkeypatch):
    monkeypatch.setattr(cli, "LINE_EVERY", 0.0)  # a line at every update
    with cli.showing_progress("lines"), cli.progress_bar(2, "composition K", "block") as bar:
        assert (bar.mode, bar.bar) == ("lines", None)
        bar.update()
        bar.update()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"composition K: 1/2 blocks, \d+ s, about \d+ s left", lines[0])
    assert re.fullmatch(r"composition K: 2/2 blocks, \d+ s", lines[1])


def test_a_progress_bar_is_a_tqdm_bar_on_stderr_as_wide_as_the_terminal(capsys):
    with cli.showing_progress("bar"), cli.progress_bar(3, "path ablation", "pair") as bar:
        assert bar.mode == "bar" and bar.bar is not None
        assert bar.bar.dynamic_ncols  # follows the terminal's width as it changes
        bar.update(3)
    shown = capsys.readouterr()
    assert shown.out == ""
    assert "path ablation" in shown.err and "3/3" in shown.err


def test_no_progress_shows_nothing(capsys):
    with cli.showing_progress(None), cli.progress_bar(2, "composition K", "block") as bar:
        bar.update(2)
    assert (bar.mode, bar.bar) == (None, None)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "where, problem",
    [(None, "must be > 0"), ("", "must be > 0"), ("model.n_heads", None), ("model.n_heads", "")],
)
def test_a_user_error_without_its_key_or_its_problem_is_our_bug_not_a_message(where, problem):
    with pytest.raises(TypeError, match="UserError needs a key or file and a problem"):
        UserError(where, problem, 0)
    assert str(UserError("model.n_heads", "must be > 0", 0)) == "model.n_heads = 0: must be > 0"


def test_the_params_option_says_its_default_in_the_help():
    parser = cli.stage_parser("python -m stages.x", None)
    shown = " ".join(parser.format_help().split())  # argparse wraps lines at the terminal's width
    helps = {a.option_strings[-1]: a.help for a in parser._actions}
    assert "params.yaml" in helps["--params"] and f"--params PARAMS {helps['--params']}" in shown
    assert f"--debug {helps['--debug']}" in shown


class Recording:
    """A stream that records its calls: ("write", text) and ("flush",)."""

    def __init__(self):
        self.calls = []

    def write(self, text: str) -> int:
        self.calls.append(("write", text))
        return len(text)

    def flush(self) -> None:
        self.calls.append(("flush",))


def test_a_progress_line_is_flushed_to_stderr_as_it_is_written(monkeypatch):
    """Without a terminal stderr is block-buffered: each line is flushed at once, so that DVC shows
    it as the stage runs and not at its end."""
    stream = Recording()
    monkeypatch.setattr(cli.sys, "stderr", stream)
    cli.progress_line("train seed 0", 4, 4, started=0.0, what=" steps")
    assert stream.calls[-1] == ("flush",)
    text = "".join(c[1] for c in stream.calls if c[0] == "write")
    assert re.fullmatch(r"train seed 0: 4/4 steps, \d+ s\n", text)


def test_with_progress_in_bar_mode_is_a_tqdm_bar_over_the_items_and_prints_no_lines(capsys, monkeypatch):
    import tqdm

    bars = []

    def spy(items, desc, unit):
        bars.append((list(items), desc, unit))
        return iter(items)

    monkeypatch.setattr(tqdm, "tqdm", spy)
    items = ["a", "b", "c"]
    assert list(cli.with_progress(items, "dynamics seed 0", "bar", "checkpoint")) == items
    assert bars == [(items, "dynamics seed 0", "checkpoint")]
    assert capsys.readouterr().err == ""
    # "lines": a plain line after each item, its label appended
    assert list(cli.with_progress(items, "d", "lines", "checkpoint", label=lambda i: f" ({i})")) == items
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r"\d+ s", "N s", line) for line in lines] == [
        "d: 1/3 checkpoints (a), N s, about N s left",
        "d: 2/3 checkpoints (b), N s, about N s left",
        "d: 3/3 checkpoints (c), N s",
    ]
    assert bars == [(items, "dynamics seed 0", "checkpoint")]


class _Terminal:
    """A stderr that says it is a terminal (and keeps what is written to it)."""

    def __init__(self):
        self.text = []

    def isatty(self):
        return True

    def write(self, s):
        self.text.append(s)
        return len(s)

    def flush(self):
        pass


def test_outside_a_stage_a_terminal_gets_a_tqdm_bar_dvc_plain_lines_and_a_pipe_nothing(monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setattr(cli.sys, "stderr", _Terminal())
    assert cli._auto_mode() == "bar"
    progress = cli.Progress(3, "composition K", "block")
    assert progress.mode == "bar" and progress.bar is not None and progress.bar.total == 3
    progress.bar.close()
    monkeypatch.setattr(cli.sys, "stderr", io.StringIO())  # a pipe or a file: not a terminal
    assert "ipykernel" not in cli.sys.modules
    assert cli._auto_mode() is None
    monkeypatch.setenv("DVC_STAGE", "composition@0")
    assert cli._auto_mode() == "lines"


@pytest.mark.parametrize(
    "env, where, way_back",
    [
        ({}, None, "AFTER_REPRO"),  # dvc repro
        ({"DVC_EXP_NAME": "e"}, "root", "AFTER_EXPERIMENT"),  # dvc exp run, in the workspace
        ({"DVC_EXP_NAME": "e"}, "copy", "AFTER_COPY"),  # queued or --temp: a copy under .dvc/tmp/exps
    ],
)
def test_under_dvc_a_user_error_says_how_to_get_the_last_run_back(
    capsys, monkeypatch, tmp_path, env, where, way_back
):
    """The error's own line, then how to get back the run before it: which way depends on how
    DVC ran the stage (tests/test_experiments.py runs each way back)."""
    monkeypatch.setenv("DVC_STAGE", "train@0")
    for key in ("DVC_EXP_NAME", "DVC_ROOT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if where:
        copy = tmp_path / ".dvc" / "tmp" / "exps" / "run"
        copy.mkdir(parents=True)
        monkeypatch.setenv("DVC_ROOT", str(tmp_path))
        monkeypatch.chdir(tmp_path if where == "root" else copy)
    parser = cli.stage_parser("python -m stages.x", None)
    assert cli.run_cli(parser, refusing, []) == 2
    said = getattr(cli, way_back)
    assert capsys.readouterr().err == f"error: model.n_heads = 0: must be > 0{said}\n"
    assert len({cli.AFTER_REPRO, cli.AFTER_EXPERIMENT, cli.AFTER_COPY}) == 3


def test_an_interrupted_stage_is_one_line_and_exit_130(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    assert cli.run_cli(cli.stage_parser("python -m stages.x", None), interrupted, []) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


class Clock:
    """time.perf_counter at fixed readings: `now` seconds."""

    def __init__(self, monkeypatch, now: float):
        import time

        self.now = now
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)


def test_a_progress_line_with_a_fixed_clock_is_known_whole(capsys, monkeypatch):
    Clock(monkeypatch, 12.0)
    cli.progress_line("train seed 0", 1, 4, started=2.0, what=" steps")
    cli.progress_line("train seed 0", 4, 4, started=2.0, what=" steps")
    cli.progress_line("train seed 0", 0, 4, started=2.0)
    assert capsys.readouterr().err.splitlines() == [
        "train seed 0: 1/4 steps, 10 s, about 30 s left",
        "train seed 0: 4/4 steps, 10 s",
        "train seed 0: 0/4, 10 s",
    ]


def test_with_progress_lines_with_a_fixed_clock_are_known_whole(capsys, monkeypatch):
    clock = Clock(monkeypatch, 100.0)
    lines = []
    for item in cli.with_progress(
        [1, 2], "dynamics seed 0", "lines", "checkpoint", label=lambda i: f" (step {i})"
    ):
        clock.now += 5.0
        lines.append(item)
    assert lines == [1, 2]
    assert capsys.readouterr().err.splitlines() == [
        "dynamics seed 0: 1/2 checkpoints (step 1), 5 s, about 5 s left",
        "dynamics seed 0: 2/2 checkpoints (step 2), 10 s",
    ]


def test_a_progress_in_lines_mode_with_a_fixed_clock_is_known_whole(capsys, monkeypatch):
    clock = Clock(monkeypatch, 0.0)
    with cli.showing_progress("lines"), cli.progress_bar(4, "composition K", "block") as bar:
        clock.now = 3.0  # under LINE_EVERY: no line
        bar.update()
        clock.now = 20.0
        bar.update()
        clock.now = 22.0
        bar.update(2)  # the end, after an earlier line
    assert capsys.readouterr().err.splitlines() == [
        "composition K: 2/4 blocks, 20 s, about 20 s left",
        "composition K: 4/4 blocks, 22 s",
    ]


def test_asking_for_cuda_where_there_is_none_names_the_key(monkeypatch):
    """Real torch, told it has no CUDA (as on these machines and CI): "auto" is the CPU, and
    asking for CUDA is refused by cli in one line naming the key."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.resolve_device("auto", "train.device") == torch.device("cpu")
    with pytest.raises(UserError) as caught:
        cli.resolve_device("cuda", "train.device")
    assert str(caught.value) == "train.device = 'cuda': CUDA is not available on this machine"
