"""Composition through training: train's checkpoints (which steps, that saving them does not
change the run, that the last is the final model), the dynamics stage through the real
stages (at the final checkpoint it reproduces the composition stage's scores and the heads
stage's attention scores exactly), the timing rules of `pipeline.behaviour.phases` on known answers,
and the per-seed figure."""

from __future__ import annotations

import hashlib
import json
import math
from importlib import import_module
from pathlib import Path

import pandas as pd
import pytest
import torch
from dvc_repo import TINY

from pipeline import checkpoint, tables
from pipeline import params as params_mod
from pipeline.behaviour import phases
from pipeline.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


# --- which steps -------------------------------------------------------------------


def test_checkpoint_steps_are_the_periodic_the_listed_and_the_last():
    t = TrainConfig(steps=25, save_every=10, save_steps=[3, 10, 17])
    assert t.checkpoint_steps() == [0, 3, 10, 17, 20, 25]
    assert TrainConfig(steps=25, save_every=0, save_steps=[]).checkpoint_steps() == [25]  # the final model
    assert TrainConfig(steps=20, save_every=10).checkpoint_steps() == [0, 10, 20]  # the last only once


def test_the_shipped_schedules_are_denser_where_induction_forms():
    shipped = ((["setup=synthetic"], (200, 900)), (["setup=code"], (300, 1400)), ([], (950, 1750)))
    for overrides, dense in shipped:
        t = params_mod.compose(overrides, conf_dir=ROOT / "conf")["train"]
        steps = TrainConfig(steps=t["steps"], save_every=t["save_every"], save_steps=t["save_steps"])
        gaps = pd.Series(steps.checkpoint_steps()).diff().dropna()
        inside = [s for s in steps.checkpoint_steps() if dense[0] <= s <= dense[1]]
        assert gaps.max() == t["save_every"] and pd.Series(inside).diff().dropna().eq(50).all()


# --- one tiny run through the real stages -------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """origin, train, weights, composition, heads and dynamics on TINY (checkpoints 0, 10, 20)."""
    root = tmp_path_factory.mktemp("dynamics")
    p = root / "params.yaml"
    p.write_text(params_mod.dump(params_mod.compose(TINY, conf_dir=ROOT / "conf")))
    out = {n: root / n for n in ("origin", "train", "weights", "composition", "heads", "dynamics")}

    def stage(name, *argv):
        assert import_module(f"stages.{name}").main(["--params", str(p), *argv]) == 0

    stage("origin", "--seed", "0", "--out", str(out["origin"]))
    stage("train", "--seed", "0", "--origin", str(out["origin"] / "origin.json"), "--out", str(out["train"]),
          "--no-progress")  # fmt: skip
    model, config = str(out["train"] / "model.safetensors"), str(out["train"] / "config.json")
    stage("weights", "--model", model, "--config", config, "--out", str(out["weights"]))
    weights = str(out["weights"] / "heads.safetensors")
    stage("composition", "--weights", weights, "--out", str(out["composition"]))
    stage("heads", "--model", model, "--config", config, "--weights", weights,
          "--scores", str(out["composition"] / "scores.csv"),
          "--invariant", str(out["composition"] / "invariant.csv"), "--out", str(out["heads"]))  # fmt: skip
    stage("dynamics", "--checkpoints", str(out["train"] / "checkpoints"), "--config", config,
          "--out", str(out["dynamics"]), "--no-progress")  # fmt: skip
    return out | {"root": root, "params": p}


def test_train_saves_the_listed_steps_and_the_last_is_the_final_model(run):
    d = run["train"] / "checkpoints"
    entries = checkpoint.read_index(d)
    assert [e["step"] for e in entries] == [0, 10, 20]  # TINY: save_every 10, 20 steps
    assert [e["tokens"] for e in entries] == [s * 8 * 20 for s in (0, 10, 20)]  # batch 8 x n_ctx 20
    assert sorted(p.name for p in d.iterdir()) == ["index.json", *(e["file"] for e in entries)]
    final, _ = checkpoint.load_state(run["train"] / "model.safetensors")
    last, meta = checkpoint.load_state(d / entries[-1]["file"])
    assert meta == {"seed": "0", "step": "20", "tokens": "3200"}
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    first, _ = checkpoint.load_state(d / entries[0]["file"])
    assert not torch.equal(first["blocks.0.attn.W_Q"], final["blocks.0.attn.W_Q"])  # training moved it


