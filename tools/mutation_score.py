"""The blind mutation score (`make mutate-blind`), per subpackage, from mutmut's results.

mutmut (3.x, configured in pyproject.toml `[tool.mutmut]`) plants every operator, constant,
comparison, argument and string change it can in pipeline/ and stages/, and runs the tests that
reach each mutated function (its own test selection, from one traced run of the fast tier). It
keeps its results in mutants/ (`*.py.meta`). This script draws a seeded sample of those mutants,
names the ones to run, and scores what ran.

    python tools/mutation_score.py --generate --sample 50 --seed S --names   # write mutants/, name
                                   # the sample's mutants not yet caught (make mutate-blind runs them)
    python tools/mutation_score.py --sample 50 --seed S           # the sample's score, 95% intervals
    python tools/mutation_score.py --sample 50 --seed S --check   # exit 1 below a target
    python tools/mutation_score.py --sample 50 --seed S --survivors [WHERE]   # each survivor's diff
    python tools/mutation_score.py                                # every mutant run so far

`--sample N` draws N mutants per subpackage, uniformly, by the seed (the same names on every
machine for the same code): the sample's score is an unbiased estimate of the subpackage's, with
its Wilson 95% interval.

Score = (killed + timeout) / checked. A mutant that made a test hang is caught (mutmut counts it
so); one that no test reaches is a survivor, and so is an equivalent mutant (one that behaves as
the original on every valid input): the score is a lower bound on the share of the mutants a test
could tell apart that the tests do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pipeline", "stages")
# the acceptance targets (stages/ is mutated and reported, without a target: its code
# runs inside DVC's subprocesses, which mutmut's per-function tracing cannot see)
TARGETS = {"circuits": 0.95, "stages": None}
DEFAULT_TARGET = 0.85
CAUGHT = {"killed", "timeout"}
# not judged yet: never run, or its run was interrupted (both run again)
UNJUDGED = {"not checked", "check was interrupted by user"}


def group_of(path: Path) -> str:
    """pipeline/circuits/x.py -> circuits; pipeline/x.py -> ground; stages/x.py -> stages."""
    parts = path.relative_to(ROOT / "mutants").parts
    if parts[0] == "stages":
        return "stages"
    return parts[1] if len(parts) > 2 else "ground"


def results() -> dict[str, tuple[str, Path]]:
    """Every mutant's status and the mutated file it lives in, from mutants/**/*.py.meta."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for source in SOURCES:
        for meta in sorted((ROOT / "mutants" / source).rglob("*.py.meta")):
            codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
            for name, code in codes.items():
                out[name] = (status_by_exit_code[code], meta.with_suffix(""))
    return out


def diff_of(name: str, path: Path) -> str:
    """The mutant's unified diff against the original function (mutmut's own rendering)."""
    import os

    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = os.getcwd()
    os.chdir(ROOT)  # mutmut reads its config and mutants/ relative to the project
    try:
        return get_diff_for_mutant(name, path=path.relative_to(ROOT / "mutants"))
    finally:
        os.chdir(cwd)


