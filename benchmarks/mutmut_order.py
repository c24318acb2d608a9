"""Benchmark: a killed mutant's test time, its tests in a set's order vs cheapest test file first.

    python benchmarks/mutmut_order.py                 # 20 killed mutants of the seeded sample of 100
    python benchmarks/mutmut_order.py --mutants 40 --seed 1

mutmut (`make mutate-blind`) hands a mutant's tests to pytest in a set's order and stops at the
first failure; tests/conftest.py reorders them cheapest test file first, by the times mutmut
recorded (mutants/mutmut-stats.json), each file whole. This measures what that saves, side by side.

Needs mutants/ from a mutmut run (`make mutate-blind SAMPLE=100`): the killed mutants of the sample
are drawn by `--seed`, with the tests that reach each. Each mutant runs in a fresh process
(`python -m pytest -x`, with mutmut's own pytest options and MUTANT_UNDER_TEST set, as mutmut's
worker calls it) in two temporary copies of mutants/:
  set order       without mutmut-stats.json, so conftest leaves the order alone: the tests run as
                  given, a seeded shuffle (a set's order is arbitrary)
  cheapest first  the same tests, the same shuffle, reordered by conftest
The two runs of a mutant follow each other, so the machine's load falls on both. A process's start
and collection, which mutmut's forked workers do not pay, is in both: the totals are printed as
measured and less the smallest time seen (`start`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import mutation_score  # noqa: E402

PYTEST = ["-m", "pytest", "--rootdir=.", "--tb=no", "-x", "-q", "-p", "no:randomly", "-p", "no:xdist"]
PYTEST += ["-p", "no:cacheprovider"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=20, help="how many killed mutants (default 20)")
    ap.add_argument("--seed", type=int, default=1, help="the draw's and the shuffles' seed (default 1)")
    ap.add_argument("--sample", type=int, default=100, help="draw from the sample of N (default 100)")
    args = ap.parse_args(argv)
    stats_file = ROOT / "mutants" / "mutmut-stats.json"
    if not stats_file.exists():
        print(
            "mutmut_order: no mutants/mutmut-stats.json: run `make mutate-blind SAMPLE=100` first",
            file=sys.stderr,
        )
        return 2
    tests_of = json.loads(stats_file.read_text())["tests_by_mangled_function_name"]
    found = mutation_score.sample(mutation_score.results(), args.sample)
    killed = sorted(
        n for n, (status, _) in found.items() if status == "killed" and n.split("__mutmut_")[0] in tests_of
    )
    rng = random.Random(args.seed)
    picked = rng.sample(killed, min(args.mutants, len(killed)))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        copies = {"set order": Path(tmp) / "set", "cheapest first": Path(tmp) / "cheapest"}
        for copy in copies.values():
            shutil.copytree(ROOT / "mutants", copy, symlinks=True)
        (copies["set order"] / "mutmut-stats.json").unlink()  # conftest's ordering off
        for name in picked:
            tests = sorted(tests_of[name.split("__mutmut_")[0]])
            rng.shuffle(tests)
            row = {"mutant": name}
            for label, copy in copies.items():
                start = time.monotonic()
                done = subprocess.run(
                    [sys.executable, *PYTEST, *tests],
                    cwd=copy,
                    env=dict(env, MUTANT_UNDER_TEST=name),
                    capture_output=True,
                )
                row[label] = time.monotonic() - start
                if done.returncode != 1:  # killed: a test failed
                    print(
                        f"mutmut_order: {name} was not killed under {label} (exit {done.returncode})",
                        file=sys.stderr,
                    )
                    return 1
            rows.append(row)
            print(f"{row['set order']:7.1f} s {row['cheapest first']:7.1f} s  {name}", flush=True)
    start = min(min(r["set order"], r["cheapest first"]) for r in rows)
    a = sum(r["set order"] for r in rows)
    b = sum(r["cheapest first"] for r in rows)
    faster = sum(r["cheapest first"] < r["set order"] for r in rows)
    n = len(rows)
    print(f"\n{'':24}{'set order':>12}{'cheapest first':>16}{'ratio':>8}")
    print(f"{f'{n} killed mutants':24}{a:11.0f}s{b:15.0f}s{a / b:8.2f}")
    a0, b0 = a - n * start, b - n * start
    print(f"{f'less start ({start:.1f} s)':24}{a0:11.0f}s{b0:15.0f}s{a0 / b0:8.2f}")
    print(f"cheapest first was faster for {faster} of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
