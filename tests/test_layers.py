"""The house's floors: pipeline/'s subpackages follow the data's journey, and no import runs
back up it. The table below is the architecture; a new import that breaks it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.source  # the imports as written: mutmut's rewritten copy adds its own

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "pipeline"

# What each floor may import (besides itself). The ground is pipeline/'s own modules.
MAY_IMPORT = {
    "ground": set(),
    "data": {"ground"},
    "model": {"ground", "data"},
    "circuits": {"ground"},  # the weights alone: no model code, no data
    "behaviour": {"ground", "data", "model", "circuits"},
    "compare": {"ground", "circuits", "behaviour"},  # circuits: the significance statistics, numpy only
    "present": {"ground", "circuits", "behaviour", "compare"},  # circuits: the null's words, where computed
    # the top floor, a module (pipeline/api.py): one model in a notebook, on the stages' code
    "api": {"ground", "data", "model", "circuits", "behaviour"},
}
SUBPACKAGES = sorted(p for p in set(MAY_IMPORT) - {"ground"} if (PIPELINE / p).is_dir())


def floor(module: str) -> str:
    """pipeline.circuits.weights -> circuits; pipeline.io -> ground."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else "ground"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module an import names; a relative one (pipeline/ is installed as attn_circuits, its
    modules import each other relatively: `from ..config import X`) resolved against `path`'s package."""
    if node.level == 0:
        return node.module or ""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]  # pipeline/circuits/x.py -> pipeline.circuits
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(path: Path) -> set[str]:
    """The pipeline modules a file imports, function-level imports too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline.")}
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, path)
            if module.split(".")[0] != "pipeline":
                continue
            for a in node.names:  # `from pipeline.circuits import weights` imports a module
                sub = f"{module}.{a.name}"
                as_module = PIPELINE.parent.joinpath(*sub.split("."))
                found.add(sub if as_module.with_suffix(".py").exists() or as_module.is_dir() else module)
    return {m for m in found if m != "pipeline"}


MODULES = {module_name(p): imports(p) for p in sorted(PIPELINE.rglob("*.py"))}


def test_floor_of_known_modules():
    assert floor("pipeline.io") == "ground"
    assert floor("pipeline.circuits") == "circuits"
    assert floor("pipeline.circuits.weights") == "circuits"
    assert floor("pipeline.present.figures.heads") == "present"
    assert floor("pipeline.api") == "api"
    assert "pipeline.behaviour.heads" in MODULES["pipeline.api"]
    assert "pipeline.circuits.weights" in MODULES["pipeline.circuits.composition"]
    assert "pipeline.model.transformer" in MODULES["pipeline.behaviour.heads"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_up_the_floors(module):
    here = floor(module)
    wrong = sorted(m for m in MODULES[module] if floor(m) not in MAY_IMPORT[here] | {here})
    assert not wrong, f"{module} ({here}) imports {wrong}"


def test_circuits_import_neither_model_nor_data():
    circuits = [m for m in MODULES if floor(m) == "circuits"]
    assert len(circuits) >= 6
    for module in circuits:
        assert not {floor(m) for m in MODULES[module]} & {"model", "data"}, module


def test_no_import_cycles():
    """Depth-first search over the module graph; a module is its own ancestor only in a cycle."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(MODULES.get(module, ())):
            assert state.get(dep) != "open", " -> ".join([*path, module, dep])
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = "done"

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_subpackage_init_holds_only_a_docstring(package):
    """Re-exports would make every stage that imports one module depend on them all.
    (present/figures/__init__ holds `save`, which every figure module uses.)"""
    init = PIPELINE / package / "__init__.py"
    body = ast.parse(init.read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), init
