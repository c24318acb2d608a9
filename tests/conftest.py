"""Fixtures shared across test modules (and across pytest-xdist workers: `make test` runs
the modules on every core, a module per worker at a time, `--dist loadfile`)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, request) -> Path:
    """A directory every worker of this run sees (the workers' common base temp directory):
    where `dvc_repo.reproduced` builds the reproduced tiny projects once a run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base
