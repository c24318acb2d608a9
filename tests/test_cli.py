"""pipeline.cli, in-process: the error boundary (`run_cli`: one line and exit code 2, the traceback
under --debug, the way back under DVC), the stages' parser and every command's `--help` (whole
sentences, each printed once, every argument explained: its structure, never its sentences), the
progress of long calls (a tqdm bar on stderr, plain lines under DVC, nothing where no one watches;
never stdout, never a changed result), the device check, and `keep_freed_memory` as its docstring
says (on glibc, read back with its own `mallinfo2`; without libc.so.6 a no-op that says so)."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import json
import platform
import re
from importlib import import_module
from pathlib import Path

import pytest
import torch
from dvc_repo import TINY
from models import random_model
from refusals import refused

from pipeline import cli, params
from pipeline.behaviour import ablation
from pipeline.circuits import channel_null, composition, invariant, weights
from pipeline.cli import resolve_device
from pipeline.config import CompositionConfig
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


REFUSAL = UserError("model.n_heads", "PROBLEM", 0)  # its words are the caller's


def refusing(args) -> int:
    raise REFUSAL


def test_a_user_error_is_one_line_and_exit_2_and_debug_shows_its_traceback(capsys, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    parser = cli.stage_parser("python -m stages.x", None)
    assert cli.run_cli(parser, refusing, []) == cli.EXIT_USER_ERROR == 2
    assert capsys.readouterr().err == f"error: {REFUSAL}\n"
    with pytest.raises(UserError) as caught:
        cli.run_cli(parser, refusing, ["--debug"])
    assert caught.value is REFUSAL
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
    assert lines[0].startswith("composition K: 1/2 blocks") and len(numbers(lines[0])) == 4  # and an estimate
    assert lines[1].startswith("composition K: 2/2 blocks") and len(numbers(lines[1])) == 3  # none: done


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
    with pytest.raises(TypeError):
        UserError(where, problem, 0)
    assert str(UserError("model.n_heads", "PROBLEM", 0)) == "model.n_heads = 0: PROBLEM"
    assert str(UserError("model.n_heads", "PROBLEM")) == "model.n_heads: PROBLEM"


def test_the_params_option_says_its_default_in_the_help():
    parser = cli.stage_parser("python -m stages.x", None)
    shown = " ".join(parser.format_help().split())  # argparse wraps lines at the terminal's width
    helps = {a.option_strings[-1]: a.help for a in parser._actions}
    assert "params.yaml" in helps["--params"] and f"--params PARAMS {helps['--params']}" in shown
    assert f"--debug {helps['--debug']}" in shown


def numbers(line: str) -> list[int]:
    """The integers a progress line shows, in order (counts, then seconds): what it says, not how."""
    return [int(n) for n in re.findall(r"\d+", line)]


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
    assert text.startswith("train seed 0: 4/4 steps") and text.count("\n") == 1 and text.endswith("\n")


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
    assert [line.split(",")[0] for line in lines] == ["d: 1/3 checkpoints (a)", "d: 2/3 checkpoints (b)",
                                                       "d: 3/3 checkpoints (c)"]  # fmt: skip
    assert [len(numbers(line)) for line in lines] == [4, 4, 3]  # an estimate until the last
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
    assert capsys.readouterr().err == f"error: {REFUSAL}{said}\n"
    assert len({cli.AFTER_REPRO, cli.AFTER_EXPERIMENT, cli.AFTER_COPY}) == 3


def test_an_interrupted_stage_is_one_line_and_exit_130(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    assert cli.run_cli(cli.stage_parser("python -m stages.x", None), interrupted, []) == 130
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


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
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["train seed 0: 1/4 steps", "train seed 0: 4/4 steps",
                                                       "train seed 0: 0/4"]  # fmt: skip
    # (step, total, seconds so far, seconds left at that pace): none left at the end, no pace at 0
    assert [numbers(line.split(": ", 1)[1]) for line in lines] == [[1, 4, 10, 30], [4, 4, 10], [0, 4, 10]]


def test_with_progress_lines_with_a_fixed_clock_are_known_whole(capsys, monkeypatch):
    clock = Clock(monkeypatch, 100.0)
    lines = []
    for item in cli.with_progress(
        [1, 2], "dynamics seed 0", "lines", "checkpoint", label=lambda i: f" (step {i})"
    ):
        clock.now += 5.0
        lines.append(item)
    assert lines == [1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "dynamics seed 0: 1/2 checkpoints (step 1)",
        "dynamics seed 0: 2/2 checkpoints (step 2)",
    ]
    assert [numbers(line.split(")", 1)[1]) for line in lines] == [[5, 5], [10]]  # seconds so far, left


def test_a_progress_in_lines_mode_with_a_fixed_clock_is_known_whole(capsys, monkeypatch):
    clock = Clock(monkeypatch, 0.0)
    with cli.showing_progress("lines"), cli.progress_bar(4, "composition K", "block") as bar:
        clock.now = 3.0  # under LINE_EVERY: no line
        bar.update()
        clock.now = 20.0
        bar.update()
        clock.now = 22.0
        bar.update(2)  # the end, after an earlier line
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["composition K: 2/4 blocks",
                                                       "composition K: 4/4 blocks"]  # fmt: skip
    assert [numbers(line.split(": ", 1)[1]) for line in lines] == [[2, 4, 20, 20], [4, 4, 22]]


def test_asking_for_cuda_where_there_is_none_names_the_key(monkeypatch):
    """Real torch, told it has no CUDA (as on these machines and CI): "auto" is the CPU, and
    asking for CUDA is refused by cli in one line naming the key."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.resolve_device("auto", "train.device") == torch.device("cpu")
    with pytest.raises(UserError) as caught:
        cli.resolve_device("cuda", "train.device")
    refused(caught, "train.device", "cuda")


ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.stem for p in (ROOT / "stages").glob("*.py") if p.stem != "__init__")
COMMANDS = [
    *(f"stages.{name}" for name in STAGES),
    "pipeline.params",
    "pipeline.restore",
    "pipeline.overrides",
]


