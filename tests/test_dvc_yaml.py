"""dvc.yaml stays exact: each stage depends on the pipeline/ modules its script imports
(transitively) and on no others, and reads params keys that exist."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def module_file(name: str) -> Path | None:
    """pipeline.x.y -> pipeline/x/y.py or pipeline/x/y/__init__.py, if it is ours."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def packages_of(name: str) -> list[str]:
    """pipeline.figures.heads -> [pipeline, pipeline.figures]: importing runs their __init__."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@cache
def imported_by(path: Path) -> frozenset[str]:
    """Modules of pipeline/ that importing `path` imports, transitively (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] == "pipeline" and module_file(name):
                found.update([name, *packages_of(name)])
    for name in list(found):
        found |= imported_by(module_file(name))
    return frozenset(found)


def stage_script(stage: dict) -> Path:
    module = stage["cmd"].split("-m ", 1)[1].split()[0]  # python -m stages.<name> ...
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


@pytest.mark.parametrize("name", sorted(DVC["stages"]))
def test_stage_deps_are_exactly_the_modules_it_imports(name):
    stage = DVC["stages"][name]
    script = stage_script(stage)
    expected = {str(module_file(m).relative_to(ROOT)) for m in imported_by(script)} | {str(script.relative_to(ROOT))}
    listed = {d for d in stage["deps"] if d.endswith(".py")}
    assert listed == expected, f"{name}: missing {sorted(expected - listed)}, extra {sorted(listed - expected)}"


@pytest.mark.parametrize("name", sorted(DVC["stages"]))
def test_stage_params_exist(name):
    for key in DVC["stages"][name].get("params", []):
        node = PARAMS
        for part in str(key).split("."):
            assert isinstance(node, dict) and part in node, f"{name}: params key {key} not in params.yaml"
            node = node[part]


def test_per_seed_stages_do_not_depend_on_the_seed_list():
    """Growing `seeds` must run only the new seeds' stages."""
    for name, stage in DVC["stages"].items():
        if "matrix" in stage:
            assert "seeds" not in stage.get("params", []), name
