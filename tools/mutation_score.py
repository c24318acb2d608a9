"""The blind mutation score (`make mutate-blind`), per subpackage, from mutmut's results.

mutmut (3.x, configured in pyproject.toml `[tool.mutmut]`) plants every operator, constant,
comparison, argument and string change it can in pipeline/ and stages/, and runs the tests that
reach each mutated function (its own test selection, from one traced run of the fast tier). It
keeps its results in mutants/ (`*.py.meta`), so a rerun tests only what changed. This script reads
those results and prints, per subpackage, how many mutants the tests killed.

A survivor that no test could ever kill (the mutant behaves exactly as the original: an equivalent
mutant) is listed in tests/mutation_equivalents/<module>.toml with the changed line and a one-line
reason, or matches one of the few RULES below (a kind of change that is equivalent wherever it
occurs, checked on the diff); the score counts only real survivors. An entry whose mutant does not
exist, or does not make that change (mutmut numbers mutants per function, so an edit renumbers them), is
stale: the script names it and exits 2, so the list cannot silently excuse a different mutant.

    python tools/mutation_score.py               # the table
    python tools/mutation_score.py --survivors   # every unexcused survivor, with its diff
    python tools/mutation_score.py --survivors pipeline.circuits.scoring   # of a subpackage or module
    python tools/mutation_score.py --check       # exit 1 below the targets (95% circuits/, 85% others)
    python tools/mutation_score.py --sample 200 --names   # the unchecked mutants of the sample, to run
    python tools/mutation_score.py --sample 200  # the score on that sample, with its 95% interval,
                                                 # and a full run's time estimated from its test times

A full run is 21,516 mutants: hours on 2 cores. `--sample N` draws N mutants per subpackage,
uniformly and by a fixed seed (the same names on every machine for the same code), and scores the
sample: an unbiased estimate of the whole subpackage's score, with its Wilson 95% interval
(a survivor the sample does not draw is not triaged; the full run finds it).

Score = (killed + timeout) / (mutants - equivalent - not yet checked): a mutant that made a test hang
is caught (mutmut counts it so); one with no test reaching it is a survivor.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents"
SOURCES = ("pipeline", "stages")
# the acceptance targets (stages/ is mutated and reported, without a target: its code
# runs inside DVC's subprocesses, which mutmut's per-function tracing cannot see)
TARGETS = {"circuits": 0.95, "stages": None}
DEFAULT_TARGET = 0.85
CAUGHT = {"killed", "timeout"}


def group_of(path: Path) -> str:
    """pipeline/circuits/x.py -> circuits; pipeline/x.py -> ground; stages/x.py -> stages."""
    parts = path.relative_to(ROOT / "mutants").parts
    if parts[0] == "stages":
        return "stages"
    return parts[1] if len(parts) > 2 else "ground"


@dataclass(frozen=True)
class Equivalent:
    mutant: str
    change: str  # the mutant's changed line, as it reads after the change
    reason: str


def load_equivalents(folder: Path = EQUIVALENTS) -> list[Equivalent]:
    out = []
    for path in sorted(folder.glob("*.toml")):
        for i, e in enumerate(tomllib.loads(path.read_text()).get("equivalent", [])):
            missing = {"mutant", "change", "reason"} - set(e)
            if missing or not e["reason"].strip() or "\n" in e["reason"].strip():
                raise SystemExit(f"{path.name}: entry {i + 1} needs mutant, change and a one-line reason")
            out.append(Equivalent(e["mutant"], e["change"].strip(), e["reason"].strip()))
    return out


def _einsum_case(removed: str, added: str) -> bool:
    """Only an einsum's subscript string changed, and only in letter case: the same contraction."""
    if removed == added or removed.lower() != added.lower() or "einsum(" not in added:
        return False
    spec = re.compile(r"einsum\(\s*([\"'])([^\"']*)\1")
    a, b = spec.search(removed), spec.search(added)
    return (
        bool(a and b)
        and a.span(2) == b.span(2)
        and removed[: a.start(2)] + removed[a.end(2) :] == (added[: b.start(2)] + added[b.end(2) :])
    )


# Kinds of change equivalent wherever they occur, each with its one-line reason; a mutant matches when
# its diff changes exactly one line and the rule holds for that pair of lines.
RULES = {
    "einsum-case": (
        _einsum_case,
        "torch.einsum labels are letters of either case: upper-casing every label "
        "of one subscript string is the same contraction",
    ),
}


def rule_of(diff: str) -> str | None:
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(removed) != 1 or len(added) != 1:
        return None
    return next((name for name, (holds, _) in RULES.items() if holds(removed[0], added[0])), None)


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


def added_lines(diff: str) -> list[str]:
    return [
        line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]