def table(found: dict, interval: bool = False, sizes: dict[str, int] | None = None) -> tuple[str, dict]:
    """The score table and each subpackage's score. `sizes` (each subpackage's mutants in all)
    marks `found` as a stratified sample: the `all` row's score is then `stratified_score`."""
    counts: dict[str, Counter] = {}
    for status, path in found.values():
        c = counts.setdefault(group_of(path), Counter())
        c["mutants"] += 1
        c[status] += 1
    header = (
        "subpackage",
        "mutants",
        "checked",
        "killed",
        "timeout",
        "survived",
        "no tests",
        "score",
        "target",
    )
    header += ("95% interval",) if interval else ()
    rows, scores = [header], {}
    order = ["circuits", "behaviour", "compare", "present", "data", "model", "ground", "stages"]
    total = Counter()
    for group in sorted(counts, key=lambda g: order.index(g) if g in order else len(order)):
        c = counts[group]
        total.update(c)
        scores[group] = score(c)
        rows.append(_row(group, c, TARGETS.get(group, DEFAULT_TARGET), interval))
    if sizes is None:
        rows.append(_row("all", total, None, interval))
    else:
        whole = stratified_score(counts, sizes)
        pooled = _row("all", total, None, interval)
        rows.append(pooled[:7] + ("-" if whole is None else f"{100 * whole:.1f}%", "-", "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join(lines), scores


def sample(found: dict, n: int, seed: int | str) -> dict:
    """N mutants per subpackage (all of a smaller one), uniformly at random by the seed: the same
    code gives the same sample on every machine, whatever has run. A mutant's place in the draw is a
    hash of the seed and its name within its module (`x_spectral_blocks__mutmut_3`), not of its
    module: a function moved to another module of its subpackage keeps its mutants in the sample, so
    a sample drawn before a split of modules and after it tests the same mutants."""
    by_group: dict[str, list[str]] = {}
    for name, (_, path) in found.items():
        by_group.setdefault(group_of(path), []).append(name)
    picked = set()
    for names in by_group.values():
        picked.update(sorted(names, key=lambda name: (draw(seed, name), name))[:n])
    return {name: found[name] for name in picked}


def draw(seed: int | str, name: str) -> str:
    """A mutant's rank in the seed's draw: the hash of the seed and the mutant's name less its
    module path (mutmut names a mutant `<module>.x_<function>__mutmut_<n>`; a method's name joins
    class and method with a character that is not a dot)."""
    return hashlib.sha256(f"{seed}:{name.rsplit('.', 1)[-1]}".encode()).hexdigest()


def to_run(found: dict) -> list[str]:
    """The mutants a sample's run tests: every one not caught yet. Never run, survived, no tests,
    or cut off by tests/conftest.py's wall-clock watchdog (SIGALRM: mutmut's "suspicious"): a
    survivor is run again against the tests of the day, so a test written to kill it shows."""
    return sorted(n for n, (status, _) in found.items() if status not in CAUGHT)


def wilson(caught: int, judged: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (scipy's): honest at a score near 100%,
    where the normal approximation's interval runs past it."""
    if judged == 0:
        return (0.0, 1.0)
    from scipy.stats import binomtest

    ci = binomtest(caught, judged).proportion_ci(confidence_level=level, method="wilson")
    return (float(ci.low), float(ci.high))


def stratified_score(counts: dict[str, Counter], sizes: dict[str, int]) -> float | None:
    """The whole code's score from a stratified sample: each subpackage's sample score weighed by
    its mutants in all, where pooling the samples would weigh every subpackage alike whatever its
    size. A subpackage with nothing judged yet is left out."""
    weighed = total = 0.0
    for group, c in counts.items():
        s = score(c)
        if s is not None:
            weighed += sizes[group] * s
            total += sizes[group]
    return weighed / total if total else None


def judged(c: Counter) -> int:
    return c["mutants"] - sum(c[s] for s in UNJUDGED)


def score(c: Counter) -> float | None:
    n = judged(c)
    return (c["killed"] + c["timeout"]) / n if n else None


def _row(group: str, c: Counter, target: float | None, interval: bool = False) -> tuple:
    s, n = score(c), judged(c)
    caught = c["killed"] + c["timeout"]
    low, high = wilson(caught, n)
    return (
        group,
        c["mutants"],
        n,
        c["killed"],
        c["timeout"],
        n - caught - c["no tests"],
        c["no tests"],
        "-" if s is None else f"{100 * s:.1f}%",
        "-" if target is None else f"{100 * target:.0f}%",
    ) + ((f"{100 * low:.1f}-{100 * high:.1f}%" if n else "-",) if interval else ())


# mutmut's first step alone (3.8.1's own functions, as `mutmut run` calls them before any test):
# copy the sources into mutants/ and write each file's mutants and .meta, so a sample can be drawn
# before anything runs. A function whose code changed loses its old results, as in `mutmut run`.
GENERATE = """
import os
from mutmut.__main__ import (copy_also_copy_files, copy_src_dir, create_mutants, set_mutant_under_test,
                             setup_source_paths, store_lines_covered_by_tests)
set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); store_lines_covered_by_tests()
create_mutants(os.cpu_count() or 2)
"""


def generate() -> int:
    import subprocess

    # its progress goes to stderr: stdout may be the sample's names (--names)
    return subprocess.run([sys.executable, "-c", GENERATE], cwd=ROOT, stdout=sys.stderr).returncode


def below_target(scores: dict[str, float | None]) -> list[str]:
    """The subpackages whose score is under their target (none for stages/, nothing judged: none)."""
    return [
        g
        for g, s in scores.items()
        if TARGETS.get(g, DEFAULT_TARGET) is not None and s is not None and s < TARGETS.get(g, DEFAULT_TARGET)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--survivors",
        nargs="*",
        metavar="WHERE",
        help="print every survivor (of these subpackages or dotted module prefixes) with its diff",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when a subpackage is below its target")
    ap.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="score only N mutants per subpackage, drawn uniformly by the seed, with a 95%% interval",
    )
    ap.add_argument("--seed", default="0", help="the sample's seed: any word or number (default 0)")
    ap.add_argument(
        "--names",
        action="store_true",
        help="print the sample's mutants not caught yet (never run, survived, or cut off), and stop",
    )
    ap.add_argument(
        "--generate", action="store_true", help="first write mutants/ as `mutmut run` does, testing nothing"
    )
    args = ap.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        print(f"mutation_score: --sample must be at least 1, got {args.sample}", file=sys.stderr)
        return 2
    if args.names and args.sample is None:
        print("mutation_score: --names lists a sample's mutants: give --sample N", file=sys.stderr)
        return 2
    if args.generate and generate() != 0:
        print("mutation_score: mutmut could not write mutants/ (its message is above)", file=sys.stderr)
        return 2
    if not (ROOT / "mutants").is_dir():
        print("mutation_score: no mutants/ here: run `make mutate-blind` first", file=sys.stderr)
        return 2
    every = results()
    found = every if args.sample is None else sample(every, args.sample, args.seed)
    if args.names:
        print("\n".join(to_run(found)))
        return 0
    sizes = None if args.sample is None else Counter(group_of(path) for _, path in every.values())
    text, scores = table(found, interval=args.sample is not None, sizes=sizes)
    if args.sample is not None:
        print(f"a sample of {args.sample} mutants per subpackage (seed {args.seed}) of {len(every)}")
    print(text)
    if args.survivors is not None:
        for name, (status, path) in sorted(found.items()):
            if status in CAUGHT or status in UNJUDGED:
                continue
            if args.survivors and not any(group_of(path) == w or name.startswith(w) for w in args.survivors):
                continue
            print(f"\n# {name}: {status}\n{diff_of(name, path)}")
    if args.check and (low := below_target(scores)):
        print(f"below target: {', '.join(low)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
