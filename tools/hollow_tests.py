"""Tests that assert nothing (part of `make mutate-blind`): for each test file, replace every
function body of the modules it imports from pipeline/ and stages/ with `return None`, run its fast
tests, and report each test that still passes. Such a test calls the code it imports but checks
nothing that code computes (or calls none of it).

The hollowing happens in a temporary copy of the repository (the files git tracks or would track),
never in the checkout; the copy's path comes first for the tests (`python -m pytest` from it).
A test that rightly passes on hollow modules (it checks a constant, a file, the config text) is
listed with a one-line reason in tests/hollow_allowed.toml; every other one is reported, and the
script exits 1. An allowed test that fails on hollow modules is named too (the entry is stale).

    python tools/hollow_tests.py                       # every test file
    python tools/hollow_tests.py tests/test_strands.py  # only these
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mutate import copy_repository  # the files git tracks or would track, as make mutate copies them

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ROOT / "tests" / "hollow_allowed.toml"
TIMEOUT_S = 900
FAST = "not slow and not interop4 and not source"  # the tier mutmut runs


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


def imported_modules(test_file: Path) -> set[str]:
    """The modules of pipeline/ and stages/ a test file imports, wherever in the file:
    `from pipeline.circuits import strands`, `from pipeline.errors import UserError`, `import stages.x`."""
    out = set()
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in ("pipeline", "stages"):
                continue
            for alias in node.names:  # a submodule if it is one, else a name in node.module
                sub = f"{node.module}.{alias.name}"
                out.add(sub if (ROOT / module_path(sub)).exists() else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] in ("pipeline", "stages"))
    return {m for m in out if (ROOT / module_path(m)).exists()}


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


def check_file(copy: Path, test_file: str, modules: set[str]) -> set[str]:
    """The fast tests of `test_file` that pass with every module in `modules` hollowed."""
    originals = {m: (copy / module_path(m)).read_text() for m in modules}
    try:
        for m, text in originals.items():
            (copy / module_path(m)).write_text(hollow(text))
        return passing(copy, [test_file, "-m", FAST])
    finally:
        for m, text in originals.items():
            (copy / module_path(m)).write_text(text)


def load_allowed() -> dict[str, str]:
    if not ALLOWED.exists():
        return {}
    out = {}
    for i, e in enumerate(tomllib.loads(ALLOWED.read_text()).get("allowed", [])):
        if not {"test", "reason"} <= set(e) or not e["reason"].strip() or "\n" in e["reason"].strip():
            raise SystemExit(f"{ALLOWED.name}: entry {i + 1} needs test and a one-line reason")
        out[e["test"]] = e["reason"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="test files (default: every tests/test_*.py)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    plan = {f: imported_modules(ROOT / f) for f in files}
    plan = {f: m for f, m in plan.items() if m}
    allowed = load_allowed()
    with tempfile.TemporaryDirectory(prefix="hollow-") as tmp:
        free = [Path(tmp) / f"copy{i}" for i in range(args.workers)]
        for copy in free:
            copy_repository(copy)

        def job(test_file: str) -> tuple[str, set[str]]:
            copy = free.pop()
            try:
                return test_file, check_file(copy, test_file, plan[test_file])
            finally:
                free.append(copy)

        with ThreadPoolExecutor(args.workers) as pool:
            found = dict(pool.map(job, sorted(plan)))
    passed = set().union(*found.values()) if found else set()

    def excused(test: str) -> bool:  # an entry names a test, or a parametrised test's every case
        return test in allowed or test.split("[")[0] in allowed

    reported = 0
    for test_file in sorted(found):
        bad = sorted(t for t in found[test_file] if not excused(t))
        if bad:
            print(f"{test_file} (hollow: {', '.join(sorted(plan[test_file]))}):")
            for test in bad:
                print(f"    {test}")
        reported += len(bad)
    stale = sorted(
        t
        for t in allowed
        if t.split("::")[0] in found and not any(p.split("[")[0] == t or p == t for p in passed)
    )
    for test in stale:
        print(f"{ALLOWED.name}: {test} fails on hollow modules: drop the entry", file=sys.stderr)
    print(
        f"{reported} test(s) in {len(found)} files pass with the modules they import hollowed out "
        f"({len(passed) - reported} allowed)",
        file=sys.stderr,
    )
    return 1 if reported or stale else 0


if __name__ == "__main__":
    sys.exit(main())
