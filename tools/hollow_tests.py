"""Tests that assert nothing (part of `make mutate-blind`): for each module of pipeline/ and stages/,
replace every function's body with `return None`, run the tests that call into that module, and
report each test that still passes. Such a test calls the module but checks nothing it computes.

Which tests call which module comes from mutmut's traced run (mutants/mutmut-stats.json, written by
`mutmut run`): a test reaches a module when it called one of its functions in-process. The
hollowing happens in a temporary copy of the repository (the files git tracks or would track),
never in the checkout; the copy's path comes first for the tests (`python -m pytest` from it).

A test that may pass on a hollow module, because what it checks lies elsewhere (it calls the
module only to build an input for another), is listed with a one-line reason in
tests/hollow_allowed.toml; every other one is reported, and the script exits 1.

    python tools/hollow_tests.py                 # every module mutmut saw a test reach
    python tools/hollow_tests.py pipeline.io     # only these modules
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATS = ROOT / "mutants" / "mutmut-stats.json"
ALLOWED = ROOT / "tests" / "hollow_allowed.toml"
TIMEOUT_S = 900


class _Hollow(ast.NodeTransformer):
    """Every function and method body -> its docstring (if any) and `return None`."""

    def visit_FunctionDef(self, node):
        keep = node.body[:1] if ast.get_docstring(node, clean=False) is not None else []
        node.body = [*keep, ast.Return(ast.Constant(None))]
        return node  # nested functions go with the body

    visit_AsyncFunctionDef = visit_FunctionDef


def hollow(source: str) -> str:
    return ast.unparse(ast.fix_missing_locations(_Hollow().visit(ast.parse(source))))


def module_path(module: str) -> Path:
    """pipeline.circuits.strands -> pipeline/circuits/strands.py (a package -> its __init__.py)."""
    base = Path(*module.split("."))
    return base / "__init__.py" if (ROOT / base).is_dir() else base.with_suffix(".py")


def tests_by_module() -> dict[str, set[str]]:
    """From mutmut's stats: function keys like `pipeline.circuits.strands.x_strand` or
    `pipeline.circuits.strands.xǁStrandǁ__post_init__` -> the module before the last dot."""
    if not STATS.exists():
        raise SystemExit(
            "hollow_tests: no mutants/mutmut-stats.json: run `make mutate-blind` (mutmut run) first"
        )
    stats = json.loads(STATS.read_text())
    out: dict[str, set[str]] = defaultdict(set)
    for function, tests in stats["tests_by_mangled_function_name"].items():
        module = function.rsplit(".", 1)[0]
        if (ROOT / module_path(module)).exists():
            out[module].update(tests)
    return out


def project_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(p for p in listed.split("\0") if p and (ROOT / p).is_file())


def copy_project(dest: Path) -> Path:
    for rel in project_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def passing(copy: Path, tests: list[str]) -> set[str]:
    """The node ids among `tests` that pass in `copy` (pytest's junit report)."""
    report = copy / "hollow-report.xml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--junit-xml={report}",
        "-o",
        "junit_family=xunit1",
        *tests,
    ]
    try:
        subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return set()  # a hang is not a pass
    if not report.exists():
        return set()
    passed = set()
    for case in ET.parse(report).iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            continue
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        passed.add(f"{file}::{case.get('name')}")
    report.unlink()
    return passed


def check_module(copy: Path, module: str, tests: set[str]) -> tuple[str, set[str]]:
    path = copy / module_path(module)
    original = path.read_text()
    try:
        path.write_text(hollow(original))
        passed = passing(copy, sorted(tests))
    finally:
        path.write_text(original)
    # junit names a parametrised test `name[param]` under its file: compare on that form
    return module, {t for t in tests if _junit_id(t) in passed}


def _junit_id(node_id: str) -> str:
    file, _, name = node_id.partition("::")
    return f"{file}::{name.split('::')[-1]}"


def load_allowed() -> dict[tuple[str, str], str]:
    if not ALLOWED.exists():
        return {}
    out = {}
    for i, e in enumerate(tomllib.loads(ALLOWED.read_text()).get("allowed", [])):
        if not {"module", "test", "reason"} <= set(e) or "\n" in e["reason"].strip():
            raise SystemExit(f"{ALLOWED.name}: entry {i + 1} needs module, test and a one-line reason")
        out[(e["module"], e["test"])] = e["reason"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="dotted module names (default: every one a test reaches)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    reach = tests_by_module()
    modules = args.modules or sorted(reach)
    unknown = [m for m in modules if m not in reach]
    if unknown:
        print(f"hollow_tests: no test reaches {', '.join(unknown)} (mutmut's stats)", file=sys.stderr)
        return 2
    allowed = load_allowed()
    with tempfile.TemporaryDirectory(prefix="hollow-") as tmp:
        copies = [copy_project(Path(tmp) / f"copy{i}") for i in range(args.workers)]
        free = list(copies)

        def job(module: str) -> tuple[str, set[str]]:
            copy = free.pop()
            try:
                return check_module(copy, module, reach[module])
            finally:
                free.append(copy)

        with ThreadPoolExecutor(args.workers) as pool:
            found = dict(pool.map(job, modules))
    reported = 0
    for module in modules:
        hollow_passes = sorted(t for t in found[module] if (module, t) not in allowed)
        print(
            f"{module}: {len(reach[module])} tests reach it; {len(found[module])} pass when it is hollow"
            + (f" ({len(found[module]) - len(hollow_passes)} allowed)" if found[module] else "")
        )
        for test in hollow_passes:
            print(f"    {test}")
        reported += len(hollow_passes)
    stale = sorted(k for k in allowed if k[0] in found and k[1] not in found[k[0]])
    for module, test in stale:
        print(f"{ALLOWED.name}: {module} / {test} no longer passes hollow: drop the entry", file=sys.stderr)
    print(f"\n{reported} test(s) pass with the module they call hollowed out", file=sys.stderr)
    return 1 if reported or stale else 0


if __name__ == "__main__":
    sys.exit(main())
