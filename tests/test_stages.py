"""The stages' own lines, in-process: each stage's command line (its prog, every option, which
are required, their types and help), and what each writes for a tiny real chain of inputs (origin,
train, weights, composition, heads with --invariant and --channels, dynamics, figures; tokenizer
unused; compare and report on tests/synthetic_seeds.py): the files it names, the fields and
settings it passes on, the figures the library draws of those inputs at the configured dpi.

The pipeline's maths is tested beside its modules; this file checks that each stage hands them
the right arguments and writes what they return where the next stage and the docs expect it.
"""

from __future__ import annotations

import contextlib
import json
import re
from importlib import import_module
from io import StringIO
from pathlib import Path

import channel_tables
import numpy as np
import pandas as pd
import planted
import pytest
import synthetic_seeds as syn
import torch
from dvc_repo import TINY
from models import random_model
from one_direction import channel_table
from PIL import Image
from refusals import refused_line

from pipeline import checkpoint, cli, io, params, tables
from pipeline import params as params_mod
from pipeline.behaviour import channel_check, heads
from pipeline.circuits import significance, weights
from pipeline.circuits.invariant import COLUMNS
from pipeline.config import CompositionConfig
from pipeline.config import notes as schema_notes
from pipeline.model import origin, tl_checkpoint
from pipeline.present import figures
from pipeline.present.figures import composition as composition_figures
from pipeline.present.figures import dynamics as dynamics_figures
from pipeline.present.figures import heads as heads_figures
from pipeline.tables import ABLATION_COLUMNS, CURVE_COLUMNS, SIGNIFICANCE_COLUMNS, VARIANTS
from stages import compare as compare_stage

