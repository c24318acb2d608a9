"""Fixtures shared across test modules (and across pytest-xdist workers: `make test` runs
the modules on every core, a module per worker at a time, `--dist loadfile`)."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """mutmut (`make mutate-blind`) learns which tests call which function from one traced run,
    with MUTANT_UNDER_TEST=stats. A stage these tests start in a subprocess, in a temporary
    directory, cannot report its calls back and would fail looking for mutmut's config there, so
    children run the original code during that run (the tracing process keeps its own copy of the
    setting: mutmut's trampoline falls back to it). While a mutant is tested, children see it."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        del os.environ["MUTANT_UNDER_TEST"]
    if "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        mutant_watchdog()


# A mutant's tests may take 8 min (a timeout at mutmut's CPU limit); a child that has run twice that
# long is stuck. mutmut limits CPU time only, and a forked child can block on a lock held at the fork
# with no CPU used, so it would wait for ever and the run would never end.
MUTANT_WALL_S = 1200


def mutant_watchdog(seconds: int = MUTANT_WALL_S) -> None:
    """End this process with SIGALRM after `seconds` of wall time: mutmut records the mutant as
    suspicious (not caught: listed with the survivors, and run again by the next `make mutate-blind`
    that draws it)."""
    import signal

    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)


# `make test` hands the workers whole files in collection order (`--dist loadfile
# --no-loadscope-reorder`; xdist would otherwise order them by their number of tests). These come
# first, longest first, so that no long file starts last while the other worker idles, and each
# file that builds a shared fixture (a file lock: `reproduced`, `synthetic_seed0`) comes before the
# files that read it, so that no worker waits on the lock, its core idle, while the other builds.
# Seconds: each file's in one run of the suite on 2 cores (`--durations=0`; the order matters, not the
# numbers).
LONGEST_FIRST = (
    "test_experiments.py",  # 320 s; builds the tiny project reproduced, seeds [0]
    "test_model_train.py",  # 100 s; trains synthetic_seed0 first
    "test_circuits_channel_null.py",  # 100 s; reads synthetic_seed0
    "test_pipeline_dvc.py",  # 175 s; grows it to seeds [0, 1]; the rest read them, or nothing shared
    "test_reliability.py",  # 115 s
    "test_dvc_yaml.py",  # 40 s
    "test_api.py",  # 60 s
    "test_circuits_significance.py",  # 115 s; reads synthetic_seed0
    "test_stages.py",  # 90 s
    "test_model_tl_checkpoint.py",  # 80 s
    "test_behaviour_heads.py",  # 20 s
    "test_bad_input.py",  # 30 s
    "test_hub.py",  # 50 s
    "test_params.py",  # 50 s
    "test_present_report.py",  # 50 s
    "test_api_docs.py",  # 40 s
)


def longest_files_first(nodeids: list[str], first: tuple[str, ...] = LONGEST_FIRST) -> list[str]:
    """`nodeids` with the files named in `first` at the front, in that order, the others after
    them in their given order; a file's tests stay together and in their order."""
    rank = {name: i for i, name in enumerate(first)}
    return sorted(nodeids, key=lambda nodeid: rank.get(Path(nodeid.split("::")[0]).name, len(first)))


def pytest_collection_modifyitems(config, items):
    """On `make test`'s pytest-xdist workers, the files named in LONGEST_FIRST first; a run in one
    process (`make test-fast`, a single file, mutmut's) keeps pytest's own order."""
    if not hasattr(config, "workerinput"):
        return
    order = longest_files_first([i.nodeid for i in items])
    rank = {nodeid: i for i, nodeid in enumerate(order)}
    items.sort(key=lambda item: rank[item.nodeid])


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, request) -> Path:
    """A directory every worker of this run sees (the workers' common base temp directory):
    where `dvc_repo.reproduced` builds the reproduced tiny projects once a run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def tiny_run(shared_dir) -> dict[str, Path]:
    """The tiny project's stages, origin to dynamics, run in-process once a run (tests/tiny_chain.py,
    dvc_repo.TINY, seed 0) for every test file and pytest-xdist worker that reads their outputs (a
    file lock; a marker file written last). Read only: {stage: its directory, "root", "params"}."""
    import shutil

    import tiny_chain
    from filelock import FileLock

    root, done = shared_dir / "tiny-run", shared_dir / "tiny-run.done"
    with FileLock(str(shared_dir / "tiny-run.lock")):
        if not done.exists():
            if root.exists():  # an earlier build in this directory that did not finish
                shutil.rmtree(root)
            root.mkdir()
            tiny_chain.run(root)
            done.write_text("")
    return {name: root / name for name in tiny_chain.STAGES} | {"root": root, "params": root / "params.yaml"}


@pytest.fixture(scope="session")
def synthetic_seed0(shared_dir):
    """The synthetic setup's model, seed 0 (`train.train` on `setup=synthetic`): trained once a run
    for every module and pytest-xdist worker that asks (a file lock; the model pickled whole, so its
    weights are the trained ones bit for bit). Returns (config, a function giving a fresh copy of
    the model: a caller may change it in place)."""
    from filelock import FileLock

    from pipeline import params
    from pipeline.model import train

    cfg = params.from_dict(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"))
    path = shared_dir / "synthetic-seed0.pt"
    with FileLock(str(shared_dir / "synthetic-seed0.lock")):
        if not path.exists():
            import torch

            tmp = path.with_suffix(".tmp")
            torch.save(train.train(cfg, seed=0, progress=False).model, tmp)
            tmp.rename(path)

    def model():
        import torch

        return torch.load(path, weights_only=False)

    return cfg, model


@pytest.fixture(scope="session")
def bridge_class():
    """TransformerLens 4.x's `TransformerBridge`, with `boot_native` attached: the `interop4` tests'
    oracle. 4.x cannot share a venv with 3.9 (the `interop` extra), so `make test` runs the
    `interop4` tests in their own venv, `.venv-tl4`, with ATTN_CIRCUITS_REQUIRE_TL4=1: there (and
    under CI) a missing 4.x fails the test, where a skip would hide it."""
    try:
        found = version("transformer-lens")
    except PackageNotFoundError:
        found = None
    if found is None or int(found.split(".")[0]) < 4:  # 3.9 has a TransformerBridge too, not 4.x's
        problem = f"needs TransformerLens 4.x, found {found}: make test runs these tests in .venv-tl4"
        if os.environ.get("CI") or os.environ.get("ATTN_CIRCUITS_REQUIRE_TL4"):
            pytest.fail(problem)
        pytest.skip(problem)
    import transformer_lens.model_bridge.sources  # noqa: F401  (attaches boot_native to the class)
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge
