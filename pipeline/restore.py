"""Bring back the workspace of your last run after a failed `dvc exp run`:

    python -m pipeline.restore

A `dvc exp run` rewrites params.yaml, and DVC deletes a stage's outputs before it runs the stage.
When a stage fails, the workspace holds the experiment's params.yaml, a dvc.lock that names what
ran before the failure, and neither the failed stage's outputs nor your run's. The committed
dvc.lock is not the way back: its outputs are in this machine's DVC cache only where this
machine computed the same bytes, and another CPU gives other bytes from training on. Your own
run is: DVC's cache holds every output it made.

- Before an experiment rewrites params.yaml (DVC composes conf/ through hydra_plugins/, which
  calls `keep`), the workspace's params.yaml, dvc.lock and the small outputs git tracks (the
  metrics and plots files, `cache: false` in dvc.yaml) are copied into .dvc/tmp/, when params.yaml
  holds the values dvc.lock was run with: a failed experiment's workspace never replaces your run.
- `python -m pipeline.restore` copies them back, stages dvc.lock as DVC's autostage does after a
  run, and runs `dvc checkout`, which brings every other output back from the local DVC cache.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from . import io
from .errors import UserError

KEPT = Path(".dvc") / "tmp" / "attn-circuits-last-run"  # git-ignored (.dvc/.gitignore: /tmp)
MANIFEST = "manifest.json"
WORKSPACE = ("params.yaml", "dvc.lock")
# What may stop `keep` (a file unreadable, git missing): the experiment runs all the same
KEEP_ERRORS = (OSError, ValueError, subprocess.SubprocessError, yaml.YAMLError)


def small_outputs(root: Path) -> list[str]:
    """The files under outputs/ that git tracks or would track (the rest is ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "outputs"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(p for p in set(listed.split("\0")) if p and (root / p).is_file())


_ABSENT = object()


def _value(params: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(params, dict) or part not in params:
            return _ABSENT
        params = params[part]
    return params


def ran_with(params: dict, lock: dict) -> bool:
    """Whether every params.yaml value that dvc.lock records for its stages equals params'."""
    for stage in (lock.get("stages") or {}).values():
        for key, value in ((stage.get("params") or {}).get("params.yaml") or {}).items():
            if _value(params, key) != value:
                return False
    return True


def keep(root: str | Path = ".") -> bool:
    """Copy the workspace's run (params.yaml, dvc.lock, the small outputs) into KEPT, replacing
    what is there, when params.yaml holds the values dvc.lock was run with; False, keeping the
    last copy, when it does not or nothing has run yet."""
    root = Path(root)
    if not all((root / name).is_file() for name in WORKSPACE):
        return False
    params = yaml.safe_load((root / "params.yaml").read_text())
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    if not (isinstance(params, dict) and isinstance(lock, dict) and ran_with(params, lock)):
        return False
    files = [*WORKSPACE, *small_outputs(root)]
    kept = root / KEPT
    fresh = kept.with_name(f"{kept.name}.new")
    shutil.rmtree(fresh, ignore_errors=True)
    for rel in files:
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, fresh / rel)
    io.write_json(fresh / MANIFEST, {"files": files, "time": time.time()})
    # the kept copy is replaced only once the new one is whole
    old = kept.with_name(f"{kept.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if kept.exists():
        kept.rename(old)
    fresh.rename(kept)
    shutil.rmtree(old, ignore_errors=True)
    return True


def restore(root: str | Path = ".") -> list[str]:
    """Put the kept run back (`keep`) and check its other outputs out of DVC's cache; the files
    written. The small outputs the run did not have (an experiment's new seed) are removed."""
    root = Path(root)
    kept = root / KEPT
    try:
        files = json.loads((kept / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        raise UserError(
            str(KEPT),
            "no run kept: one is kept when `dvc exp run` starts from a finished run "
            "(`dvc checkout` brings back the outputs dvc.lock names)",
        ) from None
    for rel in set(small_outputs(root)) - set(files):
        (root / rel).unlink()
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kept / rel, root / rel)
    tracked = subprocess.run(["git", "ls-files", "--", "dvc.lock"], cwd=root, capture_output=True, text=True)
    if tracked.stdout.strip():
        subprocess.run(["git", "add", "--", "dvc.lock"], cwd=root, check=True)
    checkout = subprocess.run([sys.executable, "-m", "dvc", "checkout"], cwd=root)
    if checkout.returncode != 0:
        raise UserError("dvc checkout", f"exited {checkout.returncode} (its output is above)")
    return files


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import run_cli

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.restore",
        description="Bring back your last run after a failed `dvc exp run`: its params.yaml, "
        "dvc.lock and metrics and plots files, kept when the experiment started, then every "
        "other output from the local DVC cache (`dvc checkout`). Run it in the repository's root.",
    )
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")

    def body(args: argparse.Namespace) -> int:
        files = restore()
        print(f"restored {len(files)} files kept before the last experiment, and DVC's outputs")
        return 0

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