ROOT = Path(__file__).resolve().parents[1]
# stage: {option: (required, type)}; a flag's type is "flag" (store_true); each option's help
# is a whole sentence (tests/test_cli.py)
OPTIONS = {
    "tokenizer": {"--out": (True, None)},
    "origin": {
        "--seed": (True, int),
        "--out": (True, None),
    },
    "train": {
        "--seed": (True, int),
        "--origin": (True, None),
        "--tokenized": (False, None),
        "--out": (True, None),
        "--no-progress": (False, "flag"),
    },
    "weights": {
        "--model": (True, None),
        "--config": (True, None),
        "--out": (True, None),
    },
    "composition": {
        "--weights": (True, None),
        "--seed": (False, int),
        "--out": (True, None),
    },
    "heads": {
        "--model": (True, None),
        "--config": (True, None),
        "--weights": (True, None),
        "--scores": (True, None),
        "--invariant": (False, None),
        "--projection": (False, None),
        "--channels": (False, None),
        "--tokenized": (False, None),
        "--seed": (False, int),
        "--out": (True, None),
    },
    "dynamics": {
        "--checkpoints": (True, None),
        "--config": (True, None),
        "--tokenized": (False, None),
        "--seed": (False, int),
        "--out": (True, None),
        "--no-progress": (False, "flag"),
    },
    "figures": {
        "--scores": (True, None),
        "--heads": (False, None),
        "--ablation": (False, None),
        "--heads-summary": (False, None),
        "--patterns": (False, None),
        "--dynamics": (False, None),
        "--channels": (False, None),
        "--channel-shares": (False, None),
        "--out": (True, None),
    },
    "compare": {
        "--train": (True, None),
        "--composition": (True, None),
        "--heads": (True, None),
        "--dynamics": (True, None),
        "--calibration": (True, None),
        "--out": (True, None),
    },
    "report": {
        "--compare": (True, None),
        "--figures": (True, None),
        "--out": (True, None),
    },
    "calibrate": {
        "--weights": (True, None),
        "--seed": (True, int),
        "--config": (True, None),
        "--composition": (True, None),
        "--heads": (True, None),
        "--out": (True, None),
    },
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_stage_takes_its_documented_options_and_runs_them_through_the_error_boundary(name, monkeypatch):
    """The parser `main` hands to `run_cli`, with the argv it was given: prog `python -m
    stages.<name>`, --params and --debug (stage_parser), and exactly the stage's options, each with
    a help text (its words are the stage's, not pinned here)."""
    module = import_module(f"stages.{name}")
    handed = []
    hand = lambda parser, body, argv: handed.append((parser, body, argv)) or 7  # noqa: E731
    monkeypatch.setattr(module, "run_cli", hand)
    argv = ["--out", "x"]
    assert module.main(argv) == 7
    [(parser, body, got)] = handed
    assert got is argv and callable(body)
    assert parser.prog == f"python -m stages.{name}"
    # --help: the module docstring's first paragraph above the options, the rest below, each once
    assert (parser.description, parser.epilog) == cli.split_doc(module.__doc__)
    options = {}
    for action in parser._actions:
        if action.dest in ("help", "params", "debug"):
            continue
        [option] = action.option_strings
        kind = "flag" if (action.nargs, action.const, action.default) == (0, True, False) else action.type
        options[option] = (action.required, kind)
        assert action.dest == option[2:].replace("-", "_")
        assert action.help and action.help.strip(), option  # every option says what it is
    assert options == OPTIONS[name]
    assert (parser.get_default("params"), parser.get_default("seed")) == (
        "params.yaml",
        0 if "--seed" in options and not options["--seed"][0] else None,
    )


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_a_missing_required_option_is_argparses_usage_error(name, capsys):
    """Every required option left out: exit code 2 and argparse's usage, then one line naming them all."""
    module = import_module(f"stages.{name}")
    with pytest.raises(SystemExit) as stopped:
        module.main([])
    assert stopped.value.code == 2
    required = [o for o, (req, _) in OPTIONS[name].items() if req]
    err = capsys.readouterr().err
    assert f" python -m stages.{name} " in err.splitlines()[0]  # the usage names the module to run
    assert err.rstrip().splitlines()[-1].endswith(f": {', '.join(required)}")


# --- one tiny real chain ------------------------------------------------------------------


def png_dpi(path: Path) -> tuple[float, float]:
    with Image.open(path) as image:
        return tuple(round(d) for d in image.info["dpi"])


class Chain:
    def __init__(self, root: Path):
        self.root = root
        self.params = params_mod.compose(TINY, conf_dir=ROOT / "conf")
        self.p = root / "params.yaml"
        self.p.write_text(params_mod.dump(self.params))
        self.cfg = params_mod.load(self.p)
        self.out = {}

    def run(self, name: str, *argv: str, out: str | None = None) -> Path:
        path = self.root / (out or name)
        assert import_module(f"stages.{name}").main(["--params", str(self.p), *argv, "--out", str(path)]) == 0
        self.out[out or name] = path
        return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Chain:
    c = Chain(tmp_path_factory.mktemp("chain"))
    o = c.run("origin", "--seed", "3")
    train = c.run("train", "--seed", "3", "--origin", str(o / "origin.json"), "--no-progress")
    model, config = str(train / "model.safetensors"), str(train / "config.json")
    w = c.run("weights", "--model", model, "--config", config)
    comp = c.run("composition", "--weights", str(w / "heads.safetensors"), "--seed", "3")
    c.heads_args = [
        "--model", model, "--config", config, "--weights", str(w / "heads.safetensors"),
        "--scores", str(comp / "scores.csv"), "--invariant", str(comp / "invariant.csv"),
        "--channels", str(comp / "channels.csv"), "--seed", "3",
    ]  # fmt: skip
    h = c.run("heads", *c.heads_args)
    d = c.run("dynamics", "--checkpoints", str(train / "checkpoints"), "--config", config, "--seed", "3")
    c.figure_args = [
        "--scores", str(comp / "scores.csv"), "--heads", str(h / "heads.csv"),
        "--ablation", str(h / "ablation.csv"), "--heads-summary", str(h / "summary.json"),
        "--patterns", str(h / "patterns.safetensors"), "--dynamics", str(d),
        "--channels", str(comp / "channels.csv"), "--channel-shares", str(comp / "channels.safetensors"),
    ]  # fmt: skip
    return c


@pytest.fixture(scope="module")
def figured(chain, tmp_path_factory) -> Path:
    """The figures stage on the chain's outputs (read only)."""
    from stages import figures as stage

    out = tmp_path_factory.mktemp("figured") / "figures"
    assert stage.main(["--params", str(chain.p), *chain.figure_args, "--out", str(out)]) == 0
    return out


def test_origin_writes_the_chosen_origin_of_its_seed(chain):
    chosen = json.loads((chain.out["origin"] / "origin.json").read_text())
    assert chosen == origin.choose(chain.cfg.train, 3) == {"source": "train"}
    assert sorted(p.name for p in chain.out["origin"].iterdir()) == ["origin.json"]


def test_origin_reads_the_params_it_is_given(tmp_path, capsys):
    """A train.source = load whose checkpoint names the seed: origin.json records that seed's
    checkpoint and config.json, from the --params file (not ./params.yaml)."""
    composed = params_mod.compose(TINY, conf_dir=ROOT / "conf")
    seeded = "seed{seed}/model.safetensors"
    composed["train"] |= {"source": "load", "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint": seeded}
    (tmp_path / "ckpt" / "seed5").mkdir(parents=True)
    (tmp_path / "ckpt" / "seed5" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "ckpt" / "seed5" / "config.json").write_text("{}")
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    from stages import origin as stage

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert stage.main(["--params", str(p), "--seed", "5", "--out", str(tmp_path / "o")]) == 0
    chosen = json.loads((tmp_path / "o" / "origin.json").read_text())
    assert chosen["source"] == "load"
    assert Path(chosen["checkpoint"]["path"]).as_posix().endswith("ckpt/seed5/model.safetensors")
    assert Path(chosen["config"]["path"]).as_posix().endswith("ckpt/seed5/config.json")


def test_train_writes_its_model_config_curve_metrics_and_manifest(chain):
    train = chain.out["train"]
    names = {p.name for p in train.iterdir()}
    files = {"model.safetensors", "config.json", "curve.tsv", "metrics.json", "manifest.json"}
    assert names == files | {"checkpoints"}
    metrics = json.loads((train / "metrics.json").read_text())
    assert {"induction", "prev_token", "eval_loss"} <= set(metrics)
    state, meta = checkpoint.load_state(train / "model.safetensors")
    assert meta["seed"] == "3" or meta["seed"] == 3
    assert state


def test_train_records_its_seed_and_where_the_model_came_from_in_the_models_metadata(chain, tmp_path):
    """The chain's trained model says {"seed": "3", "source": "train"}; the train stage loading
    that model as seed 5's checkpoint (train.source = load: no training) says "load"."""
    _, meta = checkpoint.load_state(chain.out["train"] / "model.safetensors")
    assert meta == {"seed": "3", "source": "train"}
    composed = json.loads(json.dumps(chain.params))
    composed["train"] |= {
        "source": "load", "checkpoint_dir": str(chain.out["train"]), "checkpoint": "model.safetensors",
    }  # fmt: skip
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    chosen = io.write_json(tmp_path / "origin.json", origin.choose(params_mod.load(p).train, 5))
    from stages import train as stage

    out = tmp_path / "loaded"
    argv = ["--params", str(p), "--seed", "5", "--origin", str(chosen), "--no-progress", "--out", str(out)]
    assert stage.main(argv) == 0
    _, meta = checkpoint.load_state(out / "model.safetensors")
    assert meta == {"seed": "5", "source": "load"}


def test_weights_records_the_models_config_with_sorted_keys_in_the_heads_files_metadata(chain, tmp_path):
    """The `config` metadata of heads.safetensors is the train stage's config.json, its keys in
    sorted order (the same config gives the same bytes, whatever order the fields are built in)."""
    from stages import weights as stage

    train, out = chain.out["train"], tmp_path / "w"
    argv = ["--params", str(chain.p), "--model", str(train / "model.safetensors")]
    assert stage.main([*argv, "--config", str(train / "config.json"), "--out", str(out)]) == 0
    _, meta = checkpoint.load_state(out / "heads.safetensors")
    assert json.loads(meta["config"]) == json.loads((train / "config.json").read_text())
    keys = json.loads(meta["config"], object_pairs_hook=lambda pairs: [k for k, _ in pairs])
    assert keys == sorted(keys) and len(keys) > 1


def test_weights_writes_heads_and_a_summary_of_steps_config_and_extra_tensors(chain):
    w = chain.out["weights"]
    assert {p.name for p in w.iterdir()} == {"heads.safetensors", "summary.json"}
    summary = json.loads((w / "summary.json").read_text())
    assert set(summary) == {"steps", "config", "extra_tensors"}
    trained = json.loads((chain.out["train"] / "config.json").read_text())
    assert summary["config"] == trained | summary["config"]  # the train stage's config.json, and more
    assert isinstance(summary["steps"], list) and summary["extra_tensors"] == sorted(summary["extra_tensors"])


def test_composition_writes_every_table_and_the_channel_shares(chain):
    comp = chain.out["composition"]
    assert {p.name for p in comp.iterdir()} == {
        "scores.csv", "invariant.csv", "projection.csv", "placebo.csv", "channels.csv",
        "channels_placebo.csv", "channels.safetensors", "summary.json",
    }  # fmt: skip
    scores = tables.read_csv(comp / "scores.csv", tables.SCORES_COLUMNS, empty_ok=False)
    assert len(scores) > 0
    _, meta = checkpoint.load_state(comp / "channels.safetensors")
    assert meta["rows"] == "channels.csv"


def test_heads_with_channels_writes_the_check_and_its_summary(chain):
    h = chain.out["heads"]
    assert {p.name for p in h.iterdir()} == {
        "heads.csv", "ablation.csv", "ablation_batches.csv", "channel_ablation.csv",
        "patterns.safetensors", "summary.json",
    }  # fmt: skip
    checked = pd.read_csv(h / "channel_ablation.csv")
    summary = json.loads((h / "summary.json").read_text())
    expected = channel_check.summarize(checked)
    assert summary["channel_ablation"] == json.loads(json.dumps(expected))
    assert summary["channel_ablation"]["n_pairs"] == len(expected["pairs"])


def test_heads_channel_check_cuts_on_the_probes_drawn_by_its_seed(chain, tmp_path):
    """channel_ablation.csv is the channel check on the heads stage's own batches of --seed 3:
    held-out batch b the b-th eval_sequences windows (as many as there are), probe b (synthetic
    data: uniformly random tokens, repeated) drawn from run 3's probe stream, batch b; so each
    channel cut's effects are those of these batches, recomputed here. The chain's tiny model
    discovers no pair, so every K pair is marked a discovery in a copy of its channels.csv."""
    from pipeline.behaviour import heads as heads_analysis
    from pipeline.circuits import weights
    from pipeline.data import datasets
    from pipeline.streams import seed_of
    from stages import heads as stage

    table = pd.read_csv(chain.out["composition"] / "channels.csv")
    table["pair_discovery"] = table["kind"] == "K"
    marked = tmp_path / "channels.csv"
    table.to_csv(marked, index=False)
    given = str(chain.out["composition"] / "channels.csv")
    argv = [a if a != given else str(marked) for a in chain.heads_args]
    assert stage.main(["--params", str(chain.p), *argv, "--out", str(tmp_path / "h")]) == 0

    cfg, train = chain.cfg.analysis.heads, chain.out["train"]
    n = cfg.eval_sequences
    model = heads_analysis.load_model(train / "model.safetensors", train / "config.json", cfg, chain.cfg.data)
    hw, _ = weights.load(chain.out["weights"] / "heads.safetensors")
    data = datasets.load(chain.cfg.data, model.cfg, 3, n * cfg.ablation_batches, None, need_train=False)
    heldout = [data.eval[b * n : (b + 1) * n] for b in range(cfg.ablation_batches) if len(data.eval) > b * n]
    probes = [
        datasets.repeated_random_tokens(
            n, cfg.repeat_length, model.cfg.d_vocab, torch.Generator().manual_seed(seed_of(3, "probe", b))
        )
        for b in range(len(heldout))
    ]
    whole = pd.read_csv(tmp_path / "h" / "ablation_batches.csv")
    expected = channel_check.check_batches(model, hw, table, probes, heldout, cfg.repeat_length, whole)
    checked = pd.read_csv(tmp_path / "h" / "channel_ablation.csv")
    assert len(checked) == len(expected) == len(heldout) * (table["kind"] == "K").sum() > 0
    for column in ("channel_attn_effect", "channel_loss_effect", "channel_heldout_loss_effect"):
        np.testing.assert_allclose(checked[column], expected[column], rtol=1e-8, atol=1e-12, err_msg=column)


def test_heads_refuses_a_scores_or_invariant_table_missing_a_column_naming_the_file_and_column(
    chain, tmp_path, capsys
):
    """scores.csv without its q column, then invariant.csv without its baseline_std: one line naming
    the file, the column and the columns it has, exit code 2, before any analysis."""
    from stages import heads as stage

    comp = chain.out["composition"]
    capsys.readouterr()
    for name, column in (("scores", "q"), ("invariant", "baseline_std")):
        table = pd.read_csv(comp / f"{name}.csv").drop(columns=[column])
        bad = tmp_path / f"{name}.csv"
        table.to_csv(bad, index=False)
        argv = [a if a != str(comp / f"{name}.csv") else str(bad) for a in chain.heads_args]
        assert stage.main(["--params", str(chain.p), *argv, "--out", str(tmp_path / name)]) == 2
        assert repr(column) in refused_line(capsys.readouterr().err, bad)  # the file and the column
        assert not (tmp_path / name).exists()


def test_dynamics_names_analysis_device_when_cuda_is_asked_for_and_absent(tmp_path, monkeypatch, capsys):
    """analysis.device = cuda on a machine without CUDA: refused in one line naming the key,
    before any file is read (the checkpoints named do not exist)."""
    import torch

    from stages import dynamics as stage

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    composed = params_mod.compose([*TINY, "analysis.device=cuda"], conf_dir=ROOT / "conf")
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    capsys.readouterr()
    argv = [
        "--params", str(p), "--checkpoints", str(tmp_path / "none"), "--config", str(tmp_path / "none.json"),
    ]  # fmt: skip
    assert stage.main([*argv, "--out", str(tmp_path / "d")]) == 2
    refused_line(capsys.readouterr().err, "analysis.device", "cuda")
    assert not (tmp_path / "d").exists()


def test_dynamics_summary_records_the_configured_fdr(chain):
    summary = json.loads((chain.out["dynamics"] / "summary.json").read_text())
    assert summary["fdr"] == chain.cfg.analysis.composition.fdr
    assert summary["checkpoints"] == len(pd.read_csv(chain.out["dynamics"] / "steps.tsv", sep="\t"))


def test_dynamics_without_a_terminal_prints_a_line_per_checkpoint_and_writes_its_four_tables(
    chain, tmp_path, monkeypatch, capsys
):
    """Without a terminal ("lines"), the calls inside each checkpoint stay quiet even where they
    would print a line at every step (LINE_EVERY 0): the stage's own line is the only one. Its
    files: the names the figures and compare stages read, heads.csv a row per checkpoint and head."""
    monkeypatch.setattr(cli, "LINE_EVERY", 0.0)
    capsys.readouterr()
    from stages import dynamics as stage

    argv = [
        "--params", str(chain.p), "--checkpoints", str(chain.out["train"] / "checkpoints"),
        "--config", str(chain.out["train"] / "config.json"), "--seed", "3", "--out", str(tmp_path / "d"),
    ]  # fmt: skip
    assert stage.main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines
    assert all(re.match(r"dynamics seed 3: \d+/\d+ ", line) for line in lines), lines  # progress, no more
    d = tmp_path / "d"
    assert sorted(p.name for p in d.iterdir()) == [
        "composition.csv",
        "heads.csv",
        "steps.tsv",
        "summary.json",
    ]
    steps = pd.read_csv(d / "steps.tsv", sep="\t")
    heads = tables.read_csv(d / "heads.csv", tables.DYNAMICS_HEADS_COLUMNS, empty_ok=False)
    model = chain.cfg.model
    assert len(heads) == len(steps) * model.n_layers * model.n_heads


def test_the_figures_stage_writes_every_figure_at_the_configured_dpi(chain, figured):
    f = figured
    bases = {
        "errata_diagram", *(f"composition_{k}" for k in composition_figures.KINDS), "copying_vs_qk",
        "attention_patterns", *(f"ablation_{n}" for n in ("heldout_loss", "loss", "attn", "pattern")),
        "dynamics", "channels",
    }  # fmt: skip
    drawn = {f"{b}.{x}" for b in bases for x in ("png", "svg")}
    assert {p.name for p in f.iterdir()} == drawn | {"channels.json"}
    dpi = chain.cfg.analysis.figures.dpi
    for base in bases:
        assert png_dpi(f / f"{base}.png") == (dpi, dpi), base


def redraw(fig, tmp: Path, name: str, dpi: int) -> bytes:
    return figures.save(fig, tmp / name, formats=("png",), dpi=dpi)[0].read_bytes()


def test_the_figures_stage_draws_the_librarys_figures_of_its_inputs(chain, figured, tmp_path):
    """The errata diagram of the configured variant beside the true one, the ablation figures
    (attn_effect: Q and K only) with the heads summary's rho, the patterns about their middle,
    the dynamics figure at the summary's fdr: byte for byte the library's own of the same inputs."""
    f, a, cfg = figured, chain.cfg.analysis, chain.cfg.analysis.figures
    h, comp = chain.out["heads"], chain.out["composition"]
    scores = tables.read_csv(comp / "scores.csv", tables.SCORES_COLUMNS)
    heads = tables.read_csv(h / "heads.csv", ("layer", "head", "role", "copying", "qk_positivity"))
    variants = (cfg.errata_variant, "true")
    diagram = composition_figures.errata_diagram(
        scores, cfg.edges, cfg.edge_z, cfg.edge_threshold, heads, variants, a.composition.fdr
    )
    assert redraw(diagram, tmp_path, "errata_diagram", cfg.dpi) == (f / "errata_diagram.png").read_bytes()
    effects = tables.read_csv(h / "ablation.csv", tables.ABLATION_COLUMNS)
    rhos = heads_figures.spearman_of(io.read_json(h / "summary.json"))
    for effect, name, kinds in (("attn_effect", "attn", "QK"), ("loss_effect", "loss", "QKV")):
        kinds = tuple(kinds)
        fig = heads_figures.ablation_vs_composition(effects, scores, effect, rhos.get(effect), kinds)
        assert redraw(fig, tmp_path, name, cfg.dpi) == (f / f"ablation_{name}.png").read_bytes(), name
    pattern = heads_figures.read_example(h / "patterns.safetensors")
    fig = heads_figures.attention_patterns(pattern, heads, (pattern.shape[-1] - 1) // 2)
    assert redraw(fig, tmp_path, "patterns", cfg.dpi) == (f / "attention_patterns.png").read_bytes()
    steps = tables.read_csv(chain.out["dynamics"] / "steps.tsv", tables.STEPS_COLUMNS, sep="\t")
    pair, fdr = dynamics_figures.read_summary(chain.out["dynamics"] / "summary.json")
    fig = dynamics_figures.dynamics_figure(steps, pair, fdr)
    assert redraw(fig, tmp_path, "dynamics", cfg.dpi) == (f / "dynamics.png").read_bytes()


def test_figures_refuses_scores_without_rows_and_one_channel_file_alone(chain, tmp_path, capsys):
    from stages import figures as stage

    header = tmp_path / "scores.csv"
    header.write_text((chain.out["composition"] / "scores.csv").read_text().splitlines()[0] + "\n")
    base = ["--params", str(chain.p), "--out", str(tmp_path / "f")]
    capsys.readouterr()
    assert stage.main([*base, "--scores", str(header)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {header}")
    scores = str(chain.out["composition"] / "scores.csv")
    channels = str(chain.out["composition"] / "channels.csv")
    assert stage.main([*base, "--scores", scores, "--channels", channels]) == 2
    refused_line(capsys.readouterr().err, "--channels, --channel-shares")
    assert not (tmp_path / "f").exists()


def test_figures_refuses_a_dynamics_steps_table_with_only_a_header(chain, tmp_path, capsys):
    from stages import figures as stage

    dynamics = tmp_path / "dynamics"
    dynamics.mkdir()
    steps = dynamics / "steps.tsv"
    steps.write_text((chain.out["dynamics"] / "steps.tsv").read_text().splitlines()[0] + "\n")
    (dynamics / "summary.json").write_text((chain.out["dynamics"] / "summary.json").read_text())
    argv = [
        "--params", str(chain.p), "--out", str(tmp_path / "f"),
        "--scores", str(chain.out["composition"] / "scores.csv"), "--dynamics", str(dynamics),
    ]  # fmt: skip
    capsys.readouterr()
    assert stage.main(argv) == 2
    refused_line(capsys.readouterr().err, steps)
    assert not (tmp_path / "f").exists()


def test_composition_refuses_weights_whose_config_metadata_is_not_json_naming_the_file(
    chain, tmp_path, capsys
):
    from stages import composition as stage

    state, meta = checkpoint.load_state(chain.out["weights"] / "heads.safetensors")
    bad = tmp_path / "heads.safetensors"
    checkpoint.save_state(bad, state, {**meta, "config": "{not json"})
    capsys.readouterr()
    argv = ["--params", str(chain.p), "--weights", str(bad), "--out", str(tmp_path / "c")]
    assert stage.main(argv) == 2
    refused_line(capsys.readouterr().err, bad)
    assert not (tmp_path / "c").exists()


def test_figures_refuses_a_channels_table_with_only_a_header(chain, tmp_path, capsys):
    from stages import figures as stage

    comp = chain.out["composition"]
    header = tmp_path / "channels.csv"
    header.write_text((comp / "channels.csv").read_text().splitlines()[0] + "\n")
    argv = [
        "--params", str(chain.p), "--out", str(tmp_path / "f"), "--scores", str(comp / "scores.csv"),
        "--channels", str(header), "--channel-shares", str(comp / "channels.safetensors"),
    ]  # fmt: skip
    capsys.readouterr()
    assert stage.main(argv) == 2
    refused_line(capsys.readouterr().err, header)
    assert not (tmp_path / "f").exists()


def test_the_figures_stage_titles_the_errata_diagram_with_the_configured_fdr(chain, tmp_path):
    """analysis.composition.fdr = 0.2 (not the default 0.05): the diagram the stage writes is the
    library's at q < 0.2, and not the one at 0.05."""
    from stages import figures as stage

    composed = json.loads(json.dumps(chain.params))
    composed["analysis"]["composition"]["fdr"] = 0.2
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    cfg = params_mod.load(p).analysis.figures
    assert cfg.edges == "fdr"  # the criterion whose title names the rate
    scores_csv = chain.out["composition"] / "scores.csv"
    out = tmp_path / "f"
    assert stage.main(["--params", str(p), "--scores", str(scores_csv), "--out", str(out)]) == 0
    scores = tables.read_csv(scores_csv, tables.SCORES_COLUMNS)
    drawn = {}
    for fdr in (0.2, 0.05):
        args = (scores, cfg.edges, cfg.edge_z, cfg.edge_threshold, None, (cfg.errata_variant, "true"), fdr)
        diagram = composition_figures.errata_diagram(*args)
        assert diagram._suptitle.get_text().startswith(
            f"Head composition. Edge: a discovery, FDR q < {fdr:g}\n"
        )
        drawn[fdr] = redraw(diagram, tmp_path, f"at{fdr}", cfg.dpi)
    written = (out / "errata_diagram.png").read_bytes()
    assert written == drawn[0.2] and written != drawn[0.05]
    # given the scores alone, the figures of the scores alone: no head, dynamics or channel figure
    assert {p.stem for p in out.iterdir()} == {
        "errata_diagram",
        *(f"composition_{k}" for k in composition_figures.KINDS),
    }


def test_the_figures_stage_maps_the_discoveries_of_a_model_with_more_than_one_layer_pair(chain, tmp_path):
    """Scores of three layers (the tiny run's layer-0 -> 1 rows copied to 0 -> 2 and 1 -> 2): the
    scores alone give the discoveries map beside the errata diagram and the heatmaps."""
    from stages import figures as stage

    scores = pd.read_csv(chain.out["composition"] / "scores.csv")
    deeper = pd.concat([scores, scores.assign(dst_layer=2), scores.assign(src_layer=1, dst_layer=2)])
    deeper.to_csv(tmp_path / "scores.csv", index=False)
    out = tmp_path / "f"
    assert stage.main(["--params", str(chain.root / "params.yaml"), "--scores", str(tmp_path / "scores.csv"),
                       "--out", str(out)]) == 0  # fmt: skip
    assert {p.stem for p in out.iterdir()} == {
        "errata_diagram",
        "discoveries_map",
        *(f"composition_{k}" for k in composition_figures.KINDS),
    }


def tokens_dir(root: Path, vocab: int, n: int = 1200, cut: int = 400) -> Path:
    """A tokenizer stage's output by hand: n random ids below `vocab`, the first `cut` for training."""
    root.mkdir()
    np.save(root / "tokens.npy", np.random.default_rng(0).integers(0, vocab, n).astype(np.uint16))
    (root / "manifest.json").write_text(json.dumps({"source": "text", "train_tokens": cut, "vocab": vocab}))
    return root


def test_heads_on_text_reads_the_tokenized_directory_and_records_the_seed_of_its_patterns(
    chain, tmp_path, capsys
):
    """data.source = text (a pretrained tokenizer named, so model.d_vocab need not be its
    vocab_size): held-out windows from --tokenized; without it, the stage's refusal. The probe
    [first, span, span] and its pattern [layer, head, pos, pos] are saved with the seed that drew it;
    without --channels, an earlier run's channel_ablation.csv in --out is removed."""
    from stages import heads as stage

    composed = json.loads(json.dumps(chain.params))
    composed["data"] |= {"source": "text"}
    composed["data"]["text"]["corpus"] = "kjv"
    composed["data"]["tokenizer"]["pretrained"] = "hf:org/tok"
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    model = chain.cfg.model
    tokenized = tokens_dir(tmp_path / "tokenized", model.d_vocab)
    w, c = chain.out["weights"], chain.out["composition"]
    train = chain.out["train"]
    argv = [
        "--params", str(p), "--model", str(train / "model.safetensors"),
        "--config", str(train / "config.json"), "--weights", str(w / "heads.safetensors"),
        "--scores", str(c / "scores.csv"), "--seed", "3",
    ]  # fmt: skip
    assert stage.main([*argv, "--out", str(tmp_path / "none")]) == 2
    assert "--tokenized" in refused_line(capsys.readouterr().err, "data.source", "text")  # the option
    out = tmp_path / "h"
    out.mkdir()  # an earlier run's channel check: no check this run, so it is removed, not left
    (out / "channel_ablation.csv").write_text("stale\n")
    assert stage.main([*argv, "--tokenized", str(tokenized), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "ablation.csv", "ablation_batches.csv", "heads.csv", "patterns.safetensors", "summary.json",
    ]  # fmt: skip
    state, meta = checkpoint.load_state(out / "patterns.safetensors")
    span = 1 + 2 * chain.cfg.analysis.heads.repeat_length
    assert meta == {"seed": "3"}
    assert sorted(state) == ["pattern", "tokens"]
    assert tuple(state["pattern"].shape) == (model.n_layers, model.n_heads, span, span)
    tokens, length = state["tokens"].tolist(), chain.cfg.analysis.heads.repeat_length
    assert len(tokens) == span and tokens[1 : 1 + length] == tokens[1 + length :]  # [first, span, span]


def test_tokenizer_notes_a_pretrained_tokenizer_that_the_data_source_never_reads(tmp_path, capsys):
    """data.source = synthetic with data.tokenizer.pretrained named: the stage says, in one line on
    stderr, that the name is unused, and writes its unused files."""
    from stages import tokenizer as stage

    composed = params_mod.compose(TINY, conf_dir=ROOT / "conf")
    composed["data"]["tokenizer"]["pretrained"] = "hf:org/tok"
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(composed))
    assert stage.main(["--params", str(p), "--out", str(tmp_path / "t")]) == 0
    cfg = params_mod.from_dict(composed)
    assert capsys.readouterr().err.splitlines() == schema_notes(cfg, "data")  # the schema's note
    assert (tmp_path / "t" / "tokenizer.json").read_text() == "null\n"


def test_tokenizer_unused_writes_empty_tokens_and_a_null_tokenizer(chain, tmp_path):
    """data.source = synthetic: the stage is unused; its files are there, and empty."""
    out = chain.run("tokenizer", out="tokenizer")
    tokens = np.load(out / "tokens.npy")
    assert tokens.shape == (0,) and tokens.dtype == np.uint16
    assert (out / "tokenizer.json").read_text() == "null\n"
    assert json.loads((out / "manifest.json").read_text())


# --- compare and report on hand-made seeds ------------------------------------------------


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """compare on tests/synthetic_seeds.py's two seeds (and a stale seed9 under train/), then report."""
    root = tmp_path_factory.mktemp("compared")
    dirs = syn.write_stage_outputs(root / "outputs", [0, 1])
    (dirs["train"] / "seed9").mkdir()
    p = root / "params.yaml"
    overrides = ["seeds=[0,1]", "analysis.compare.dpi=40", "analysis.compare.min_seeds=2"]
    p.write_text(params_mod.dump(params_mod.compose(overrides)))
    from stages import compare, report

    out = root / "compare"
    stages_read = ("train", "composition", "heads", "dynamics", "calibration")
    argv = ["--params", str(p), *(f"--{n}={dirs[n]}" for n in stages_read)]
    err = StringIO()
    with contextlib.redirect_stderr(err):
        assert compare.main([*argv, "--out", str(out)]) == 0
    page = root / "index.html"
    assert report.main(["--params", str(p), "--compare", str(out), "--figures", str(dirs["figures"]),
                        "--out", str(page)]) == 0  # fmt: skip
    return out, page, dirs, err.getvalue()


def test_compare_writes_its_tables_and_figures_at_the_configured_dpi(compared):
    out, _, _, _ = compared
    written = {f"{t}.csv" for t in ("claims", "stats", "groups", "roles")} | {"curves.tsv"}
    written |= {"verdicts.json", "summary.json"}
    assert {p.name for p in out.iterdir()} == written | {"figures"}
    bases = ("claims", "roles", "curves", "timing")
    drawn = {f"{b}.{x}" for b in bases for x in ("png", "svg")}
    assert {p.name for p in (out / "figures").iterdir()} == drawn
    for base in bases:
        assert png_dpi(out / "figures" / f"{base}.png") == (40, 40), base
    for name in ("claims", "stats", "groups", "roles"):
        assert len(pd.read_csv(out / f"{name}.csv")) > 0, name
    assert isinstance(json.loads((out / "verdicts.json").read_text()), dict)


def test_compare_notes_a_stale_seed_directory(compared):
    _, _, dirs, err = compared
    stale = dirs["train"] / "seed9"
    assert err.count("\n") == 1 and err.startswith(f"note: {stale} ") and "seeds [0, 1]" in err


def test_report_writes_one_page_titled_as_configured_with_the_compare_stats(compared):
    _, page, _, _ = compared
    text = page.read_text()
    assert text.lstrip().lower().startswith("<!doctype html>")
    title = params_mod.load(page.parent / "params.yaml").analysis.report.title
    assert f"<title>{title}</title>" in text
    assert 'id="across-seeds"' in text  # the compare stage's stats, one row each


@pytest.fixture(scope="module")
def dynamics_chain(tiny_run) -> dict[str, Path]:
    return tiny_run


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
    return compare_stage.main(["--params", str(p), *syn.compare_args(dirs), "--out", str(out)])


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


def test_without_a_terminal_the_stage_prints_a_line_per_checkpoint(dynamics_chain, tmp_path, capsys):
    """Under DVC (no terminal): one plain line on stderr per checkpoint analysed, with its step."""
    config = str(dynamics_chain["train"] / "config.json")
    capsys.readouterr()
    code = import_module("stages.dynamics").main(
        ["--params", str(dynamics_chain["params"]),
         "--checkpoints", str(dynamics_chain["train"] / "checkpoints"),
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


def test_stage_writes_invariant_csv_and_its_summary(tmp_path):
    from pipeline import params
    from stages import composition as stage

    ROOT = Path(__file__).resolve().parents[1]
    (tmp_path / "params.yaml").write_text(
        params.dump(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"))
    )
    hw = weights.from_state_dict(planted.state_dict())
    weights.save(
        tmp_path / "heads.safetensors",
        hw,
        {"config": json.dumps({"positional_embedding_type": "shortformer"})},
    )
    out = tmp_path / "out"
    args = ["--params", str(tmp_path / "params.yaml"), "--weights", str(tmp_path / "heads.safetensors")]
    assert stage.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "invariant.csv")
    assert list(table.columns) == [*COLUMNS, *SIGNIFICANCE_COLUMNS] and len(table) == 27
    summary = json.loads((out / "summary.json").read_text())
    assert summary["K"]["invariant"]["max_pair"] == "L0H0->L1H0" and "true" in summary["K"]


def test_weights_stage_records_every_step(tmp_path):
    from stages import weights as stage

    model = random_model("layernorm", positional_embedding_type="shortformer")
    checkpoint.save_state(tmp_path / "model.safetensors", model.float().state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(model.cfg)))
    params = tmp_path / "params.yaml"
    from pipeline import params as params_mod

    params.write_text(
        params_mod.dump(params_mod.compose(conf_dir=Path(__file__).resolve().parents[1] / "conf"))
    )
    for out in ("out", "again"):
        code = stage.main(
            [
                "--model",
                str(tmp_path / "model.safetensors"),
                "--config",
                str(tmp_path / "config.json"),
                "--out",
                str(tmp_path / out),
                "--params",
                str(params),
            ]
        )
        assert code == 0
    for name in ("heads.safetensors", "summary.json"):  # byte-identical when run again
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    hw, meta = weights.load(tmp_path / "out" / "heads.safetensors")
    assert json.loads(meta["steps"]) == summary["steps"] and len(summary["steps"]) >= 4
    state, _ = checkpoint.load_state(tmp_path / "out" / "heads.safetensors")
    assert "blocks.0.attn.pos_Q" in state and hw.n_heads == model.cfg.n_heads


# synthetic_seeds' true discoveries: K 1.0 <- 0.0, 1.1 <- 0.0, 1.0 <- 0.1; V 1.2 <- 0.2
FOUND = [("K", 0, 0, 1, 0), ("K", 0, 0, 1, 1), ("K", 0, 1, 1, 0), ("V", 0, 2, 1, 2)]


def stage_args(tmp_path: Path) -> list[str]:
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(["analysis.figures.dpi=40"])))
    syn.scores()[lambda f: f["variant"] != "invariant"].to_csv(tmp_path / "scores.csv", index=False)
    return ["--params", str(tmp_path / "params.yaml"), "--scores", str(tmp_path / "scores.csv")]


def test_figures_stage_draws_the_channel_figure_byte_stably(tmp_path):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    csv, st = channel_tables.write(
        tmp_path, *channel_tables.tables({FOUND[0]: (1, 2)}, FOUND, channel_discovery=[FOUND[0]])
    )
    channel_args = ["--channels", str(csv), "--channel-shares", str(st)]
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert figures_stage.main([*args, *channel_args, "--out", str(out)]) == 0
    names = {"channels.png", "channels.svg", "channels.json"}
    assert names <= {p.name for p in outs[0].iterdir()}
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    facts = json.loads((outs[0] / "channels.json").read_text())
    assert facts["discovered"] == {"K": 3, "Q": 0, "V": 1} and facts["channel_discoveries"] == 1


def test_figures_stage_refuses_tables_that_do_not_match_the_csv(tmp_path, capsys):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    frame, shares = channel_tables.tables({}, FOUND)
    csv, st = channel_tables.write(tmp_path, frame, {**shares, "K": shares["K"][:-1]})
    out = tmp_path / "out"
    assert (
        figures_stage.main([*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)])
        != 0
    )
    err = capsys.readouterr().err
    assert "channels.safetensors" in err and re.search(r"\bK\b\D*\b9\b", err)  # the kind, its 9 pairs
    assert not out.exists()  # every input is checked before anything is written
    # a top channel (a block of directions 2-4) beyond the file's d_head = 4
    wide = frame.assign(writer_channel=2, writer_block=frame["writer_block"].where(frame.index != 3, 3))
    csv, st = channel_tables.write(tmp_path, wide, shares)
    args_wide = [*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)]
    assert figures_stage.main(args_wide) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "channels.safetensors" in err and "d_head = 4" in err
    assert not out.exists()
    csv, st = channel_tables.write(tmp_path, frame, shares)
    assert figures_stage.main([*args, "--channels", str(csv), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "--channels" in err and "--channel-shares" in err and err.count("\n") == 1  # names both
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    bad = ["--channels", str(csv), "--channel-shares", str(tmp_path / "bad.safetensors")]
    assert figures_stage.main([*args, *bad, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path / "bad.safetensors") in err and err.count("\n") == 1
