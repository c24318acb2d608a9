"""The environment table: the machine and the commit that built the report.

Each package's installed version, the threads torch may use and why, the git revision. The one part
of the page that is not a function of the pipeline's outputs and config (`ENVIRONMENT_NOTE` says so
on the page).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

PACKAGES = (
    "torch",
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "hydra-core",
    "omegaconf",
    "dvc",
    "safetensors",
    "transformer-lens",
)
ENVIRONMENT_NOTE = (
    "This table describes the machine and the git commit that built this page, not necessarily those "
    "that trained the models (DVC rebuilds the page only when its inputs change, and may restore it "
    "from its cache). It is the only part of the page that depends on the machine; nothing on the page "
    "records the time, so the same outputs, config, commit and machine give the same bytes."
)


def environment(train_threads: int | None, cwd: str | Path = ".") -> dict[str, str]:
    """Versions, threads and git revision of the process building the report.

    Versions come from package metadata: nothing is imported (torch alone takes seconds).
    """
    env = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env[name] = "not installed"
    env["platform"] = f"{platform.system()} {platform.machine()}"
    visible = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    env["cpus (visible / total)"] = f"{visible} / {os.cpu_count()}"
    env["torch threads (train.threads)"] = (
        str(train_threads) if train_threads else "torch's default (one per physical core)"
    )
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # they change torch's default
        env[var] = os.environ.get(var, "unset")
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=30
        )
        env["git revision"] = rev.stdout.strip() if rev.returncode == 0 else "unknown (not a git checkout)"
    except (OSError, subprocess.TimeoutExpired):
        env["git revision"] = "unknown (git not available)"
    return env