def whole_sentence(text: str | None) -> bool:
    """Starts with a capital letter (its first letter, after a quote or a backtick) and ends with
    a full stop."""
    text = " ".join((text or "").split())
    first = next((c for c in text if c.isalpha()), "")
    return first.isupper() and text.endswith(".")


def test_whole_sentence():
    assert whole_sentence("The directory to write.") and whole_sentence('"Seeds" are listed.')
    assert not whole_sentence("output directory") and not whole_sentence("The seed")
    assert not whole_sentence(None)


def shown_help(module: str, capsys, monkeypatch) -> tuple[argparse.ArgumentParser, str]:
    """`python -m <module> --help`, run in-process: the parser that printed it, and what it printed."""
    printed = []
    print_help = argparse.ArgumentParser.print_help

    def recording(self, file=None):
        printed.append(self)
        return print_help(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", recording)
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        import_module(module).main(["--help"])
    assert done.value.code == 0
    [parser] = printed
    return parser, capsys.readouterr().out


@pytest.mark.parametrize("module", COMMANDS)
def test_help_is_whole_sentences_each_printed_once(module, capsys, monkeypatch):
    parser, text = shown_help(module, capsys, monkeypatch)
    assert f" python -m {module} " in text.splitlines()[0], text  # the usage names the module to run
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    repeated = {p for p in paragraphs if paragraphs.count(p) > 1}
    assert not repeated, repeated
    assert whole_sentence(parser.description), parser.description
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):  # argparse's own line
            continue
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings or action.dest
        assert whole_sentence(action.help), (action.option_strings or action.dest, action.help)


def test_a_stage_docstring_is_split_into_its_summary_and_the_rest():
    first, rest = cli.split_doc("Do one thing.\n\n    python -m stages.x \\\n        --out o\n\nAt length.\n")
    assert first == "Do one thing."
    assert rest.splitlines() == ["    python -m stages.x \\", "        --out o", "", "At length."]
    assert cli.split_doc("Only this.") == ("Only this.", None)
    assert cli.split_doc(None) == (None, None)


