"""The README's recipes with the real DVC on the tiny config (tests/dvc_repo.py):
`dvc exp run -S` listed by `dvc exp show` with its metrics (growing and shrinking `seeds` are
test_pipeline_dvc's), a queued sweep run by two workers, `dvc exp show --csv`,
`dvc metrics diff`, `dvc plots diff`, `dvc exp apply`, sharing results through a DVC remote
so that a fresh clone reproduces nothing, and, on a copy whose outputs have other bytes than
the committed run's (another CPU's), comparing against main and getting back after a failed
experiment.

The pipeline is reproduced once per test run (`dvc_repo.reproduced`) and copied (`base`);
each test works in a git clone of it that shares its DVC cache, so it starts from
checked-out outputs without recomputing them.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dvc_repo import BIN, copy_repo, dvc, git, reproduced, run, stages_run

from pipeline.compare.claims import CLAIMS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory, shared_dir) -> Path:
    """The tiny project (seeds [0]) reproduced and committed, dvc.lock included: a copy, as
    this module's experiments write into its DVC cache."""
    return copy_repo(reproduced(shared_dir)[0], tmp_path_factory.mktemp("experiments") / "base")


def clone(base: Path, dest: Path, share_cache: bool = True, cache: Path | None = None) -> Path:
    """A git clone of `base` with its outputs checked out of `base`'s DVC cache (or of `cache`),
    which it shares; with `share_cache=False`, its own empty cache and no outputs."""
    run(dest.parent, "git", "clone", "-q", str(base), str(dest))
    if share_cache:
        dvc(dest, "cache", "dir", "--local", str(cache or base / ".dvc" / "cache"))
        dvc(dest, "checkout")
    return dest


def set_params(repo: Path, *overrides: str) -> None:
    """`python -m pipeline.params`: the README's way to change params.yaml without an experiment."""
    run(repo, str(BIN / "python"), "-m", "pipeline.params", *overrides)


def up_to_date(repo: Path) -> bool:
    return "Data and pipelines are up to date" in dvc(repo, "status").stdout


ROOT = Path(__file__).resolve().parents[1]
FIXED_COLUMNS = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
VERDICTS = tuple(CLAIMS)  # summary.json's verdicts, in the registry's order


def readme_exp_show() -> list[str]:
    """The README's `dvc exp show` command for people (the verdicts), as arguments."""
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "dvc exp show --drop" in ln)
    return shlex.split(line.split("#")[0])[1:]


def test_an_experiment_is_listed_with_its_metrics_and_the_readme_prints_a_handful(base, tmp_path):
    """`dvc exp run -S` on a compare parameter reruns compare and the report alone and is listed by
    `dvc exp show` with its metrics. The README's command prints the experiments' verdicts: the
    setup (the one param), the seeds and a verdict per claim of the corrected score (summary.json;
    the invariant measure's restatements and the training metrics are in `dvc exp show` whole), in
    at most 200 columns."""
    repo = clone(base, tmp_path / "repo")
    done = dvc(repo, "exp", "run", "-n", "narrower", "-S", "analysis.compare.ci=0.9")
    assert sorted(stages_run(done)) == ["compare", "report"]
    table = list(csv.DictReader(io.StringIO(dvc(repo, "exp", "show", "--csv").stdout)))
    row = next(r for r in table if r["Experiment"] == "narrower")
    assert float(row["analysis.compare.ci"]) == 0.9
    metric_columns = [c for c in row if c.endswith("induction") or c.endswith("eval_loss")]
    assert metric_columns and all(row[c] not in ("", "-") for c in metric_columns), row

    args = readme_exp_show()
    assert args[:2] == ["exp", "show"], args
    out = dvc(repo, *args, "--csv").stdout.splitlines()
    header = out[0].split(",")
    params = set(pd.json_normalize(yaml.safe_load((repo / "params.yaml").read_text())).columns)
    metrics = [c for c in header if c not in FIXED_COLUMNS | {"setup"}]
    assert "setup" in header and not params & set(metrics), header
    own = [c for c in VERDICTS if not CLAIMS[c].restates]
    assert ["n_seeds", *(f"verdict.{c}" for c in own)] == metrics, header
    assert "narrower" in "\n".join(out[1:])
    wide = run(repo, "env", "COLUMNS=1000", str(BIN / "dvc"), *args).stdout.splitlines()
    assert max(len(line.rstrip()) for line in wide) <= 200, "\n".join(wide)
    # and the declared metrics are the headline only: the summary of compare, 24 columns at most,
    # then (m) per kind against each rotation (6) and each seed's K detection limits (3 a seed)
    everything = dvc(repo, "exp", "show", "--drop", ".*/|data$", "--csv").stdout.splitlines()[0].split(",")
    deps = {c for c in everything if (repo / c).exists()}  # a dependency's column: `checkpoints`
    # a seed's training metrics (train's metrics.json): unprefixed here, with one seed, by their path
    # where seeds' files share their keys
    trained = set(json.loads((repo / "outputs" / "train" / "seed0" / "metrics.json").read_text()))
    declared = [c for c in everything if c not in FIXED_COLUMNS | params | deps | trained]
    headline = ("n_seeds", "verdict", "mean", "training")
    extra = ("m_by_kind", "c_vs_roles", "detection_limit_K")
    assert all(c.split(".")[0] in (*headline, *extra) for c in declared), declared
    assert len([c for c in declared if c.split(".")[0] in headline]) <= 24, declared
    assert len([c for c in declared if c.startswith("m_by_kind.")]) == 6, declared
    assert {c.split(".")[1] for c in declared if c.startswith("detection_limit_K.")} <= {"seed0", "seed1"}


