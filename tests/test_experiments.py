"""The README's recipes with the real DVC on the tiny config (tests/dvc_repo.py):
`dvc exp run -S` listed by `dvc exp show` with its metrics, shrinking `seeds` (growing
them is test_pipeline_dvc's), a queued sweep run by two workers, `dvc exp show --csv`,
`dvc metrics diff`, `dvc plots diff`, `dvc exp apply`, and sharing results through a
DVC remote so that a fresh clone reproduces nothing.

The pipeline is reproduced once per test run (`dvc_repo.reproduced`) and copied (`base`);
each test works in a git clone of it that shares its DVC cache, so it starts from
checked-out outputs without recomputing them.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
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


def seeds_in_table(repo: Path) -> list[int]:
    return list(pd.read_csv(repo / "outputs" / "compare" / "claims.csv")["seed"].unique())


def up_to_date(repo: Path) -> bool:
    return "Data and pipelines are up to date" in dvc(repo, "status").stdout


def test_experiment_runs_and_is_listed_with_metrics(base, tmp_path):
    repo = clone(base, tmp_path / "repo")
    # a compare parameter: the experiment reruns compare and the report, and restores the rest
    # (the queued sweep below retrains)
    done = dvc(repo, "exp", "run", "-n", "narrower", "-S", "analysis.compare.ci=0.9")
    assert sorted(stages_run(done)) == ["compare", "report"]
    table = list(csv.DictReader(io.StringIO(dvc(repo, "exp", "show", "--csv").stdout)))
    row = next(r for r in table if r["Experiment"] == "narrower")
    assert float(row["analysis.compare.ci"]) == 0.9
    metric_columns = [c for c in row if c.endswith("induction") or c.endswith("eval_loss")]
    assert metric_columns and all(row[c] not in ("", "-") for c in metric_columns), row


ROOT = Path(__file__).resolve().parents[1]
FIXED_COLUMNS = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
VERDICTS = tuple(CLAIMS)  # summary.json's verdicts, in the registry's order


def readme_exp_show() -> list[str]:
    """The README's `dvc exp show` command for people (the verdicts), as arguments."""
    import shlex

    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "dvc exp show --drop" in ln)
    return shlex.split(line.split("#")[0])[1:]


def test_readme_exp_show_prints_a_handful_of_metric_columns(base, shared_dir, tmp_path):
    """The README's command prints the experiments' verdicts: the setup (the one param), the seeds
    and a verdict per claim of the corrected score (summary.json; the invariant measure's
    restatements and the training metrics are in `dvc exp show` whole), in at most 200 columns."""
    # a copy of the cache of the project grown to seeds [0, 1] (built once a run, as the pipeline
    # tests grow it): its run cache holds seed 1's stages, so the experiment restores them instead of
    # training seed 1 again, and reruns compare and the report for seeds [1]
    cache = tmp_path / "cache"
    shutil.copytree(reproduced(shared_dir, (0, 1))[0] / ".dvc" / "cache", cache)
    repo = clone(base, tmp_path / "repo", cache=cache)
    done = dvc(repo, "exp", "run", "-n", "other-seed", "-S", "seeds=[1]")
    assert sorted(stages_run(done)) == ["compare", "report"]
    args = readme_exp_show()
    assert args[:2] == ["exp", "show"], args
    out = dvc(repo, *args, "--csv").stdout.splitlines()
    header = out[0].split(",")
    params = set(pd.json_normalize(yaml.safe_load((repo / "params.yaml").read_text())).columns)
    metrics = [c for c in header if c not in FIXED_COLUMNS | {"setup"}]
    assert "setup" in header and not params & set(metrics), header
    own = [c for c in VERDICTS if not CLAIMS[c].restates]
    assert ["n_seeds", *(f"verdict.{c}" for c in own)] == metrics, header
    assert "other-seed" in "\n".join(out[1:])
    wide = run(repo, "env", "COLUMNS=1000", str(BIN / "dvc"), *args).stdout.splitlines()
    assert max(len(line.rstrip()) for line in wide) <= 200, "\n".join(wide)
    # and the declared metrics are the headline only: the summary of compare, 24 columns at most,
    # then (m) per kind against each rotation (6) and each seed's K detection limits (3 a seed)
    everything = dvc(repo, "exp", "show", "--drop", ".*/|data$", "--csv").stdout.splitlines()[0].split(",")
    deps = {c for c in everything if (repo / c).exists()}  # a dependency's column: `checkpoints`
    declared = [c for c in everything if c not in FIXED_COLUMNS | params | deps]
    headline = ("n_seeds", "verdict", "mean", "training")
    extra = ("m_by_kind", "c_vs_roles", "detection_limit_K")
    assert all(c.split(".")[0] in (*headline, *extra) for c in declared), declared
    assert len([c for c in declared if c.split(".")[0] in headline]) <= 24, declared
    assert len([c for c in declared if c.startswith("m_by_kind.")]) == 6, declared
    assert {c.split(".")[1] for c in declared if c.startswith("detection_limit_K.")} <= {"seed0", "seed1"}