CFG = CompositionConfig(baseline_samples=8, null_samples=8)


def tiny_weights(seed: int = 0) -> weights.HeadWeights:
    return weights.from_state_dict(random_model("three_layers", seed=seed).state_dict())


def bar_total(err: str, desc: str) -> int:
    """The total of `desc`'s tqdm bar in the captured stderr (`desc: 40%|####  | 2/5 [...]`)."""
    found = re.findall(rf"{re.escape(desc)}: +\d+%\|[^|]*\| (\d+)/(\d+) \[", err)
    assert found, err
    assert found[-1][0] == found[-1][1], found  # it reached its total
    return int(found[-1][1])


def test_the_composition_null_shows_a_bar_with_its_total_and_changes_nothing(capsys):
    hw = tiny_weights()
    plain = composition.composition_scores(hw, CFG, seed=0)
    placebo = composition.composition_scores(hw, CFG, seed=0, placebo=True)
    assert capsys.readouterr().err == ""  # outside a stage and a terminal: no bar
    with cli.showing_progress("bar"):
        shown = composition.composition_scores(hw, CFG, seed=0)
        shown_placebo = composition.composition_scores(hw, CFG, seed=0, placebo=True)
    out, err = capsys.readouterr()
    assert out == ""
    # 3 kinds x one block of reader heads per writer layer (3 heads: one block): layers 0 and 1
    # write to later ones; every layer writes to its own and earlier ones in the placebo
    assert bar_total(err, "composition null") == 3 * 2
    assert bar_total(err, "composition placebo null") == 3 * 3
    assert "s/block" in err or "block/s" in err  # the rate, hence the estimate
    assert plain.to_csv() == shown.to_csv() and placebo.to_csv() == shown_placebo.to_csv()


def test_invariant_and_channel_nulls_show_their_bars(capsys):
    hw = tiny_weights(1)
    inv = invariant.invariant_scores(hw, CFG, seed=0)
    gen = torch.Generator().manual_seed(0)
    blocks = channel_null.channel_blocks(8, hw.d_model, hw.d_head, gen)
    rows, _ = channel_null.channel_rows(hw, blocks, CompositionConfig().channel_tolerance)
    capsys.readouterr()
    with cli.showing_progress("bar"):
        inv_shown = invariant.invariant_scores(hw, CFG, seed=0)
        rows_shown, _ = channel_null.channel_rows(hw, blocks, CompositionConfig().channel_tolerance)
    out, err = capsys.readouterr()
    assert out == ""
    assert bar_total(err, "invariant null") == 3 * 3  # kinds x (writer, later reader) layer pairs of 3 layers
    assert bar_total(err, "channels null") == 3  # kinds
    assert inv.to_csv() == inv_shown.to_csv() and rows.to_csv() == rows_shown.to_csv()


def test_the_ablations_show_their_bars_and_change_nothing(capsys):
    model = random_model("three_layers", seed=2)
    tokens = torch.randint(
        0, model.cfg.d_vocab, (4, model.cfg.n_ctx), generator=torch.Generator().manual_seed(0)
    )
    H = model.cfg.n_heads
    cuts = [ablation.ChannelCut((0, 1), (1, 2), torch.eye(16)[3], torch.eye(16)[7]),
            ablation.ChannelCut((1, 0), (2, 2), torch.eye(16)[0], torch.eye(16)[1])]  # fmt: skip
    sets = [[(0, 0)], [(1, 1), (2, 2)], [(0, 2), (2, 0)]]

    def run():
        return (
            ablation.path_ablation(model, tokens, None).to_csv(),
            ablation.channel_ablation(model, tokens, cuts, None).to_csv(),
            ablation.heads_loss_effects(model, tokens, sets),
        )

    plain = run()
    capsys.readouterr()
    with cli.showing_progress("bar"):
        shown = run()
    out, err = capsys.readouterr()
    assert out == "" and shown == plain
    assert bar_total(err, "path ablation") == H * (1 + 2)  # every head a of layer 0 into 1, 2; of 1 into 2
    assert bar_total(err, "channel ablation") == len(cuts)
    assert bar_total(err, "role ablation") == len(sets)


