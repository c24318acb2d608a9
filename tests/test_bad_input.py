"""The catalogue of bad inputs: one case of each mechanism by which a mistake is caught (the rows of
docs/bad-inputs.md's table), given to the entry point a user runs, stops with one line on stderr
naming the bad key, file or value, exit code 2, no traceback, no warning, and nothing written (no
output, no temporary file, no directory).

Every case runs a stage's (or `pipeline.params`') real `main(argv)` in-process; one of each kind
also runs as a `python -m ...` process (and `--debug` there shows the traceback). Inputs are tiny
(tests/dvc_repo.py TINY), made from one real run of the train, weights, composition, heads and
dynamics stages. The Python API's cases (`API_CASES`) call `attn_circuits` in a process of its
own, as a notebook does: a `UserError` of one line naming the argument or file, and no file
changed. Each rule a mechanism applies is tested once beside the module that defines it (the
config's in test_config.py); `dvc exp run -S` runs for real in test_experiments.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from dvc_repo import TINY

from pipeline import checkpoint
from pipeline import params as params_mod
from pipeline.model import origin

ROOT = Path(__file__).resolve().parents[1]


# --- one real, tiny run: the good inputs every case spoils one thing of ----------------


@dataclass(frozen=True)
class Good:
    params: dict  # the composed TINY config
    model: Path  # train stage: model.safetensors, config.json beside it
    config: Path
    weights: Path  # weights stage: heads.safetensors
    scores: Path  # composition stage: scores.csv
    heads: Path  # heads stage: heads.csv, ablation.csv, summary.json, patterns.safetensors
    checkpoints: Path  # train stage: checkpoints/ (index.json, step*.safetensors)
    dynamics: Path  # dynamics stage: composition.csv, heads.csv, steps.tsv, summary.json

    def state(self) -> dict[str, torch.Tensor]:
        return checkpoint.load_state(self.model)[0]


@pytest.fixture(scope="module")
def good(tiny_run) -> Good:
    """The tiny project's real run (conftest's `tiny_run`), read only: each case builds its bad input
    beside it, in its own directory."""
    composed = params_mod.compose(TINY, conf_dir=ROOT / "conf")
    train = tiny_run["train"]
    model, config = train / "model.safetensors", train / "config.json"
    weights, scores = tiny_run["weights"] / "heads.safetensors", tiny_run["composition"] / "scores.csv"
    return Good(
        composed,
        model,
        config,
        weights,
        scores,
        tiny_run["heads"],
        train / "checkpoints",
        tiny_run["dynamics"],
    )


# --- how each case is built --------------------------------------------------------------


def write_params(tmp: Path, good: Good, changes: dict | None = None, name: str = "params.yaml") -> Path:
    """The tiny params.yaml with `changes` ({"model.n_heads": 4}) applied, as a user edits it."""
    raw = json.loads(json.dumps(good.params))  # a deep copy
    for dotted, value in (changes or {}).items():
        *parents, last = dotted.split(".")
        node = raw
        for key in parents:
            node = node[key]
        node[last] = value
    path = tmp / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def train_args(
    tmp: Path, good: Good, changes: dict | None = None, tokenized: Path | None = None
) -> list[str]:
    """The train stage's arguments, with the origin stage's origin.json (computed here: for
    train.source = load, the checkpoint it names) and the tokenizer stage's directory."""
    p = write_params(tmp, good, changes)
    chosen = {"source": "train"}
    if (changes or {}).get("train.source") == "load" and "train.checkpoint" in changes:
        chosen = origin.choose(params_mod.load(p).train, 0)
    (tmp / "origin.json").write_text(json.dumps(chosen))
    extra = ["--tokenized", str(tokenized)] if tokenized else []
    return ["--params", str(p), "--seed", "0", "--origin", str(tmp / "origin.json"), *extra,
            "--out", str(tmp / "out"), "--no-progress"]  # fmt: skip


def weights_args(tmp: Path, good: Good, model: Path | None = None, config: Path | None = None) -> list[str]:
    return ["--params", str(write_params(tmp, good)), "--model", str(model or good.model),
            "--config", str(config or good.config), "--out", str(tmp / "out")]  # fmt: skip


def composition_args(tmp: Path, good: Good, weights: Path, changes: dict | None = None) -> list[str]:
    p = write_params(tmp, good, changes)
    return ["--params", str(p), "--weights", str(weights), "--out", str(tmp / "out")]


def heads_args(tmp: Path, good: Good, changes: dict | None = None, model: Path | None = None,
               config: Path | None = None, weights: Path | None = None,
               scores: Path | None = None) -> list[str]:  # fmt: skip
    return ["--params", str(write_params(tmp, good, changes)), "--model", str(model or good.model),
            "--config", str(config or good.config), "--weights", str(weights or good.weights),
            "--scores", str(scores or good.scores), "--out", str(tmp / "out")]  # fmt: skip


