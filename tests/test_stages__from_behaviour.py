"""stages/heads.py, stages/dynamics.py, stages/figures.py and stages/compare.py: the files each
writes, exit codes, and one-line refusals."""

from __future__ import annotations

import json
from importlib import import_module
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import synthetic_seeds as syn
import tiny_chain
from one_direction import channel_table

from pipeline import checkpoint, params, tables
from pipeline.behaviour import channel_check, heads
from pipeline.circuits import significance, weights
from pipeline.config import CompositionConfig
from pipeline.model import tl_checkpoint
from pipeline.tables import ABLATION_COLUMNS, CURVE_COLUMNS, VARIANTS
from stages import compare as compare_stage


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict[str, Path]:
    return tiny_chain.run(tmp_path_factory.mktemp("dynamics"))


ROOT = Path(__file__).resolve().parents[1]


LENGTH = 7


PLANTED_ROLES = {
    (0, 0): "previous_token", (0, 1): "first_token", (0, 2): "duplicate_token",
    (1, 0): "induction", (1, 1): "current_token", (1, 2): "recent_window",
}  # fmt: skip


def stage_inputs(tmp_path):
    """The planted model's checkpoint, weights and composition scores, and a params.yaml."""
    model = planted.model()
    checkpoint.save_state(tmp_path / "model.safetensors", model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(planted.CONFIG)))
    hw = weights.from_state_dict(model.state_dict())
    weights.save(tmp_path / "heads.safetensors", hw)
    measured, _ = significance.measured(
        hw, CompositionConfig(baseline_samples=8, null_samples=4), 0, "shortformer"
    )
    tables.split_measures(measured)[0].to_csv(tmp_path / "scores.csv", index=False)
    overrides = [
        "setup=synthetic", "model.n_ctx=16", "model.d_vocab=16",
        "model.n_heads=3", "model.d_head=32", "model.d_model=96",
        "train.probe_length=7", "analysis.heads.repeat_length=7", "analysis.heads.eval_sequences=16",
        "data.n_train_sequences=1000",  # 50 held out: three ablation batches of 16
    ]  # fmt: skip
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(overrides, conf_dir=ROOT / "conf")))
    return [
        "--params", str(tmp_path / "params.yaml"), "--model", str(tmp_path / "model.safetensors"),
        "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "heads.safetensors"),
        "--scores", str(tmp_path / "scores.csv"), "--seed", "0",
    ]  # fmt: skip


def write_params(path: Path, overrides: list[str]) -> Path:
    path.write_text(params.dump(params.compose(overrides)))  # real Hydra compose of conf/
    return path


def run_stage(tmp_path: Path, dirs: dict, out: Path, seeds: str) -> int:
    p = write_params(
        tmp_path / f"params-{out.name}.yaml",
        [f"seeds={seeds}", "analysis.compare.dpi=40"],
    )
    return compare_stage.main(
        [
            "--params",
            str(p),
            "--train",
            str(dirs["train"]),
            "--calibration",
            str(dirs["calibration"]),
            "--composition",
            str(dirs["composition"]),
            "--heads",
            str(dirs["heads"]),
            "--dynamics",
            str(dirs["dynamics"]),
            "--out",
            str(out),
        ]
    )


