"""Fixtures shared across test modules (and across pytest-xdist workers: `make test` runs
the modules on every core, a module per worker at a time, `--dist loadfile`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dvc_repo import reproduced


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, request) -> Path:
    """A directory every worker of this run sees (the workers' common base temp directory)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def tiny_reproduced(shared_dir) -> Path:
    """The tiny project (seeds [0]) after `dvc repro`, committed: read-only, copy it."""
    return reproduced(shared_dir)[0]