def test_an_experiment_on_three_layers_with_mlps_runs_every_stage_over_every_layer_pair(base, tmp_path):
    """`dvc exp run -S` to Pythia's block (LayerNorm, rotary positions on half of each head's
    dimensions, an MLP beside attention) three layers deep: every stage that reads the model runs
    again, and the
    composition, channel and path-ablation tables hold every later layer pair; the weights stage
    writes the heads alone (no MLP weight in the file), the checkpoint's config.json says the model
    has its MLPs and rotary positions."""
    repo = clone(base, tmp_path / "repo")
    overrides = {"model.n_layers": "3", "model.d_mlp": "32", "model.parallel_attn_mlp": "true",
                 "model.normalization_type": "LN", "model.positional_embedding_type": "rotary",
                 "model.rotary_dim": "2"}  # fmt: skip
    done = dvc(repo, "exp", "run", *[a for k, v in overrides.items() for a in ("-S", f"{k}={v}")])
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    ran = {name.split("@")[0] for name in stages_run(done)}
    assert ran == set(stages) - {"origin", "tokenizer"}, ran  # the two that read no model setting
    out = repo / "outputs"
    config = json.loads((out / "train" / "seed0" / "config.json").read_text())
    assert (config["n_layers"], config["d_mlp"], config["attn_only"]) == (3, 32, False)
    assert (config["positional_embedding_type"], config["rotary_dim"], config["parallel_attn_mlp"]) == (
        "rotary",
        2,
        True,
    )
    from safetensors import safe_open

    with safe_open(out / "weights" / "seed0" / "heads.safetensors", "pt") as f:
        names = set(f.keys())
    assert {f"blocks.{l}.attn.W_Q" for l in range(3)} <= names and not any(".mlp." in k for k in names)
    every = {(0, 1), (0, 2), (1, 2)}
    for table in (
        "composition/seed0/scores.csv",
        "composition/seed0/channels.csv",
        "heads/seed0/ablation.csv",
    ):
        frame = pd.read_csv(out / table)
        assert set(zip(frame["src_layer"], frame["dst_layer"], strict=True)) == every, table
    assert (out / "report" / "index.html").stat().st_size > 0