EXPECTED_FILES = {
    "claims.csv",
    "stats.csv",
    "groups.csv",
    "roles.csv",
    "curves.tsv",
    "summary.json",
    "verdicts.json",
    "figures/claims.png",
    "figures/claims.svg",
    "figures/roles.png",
    "figures/roles.svg",
    "figures/curves.png",
    "figures/curves.svg",
    "figures/timing.png",
    "figures/timing.svg",
}


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_heads_stage_with_channels_writes_the_check(tmp_path):
    """The planted model (tests/planted.py): its one composing K pair 0.0 -> 1.0 is the one
    discovered; channel_ablation.csv holds it on each of the three batches beside the whole path of
    ablation_batches.csv, summary.json its entry. Without --channels, neither (an earlier run's
    table removed)."""
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    hw, _ = weights.load(tmp_path / "heads.safetensors")
    channel_table(hw, {(0, 0, 1, 0)}).to_csv(tmp_path / "channels.csv", index=False)
    out = tmp_path / "out"
    assert stage.main([*args, "--channels", str(tmp_path / "channels.csv"), "--out", str(out)]) == 0
    frame = pd.read_csv(out / "channel_ablation.csv")
    assert list(frame.columns) == list(channel_check.COLUMNS)
    assert frame[["batch", "kind", "src_layer", "src_head", "dst_layer", "dst_head"]].values.tolist() == [
        [b, "K", 0, 0, 1, 0] for b in range(3)
    ]
    batches = pd.read_csv(out / "ablation_batches.csv")
    path = batches[(batches["kind"] == "K") & (batches["src_head"] == 0) & (batches["dst_head"] == 0)]
    np.testing.assert_array_equal(frame["path_pattern_effect"], path["pattern_effect"])
    assert (frame["channel_pattern_effect"] > 0).all()
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["channel_ablation"]
    assert entry["n_pairs"] == 1 and entry["pairs"][0]["src"] == "0.0" and entry["pairs"][0]["dst"] == "1.0"
    assert entry["pairs"][0]["causal_share"] == pytest.approx(frame["causal_share"].mean())
    assert entry["median_causal_share"] == entry["pairs"][0]["causal_share"]

    assert stage.main([*args, "--out", str(out)]) == 0
    assert not (out / "channel_ablation.csv").exists()
    assert "channel_ablation" not in json.loads((out / "summary.json").read_text())


def test_without_a_terminal_the_stage_prints_a_line_per_checkpoint(chain, tmp_path, capsys):
    """Under DVC (no terminal): one plain line on stderr per checkpoint analysed, with its step."""
    config = str(chain["train"] / "config.json")
    capsys.readouterr()
    code = import_module("stages.dynamics").main(
        ["--params", str(chain["params"]), "--checkpoints", str(chain["train"] / "checkpoints"),
         "--config", config, "--out", str(tmp_path / "dynamics")]
    )  # fmt: skip
    assert code == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dynamics seed 0: ")]
    assert len(lines) == 3  # a line per checkpoint: how many of the three are done, and its step
    for line, done, step in zip(lines, (1, 2, 3), (0, 10, 20), strict=True):
        assert f" {done}/3 " in line and f"step {step}" in line and "\r" not in line