def test_saving_checkpoints_does_not_change_the_run(run, tmp_path):
    """The same seed without checkpoints (save_every 0): the same final model, byte for byte."""
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(params_mod.compose([*TINY, "train.save_every=0"], conf_dir=ROOT / "conf")))
    argv = ["--params", str(p), "--seed", "0", "--origin", str(run["origin"] / "origin.json"),
            "--out", str(tmp_path / "train"), "--no-progress"]  # fmt: skip
    assert import_module("stages.train").main(argv) == 0
    sha = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    assert sha(tmp_path / "train" / "model.safetensors") == sha(run["train"] / "model.safetensors")
    assert [e["step"] for e in checkpoint.read_index(tmp_path / "train" / "checkpoints")] == [20]


def test_final_checkpoint_reproduces_the_composition_stage_exactly(run):
    dyn = pd.read_csv(run["dynamics"] / "composition.csv")
    assert list(dyn.columns) == list(tables.DYNAMICS_COLUMNS)
    assert sorted(dyn["step"].unique()) == [0, 10, 20]
    final = dyn[dyn["step"] == 20].drop(columns=["step", "tokens", "excess"]).reset_index(drop=True)
    stage = tables.join_measures(
        pd.read_csv(run["composition"] / "scores.csv"),
        {m: pd.read_csv(run["composition"] / f"{m}.csv") for m in tables.OTHER_MEASURES},
    )
    pd.testing.assert_frame_equal(final, stage, check_exact=True)
    assert set(dyn["variant"]) == set(tables.MEASURES)
    # the text files agree too: the same numbers, written the same way
    text = (run["dynamics"] / "composition.csv").read_text().splitlines()
    stage_text = (run["composition"] / "scores.csv").read_text().splitlines()[1:]
    cut = lambda line: ",".join(line.split(",")[2:-1])  # noqa: E731  (drop step, tokens, excess)
    final_text = {cut(line) for line in text[1:] if line.startswith("20,3200,")}
    assert set(stage_text) <= final_text


def test_final_checkpoint_reproduces_the_heads_stage_scores_exactly(run):
    dyn = pd.read_csv(run["dynamics"] / "heads.csv")
    assert list(dyn.columns) == list(tables.DYNAMICS_HEADS_COLUMNS)
    final = dyn[dyn["step"] == 20].drop(columns=["step", "tokens"]).reset_index(drop=True)
    stage = pd.read_csv(run["heads"] / "heads.csv")[["layer", "head", *tables.PATTERN_SCORES]]
    pd.testing.assert_frame_equal(final, stage, check_exact=True)


def test_steps_table_follows_the_top_pair(run):
    steps = pd.read_csv(run["dynamics"] / "steps.tsv", sep="\t")
    summary = json.loads((run["dynamics"] / "summary.json").read_text())
    assert list(steps.columns) == list(tables.STEPS_COLUMNS) and steps["step"].tolist() == [0, 10, 20]
    (i, a), (j, b) = summary["pair"]["src"], summary["pair"]["dst"]
    heads = pd.read_csv(run["dynamics"] / "heads.csv")
    last = heads[heads["step"] == 20]
    assert (
        j >= 1
        and last.loc[last["layer"] >= 1, "induction"].idxmax()
        == last.index[(last["layer"] == j) & (last["head"] == b)][0]
    )
    comp = pd.read_csv(run["dynamics"] / "composition.csv")
    for m in tables.MEASURES:
        pair = (
            (comp["src_layer"] == i)
            & (comp["src_head"] == a)
            & (comp["dst_layer"] == j)
            & (comp["dst_head"] == b)
        )
        rows = comp.loc[(comp["kind"] == "K") & (comp["variant"] == m) & pair]
        assert steps[f"z_{m}"].tolist() == rows["z"].tolist()
        assert steps[f"q_{m}"].tolist() == rows["q"].tolist()  # each checkpoint calibrated on its own
    best = heads.groupby("step").apply(
        lambda f: f.loc[f["layer"] >= 1, "induction"].max(), include_groups=False
    )
    assert steps["induction"].tolist() == best.tolist()
    assert summary["checkpoints"] == 3 and summary == {**summary, **phases.summary(steps, 0.05)}
    # 20 steps of the tiny model need not lower the loss (seed 0 does not); the untrained model's
    # is near uniform over 16 tokens
    assert (steps["eval_loss"] > 0).all() and steps["eval_loss"].iloc[0] == pytest.approx(
        math.log(16), abs=0.15
    )