@pytest.mark.parametrize(
    "overrides,named",
    [
        # a setting a stage would refuse (an input the config names), refused while DVC composes conf/
        (["data.text.corpus=gutenberg"], "data.text.corpus = 'gutenberg'"),
        # an override Hydra itself refuses (a group given a value that is none of its options)
        (["model=4"], "model = 4"),
    ],
)
def test_a_bad_experiment_stops_before_any_stage_and_leaves_git_clean(base, tmp_path, overrides, named):
    """A bad `-S` is refused while DVC composes conf/ (hydra_plugins/), in one line naming the key and
    the value, before params.yaml is written or any stage runs: one case per way of refusing (each
    input rule is tested where it is defined, tests/test_params.py)."""
    repo = clone(base, tmp_path / "repo", share_cache=False)
    done = dvc(repo, "exp", "run", *[arg for o in overrides for arg in ("-S", o)], check=False)
    assert done.returncode != 0 and stages_run(done) == []
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and named in errors[0], done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert git(repo, "status", "--porcelain").stdout == ""
    assert dvc(repo, "exp", "list").stdout.strip() == ""  # no experiment recorded


def in_cache(repo: Path, md5: str) -> bool:
    return (repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).exists()


def small_outputs(repo: Path) -> list[str]:
    """The outputs git tracks (the metrics and plots files, `cache: false` in dvc.yaml)."""
    listed = git(repo, "ls-files", "--cached", "--others", "--exclude-standard", "outputs").stdout
    return sorted(listed.split())