def figures_args(tmp: Path, good: Good, changes: dict | None = None, heads: Path | None = None,
                 patterns: Path | None = None, summary: Path | None = None,
                 ablation: Path | None = None, scores: Path | None = None) -> list[str]:  # fmt: skip
    return ["--params", str(write_params(tmp, good, changes)), "--scores", str(scores or good.scores),
            "--heads", str(heads or good.heads / "heads.csv"),
            "--ablation", str(ablation or good.heads / "ablation.csv"),
            "--heads-summary", str(summary or good.heads / "summary.json"),
            "--patterns", str(patterns or good.heads / "patterns.safetensors"),
            "--out", str(tmp / "out")]  # fmt: skip


def dynamics_args(tmp: Path, good: Good, spoil: Callable[[Path], object] | None = None,
                  config: Path | None = None) -> list[str]:  # fmt: skip
    """The dynamics stage on a copy of train's checkpoints/, `spoil`ed first."""
    import shutil

    checkpoints = tmp / "checkpoints"
    shutil.copytree(good.checkpoints, checkpoints)
    if spoil:
        spoil(checkpoints)
    return ["--params", str(write_params(tmp, good)), "--checkpoints", str(checkpoints),
            "--config", str(config or good.config), "--out", str(tmp / "out"), "--no-progress"]  # fmt: skip


def _edit_index(checkpoints: Path, edit: Callable[[dict], object]) -> None:
    index = json.loads((checkpoints / "index.json").read_text())
    edit(index)
    (checkpoints / "index.json").write_text(json.dumps(index))


def save_state(path: Path, state: dict) -> Path:
    checkpoint.save_state(path, state)
    return path


def spoiled_state(tmp: Path, good: Good, name: str, change: Callable[[dict], None]) -> Path:
    state = good.state()
    change(state)
    return save_state(tmp / name, state)


def config_with(tmp: Path, good: Good, **changes) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps({**json.loads(good.config.read_text()), **changes}))
    return path


def tokens_file(tmp: Path, good: Good, array: np.ndarray) -> list[str]:
    (tmp / "data").mkdir()
    np.save(tmp / "data" / "ids.npy", array)
    return train_args(
        tmp, good, {"data.source": "tokens", "data.dir": str(tmp / "data"), "data.tokens.path": "ids.npy"}
    )


TEXT = {"data.source": "text", "data.tokenizer.vocab_size": 256, "model.d_vocab": 256}


def text_corpus(
    tmp: Path, good: Good, files: dict[str, bytes], glob: str = "*.txt", data_dir: str = "data", **changes
) -> list[str]:
    """The tokenizer stage's arguments for local text files under tmp/data."""
    (tmp / "data").mkdir()
    for name, content in files.items():
        (tmp / "data" / name).write_bytes(content)
    changes = {**TEXT, "data.dir": str(tmp / data_dir), "data.text.glob": glob, **changes}
    return ["--params", str(write_params(tmp, good, changes)), "--out", str(tmp / "out")]


def short_text(tmp: Path, good: Good) -> list[str]:
    """The train stage on a tokenized text too short for the model's context (tokenized for a
    smaller one: the tokenizer stage refuses a held-out part shorter than model.n_ctx)."""
    tokenizer_args = text_corpus(tmp, good, {"a.txt": b"x y z\n" * 60}, **{"model.n_ctx": 14})
    tokenizer_args[-1] = str(tmp / "tokenized")
    assert import_module("stages.tokenizer").main(tokenizer_args) == 0
    changes = {**TEXT, "data.dir": str(tmp / "data"), "data.text.glob": "*.txt"}
    return train_args(tmp, good, changes, tokenized=tmp / "tokenized")


