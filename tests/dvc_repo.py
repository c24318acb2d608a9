"""A copy of this project in a temporary git repository with a tiny config, for tests
that run the real `dvc repro` / `dvc exp run` (no mocks).

    from dvc_repo import make_repo, dvc
    repo = make_repo(tmp_path / "repo")                  # TINY config, seeds [0]
    repo = make_repo(tmp_path / "repo", ["seeds=[0,1]"])  # plus overrides
    dvc(repo, "repro")                                    # the venv's dvc; fails the test on error
    copy_repo(reproduced(shared_dir)[0], tmp_path / "repo")  # TINY, seeds [0], reproduced once a run

What is copied: the files git knows in this checkout (`git ls-files`: tracked, plus
untracked files that are not ignored, so work in progress is tested too; in CI, a fresh
clone, that is exactly the tracked files). No outputs/, .venv, DVC cache or git history.

The tiny config goes into conf/config.yaml (its `_self_` entry overrides the groups) and
params.yaml is composed from it with `python -m pipeline.params`: conf/ and params.yaml
agree, so `dvc exp run` (which recomposes conf/) keeps the tiny values. Everything is
committed: DVC experiments need a commit and see only what git or DVC track.

Commands run with this venv's bin/ first on PATH (so stage commands find its python),
DVC analytics off, and DVC's site cache (its hash database) beside the repo instead of
/var/tmp/dvc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# The tiny model and its data, shared by the DVC tests' config and the in-process training tests'.
TINY_MODEL = [
    "setup=synthetic",
    "model.n_heads=2",
    "model.d_head=4",
    "model.d_model=16",
    "model.n_ctx=20",
    "model.d_vocab=16",
    "data.n_train_sequences=64",
]
# A seed trains in a second or two; every stage still does real work. Others may append
# keys their stages need to stay tiny.
TINY = [
    *TINY_MODEL,
    "data.copies.min_span=3",
    "data.copies.max_span=6",
    "train.steps=20",
    "train.warmup_steps=2",
    "train.eval_every=10",
    "train.save_every=10",
    "train.save_steps=[]",
    "train.batch_size=8",
    "train.eval_batch_size=8",
    "train.probe_length=6",
    "train.threads=1",
    "analysis.composition.baseline_samples=8",
    "analysis.composition.null_samples=8",
    "analysis.heads.eval_sequences=8",
    "analysis.heads.repeat_length=6",
    "analysis.heads.window_length=2",
    "analysis.calibration.surrogates=1",
    "analysis.calibration.untrained=1",
    "analysis.calibration.strengths=[1.0]",
    "analysis.calibration.claim_e_surrogates=2",
    "analysis.figures.dpi=30",
    "analysis.compare.dpi=30",
    "seeds=[0]",
]
# In-process training tests (test_model_train, test_model_origin): a shorter run, smaller batches.
TINY_TRAIN = [
    *TINY_MODEL,
    "train.steps=12",
    "train.save_steps=[]",
    "train.warmup_steps=2",
    "train.eval_every=5",
    "train.batch_size=4",
    "train.eval_batch_size=4",
    "train.probe_length=6",
    "train.threads=1",
    "analysis.heads.repeat_length=6",
]
# The text source on a 20k-character slice of the corpus, a 300-token BPE vocabulary.
TINY_TEXT = [
    "setup=kjv",
    *TINY[1:],
    "data.text.max_chars=20000",
    "data.tokenizer.vocab_size=300",
    "model.d_vocab=300",
    "data.copies.min_span=3",
    "data.copies.max_span=6",
]


def env(repo: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["DVC_NO_ANALYTICS"] = "1"
    e["DVC_SITE_CACHE_DIR"] = str(Path(repo).parent / f".{Path(repo).name}-dvc-site")
    for who in ("AUTHOR", "COMMITTER"):
        e[f"GIT_{who}_NAME"] = "attn-circuits tests"
        e[f"GIT_{who}_EMAIL"] = "tests@example.invalid"
    return e


def run(
    repo: Path, *cmd: str, check: bool = True, timeout: float = 600, capture: bool = True
) -> subprocess.CompletedProcess:
    """Run `cmd` in `repo`; on failure (with `check`) fail with its output.

    `capture=False` discards the output instead: needed for commands that leave background
    processes (`dvc queue start`), which would otherwise hold the pipes open until they exit.
    """
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.run(
        list(cmd), cwd=repo, env=env(repo), stdout=out, stderr=out, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def dvc(
    repo: Path, *args: str, check: bool = True, timeout: float = 600, capture: bool = True
) -> subprocess.CompletedProcess:
    return run(repo, str(BIN / "dvc"), *args, check=check, timeout=timeout, capture=capture)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(repo, "git", *args, check=check)


def project_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # never this checkout's dvc.lock: it records *its* runs (a `make repro` here lists seeds the tiny
    # project has not reproduced), and DVC writes it beside every repro
    return sorted(p for p in out.split("\0") if p and p != "dvc.lock" and (ROOT / p).is_file())


def set_config(repo: Path, overrides: Sequence[str]) -> None:
    """Write `overrides` into conf/config.yaml and recompose params.yaml: a config group's
    option (`setup=synthetic`) into its defaults list, a dotted key=value into the values."""
    path = repo / "conf" / "config.yaml"
    conf = OmegaConf.load(path)
    groups = {next(iter(d)): i for i, d in enumerate(conf.defaults) if not isinstance(d, str)}
    values = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in groups:
            conf.defaults[groups[key]] = {key: value}
        else:
            values.append(override)
    conf = OmegaConf.merge(conf, OmegaConf.from_dotlist(values))
    path.write_text(OmegaConf.to_yaml(conf))
    run(repo, str(BIN / "python"), "-m", "pipeline.params")


def make_repo(dest: Path, overrides: Sequence[str] = (), commit: bool = True) -> Path:
    """Copy the project to `dest` (created), apply TINY + `overrides`, `git init` and commit."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in project_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    set_config(dest, [*TINY, *overrides])
    git(dest, "init", "-q", "-b", "main")
    if commit:
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", "tiny config")
    return dest