@pytest.mark.slow
def test_stage_writes_the_interface_and_is_byte_identical_on_rerun(tmp_path):
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    out = tmp_path / "out"
    assert stage.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "heads.csv")
    assert list(table.columns[:3]) == ["layer", "head", "role"] and list(table.columns) == heads.COLUMNS
    assert (
        dict(zip(zip(table["layer"], table["head"], strict=True), table["role"], strict=True))
        == PLANTED_ROLES
    )
    ablated = pd.read_csv(out / "ablation.csv")
    assert list(ablated.columns) == list(ABLATION_COLUMNS)
    # three disjoint batches (analysis.heads.ablation_batches), ablation.csv their mean
    batches = pd.read_csv(out / "ablation_batches.csv")
    assert list(batches.columns) == ["batch", *ABLATION_COLUMNS] and sorted(set(batches["batch"])) == [
        0,
        1,
        2,
    ]
    mean = batches.groupby(list(ABLATION_COLUMNS[:5]), sort=False)[list(ABLATION_COLUMNS[5:])].mean()
    pd.testing.assert_frame_equal(ablated.set_index(list(ABLATION_COLUMNS[:5])), mean)
    assert batches.groupby("batch")["heldout_loss_effect"].sum().nunique() == 3  # different data each
    summary = json.loads((out / "summary.json").read_text())
    assert summary["roles"]["induction"] == 1
    assert summary["agreement"]["loss_effect"]["spearman"]["K"].keys() == set(VARIANTS)
    rho = summary["agreement"]["loss_effect"]["spearman"]["K"]["true"]
    assert rho is not None and rho > 0  # the one K edge with an effect is the one that composes
    example, _ = checkpoint.load_state(out / "patterns.safetensors")
    assert example["pattern"].shape == (2, 3, 2 * LENGTH + 1, 2 * LENGTH + 1) and example["tokens"].shape == (
        2 * LENGTH + 1,
    )

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert stage.main([*args, "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_stage_names_a_missing_input_in_one_line(tmp_path, capsys):
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    (tmp_path / "scores.csv").unlink()
    assert stage.main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scores.csv" in err
    assert not (tmp_path / "out" / "heads.csv").exists()


@pytest.mark.slow
def test_figures_stage_draws_the_head_figures(tmp_path):
    from stages import figures as figures_stage
    from stages import heads as heads_stage

    args = stage_inputs(tmp_path)
    out = tmp_path / "heads"
    assert heads_stage.main([*args, "--out", str(out)]) == 0
    figure_args = [
        "--params", str(tmp_path / "params.yaml"), "--scores", str(tmp_path / "scores.csv"),
        "--heads", str(out / "heads.csv"), "--ablation", str(out / "ablation.csv"),
        "--heads-summary", str(out / "summary.json"), "--patterns", str(out / "patterns.safetensors"),
    ]  # fmt: skip
    assert figures_stage.main([*figure_args, "--out", str(tmp_path / "figures")]) == 0
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    for base in (
        "attention_patterns",
        "copying_vs_qk",
        "ablation_heldout_loss",
        "ablation_loss",
        "ablation_attn",
        "ablation_pattern",
    ):
        assert {f"{base}.png", f"{base}.svg"} <= names


@pytest.mark.slow
def test_stage_reads_exactly_the_listed_seeds_and_is_byte_stable(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0, 1, 2])
    assert run_stage(tmp_path, dirs, tmp_path / "a", "[2,0]") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "seed1" in line]
    assert notes and all("[2, 0]" in n for n in notes)  # a shrunk list: each directory left out named
    first = files(tmp_path / "a")
    assert set(first) == EXPECTED_FILES
    claims = pd.read_csv(tmp_path / "a" / "claims.csv")
    assert list(claims["seed"].unique()) == [2, 0]  # the order of params.yaml
    assert set(pd.read_csv(tmp_path / "a" / "groups.csv")["seed"]) == {0, 2}
    assert set(pd.read_csv(tmp_path / "a" / "roles.csv")["seed"]) == {0, 2}
    json.loads(first["summary.json"], parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
    curves = pd.read_csv(tmp_path / "a" / "curves.tsv", sep="\t")
    assert list(curves.columns) == list(CURVE_COLUMNS)
    assert curves["eval_loss"].iloc[-1] == pytest.approx((2.0 + 1.8) / 2)
    # same inputs and config: the same bytes, figures included
    assert run_stage(tmp_path, dirs, tmp_path / "b", "[2,0]") == 0
    assert files(tmp_path / "b") == first


def test_stage_missing_input_is_one_line_naming_the_file(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0,1]") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seed1" in err  # the missing seed's file
    assert not (tmp_path / "out" / "claims.csv").exists()  # nothing half-written


def test_stage_heads_without_roles_is_named(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    heads_csv = dirs["heads"] / "seed0" / "heads.csv"
    pd.read_csv(heads_csv).drop(columns="role").to_csv(heads_csv, index=False)
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0]") == 2
    err = capsys.readouterr().err
    assert "heads.csv" in err and "'role'" in err


def test_stage_summary_without_agreement_is_named(tmp_path, capsys):
    dirs = syn.write_stage_outputs(tmp_path / "outputs", [0])
    (dirs["heads"] / "seed0" / "summary.json").write_text(json.dumps({"roles": {}}))
    assert run_stage(tmp_path, dirs, tmp_path / "out", "[0]") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "summary.json" in err and "agreement" in err  # the file and the key