class RunsCodeWhenUnpickled:
    """Unpickling this opens (creates) `marker`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _load_args(tmp: Path, good: Good, change: Callable[[dict], None], **config: object) -> list[str]:
    """train.source = load of a changed copy of the good checkpoint (and its config.json)."""
    (tmp / "checkpoints").mkdir()
    spoiled_state(tmp / "checkpoints", good, "model.safetensors", change)
    (tmp / "checkpoints" / "config.json").write_text(
        json.dumps({**json.loads(good.config.read_text()), **config})
    )
    return train_args(tmp, good, {"train.source": "load", "train.checkpoint": "model.safetensors",
                                  "train.checkpoint_dir": str(tmp / "checkpoints")})  # fmt: skip


def pickle_checkpoint(tmp: Path, good: Good) -> list[str]:
    """A .pth under train.checkpoint_dir that would create tmp/PWNED when loaded with pickle."""
    (tmp / "checkpoints").mkdir()
    torch.save(
        {**good.state(), "embed.W_E": RunsCodeWhenUnpickled(tmp / "PWNED")}, tmp / "checkpoints" / "model.pth"
    )
    (tmp / "checkpoints" / "config.json").write_text(good.config.read_text())
    return train_args(tmp, good, {"train.source": "load", "train.checkpoint": "model.pth",
                                  "train.checkpoint_dir": str(tmp / "checkpoints")})  # fmt: skip


def truncated(tmp: Path, good: Good) -> list[str]:
    data = good.model.read_bytes()
    (tmp / "model.safetensors").write_bytes(data[: len(data) // 2])
    return weights_args(tmp, good, model=tmp / "model.safetensors")


def corrupted(tmp: Path, good: Good) -> list[str]:
    data = bytearray(good.model.read_bytes())
    start = 8 + data[8:].index(b'"dtype"')  # the header's first dtype field
    data[start : start + 7] = b'"dtypo"'
    (tmp / "model.safetensors").write_bytes(bytes(data))
    return weights_args(tmp, good, model=tmp / "model.safetensors")


def file_in_the_way(tmp: Path) -> Path:
    (tmp / "a-file").write_text("not a directory\n")
    return tmp / "a-file"


def set_(key: str, value) -> Callable[[dict], None]:
    return lambda state: state.__setitem__(key, value)


# Each case: (stage, build(tmp, good) -> argv, the substrings its one line must hold).
# "stage" is a module under stages/, or "params" for `python -m pipeline.params`.
def symlinked_corpus(tmp: Path, good: Good) -> list[str]:
    """A corpus file that is a link to a file outside data.dir (which DVC does not track)."""
    args = text_corpus(tmp, good, {}, glob="link.txt")
    (tmp / "outside.txt").write_bytes(b"x" * 500)
    (tmp / "data" / "link.txt").symlink_to(tmp / "outside.txt")
    return args


CASES: dict[str, tuple[str, Callable[[Path, Good], list[str]], tuple[str, ...]]] = {
    # --- config: params.yaml edited by hand, or an override -------------------------
    "unknown-config-key": (
        "train",
        lambda t, g: train_args(t, g, {"model.n_head": 2}),
        ("params.yaml: model.n_head",),
    ),
    "wrong-type": (
        "train",
        lambda t, g: train_args(t, g, {"model.n_heads": "four"}),
        ("model.n_heads = 'four'", "int"),
    ),
    "zero-size": (
        "train",
        lambda t, g: train_args(t, g, {"model.d_model": 0}),
        ("model.d_model = 0",),
    ),
    "heads-exceed-d_model": (
        "params",
        lambda t, g: [
            "model.d_head=32",
            "--conf",
            str(ROOT / "conf"),
            "--out",
            str(t / "out" / "params.yaml"),
        ],
        ("override: model.d_head = 32", "d_model = 128"),
    ),
    "n_ctx-below-eval-length": (
        "train",
        lambda t, g: train_args(t, g, {"model.n_ctx": 12}),
        ("analysis.heads.repeat_length = 6", "model.n_ctx = 12"),
    ),
    "infinite-weight-decay": (  # passed `>= 0`; the loss became NaN and the train stage blamed train.lr
        "train",
        lambda t, g: train_args(t, g, {"train.weight_decay": float("inf")}),
        ("train.weight_decay = inf",),
    ),
    "missing-params-file": (
        "composition",
        lambda t, g: [
            "--params",
            str(t / "nowhere.yaml"),
            "--weights",
            str(g.weights),
            "--out",
            str(t / "out"),
        ],
        ("nowhere.yaml",),
    ),
    "params-file-missing-a-key": (
        "train",
        lambda t, g: train_args(t, g, {"train": {k: v for k, v in g.params["train"].items() if k != "lr"}}),
        ("params.yaml: train.lr",),
    ),
    "params-not-yaml": (
        "composition",
        lambda t, g: [
            "--params",
            str(_write(t / "p.yaml", b"model: [oops\n")),
            "--weights",
            str(g.weights),
            "--out",
            str(t / "out"),
        ],
        ("p.yaml",),
    ),
    # --- data ------------------------------------------------------------------------
    "missing-corpus-dir": (
        "tokenizer",
        lambda t, g: text_corpus(t, g, {"a.txt": b"x" * 500}, data_dir="nowhere"),
        ("data.dir = ", "nowhere'"),
    ),
    "corpus-symlink-leaves-data-dir": (
        "tokenizer",
        lambda t, g: symlinked_corpus(t, g),
        ("data.text.glob = 'link.txt'", "data.dir"),
    ),
    "corpus-not-utf8": (
        "tokenizer",
        lambda t, g: text_corpus(t, g, {"a.txt": b"caf\xe9 au lait\n"}),
        ("a.txt",),
    ),
    "heldout-part-shorter-than-a-window": (
        "tokenizer",
        lambda t, g: text_corpus(t, g, {"a.txt": b"x y z\n" * 60}),
        ("data.eval_fraction = 0.05", "model.n_ctx = 20"),
    ),
    "token-ids-beyond-d_vocab": (
        "train",
        lambda t, g: tokens_file(t, g, np.arange(2000) % 40),
        ("ids.npy", "[0, 39]", "model.d_vocab = 16"),
    ),
    # --- training --------------------------------------------------------------------
    "nan-loss": (
        "train",
        lambda t, g: train_args(t, g, {"train.lr": 1e30, "train.grad_clip": 1e30}),
        ("train.lr = 1e+30",),
    ),
    # --- checkpoints -------------------------------------------------------------------
    "missing-checkpoint": (
        "weights",
        lambda t, g: weights_args(t, g, model=t / "model.safetensors"),
        ("model.safetensors",),
    ),
    "truncated-safetensors": ("weights", truncated, ("model.safetensors",)),
    "shapes-disagree-with-config": (
        "weights",
        lambda t, g: weights_args(t, g, config=config_with(t, g, n_heads=1, d_head=8)),
        ("blocks.0.attn.W_Q", "[2, 16, 4]", "[1, 16, 8]", "config.json"),
    ),
    "mlp-weights": (
        "weights",
        lambda t, g: weights_args(
            t, g, model=spoiled_state(t, g, "m.safetensors", set_("blocks.0.mlp.W_in", torch.zeros(16, 64)))
        ),
        ("m.safetensors: blocks.0.mlp.W_in",),
    ),
    "config-mlp-activation-not-computed": (
        "weights",
        lambda t, g: weights_args(
            t, g, config=config_with(t, g, attn_only=False, d_mlp=64, act_fn="solu_ln")
        ),
        ("config.json: act_fn = 'solu_ln'",),
    ),
    "pickle-that-runs-code": (
        "train",
        pickle_checkpoint,
        ("model.pth", "io.open"),
    ),
    "nan-in-checkpoint": (
        "weights",
        lambda t, g: weights_args(
            t,
            g,
            model=spoiled_state(
                t, g, "m.safetensors", set_("blocks.1.attn.W_O", torch.full((2, 4, 16), float("nan")))
            ),
        ),
        ("m.safetensors: blocks.1.attn.W_O",),
    ),
    "checkpoint-overflows-float32": (
        "train",
        lambda t, g: _load_args(
            t, g, lambda s: s.update({k: v.double() * 1e100 for k, v in s.items() if k.endswith(".W_Q")})
        ),
        ("model.safetensors",),
    ),
    # --- analysis inputs -----------------------------------------------------------------
    "inf-in-weights-file": (
        "composition",
        lambda t, g: composition_args(
            t,
            g,
            spoiled_state(t, g, "heads.safetensors", set_("embed.W_E", torch.full((16, 16), float("inf")))),
        ),
        ("heads.safetensors: embed.W_E",),
    ),
    "weights-file-missing-W_V": (
        "composition",
        lambda t, g: composition_args(
            t, g, spoiled_state(t, g, "heads.safetensors", lambda s: s.pop("blocks.1.attn.W_V"))
        ),
        ("heads.safetensors: blocks.1.attn.W_V",),
    ),
    "weights-of-another-model": (
        "heads",
        lambda t, g: heads_args(
            t,
            g,
            weights=spoiled_state(
                t, g, "heads.safetensors", lambda s: [s.pop(k) for k in list(s) if k.startswith("blocks.1.")]
            ),
        ),
        ("heads.safetensors", "model.safetensors"),
    ),
    "checkpoint-n_ctx-below-eval-length": (
        "heads",
        lambda t, g: heads_args(
            t,
            g,
            model=spoiled_state(
                t, g, "m.safetensors", lambda s: s.__setitem__("pos_embed.W_pos", s["pos_embed.W_pos"][:12])
            ),
            config=config_with(t, g, n_ctx=12),
        ),
        ("analysis.heads.repeat_length = 6", "n_ctx = 12"),
    ),
    "weights-overflow-the-forward-pass": (
        "heads",
        lambda t, g: heads_args(
            t,
            g,
            model=spoiled_state(
                t,
                g,
                "m.safetensors",
                lambda s: s.update({k: v.double() * 1e100 for k, v in s.items() if ".W_" in k}),
            ),
        ),
        ("m.safetensors",),
    ),
    "table-missing-a-column": (
        "figures",
        lambda t, g: figures_args(t, g, heads=_without_column(t, g, "copying")),
        ("heads.csv", "'copying'"),
    ),
    "patterns-file-corrupted": (
        "figures",
        lambda t, g: figures_args(t, g, patterns=_write(t / "patterns.safetensors", b"\x00" * 64)),
        ("patterns.safetensors",),
    ),
    # --- memory: tensors that cannot fit are refused before anything is allocated ---------
    "enormous-n_ctx": (
        "train",
        lambda t, g: train_args(t, g, {"model.n_ctx": 10**6}),
        ("model.n_ctx = 1000000",),
    ),
    # --- empty or partial files ----------------------------------------------------------
    "origin-json-of-nothing": (
        "train",
        lambda t, g: _with_origin(t, g, b"{}"),
        ("origin.json",),
    ),
    "empty-config-json": (
        "weights",
        lambda t, g: weights_args(t, g, config=_write(t / "config.json", b"")),
        ("config.json",),
    ),
    "empty-scores-csv": (
        "heads",
        lambda t, g: heads_args(t, g, scores=_write(t / "scores.csv", b"")),
        ("scores.csv",),
    ),
    "scores-csv-without-rows": (
        "heads",
        lambda t, g: heads_args(t, g, scores=_header_only(t, g.scores)),
        ("scores.csv",),
    ),
    "heads-summary-not-an-object": (
        "figures",
        lambda t, g: figures_args(t, g, summary=_write(t / "summary.json", b"[]")),
        ("summary.json: agreement",),
    ),
    "empty-token-file": (
        "train",
        lambda t, g: _empty_tokens_file(t, g),
        ("ids.npy",),
    ),
    "tokenizer-manifest-without-vocab": (
        "train",
        lambda t, g: _spoiled_tokenized(t, g, lambda d: _edit_json(d / "manifest.json", "vocab")),
        ("tokenized/manifest.json", "data.source = text"),
    ),
    # --- checkpoints through training (train.save_*, the dynamics stage) -----------------
    "dynamics-index-out-of-order": (
        "dynamics",
        lambda t, g: dynamics_args(t, g, lambda d: _edit_index(d, lambda i: i["checkpoints"].reverse())),
        ("index.json: checkpoints[1].step = 10", "(20)"),
    ),
    "dynamics-checkpoint-of-another-model": (
        "dynamics",
        lambda t, g: dynamics_args(t, g, config=_other_config(t, g)),
        ("step0000000.safetensors", "blocks.0.attn.W_Q"),
    ),
    "figures-dynamics-summary-without-pair": (
        "figures",
        lambda t, g: [*figures_args(t, g), "--dynamics", str(_dynamics_without_pair(t, g))],
        ("summary.json: pair",),
    ),
    # --- calibrated significance and the ablation's noise ----------------------------------
    "placebo-csv-missing": (
        "compare",
        lambda t, g: _compare_args(
            t, g, lambda dirs: (dirs["composition"] / "seed0" / "placebo.csv").unlink()
        ),
        ("placebo.csv",),
    ),
    # --- outputs -----------------------------------------------------------------------
    "out-dir-under-a-file": (
        "weights",
        lambda t, g: [*weights_args(t, g)[:-1], str(file_in_the_way(t) / "out")],
        ("a-file/out",),
    ),
    "report-out-is-a-folder": (  # a file is never written over a folder of the user's
        "report",
        lambda t, g: _report_args(t, g, out=_folder(t / "index.html")),
        ("index.html",),
    ),
    # --- the files stages hand each other: checked against what they need and their siblings --
    "channel-tables-of-another-model": (  # would be drawn under channels.csv's titles
        "figures",
        lambda t, g: [
            *figures_args(t, g),
            "--channels",
            str(g.scores.parent / "channels.csv"),
            "--channel-shares",
            str(_narrower_channel_tables(t, g)),
        ],  # fmt: skip
        ("channels.safetensors", "channels.csv", "(2, 0)", "d_head = 2"),
    ),
    "table-cut-inside-its-last-row": (  # pandas would fill the cut cells with NaN
        "heads",
        lambda t, g: heads_args(t, g, scores=_write(t / "scores.csv", g.scores.read_bytes()[:-7])),
        ("scores.csv",),
    ),
    "table-cell-of-another-type": (
        "figures",
        lambda t, g: figures_args(t, g, heads=_with_cell(t, g.heads / "heads.csv", "copying", "0.9x")),
        ("heads.csv: copying", "'0.9x'"),
    ),
    "json-value-of-another-type": (  # a number written as text would reach compare's arithmetic
        "compare",
        lambda t, g: _compare_args(
            t, g, lambda dirs: _set_json(dirs["train"] / "seed0" / "metrics.json", "eval_loss", "2.7")
        ),
        ("metrics.json: eval_loss = '2.7'",),
    ),
    "group-override-not-a-name": (  # Hydra's own error: a traceback naming no key
        "params",
        lambda t, g: ["model=4", "--conf", str(ROOT / "conf"), "--out", str(t / "out" / "params.yaml")],
        ("override: model = 4", "tl_attn_only_2l"),
    ),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _set_json(path: Path, key: str, value: object) -> Path:
    """`path`'s JSON object with `key` set to `value` (by hand)."""
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    (path / "mine.txt").write_text("the user's\n")
    return path