def test_figure_marks_the_phase_change(run):
    from pipeline.present.figures import dynamics as figure

    steps = pd.read_csv(run["dynamics"] / "steps.tsv", sep="\t").assign(induction=[0.1, 0.6, 0.7])
    pair, z = figure.read_summary(str(run["dynamics"] / "summary.json"))
    fig = figure.dynamics_figure(steps, pair, z)
    top, bottom = fig.axes[0], fig.axes[1]
    at = steps["tokens"].iloc[1]  # induction first reaches 0.5 at step 10
    assert any(list(line.get_xdata()) == [at, at] for line in bottom.get_lines())
    assert len([line for line in bottom.get_lines() if line.get_marker() == "."]) == len(tables.MEASURES)
    assert "induction" in top.get_legend_handles_labels()[1][0]
    import matplotlib.pyplot as plt

    plt.close(fig)


# --- phases: known answers -----------------------------------------------------------


def steps_with(induction, q, z=None) -> pd.DataFrame:
    z = [0.0] * 5 if z is None else z
    return pd.DataFrame({"step": [0, 100, 200, 300, 400], "induction": induction, "q_true": q, "z_true": z})


def test_phase_step_is_the_first_checkpoint_at_the_threshold():
    assert phases.phase_step(steps_with([0, 0.2, 0.5, 0.4, 0.7], [0] * 5)) == 200  # 0.5 counts
    assert math.isnan(phases.phase_step(steps_with([0, 0.2, 0.49, 0.4, 0.3], [0] * 5)))


@pytest.mark.parametrize(
    "q, cleared",
    [
        ([1, 0.01, 0.02, 0.001, 0.001], 100),
        ([1, 0.01, 0.5, 0.01, 0.01], 300),  # discovered at 100, lost again: cleared for good at 300
        ([0.01] * 5, 0),
        ([1, 0.06, 0.051, 0.05, 0.05], 300),  # q = fdr is a discovery
        ([1, 0.01, 0.01, 0.01, 0.2], None),  # not a discovery at the end: not cleared
        ([1, 0.01, float("nan"), 0.01, 0.01], 300),  # an undefined q is not a discovery
    ],
)
def test_clear_step_is_the_first_from_which_the_pair_stays_a_discovery(q, cleared):
    got = phases.clear_step(steps_with([0] * 5, q), "q_true", 0.05)
    assert (math.isnan(got) and cleared is None) or got == cleared


def test_lag_is_clear_step_minus_phase_step():
    s = steps_with([0, 0.2, 0.6, 0.7, 0.7], [1, 0.01, 0.01, 0.01, 0.01])
    for m in tables.MEASURES:
        if m != "true":
            s[f"q_{m}"] = [1.0] * 5
            s[f"z_{m}"] = [0.0] * 5
    lags = phases.lags(s, 0.05)
    assert lags["true"] == 100 - 200 and all(math.isnan(v) for m, v in lags.items() if m != "true")
    summary = phases.summary(s, 0.05)
    assert (
        summary["phase_step"] == 200
        and summary["lag"]["true"] == -100
        and summary["lag"]["invariant"] is None
    )


def test_z_growth_is_the_slope_before_the_phase_step():
    # phase at 200: the window is [0, 200] (500 steps before it reach below 0); z = 1 + 3 x step/100
    s = steps_with([0, 0.2, 0.6, 0.7, 0.7], [1] * 5, z=[1, 4, 7, 0, 0])
    assert phases.z_growth(s, "true") == pytest.approx(3.0, abs=1e-12)
    assert math.isnan(phases.z_growth(steps_with([0] * 5, [1] * 5), "true"))  # no phase change


def test_without_a_terminal_the_stage_prints_a_line_per_checkpoint(run, tmp_path, capsys):
    """Under DVC (no terminal): one plain line on stderr per checkpoint analysed, with its step."""
    config = str(run["train"] / "config.json")
    capsys.readouterr()
    code = import_module("stages.dynamics").main(
        ["--params", str(run["params"]), "--checkpoints", str(run["train"] / "checkpoints"),
         "--config", config, "--out", str(tmp_path / "dynamics")]
    )  # fmt: skip
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dynamics seed 0: ")]
    assert [line.split(",")[0] for line in lines] == [
        f"dynamics seed 0: {i}/3 checkpoints (step {s})" for i, s in enumerate((0, 10, 20), 1)
    ]
