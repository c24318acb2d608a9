"""Nothing lost or half-written, and the same bytes every time, on the real `dvc repro` of the
tiny config (tests/dvc_repo.py):

- Determinism: a fresh clone of the repository, reproduced from nothing, gives every file
  under outputs/ byte for byte (model, weights, scores, tables, figures, report).
- Atomic outputs: a stage killed with SIGKILL in the middle of writing an artifact leaves
  no partial file under an artifact's name (only a hidden `.<name>.tmp-*` file), the
  artifacts already there intact, DVC still up to date; `dvc repro` then completes, and
  the stage's next run removes the leftover (`pipeline.io.clean_stale`).

No hook in the code under test: the kill lands mid-write because the test watches the
output directory and kills as soon as a temporary file appears, and then checks that one
was left behind (a kill that came too late is retried).
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dvc_repo import BIN, TINY, copy_repo, dvc, env, git, reproduced, stages_run

from pipeline import io
from pipeline import params as params_mod

ROOT = Path(__file__).resolve().parents[1]


def hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except the temporary files of interrupted writes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and io.TMP_MARK not in str(p.relative_to(root))  # nor files in a temporary dir
    }


def leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if io.TMP_MARK in n) if directory.is_dir() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared_dir) -> tuple[Path, dict[str, str]]:
    # a copy of the tiny project reproduced once a run: this module kills processes in it
    repo = copy_repo(reproduced(shared_dir)[0], tmp_path_factory.mktemp("first") / "repo")
    outputs = hashes(repo / "outputs")
    assert len(outputs) > 30 and "report/index.html" in outputs
    return repo, outputs


@pytest.mark.slow
def test_a_fresh_clone_reproduces_every_output_byte_for_byte(reference, tmp_path):
    """Same config, seeds, commit and machine, another directory: the same bytes, report included."""
    repo, expected = reference
    clone = tmp_path / "repo"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    # the commit the outputs were built at (the report names it): the one before "dvc repro"
    git(clone, "checkout", "-q", "HEAD~1")
    ran = stages_run(dvc(clone, "repro"))
    assert "train@0" in ran and "report" in ran  # computed again, not restored from a cache
    assert hashes(clone / "outputs") == expected


def kill_when_writing(
    cmd: list[str], cwd: Path, directory: Path, timeout: float = 300, pattern: str = f".*{io.TMP_MARK}*"
) -> subprocess.Popen:
    """Start `cmd` in its own process group; SIGKILL the whole group as soon as a temporary
    file matching `pattern` appears under `directory` (an artifact is being written)."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env(cwd),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout

    def writing() -> bool:
        try:
            return any(directory.glob(pattern))
        except FileNotFoundError:  # DVC removes a stage's outputs before it runs the stage
            return False

    while not writing():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
            pytest.fail(
                f"{' '.join(cmd)} wrote no temporary file in {directory} (exit code {proc.returncode})"
            )
        time.sleep(0.001)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc


@pytest.mark.slow
def test_sigkill_mid_write_leaves_no_partial_artifact_and_repro_completes(reference, tmp_path):
    repo, expected = reference
    outputs = repo / "outputs"

    # 1. The train stage run by hand into the existing seed0 directory, killed while it writes a
    #    large checkpoint (~30 MB: tens of milliseconds of writing and fsync) into its temporary
    #    checkpoints directory, which replaces checkpoints/ only once every checkpoint is written.
    big = [*TINY, "model.d_vocab=16384", "model.d_model=256", "train.steps=1", "train.warmup_steps=0",
           "train.eval_every=1", "train.batch_size=1", "train.eval_batch_size=1",
           "data.n_train_sequences=40"]  # fmt: skip
    big_params = tmp_path / "big.yaml"
    big_params.write_text(params_mod.dump(params_mod.compose(big, conf_dir=ROOT / "conf")))
    seed0 = outputs / "train" / "seed0"
    cmd = [
        str(BIN / "python"),
        "-m",
        "stages.train",
        "--params",
        str(big_params),
        "--seed",
        "0",
        "--origin",
        str(outputs / "origin" / "seed0" / "origin.json"),
        "--out",
        str(seed0),
        "--no-progress",
    ]
    for _ in range(5):
        kill_when_writing(cmd, repo, seed0, pattern=f".checkpoints{io.TMP_MARK}*/.step*{io.TMP_MARK}*")
        if leftovers(seed0):
            break  # killed mid-write; else the write finished first: restore and try again
        dvc(repo, "checkout", "--force")
    stray = leftovers(seed0)
    assert stray and stray[0].startswith(".checkpoints.tmp-"), stray
    assert hashes(outputs) == expected  # every artifact intact: nothing half-written under its name
    assert "up to date" in dvc(repo, "status").stdout  # a stray temporary file is ignored (.dvcignore)

    # 2. `dvc repro` itself killed (its whole process group) while the figures stage writes a figure.
    figures = outputs / "figures" / "seed0"
    kill_when_writing([str(BIN / "dvc"), "repro", "--force", "-s", "figures@0"], repo, figures)
    partial = leftovers(figures)
    assert partial, "killed after the write finished"
    names = set(os.listdir(figures))
    for tmp in partial:  # the figure being written is not there under its name
        assert tmp.split(io.TMP_MARK)[0].removeprefix(".") not in names
    written = {f"figures/seed0/{n}" for n in names if io.TMP_MARK not in n}
    assert all(hashes(outputs)[k] == expected[k] for k in written)  # any finished figure is complete
    assert "figures@0" in dvc(repo, "status").stdout  # DVC sees the stage as unfinished

    # 3. `dvc repro` completes (the killed process's locks are released), with every output
    #    as before; the train stage's next run removes its stray file.
    dvc(repo, "repro")
    assert hashes(outputs) == expected and not leftovers(figures)
    assert leftovers(seed0) == stray  # train@0 did not need to run
    assert "train@0" in stages_run(dvc(repo, "repro", "--force", "-s", "train@0"))
    assert not leftovers(seed0) and hashes(outputs) == expected
    assert "up to date" in dvc(repo, "status").stdout


# --- the mechanism, without DVC --------------------------------------------------------------

WRITES = re.compile(
    r"\.write_(text|bytes)\(|\bopen\([^)]*[\"'][wax]|\.savefig\(|\.to_csv\(|torch\.save\(|np\.save\(|save_file\(|json\.dump\("
)


@pytest.mark.source
def test_every_write_goes_through_pipeline_io():
    """Outside pipeline/io.py, a line that writes a file must be a call of pipeline.io
    (temp file + os.replace)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted([*(ROOT / "pipeline").rglob("*.py"), *(ROOT / "stages").glob("*.py")])
        if path != ROOT / "pipeline" / "io.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WRITES.search(line) and "io.write" not in line
    ]
    assert not offenders, offenders


def test_a_failed_write_keeps_the_old_artifact_and_leaves_no_temporary_file(tmp_path):
    path = io.write_text(tmp_path / "summary.json", "old\n")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("new, half wri")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        io.write_with(path, half_then_fail)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["summary.json"]


def test_a_full_disk_ends_the_stage_in_one_line_naming_the_file_and_leaves_no_partial_file(tmp_path):
    """A real storage failure: the train stage under a 1 KB file-size limit (EFBIG, as a full
    disk gives ENOSPC), as a subprocess. Python ignores SIGXFSZ, so the write itself fails."""
    params = tmp_path / "params.yaml"
    params.write_text(params_mod.dump(params_mod.compose(TINY, conf_dir=ROOT / "conf")))
    out = tmp_path / "out"
    (tmp_path / "origin.json").write_text('{"source": "train"}')
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))  # noqa: E731
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.train",
            "--params",
            str(params),
            "--seed",
            "0",
            "--origin",
            str(tmp_path / "origin.json"),
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and errors[0].endswith(": cannot write (File too large)"), done.stderr
    assert errors[0].startswith(f"error: {out}/"), errors
    assert "Traceback" not in done.stderr
    assert leftovers(out) == [] and not Path(errors[0][len("error: ") :].split(": ")[0]).exists()


def test_clean_stale_removes_only_the_leftovers_of_interrupted_writes(tmp_path):
    names = [".model.safetensors.tmp-k2j4", ".curve.tsv.tmp-0", "model.safetensors", ".keep", "notes.tmp-1"]
    for name in names:
        (tmp_path / name).write_text("x")
    io.clean_stale(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(names[2:])
    io.clean_stale(tmp_path / "absent")  # a stage's first run: nothing to clean