def _narrower_channel_tables(tmp: Path, good: Good) -> Path:
    """channels.safetensors of a model with as many pairs and a narrower d_head (2): each table's
    leading 2 x 2 channels, normalised."""
    from safetensors.numpy import load_file, save_file

    shares = load_file(str(good.scores.parent / "channels.safetensors"))
    narrow = {k: v[:, :2, :2] / v[:, :2, :2].sum(axis=(1, 2), keepdims=True) for k, v in shares.items()}
    save_file({k: np.ascontiguousarray(v) for k, v in narrow.items()}, str(tmp / "channels.safetensors"))
    return tmp / "channels.safetensors"


def _with_cell(tmp: Path, table: Path, column: str, value: str) -> Path:
    """`table` under `tmp` with the first row's `column` set to `value` (by hand, as text)."""
    lines = table.read_text().splitlines(keepends=True)
    at = lines[0].rstrip("\n").split(",").index(column)
    first = lines[1].rstrip("\n").split(",")
    first[at] = value
    path = tmp / table.name
    path.write_text(lines[0] + ",".join(first) + "\n" + "".join(lines[2:]))
    return path


def _with_origin(tmp: Path, good: Good, content: bytes) -> list[str]:
    """The train stage reading an origin.json with `content` (hand-edited, or cut short)."""
    args = train_args(tmp, good)
    _write(tmp / "origin.json", content)
    return args