def copy_repo(src: Path, dest: Path) -> Path:
    """A copy of a repository, its git history, DVC cache and outputs included (DVC rehashes
    the copied outputs: its hash database lives beside `src`, not in it)."""
    shutil.copytree(src, dest, symlinks=True)
    return Path(dest)


def reproduced(shared: Path, seeds: Sequence[int] = (0,)) -> tuple[Path, list[str]]:
    """The tiny project reproduced and committed (dvc.lock included), and the stages its last
    `dvc repro` ran. Built once in `shared` however many modules or pytest-xdist workers ask
    (a file lock per repository; a marker file, written last, holds the stages). Seeds other
    than [0] are grown from [0]'s repository as a user adds seeds: the seeds changed in conf/
    and params.yaml, then `dvc repro`. Read-only: callers `copy_repo` or `git clone` it."""
    from filelock import FileLock

    name = "reproduced-" + "-".join(map(str, seeds))
    repo, done = shared / name / "repo", shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            if repo.parent.exists():  # an earlier build in this directory that did not finish
                shutil.rmtree(repo.parent)
            if list(seeds) == [0]:
                make_repo(repo)
            else:
                copy_repo(reproduced(shared)[0], repo)
                set_config(repo, [f"seeds=[{','.join(map(str, seeds))}]"])
            ran = stages_run(dvc(repo, "repro"))
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", "dvc repro")
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(ran))
            tmp.rename(done)
    return repo, json.loads(done.read_text())


def stages_run(proc: subprocess.CompletedProcess) -> list[str]:
    """Names of the stages a `dvc repro` / `dvc exp run` ran (not skipped or restored from cache)."""
    return [line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage '")]