def other_machine(base: Path, dest: Path) -> Path:
    """A copy of `base` as `make repro` leaves it on a machine whose CPU gives other bytes than
    the committed dvc.lock's: a training output perturbed (train@0's held-out loss, in its
    metrics and curve, 0.001 higher), every stage after it rerun on it, dvc.lock changed but not
    committed, and the DVC cache holding this machine's run alone (`dvc gc -w`)."""
    repo = copy_repo(base, dest)
    train = repo / "outputs" / "train" / "seed0"
    metrics = json.loads((train / "metrics.json").read_text())
    metrics["eval_loss"] += 1e-3
    (train / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    curve = pd.read_csv(train / "curve.tsv", sep="\t")
    curve["eval_loss"] += 1e-3
    curve.to_csv(train / "curve.tsv", sep="\t", index=False)
    dvc(repo, "commit", "-f", "train@0")
    assert sorted(stages_run(dvc(repo, "repro"))) == ["compare", "report"]
    dvc(repo, "gc", "-w", "-f")
    return repo


def workspace(repo: Path) -> dict[str, bytes]:
    """What a run leaves that a way back must restore: params.yaml, dvc.lock, the outputs git
    tracks and two that only DVC's cache holds."""
    names = ["params.yaml", "dvc.lock", *small_outputs(repo)]
    names += ["outputs/train/seed0/model.safetensors", "outputs/compare/claims.csv"]
    return {name: (repo / name).read_bytes() for name in names}


def changed_paths(repo: Path) -> set[str]:
    return {line[3:] for line in git(repo, "status", "--porcelain").stdout.splitlines()}


def test_on_another_machine_main_is_compared_and_a_failed_experiment_gets_back_its_own_run(base, tmp_path):
    """Where `make repro` gives other bytes than the committed run, main's outputs are not in the
    DVC cache: main's numbers still come from git (the metrics and plots files), and a stage that
    fails in an experiment prints a way back to this machine's own last run, which works."""
    repo = other_machine(base, tmp_path / "repo")
    main_lock = yaml.safe_load(git(repo, "show", "main:dvc.lock").stdout)
    outs = [o for stage in main_lock["stages"].values() for o in stage.get("outs", [])]
    assert [o["path"] for o in outs if not in_cache(repo, o["md5"])], "main's outputs are all in the cache"
    committed = small_outputs(repo)
    assert "outputs/compare/summary.json" in committed and "outputs/train/seed0/metrics.json" in committed
    assert all(git(repo, "ls-files", "--error-unmatch", p, check=False).returncode == 0 for p in committed)

    # main's headline beside this machine's
    diff = dvc(repo, "metrics", "diff", "main", "--json")
    loss = json.loads(diff.stdout)["outputs/compare/summary.json"]["training.eval_loss"]
    assert loss["new"] == pytest.approx(loss["old"] + 1e-3, abs=2e-5), loss
    dvc(repo, "exp", "run", "-n", "tweak", "-S", "analysis.compare.ci=0.9")
    diff = dvc(repo, "metrics", "diff", "main", "tweak", "--all", "--json")
    assert "failed to load" not in diff.stderr, diff.stderr
    summary = json.loads(diff.stdout)["outputs/compare/summary.json"]
    assert summary and all(v["old"] is not None and v["new"] is not None for v in summary.values()), summary
    rows = list(csv.DictReader(io.StringIO(dvc(repo, "exp", "show", "--csv").stdout)))
    main = next(r for r in rows if r["rev"] == "main" and not r["Experiment"])
    verdicts = {k: v for k, v in main.items() if k.startswith("verdict.")}
    assert verdicts and all(v not in ("", "!", "-") for v in verdicts.values()), main
    plots = json.loads(dvc(repo, "plots", "diff", "main", "tweak", "--json").stdout)
    assert not plots.get("errors"), plots.get("errors")
    assert {v["rev"] for v in plots["data"]["loss"][0]["content"]["data"]["values"]} == {"main", "tweak"}

    # a stage fails in an experiment (the loss diverges): DVC has deleted train@0's outputs and
    # changed params.yaml; the stage's own line says how to get this machine's last run back
    before, changed = workspace(repo), changed_paths(repo)
    assert (
        before["outputs/train/seed0/metrics.json"]
        != git(repo, "show", "main:outputs/train/seed0/metrics.json").stdout.encode()
    )
    done = dvc(repo, "exp", "run", "-S", "train.lr=1e30", "-S", "train.grad_clip=1e30", check=False)
    assert done.returncode != 0 and stages_run(done) == ["train@0"]
    refusal = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1 and "train.lr = 1e+30" in refusal[0], done.stderr
    assert not (repo / "outputs" / "train" / "seed0" / "model.safetensors").exists()
    commands = re.findall(r"`([^`]+)`", refusal[0])
    assert commands, refusal[0]
    for command in commands:
        run(repo, *shlex.split(command))
    assert workspace(repo) == before  # this machine's run, byte for byte, not main's
    assert changed_paths(repo) == changed
    assert up_to_date(repo)


def test_what_each_experiment_changed_fits_160_columns(base, tmp_path):
    """`python -m pipeline.overrides`, what each experiment changed: one row per experiment, its
    changes the overrides `dvc exp run -S` was given, within 160 columns, on a table that
    `dvc exp show --only-changed` prints far wider (a setup changes a dozen keys at once)."""
    repo = clone(base, tmp_path / "repo")
    given = {
        "text": [
            "setup=kjv",
            "data.text.max_chars=20000",
            "data.tokenizer.vocab_size=300",
            "model.d_vocab=300",
            "train.lr=0.02",
        ],
        # a list value; the seeds stay: `dvc exp save` needs every output of the stages params.yaml names
        "heads": ["model.n_heads=4", "train.betas=[0.8,0.95]", "analysis.compare.ci=0.9"],
    }
    for name, overrides in given.items():  # experiments saved, not run: their params are what is shown
        set_params(repo, *overrides)
        dvc(repo, "exp", "save", "-n", name)
        git(repo, "checkout", "params.yaml")
    drop = r".*/|data$|^(verdict|mean|training)\."  # dvc exp show's own view of it
    wide = run(repo, "env", "COLUMNS=1000", str(BIN / "dvc"), "exp", "show", "--only-changed", "--drop", drop)
    assert max(len(line.rstrip()) for line in wide.stdout.splitlines()) > 160
    shown = run(repo, "env", "COLUMNS=1000", str(BIN / "python"), "-m", "pipeline.overrides").stdout
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 160, shown
    rows: dict[str, str] = {}
    for line in lines[1:]:  # a row, or the wrapped rest of its changes
        if line.startswith(" "):
            rows[name] += " " + line.strip()
        else:
            name, _, changes = re.split(r"\s{2,}", line.strip(), maxsplit=2)
            name = name.removeprefix("└── ")
            rows[name] = changes
    for name, overrides in given.items():
        assert sorted(rows[name].split("; ")) == sorted(overrides), shown
    assert "main" in rows and "workspace" in rows, shown


def wait_for_queue(repo: Path, timeout: float = 480) -> str:
    """Poll `dvc queue status` until nothing is queued or running; its last output."""
    deadline = time.monotonic() + timeout
    while True:
        status = dvc(repo, "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"queue still busy after {timeout} s:\n{status}")
        time.sleep(2)


def test_queued_sweep_two_workers_show_diff_apply(base, tmp_path):
    repo = clone(base, tmp_path / "repo")
    try:
        # a sweep over the training probe's length, which the metrics read and the model does not:
        # the first is the baseline's own (its stages are restored from the cache), the second reruns
        # train, which writes the same model and new metrics, then compare and the report (the
        # queue's machinery is tested without training another model)
        dvc(repo, "exp", "run", "--queue", "-S", "train.probe_length=6,8")
        assert dvc(repo, "queue", "status").stdout.count("Queued") == 2
        dvc(repo, "queue", "start", "-j", "2", capture=False)  # two workers, in the background
        status = wait_for_queue(repo)
    finally:
        dvc(repo, "queue", "stop", "--kill", check=False)  # leave no worker behind, whatever happened
    assert status.count("Success") == 2, status

    rows = list(csv.DictReader(io.StringIO(dvc(repo, "exp", "show", "--csv").stdout)))
    exps = {r["train.probe_length"]: r for r in rows if r["Experiment"]}
    assert set(exps) == {"6", "8"}, rows
    for row in exps.values():
        assert row["State"] == "Success"
        assert row["verdict.b"] in {"holds", "fails", "inconclusive", "untestable"}
        assert float(row["training.induction"]) > 0 and row["n_seeds"] == "1"
    name = exps["8"]["Experiment"]
    assert exps["8"]["training.induction"] != exps["6"]["training.induction"]
    main = next(r for r in rows if r["rev"] == "main" and not r["Experiment"])
    assert exps["6"]["training.induction"] == main["training.induction"]  # the baseline's own run
    assert exps["8"]["training.eval_loss"] == main["training.eval_loss"]  # the same model

    diff = json.loads(dvc(repo, "metrics", "diff", "main", name, "--json").stdout)
    score = diff["outputs/compare/summary.json"]["training.induction"]  # both columns: main has dvc.lock
    assert score["old"] is not None and score["new"] is not None and score["old"] != score["new"], score

    plots = json.loads(dvc(repo, "plots", "diff", "main", name, "--json").stdout)["data"]
    values = plots["loss"][0]["content"]["data"]["values"]  # the mean training curves, overlaid
    assert {v["rev"] for v in values} == {"main", name}
    assert {v["field"] for v in values} == {"train_loss", "eval_loss"}
    assert "outputs/train/seed0/curve.tsv" in plots

    dvc(repo, "exp", "apply", name)
    assert "probe_length: 8" in (repo / "params.yaml").read_text()
    summary = json.loads((repo / "outputs" / "compare" / "summary.json").read_text())
    assert summary["training"]["induction"] == pytest.approx(float(exps["8"]["training.induction"]))
    assert up_to_date(repo)
    assert stages_run(dvc(repo, "repro")) == []


def test_pushed_results_reproduce_nothing_in_a_fresh_clone(base, tmp_path):
    repo = clone(base, tmp_path / "repo")
    remote = tmp_path / "remote"
    dvc(repo, "remote", "add", "-d", "shared", str(remote))
    git(repo, "commit", "-q", "-m", "a DVC remote", ".dvc/config")
    dvc(repo, "push", "--run-cache")
    assert any(remote.rglob("*"))

    fresh = clone(repo, tmp_path / "fresh", share_cache=False)  # its own, empty cache
    # git brought the metrics and plots files alone; every other output comes from the remote
    assert sorted(
        str(p.relative_to(fresh)) for p in (fresh / "outputs").rglob("*") if p.is_file()
    ) == small_outputs(fresh)
    dvc(fresh, "pull")
    assert stages_run(dvc(fresh, "repro")) == []
    assert up_to_date(fresh)
    for rel in ("outputs/compare/summary.json", "outputs/compare/claims.csv", "outputs/report/index.html"):
        assert (fresh / rel).read_bytes() == (repo / rel).read_bytes(), rel