def _header_only(tmp: Path, table: Path) -> Path:
    """`table` under `tmp` (in place if it is there) with its header and no rows."""
    path = tmp / table.name
    path.write_text(table.read_text().splitlines()[0] + "\n")
    return path


def _spoiled_tokenized(tmp: Path, good: Good, spoil: Callable[[Path], object]) -> list[str]:
    """The train stage on the tokenizer stage's output, one of its files then spoiled."""
    args = short_text(tmp, good)
    spoil(tmp / "tokenized")
    return args


def _edit_json(path: Path, drop: str) -> Path:
    """`path`'s JSON object without its key `drop` (a partial file)."""
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != drop}))
    return path


def _compare_args(
    tmp: Path, good: Good, spoil: Callable[[dict[str, Path]], object], changes: dict | None = None
) -> list[str]:
    """The compare stage on hand-made seed outputs (synthetic_seeds), one file then spoiled."""
    import synthetic_seeds as syn

    dirs = syn.write_stage_outputs(tmp / "inputs", [0])
    spoil(dirs)
    p = write_params(tmp, good, {"seeds": [0], "analysis.compare.min_seeds": 1, **(changes or {})})
    return ["--params", str(p), "--train", str(dirs["train"]), "--composition", str(dirs["composition"]),
            "--heads", str(dirs["heads"]), "--dynamics", str(dirs["dynamics"]),
            "--calibration", str(dirs["calibration"]), "--out", str(tmp / "compare")]  # fmt: skip