def check_equivalents(found: dict, equivalents: list[Equivalent]) -> list[str]:
    """The stale entries, each as one line naming why."""
    stale = []
    for e in equivalents:
        if e.mutant not in found:
            stale.append(
                f"{e.mutant}: no such mutant (renamed or renumbered): find it again, update the entry"
            )
            continue
        status, path = found[e.mutant]
        if e.change not in added_lines(diff_of(e.mutant, path)):
            stale.append(f"{e.mutant}: does not change a line to {e.change!r}: mutmut renumbered it")
        elif status in CAUGHT:
            stale.append(f"{e.mutant}: listed as equivalent but a test now kills it: drop the entry")
    return stale


def table(
    found: dict, equivalent: set[str], interval: bool = False, sizes: dict[str, int] | None = None
) -> tuple[str, dict[str, float | None]]:
    """The score table. `sizes` (each subpackage's mutants in all) marks `found` as a stratified
    sample: the `all` row's score is then `stratified_score`, without an interval."""
    counts: dict[str, Counter] = {}
    for name, (status, path) in found.items():
        c = counts.setdefault(group_of(path), Counter())
        c["mutants"] += 1
        c["equivalent" if name in equivalent and status != "not checked" else status] += 1
    header = (
        "subpackage",
        "mutants",
        "checked",
        "killed",
        "timeout",
        "survived",
        "no tests",
        "equivalent",
        "score",
        "target",
    ) + (("95% interval",) if interval else ())
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
        rows.append(pooled[:8] + ("-" if whole is None else f"{100 * whole:.1f}%", "-", "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join(lines), scores


def sample(found: dict, n: int, seed: int = 36) -> dict:
    """N mutants per subpackage (all of a smaller one), uniformly at random by a fixed seed: the same
    code gives the same sample on every machine, whatever has run."""
    by_group: dict[str, list[str]] = {}
    for name, (_, path) in found.items():
        by_group.setdefault(group_of(path), []).append(name)
    picked = set()
    for group, names in by_group.items():
        picked.update(random.Random(f"{group}-{seed}").sample(sorted(names), min(n, len(names))))
    return {name: found[name] for name in picked}


def to_run(found: dict) -> list[str]:
    """The mutants a sample's run tests: those not run yet, and those whose run was cut off by
    tests/conftest.py's wall-clock watchdog (SIGALRM: mutmut's "suspicious"), run again."""
    return sorted(n for n, (status, _) in found.items() if status in ("not checked", "suspicious"))


def durations() -> dict[str, float]:
    """Every run mutant's test time in seconds (mutmut's `durations_by_key`: the wall time of the
    forked child that ran its tests), from mutants/**/*.py.meta."""
    out = {}
    for source in SOURCES:
        for meta in sorted((ROOT / "mutants" / source).rglob("*.py.meta")):
            out.update(json.loads(meta.read_text()).get("durations_by_key", {}))
    return out


def full_run_estimate(
    times: dict[str, list[float]], sizes: dict[str, int], z: float = 1.959964
) -> tuple[float, float, float]:
    """A full run's total test time from a stratified sample: per subpackage, its mutants times the
    mean time of its sampled ones, summed; and the 95% interval of that sum (the stratified
    estimator's variance, sum of N^2 s^2 / n (1 - n/N), with the finite-population correction).
    `times`: the sampled mutants' seconds per subpackage; `sizes`: each subpackage's mutants.
    Returns (estimate, low, high) in seconds, serial: divide by the workers for the wall time."""
    total = var = 0.0
    for group, ts in times.items():
        n, N = len(ts), sizes[group]
        mean = sum(ts) / n
        s2 = sum((t - mean) ** 2 for t in ts) / (n - 1) if n > 1 else 0.0
        total += N * mean
        var += N * N * s2 / n * (1 - n / N)
    half = z * var**0.5
    return total, max(total - half, 0.0), total + half


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
    the non-equivalent mutants it is estimated to hold (its size times its sample's judged share),
    where pooling the samples would weigh every subpackage alike whatever its size."""
    weighed = judged_total = 0.0
    for group, c in counts.items():
        s = score(c)
        if s is None:
            continue
        sampled = c["mutants"] - c["not checked"]
        judged = sizes[group] * (sampled - c["equivalent"]) / sampled
        weighed += judged * s
        judged_total += judged
    return weighed / judged_total if judged_total else None


def score(c: Counter) -> float | None:
    judged = c["mutants"] - c["equivalent"] - c["not checked"]
    return (c["killed"] + c["timeout"]) / judged if judged else None


def _row(group: str, c: Counter, target: float | None, interval: bool = False) -> tuple:
    s = score(c)
    checked = c["mutants"] - c["not checked"]
    judged = checked - c["equivalent"]
    low, high = wilson(c["killed"] + c["timeout"], judged)
    return (
        group,
        c["mutants"],
        checked,
        c["killed"],
        c["timeout"],
        c["survived"] + c["suspicious"] + c["segfault"],
        c["no tests"],
        c["equivalent"],
        "-" if s is None else f"{100 * s:.1f}%",
        "-" if target is None else f"{100 * target:.0f}%",
    ) + ((f"{100 * low:.1f}-{100 * high:.1f}%" if judged else "-",) if interval else ())


def by_rule(found: dict, listed: set[str]) -> dict[str, str]:
    """The uncaught, unlisted mutants a rule excuses -> the rule's name."""
    out = {}
    for name, (status, path) in found.items():
        if status in CAUGHT or status == "not checked" or name in listed:
            continue
        rule = rule_of(diff_of(name, path))
        if rule:
            out[name] = rule
    return out


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


def estimate_line(every: dict, found: dict, seconds: dict[str, float], workers: int) -> str:
    """What a full run would take, estimated from the sample's run mutants (or why not)."""
    sizes = Counter(group_of(path) for _, path in every.values())
    times: dict[str, list[float]] = {}
    for name, (_, path) in found.items():
        if name in seconds:
            times.setdefault(group_of(path), []).append(seconds[name])
    if set(times) != set(sizes) or any(len(ts) < 2 for ts in times.values()):
        return "a full run's time: not estimated until the sample has run in every subpackage"
    total, low, high = full_run_estimate(times, sizes)
    hours = [t / 3600 / workers for t in (total, low, high)]
    return (
        f"a full run ({len(every)} mutants), estimated from the sample's test times: "
        f"{hours[0]:.1f} h on {workers} workers (95% interval {hours[1]:.1f}-{hours[2]:.1f} h)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--survivors",
        nargs="*",
        metavar="WHERE",
        help="print every unexcused survivor (of these subpackages or dotted module prefixes) with its diff",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when a subpackage is below its target")
    ap.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="score only N mutants per subpackage, drawn uniformly by a fixed seed, with a 95%% interval",
    )
    ap.add_argument("--seed", type=int, default=36, help="the sample's seed (default 36)")
    ap.add_argument(
        "--workers", type=int, default=2, help="mutmut's --max-children, for a full run's estimated time"
    )
    ap.add_argument(
        "--names",
        action="store_true",
        help="print the sample's mutants not run yet (or cut off by the watchdog), and stop",
    )
    ap.add_argument(
        "--generate", action="store_true", help="first write mutants/ as `mutmut run` does, testing nothing"
    )
    args = ap.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        print(f"mutation_score: --sample must be at least 1, got {args.sample}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"mutation_score: --workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    if args.names and args.sample is None:
        print("mutation_score: --names lists a sample's mutants: give --sample N", file=sys.stderr)
        return 2
    if args.generate and generate() != 0:
        print("mutation_score: mutmut could not write mutants/ (its message is above)", file=sys.stderr)
        return 2
    if not (ROOT / "mutants").is_dir():
        print("mutation_score: no mutants/ here: run `make mutate-blind` (mutmut run) first", file=sys.stderr)
        return 2
    every = results()
    found = every if args.sample is None else sample(every, args.sample, args.seed)
    if args.names:
        print("\n".join(to_run(found)))
        return 0
    equivalents = load_equivalents()
    listed = {e.mutant for e in equivalents}
    stale = check_equivalents(every, equivalents)
    ruled = by_rule(found, listed)
    sizes = None if args.sample is None else Counter(group_of(path) for _, path in every.values())
    text, scores = table(found, listed | set(ruled), interval=args.sample is not None, sizes=sizes)
    if args.sample is not None:
        print(f"a sample of {args.sample} mutants per subpackage (seed {args.seed}) of {len(every)}")
    print(text)
    if args.sample is not None:
        print(estimate_line(every, found, durations(), args.workers))
    print(
        f"equivalent: {len(listed)} listed in {EQUIVALENTS.relative_to(ROOT)}/, "
        + ", ".join(f"{sum(r == name for r in ruled.values())} by rule {name}" for name in RULES)
    )
    if args.survivors is not None:
        for name, (status, path) in sorted(found.items()):
            if status in CAUGHT or status == "not checked" or name in listed or name in ruled:
                continue
            if args.survivors and not any(group_of(path) == w or name.startswith(w) for w in args.survivors):
                continue
            print(f"\n# {name}: {status}\n{diff_of(name, path)}")
    if stale:
        print(f"\n{len(stale)} stale equivalent entr{'y' if len(stale) == 1 else 'ies'}:", file=sys.stderr)
        for line in stale:
            print("  " + line, file=sys.stderr)
        return 2
    if args.check:
        low = [
            g
            for g, s in scores.items()
            if TARGETS.get(g, DEFAULT_TARGET) is not None
            and s is not None
            and s < TARGETS.get(g, DEFAULT_TARGET)
        ]
        if low:
            print(f"below target: {', '.join(low)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
