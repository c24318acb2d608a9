"""Progress of the library's long calls (pipeline/cli.py `progress_bar`): a tqdm bar with its total
and time estimate on stderr, plain lines under DVC, nothing where no one watches; never stdout, and
never a changed result (the same config and seed give byte-identical artifacts)."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import import_module
from pathlib import Path

import torch
from dvc_repo import TINY
from models import random_model

from pipeline import cli, params
from pipeline.behaviour import ablation
from pipeline.circuits import channels, composition, invariant, weights
from pipeline.config import CompositionConfig

ROOT = Path(__file__).resolve().parents[1]
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
    blocks = channels.channel_blocks(8, hw.d_model, hw.d_head, gen)
    rows, _ = channels.channel_rows(hw, blocks, CompositionConfig().channel_tolerance)
    capsys.readouterr()
    with cli.showing_progress("bar"):
        inv_shown = invariant.invariant_scores(hw, CFG, seed=0)
        rows_shown, _ = channels.channel_rows(hw, blocks, CompositionConfig().channel_tolerance)
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
    assert (
        lines[0].startswith("path ablation: 3/9 source heads, ")
        and "about" in lines[0]
        and "s left" in lines[0]
    )
    assert lines[-1].startswith("path ablation: 9/9 source heads, ") and "left" not in lines[-1]
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