def _other_config(tmp: Path, good: Good) -> Path:
    """config.json of a model with twice the heads: not the one the checkpoints hold."""
    config = json.loads(good.config.read_text())
    config["n_heads"] *= 2
    path = tmp / "other" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return path


def _dynamics_without_pair(tmp: Path, good: Good) -> Path:
    import shutil

    shutil.copytree(good.dynamics, tmp / "dynamics")
    summary = json.loads((tmp / "dynamics" / "summary.json").read_text())
    del summary["pair"]
    (tmp / "dynamics" / "summary.json").write_text(json.dumps(summary))
    return tmp / "dynamics"


def _empty_tokens_file(tmp: Path, good: Good) -> list[str]:
    """data.source = tokens with a zero-byte .npy file."""
    args = tokens_file(tmp, good, np.arange(10))
    _write(tmp / "data" / "ids.npy", b"")
    return args


def _without_column(tmp: Path, good: Good, column: str) -> Path:
    import pandas as pd

    pd.read_csv(good.heads / "heads.csv").drop(columns=column).to_csv(tmp / "heads.csv", index=False)
    return tmp / "heads.csv"


def _report_args(tmp: Path, good: Good, out: Path | None = None) -> list[str]:
    """The compare stage's outputs for hand-made seeds (synthetic_seeds),
    then the report into `out` (default: a path under a file)."""
    import synthetic_seeds as syn

    shared = good.heads.parent / "report-inputs"  # built once, for both runs of this case (read only)
    p = write_params(tmp, good, {"seeds": [0], "analysis.compare.min_seeds": 1})
    if not (shared / "compare" / "summary.json").exists():
        dirs = syn.write_stage_outputs(shared / "inputs", [0])
        compare = import_module("stages.compare").main(["--params", str(p), "--train", str(dirs["train"]),
                                                        "--composition", str(dirs["composition"]),
                                                        "--heads", str(dirs["heads"]),
                                                        "--dynamics", str(dirs["dynamics"]),
                                                        "--calibration", str(dirs["calibration"]),
                                                        "--out", str(shared / "compare")])  # fmt: skip
        assert compare == 0
    return ["--params", str(p), "--compare", str(shared / "compare"),
            "--figures", str(shared / "inputs" / "figures"),
            "--out", str(out or file_in_the_way(tmp) / "report" / "index.html")]  # fmt: skip


# --- the checks --------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (hidden ones too): a file's sha256, or "dir"."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def check_refusal(code: int, err: str, names: tuple[str, ...], before: dict, after: dict) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    assert after == before, (
        f"written: {sorted(set(after) - set(before))}, "
        f"changed: {[k for k in before if after.get(k) != before[k]]}"
    )
    return lines[0]


def entry(stage: str) -> Callable[[list[str]], int]:
    return import_module("pipeline.params" if stage == "params" else f"stages.{stage}").main


# --- the Hugging Face cache (pipeline/hub.py): a real cache in the library's layout under tmp/hub ----