def test_lines_under_dvc_and_nothing_with_no_progress(capsys, monkeypatch):
    """Without a terminal (DVC sets DVC_STAGE) a plain line at most every LINE_EVERY seconds, with
    the estimate; a call quicker than that says nothing. --no-progress (None): nothing at all."""
    model = random_model("three_layers", seed=3)
    tokens = torch.randint(
        0, model.cfg.d_vocab, (2, model.cfg.n_ctx), generator=torch.Generator().manual_seed(1)
    )
    monkeypatch.setenv("DVC_STAGE", "heads@0")
    ablation.path_ablation(model, tokens, None)  # auto: lines, and this call is quicker than LINE_EVERY
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli, "LINE_EVERY", 0.0)
    ablation.path_ablation(model, tokens, None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("path ablation: 3/9 ") and len(numbers(lines[0])) == 4  # and an estimate
    assert lines[-1].startswith("path ablation: 9/9 ") and len(numbers(lines[-1])) == 3
    assert all("\r" not in line for line in lines)
    with cli.showing_progress(None):
        ablation.path_ablation(model, tokens, None)
    assert capsys.readouterr().err == ""


def test_the_composition_stage_writes_the_same_bytes_with_a_bar(tmp_path, capsys):
    """The stage the paper's shape spends most on (with the heads stage): its every artifact
    byte-identical with and without the bars, and the bars on stderr only."""
    hw = tiny_weights(4)
    metadata = {"config": json.dumps({"positional_embedding_type": "shortformer"})}
    weights.save(tmp_path / "heads.safetensors", hw, metadata)
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(TINY, conf_dir=ROOT / "conf")))
    stage = import_module("stages.composition").main

    def run(out: str) -> dict[str, str]:
        argv = ["--params", str(tmp_path / "params.yaml"), "--weights", str(tmp_path / "heads.safetensors")]
        assert stage([*argv, "--out", str(tmp_path / out)]) == 0
        files = sorted((tmp_path / out).iterdir())
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    plain = run("plain")
    assert capsys.readouterr().err == ""
    with cli.showing_progress("bar"):
        shown = run("shown")
    out, err = capsys.readouterr()
    assert shown == plain and len(plain) >= 7
    assert out == ""
    for desc in ("composition null", "composition placebo null", "invariant null", "channels null"):
        assert bar_total(err, desc) > 0


def test_a_bar_in_a_table_of_calls_is_cheap():
    """The cost of the bars themselves: a clock read and a tqdm update per step, against the steps'
    work (a block of the null: milliseconds on the default shape, about a second on the paper's)."""
    import time

    with cli.showing_progress("bar"):
        started = time.perf_counter()
        with cli.progress_bar(10_000, "cost", "step") as bar:
            for _ in range(10_000):
                bar.update()
        per_update = (time.perf_counter() - started) / 10_000
    assert per_update < 1e-4  # 100 us: under 0.1% of a 0.1 s step


def test_an_unavailable_device_names_its_key() -> None:
    if torch.cuda.is_available():
        assert resolve_device("cuda", "analysis.device") == torch.device("cuda")
    else:
        with pytest.raises(UserError) as caught:
            resolve_device("cuda", "analysis.device")
        message = str(caught.value)
        assert "\n" not in message and message.startswith("analysis.device = 'cuda': "), message
    assert resolve_device("cpu", "analysis.device") == torch.device("cpu")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto", "analysis.device").type == want


def test_keep_freed_memory_takes_on_glibc() -> None:
    """The heads and dynamics stages' allocator settings (pipeline.cli.keep_freed_memory): glibc
    takes them (this project's machines are Linux); anywhere else the call is a no-op."""
    import platform

    from pipeline.cli import keep_freed_memory

    took = keep_freed_memory()
    assert took is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