@pytest.mark.parametrize(
    "overrides,refused",
    [
        (["data.text.corpus=gutenberg"], "data.text.corpus = 'gutenberg': unknown corpus"),
        (
            ["data.source=tokens", "data.tokens.path=ids.npy", "data.dir=nowhere"],
            "data.dir = 'nowhere': directory not found",
        ),
        (["data.source=tokens", "data.tokens.path=ids.npy"], "data.tokens.path = 'ids.npy': file not found"),
        (
            ["train.source=load", "train.checkpoint=seed0/model.safetensors"],
            "train.checkpoint = 'seed0/model.safetensors': checkpoints/seed0/model.safetensors not found",
        ),
        (["model=4"], "override: model = 4: a config group takes the name of one of its options"),
    ],
)
def test_a_bad_experiment_stops_before_any_stage_and_leaves_git_clean(base, tmp_path, overrides, refused):
    """A corpus, path or checkpoint a stage would refuse is refused while DVC composes conf/
    (hydra_plugins/), in one line, before params.yaml is written or any stage runs."""
    repo = clone(base, tmp_path / "repo", share_cache=False)
    done = dvc(repo, "exp", "run", *[arg for o in overrides for arg in ("-S", o)], check=False)
    assert done.returncode != 0 and stages_run(done) == []
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and refused in errors[0], done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert git(repo, "status", "--porcelain").stdout == ""
    assert dvc(repo, "exp", "list").stdout.strip() == ""  # no experiment recorded


def test_an_experiment_that_fails_in_a_stage_says_how_to_get_back(base, tmp_path):
    """A mistake only training can see (the loss diverges): DVC removed train@0's outputs before
    running it and left params.yaml changed; the stage's one line says how to get the last run
    back, and doing so gives a clean workspace with the same outputs."""
    repo = clone(base, tmp_path / "repo")
    model = repo / "outputs" / "train" / "seed0" / "model.safetensors"
    before = model.read_bytes()
    done = dvc(repo, "exp", "run", "-S", "train.lr=1e30", "-S", "train.grad_clip=1e30", check=False)
    assert done.returncode != 0 and stages_run(done) == ["train@0"]
    refusal = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1 and "train.lr = 1e+30" in refusal[0], done.stderr
    assert "git checkout params.yaml dvc.lock && dvc checkout" in refusal[0]
    assert not model.exists()  # DVC removes a stage's outputs before it runs
    git(repo, "checkout", "params.yaml", "dvc.lock")
    dvc(repo, "checkout")
    assert model.read_bytes() == before
    assert git(repo, "status", "--porcelain").stdout == ""
    assert up_to_date(repo)


def test_shrinking_seeds_leaves_no_stale_seed(shared_dir, tmp_path):
    grown = reproduced(shared_dir, (0, 1))[0]  # seeds [0] reproduced, then seed 1 added
    repo = copy_repo(grown, tmp_path / "repo")
    set_params(repo, "seeds=[1]")
    proc = dvc(repo, "repro")
    assert sorted(stages_run(proc)) == ["compare", "report"]
    assert "seed0 is not in seeds [1]" in proc.stdout + proc.stderr  # named, left out
    assert seeds_in_table(repo) == [1]
    assert set(pd.read_csv(repo / "outputs" / "compare" / "roles.csv")["seed"]) == {1}
    page = (repo / "outputs" / "report" / "index.html").read_text()
    assert '<h2 id="seed1">' in page and '<h2 id="seed0">' not in page
    assert up_to_date(repo)


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
        # a sweep: two experiments, the first the baseline's own n_heads (its stages are restored
        # from the cache, so the queue's machinery is tested without training a third model)
        dvc(repo, "exp", "run", "--queue", "-S", "model.n_heads=2,4")
        assert dvc(repo, "queue", "status").stdout.count("Queued") == 2
        dvc(repo, "queue", "start", "-j", "2", capture=False)  # two workers, in the background
        status = wait_for_queue(repo)
    finally:
        dvc(repo, "queue", "stop", "--kill", check=False)  # leave no worker behind, whatever happened
    assert status.count("Success") == 2, status

    rows = list(csv.DictReader(io.StringIO(dvc(repo, "exp", "show", "--csv").stdout)))
    exps = {r["model.n_heads"]: r for r in rows if r["Experiment"]}
    assert set(exps) == {"2", "4"}, rows
    for row in exps.values():
        assert row["State"] == "Success"
        assert row["verdict.b"] in {"holds", "fails", "inconclusive", "untestable"}
        assert float(row["training.eval_loss"]) > 0 and row["n_seeds"] == "1"
    name = exps["4"]["Experiment"]
    assert exps["4"]["training.eval_loss"] != exps["2"]["training.eval_loss"]
    main = next(r for r in rows if r["rev"] == "main" and not r["Experiment"])
    assert exps["2"]["training.eval_loss"] == main["training.eval_loss"]  # the baseline's own model

    diff = json.loads(dvc(repo, "metrics", "diff", "main", name, "--json").stdout)
    loss = diff["outputs/compare/summary.json"]["training.eval_loss"]  # both columns: main has dvc.lock
    assert loss["old"] is not None and loss["new"] is not None and loss["old"] != loss["new"], loss

    plots = json.loads(dvc(repo, "plots", "diff", "main", name, "--json").stdout)["data"]
    values = plots["loss"][0]["content"]["data"]["values"]  # the mean training curves, overlaid
    assert {v["rev"] for v in values} == {"main", name}
    assert {v["field"] for v in values} == {"train_loss", "eval_loss"}
    assert "outputs/train/seed0/curve.tsv" in plots

    dvc(repo, "exp", "apply", name)
    assert "n_heads: 4" in (repo / "params.yaml").read_text()
    summary = json.loads((repo / "outputs" / "compare" / "summary.json").read_text())
    assert summary["training"]["eval_loss"] == pytest.approx(float(exps["4"]["training.eval_loss"]))
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
    assert not (fresh / "outputs").exists()
    dvc(fresh, "pull")
    assert stages_run(dvc(fresh, "repro")) == []
    assert up_to_date(fresh)
    for rel in ("outputs/compare/summary.json", "outputs/compare/claims.csv", "outputs/report/index.html"):
        assert (fresh / rel).read_bytes() == (repo / rel).read_bytes(), rel