HUB_REPO = "org/tiny-attn-only"


def hub_origin(tmp: Path, good: Good, value: str, spoil: Callable[[Path], object] | None = None) -> list[str]:
    """The origin stage for `train.checkpoint = value` on a cache holding HUB_REPO's main (the origin
    stage records files by sha256: any bytes serve), `spoil`ed."""
    from hub_cache import add_snapshot

    add_snapshot(tmp / "hub", HUB_REPO, {"config.json": b"{}", "model_final.pth": b"main"})
    if spoil:
        spoil(tmp / "hub" / ("models--" + HUB_REPO.replace("/", "--")))
    p = write_params(tmp, good, {"train.source": "load", "train.checkpoint": value})
    return ["--params", str(p), "--seed", "0", "--out", str(tmp / "out")]


def hub_tokenizer(tmp: Path, good: Good) -> list[str]:
    """The tokenizer stage with a word-level tokenizer.json that has no unknown token."""
    from hub_cache import add_snapshot, word_level_tokenizer

    add_snapshot(
        tmp / "hub", "org/words", {"tokenizer.json": word_level_tokenizer(["in", "the", "beginning"])}
    )
    lines = {"a.txt": b"in the beginning\n" * 100 + b"in the end\n" + b"in the beginning\n" * 100}
    return text_corpus(tmp, good, lines, **{"data.tokenizer.pretrained": "hf:org/words"})


HUB_CASES = {
    "hub-revision-dot-dot": (  # the name's parser: a revision that would walk the cache
        "origin",
        lambda t, g: hub_origin(t, g, f"hf:{HUB_REPO}@.."),
        (f"train.checkpoint = 'hf:{HUB_REPO}@..'", "'..'"),
    ),
    "hub-empty-ref": (  # the cache's lookup: an interrupted download left refs/main empty
        "origin",
        lambda t, g: hub_origin(t, g, f"hf:{HUB_REPO}", lambda repo: (repo / "refs" / "main").write_text("")),
        (f"train.checkpoint = 'hf:{HUB_REPO}'", "refs/main", f"`hf download {HUB_REPO}`"),
    ),
    "hub-tokenizer-cannot-encode": (  # a pretrained tokenizer tried on the text
        "tokenizer",
        hub_tokenizer,
        ("data.tokenizer.pretrained = 'hf:org/words'", "'in the end'"),
    ),
}


