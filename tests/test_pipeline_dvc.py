"""The foundation, end to end with the real DVC, Hydra and torch on the tiny config:
`dvc repro` produces every artifact; adding a seed runs only that seed, removing one leaves
nothing of it; a second run does nothing; a figures parameter
reruns only what draws; a bad experiment override fails in one line naming the key,
leaving params.yaml as it was; a change to the model code reruns the stages that run the
model and not composition (which reads only weight files);
editing train.checkpoint while training reruns no training."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from dvc_repo import BIN, copy_repo, dvc, git, reproduced, run, stages_run

pytestmark = pytest.mark.slow

ARTIFACTS = {
    "origin": ("origin.json",),
    "train": ("model.safetensors", "config.json", "metrics.json", "curve.tsv", "checkpoints/index.json"),
    "weights": ("heads.safetensors", "summary.json"),
    "composition": ("scores.csv", "invariant.csv", "summary.json"),
    "heads": ("heads.csv", "summary.json", "ablation.csv"),
    "dynamics": ("composition.csv", "heads.csv", "steps.tsv", "summary.json"),
    "calibrate": ("calibration.json", "power.csv"),
    "figures": (
        "dynamics.png",
        "errata_diagram.png",
        "errata_diagram.svg",
        "composition_Q.png",
        "composition_K.png",
        "composition_V.png",
    ),
}
FOLDER = {"calibrate": "calibration"}  # a stage whose folder is not its name


@pytest.fixture(scope="module")
def repo(tmp_path_factory, shared_dir):
    """Seeds [0, 1]: [0] reproduced, then seed 1 added and reproduced (tests/dvc_repo.py,
    built once a run); a copy, as these tests change it. Also the stages each repro ran."""
    _, first = reproduced(shared_dir, (0,))
    two, grown = reproduced(shared_dir, (0, 1))
    return copy_repo(two, tmp_path_factory.mktemp("foundation") / "repo"), first, grown


def test_repro_produces_every_artifact_for_every_seed(repo):
    path, first, grown = repo
    for seed in (0, 1):
        for stage, names in ARTIFACTS.items():
            for name in names:
                artifact = path / "outputs" / FOLDER.get(stage, stage) / f"seed{seed}" / name
                assert artifact.is_file() and artifact.stat().st_size > 0, artifact
    assert (path / "outputs" / "report" / "index.html").is_file()
    assert json.loads((path / "outputs/tokenizer/manifest.json").read_text()) == {
        "source": "synthetic",
        "used": False,
    }
    metrics = json.loads((path / "outputs/train/seed0/metrics.json").read_text())
    assert {"train_loss", "eval_loss", "induction", "prev_token"} <= set(metrics)
    assert set(first) >= {f"{s}@0" for s in ARTIFACTS} and set(grown) >= {f"{s}@1" for s in ARTIFACTS}


def test_adding_a_seed_runs_only_the_new_seed(repo):
    path, _, grown = repo
    # and seed 0's calibration: its chimeras take their later layers from every other seed
    assert sorted(grown) == sorted([f"{s}@1" for s in ARTIFACTS] + ["calibrate@0", "compare", "report"])
    assert list(pd.read_csv(path / "outputs" / "compare" / "claims.csv")["seed"].unique()) == [0, 1]
    assert '<h2 id="seed1">' in (path / "outputs" / "report" / "index.html").read_text()


def test_shrinking_seeds_leaves_no_stale_seed(shared_dir, tmp_path):
    grown = reproduced(shared_dir, (0, 1))[0]
    repo = copy_repo(grown, tmp_path / "repo")
    run(repo, str(BIN / "python"), "-m", "pipeline.params", "seeds=[1]")
    proc = dvc(repo, "repro")
    assert sorted(stages_run(proc)) == ["calibrate@1", "compare", "report"]  # its chimeras: no other seed
    assert "seed0 is not in seeds [1]" in proc.stdout + proc.stderr  # named, left out
    assert list(pd.read_csv(repo / "outputs" / "compare" / "claims.csv")["seed"].unique()) == [1]
    assert set(pd.read_csv(repo / "outputs" / "compare" / "roles.csv")["seed"]) == {1}
    page = (repo / "outputs" / "report" / "index.html").read_text()
    assert '<h2 id="seed1">' in page and '<h2 id="seed0">' not in page
    assert changed_stages(repo) == set()


def test_second_repro_runs_nothing(repo):
    path, _, _ = repo
    again = dvc(path, "repro")
    assert stages_run(again) == []
    assert "Data and pipelines are up to date" in dvc(path, "status").stdout


def changed_stages(path) -> set[str]:
    """The stages `dvc status` says have changed (their deps, params or outputs)."""
    status = json.loads(dvc(path, "status", "--json").stdout)
    return set(status)


def test_a_figures_parameter_reruns_only_what_draws(repo):
    path, _, _ = repo
    run(path, str(BIN / "python"), "-m", "pipeline.params", "analysis.figures.dpi=31")
    try:
        # what `dvc repro` would rerun (the stages read only the params they declare: test_dvc_yaml)
        assert changed_stages(path) == {"figures@0", "figures@1", "report"}  # the report embeds them
    finally:
        git(path, "checkout", "HEAD", "--", "params.yaml", "conf")
    assert changed_stages(path) == set()


def test_a_model_code_change_reruns_what_runs_the_model_but_not_composition(repo):
    path, _, _ = repo
    model = path / "pipeline" / "model" / "transformer.py"
    text = model.read_text()
    model.write_text(text + "# a comment: the bytes changed, the behaviour did not\n")
    try:
        changed = changed_stages(path)
        # calibrate runs the model's code too: its untrained models of the run's shape
        runs_model = ("train", "weights", "heads", "dynamics", "calibrate")
        assert changed == {f"{s}@{n}" for s in runs_model for n in (0, 1)}, changed
    finally:
        model.write_text(text)
    assert changed_stages(path) == set()


def test_editing_an_unused_checkpoint_reruns_no_training(repo):
    path, _, _ = repo
    run(path, str(BIN / "python"), "-m", "pipeline.params", "train.checkpoint=elsewhere/model.safetensors")
    try:
        changed = changed_stages(path)
        assert changed == {"origin@0", "origin@1", "report"}, dvc(
            path, "status"
        ).stdout  # origin reads it; the report prints params
        ran = stages_run(dvc(path, "repro"))
        # the same origin.json: no training; the report reruns because it prints params.yaml
        assert sorted(ran) == ["origin@0", "origin@1", "report"], ran
        assert changed_stages(path) == set()
    finally:
        git(path, "checkout", "HEAD", "--", "params.yaml", "conf", "dvc.lock")
        dvc(path, "checkout", "-q")


@pytest.mark.parametrize(
    "override,key", [("model.n_head=4", "model.n_head"), ("model.n_heads=four", "model.n_heads")]
)
def test_bad_experiment_override_fails_in_one_line_naming_the_key(repo, override, key):
    path, _, _ = repo
    before = (path / "params.yaml").read_text()
    done = dvc(path, "exp", "run", "-S", override, check=False)
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and key in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert (path / "params.yaml").read_text() == before