@pytest.mark.parametrize("case", list(HUB_CASES))
def test_bad_hub_input_is_one_line_naming_it_and_writes_nothing(case, good, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # as HF_HUB_CACHE sets it
    refused_without_a_trace(*HUB_CASES[case], good, tmp_path, capsys)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_naming_it_and_writes_nothing(case, good, tmp_path, capsys):
    refused_without_a_trace(*CASES[case], good, tmp_path, capsys)


def refused_without_a_trace(stage, build, names, good, tmp_path, capsys) -> None:
    argv = build(tmp_path, good)
    before = snapshot(tmp_path)
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:  # a warning would be a second line on stderr
        warnings.simplefilter("default")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", quiet)  # hidden outside __main__ by Python's defaults
        code = entry(stage)(argv)
    captured = capsys.readouterr()
    check_refusal(code, captured.err, names, before, snapshot(tmp_path))
    assert not captured.out
    assert not caught, [str(w.message) for w in caught]
    assert not (tmp_path / "PWNED").exists()  # the pickle case: its code did not run


def test_each_case_is_one_row_of_the_docs_table_of_mechanisms():
    """docs/bad-inputs.md's table has a row per mechanism, naming the case here that runs it (or none,
    for one tested elsewhere): each case is named by exactly one row."""
    table = [
        line for line in (ROOT / "docs" / "bad-inputs.md").read_text().splitlines() if line.startswith("| ")
    ]
    assert table[0].split("|")[-2].strip() == "case"
    named = [name for row in table[2:] for name in re.findall(r"`([\w-]+)`", row.split("|")[-2])]
    assert sorted(named) == sorted([*CASES, *HUB_CASES, *API_CASES])


def test_the_pickle_would_run_code_if_unpickled(good, tmp_path):
    """So the refusal above is not vacuous: an unsafe load does create the marker."""
    pickle_checkpoint(tmp_path, good)
    torch.load(tmp_path / "checkpoints" / "model.pth", weights_only=False)  # what we never do
    assert (tmp_path / "PWNED").exists()


# --- end to end: real processes --------------------------------------------------------

SUBPROCESS = [  # one per kind of entry point: a stage, and `python -m pipeline.params`
    "truncated-safetensors",
    "heads-exceed-d_model",
]


def run_module(stage: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    module = "pipeline.params" if stage == "params" else f"stages.{stage}"
    env = os.environ | {"PYTHONPATH": str(ROOT)}  # stages/ and pipeline/ are the checkout's, not installed
    return subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("case", SUBPROCESS)
def test_bad_input_end_to_end_in_a_real_process(case, good, tmp_path):
    stage, build, names = CASES[case]
    argv = build(tmp_path, good)
    before = snapshot(tmp_path)
    done = run_module(stage, argv, cwd=tmp_path)
    check_refusal(done.returncode, done.stderr, names, before, snapshot(tmp_path))


def test_debug_shows_the_traceback(good, tmp_path):
    stage, build, _ = CASES["truncated-safetensors"]
    done = run_module(stage, [*build(tmp_path, good), "--debug"], cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "UserError" in done.stderr and "model.safetensors" in done.stderr
    assert not (tmp_path / "out").exists()


# --- the Python API, in a process of its own as a notebook runs it ------------------------------
#
# Each case is a call of `attn_circuits` (the installed package, as docs/api.md imports it) on copies
# of the real run's files; all of them run in one `python` process, each caught alone. The call
# must raise the project's UserError, its message one line naming the argument or file, and leave
# every file under the case's folder as it was.

API_PREAMBLE = """
from dataclasses import replace
from attn_circuits import api, checkpoint
from attn_circuits.model import tl_checkpoint
standard = replace(tl_checkpoint.read_tl_config({config!r}), positional_embedding_type="standard")
state = checkpoint.load_state({model!r})[0]
"""
LACKING_DEVICE = "cuda:99"  # no machine of ours has it, with CUDA or without

API_CASES: dict[str, tuple[Callable[[Path, Good], str], tuple[str, ...]]] = {
    "api-setting-of-the-wrong-type": (  # OmegaConf's types, as params.yaml has them
        lambda t, g: f"api.composition({str(g.model)!r}, fdr='high')",
        ("analysis.composition.fdr = 'high'", "float"),
    ),
    "api-device-the-machine-lacks": (  # the stages' device check, not torch's error
        lambda t, g: f"api.composition({str(g.weights)!r}, device={LACKING_DEVICE!r})",
        (f"device = {LACKING_DEVICE!r}",),
    ),
    "api-weights-file-with-mlp-weights": (  # read as it is, the analysis would leave the MLP out
        lambda t, g: "api.composition({!r})".format(
            str(spoiled_state(t, g, "heads.safetensors", set_("blocks.0.mlp.W_in", torch.zeros(16, 64))))
        ),
        ("heads.safetensors: blocks.0.mlp.W_in",),
    ),
    "api-bridge-checkpoint-onto-a-file": (
        lambda t, g: f"tl_checkpoint.write_bridge_checkpoint({str(file_in_the_way(t))!r}, standard, state)",
        ("a-file",),
    ),
}
API_RUNNER = """
import json, sys
from attn_circuits.errors import UserError
preamble, cases, results = sys.argv[1], json.loads(sys.argv[2]), {}
for name, call in cases.items():
    try:
        exec(preamble + call, {})
    except UserError as e:
        results[name] = [f"{type(e).__module__}.{type(e).__qualname__}", str(e)]
    else:
        results[name] = [None, ""]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def api_runs(good, tmp_path_factory) -> dict[str, tuple[list, dict, dict, Path]]:
    """Every API case (and writing a bridge checkpoint into a folder in use) in one real process:
    {case: ([exception type, message], files before, files after, the case's folder)}."""
    folders, calls = {}, {}
    for name, (build, _) in API_CASES.items():
        folders[name] = tmp_path_factory.mktemp(name)
        calls[name] = build(folders[name], good)
    in_use = folders["in-use"] = tmp_path_factory.mktemp("in-use")
    (in_use / "notes.md").write_text("the user's\n")
    (in_use / "config.json").write_text("{}\n")  # replaced: the checkpoint's own name
    calls["in-use"] = f"tl_checkpoint.write_bridge_checkpoint({str(in_use)!r}, standard, state)"
    before = {name: snapshot(folder) for name, folder in folders.items()}
    preamble = API_PREAMBLE.format(config=str(good.config), model=str(good.model))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", API_RUNNER, preamble, json.dumps(calls)], cwd=in_use,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    return {name: (results[name], before[name], snapshot(folder), folder) for name, folder in folders.items()}


@pytest.mark.parametrize("case", list(API_CASES))
def test_bad_api_input_raises_one_user_error_line_naming_it_and_changes_no_file(case, api_runs):
    (kind, message), before, after, _ = api_runs[case]
    assert kind == "attn_circuits.errors.UserError", (case, kind, message)
    assert "\n" not in message
    for name in API_CASES[case][1]:
        assert name in message, f"{name!r} not in {message!r}"
    assert after == before


def test_a_bridge_checkpoint_written_into_a_folder_in_use_keeps_the_users_files(api_runs):
    """The folder's other files stay byte for byte; the checkpoint's own two names are written."""
    (kind, message), before, after, folder = api_runs["in-use"]
    assert kind is None, message
    assert after["notes.md"] == before["notes.md"]
    assert set(after) == {"notes.md", "config.json", "model.safetensors"}
    assert json.loads((folder / "config.json").read_text())["architecture"] == "TransformerLensNative"
