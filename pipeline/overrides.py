"""What each experiment changed, as the overrides that turn its baseline into it:

    python -m pipeline.overrides          # the workspace, each baseline and its experiments
    python -m pipeline.overrides -A       # every commit's experiments, as `dvc exp show -A`

`dvc exp show --only-changed` gives every changed param a column of its own, and a setup
changes a dozen keys at once: one table of a few experiments ran to hundreds of columns. Here
each experiment is one row, its changes one wrapped cell, within 160 columns (or the terminal's
width, where it is narrower). A changed setup reads as `setup=NAME` followed by the keys that
differ from what composing conf/ with that setup gives, as `dvc exp run -S` would have been
told; every other change as `key=value` against the experiment's baseline commit. The numbers
each experiment reached are `dvc exp show`'s and `dvc metrics diff`'s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import UserError

WIDTH = 160  # the widest table printed: a terminal narrower than this gets its own width
HEADER = ("Experiment", "setup", "changed against its baseline")


def flat(params: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values (a list is a value: `seeds`, `train.betas`)."""
    if not isinstance(params, dict):
        return {prefix: params}
    out: dict[str, Any] = {}
    for key, value in params.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def shown(value: Any) -> str:
    """A value as a Hydra override writes it: null, true, [0,1], 0.001."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value)


def diff(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """`key=value` for every key of `new` whose value is not `old`'s (`setup` first); `~key` for a
    key gone."""
    changed = [f"{k}={shown(v)}" for k, v in new.items() if k not in old or old[k] != v]
    changed.sort(key=lambda c: not c.startswith("setup="))
    return changed + [f"~{k}" for k in old if k not in new]


def quoted(value: Any) -> str:
    """A value as a Hydra override must spell it for compose: strings quoted."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list | tuple):
        return "[" + ",".join(quoted(v) for v in value) + "]"
    return shown(value)


def composed(setup: str, keys: dict[str, Any]) -> dict[str, Any] | None:
    """conf/ composed with `setup=NAME` and `keys` as overrides, flat; None where that does not
    compose (or validate) here."""
    from .params import compose

    try:
        return flat(compose([f"setup={setup}", *(f"{k}={quoted(v)}" for k, v in keys.items())]))
    except UserError:
        return None


def setup_overrides(new: dict[str, Any], old: dict[str, Any], compose=composed) -> list[str] | None:
    """The fewest `key=value` overrides that, beside `setup=NAME`, compose conf/ into `new`: the
    keys where `new` differs from `old` and from what the setup sets, each dropped in turn where
    the composition gives `new` without it; None where no set of them does (conf/ has changed
    since the experiment ran)."""
    setup = str(new.get("setup"))
    target = {k: v for k, v in new.items() if k != "setup"}
    keys = {k: v for k, v in target.items() if k not in old or old[k] != v}
    for _ in range(3):  # the keys the setup sets otherwise than the experiment has them
        got = compose(setup, keys)
        if got is None:
            return None
        missing = {k: v for k, v in target.items() if k not in got or got[k] != v}
        if not missing:
            break
        keys |= missing
    else:
        return None
    for key in list(keys):
        fewer = {k: v for k, v in keys.items() if k != key}
        got = compose(setup, fewer)
        if got is not None and all(got.get(k, _GONE) == v for k, v in target.items()):
            keys = fewer
    return [f"setup={shown(setup)}", *(f"{k}={shown(v)}" for k, v in keys.items())]


_GONE = object()


def changes(params: dict, baseline: dict, compose=composed) -> list[str]:
    """The overrides that turn `baseline` into `params` (both as in params.yaml): `key=value`
    against the baseline; under another setup, `setup=NAME` and the keys that differ from it."""
    new, old = flat(params), flat(baseline)
    if new.get("setup") != old.get("setup"):
        found = setup_overrides(new, old, compose)
        if found is not None:
            return found
    return diff(new, old)


def _params(entry: dict) -> dict | None:
    data = (entry.get("data") or {}).get("params") or {}
    return (data.get("params.yaml") or {}).get("data")


def rows(shown_json: list[dict], compose=composed) -> Iterator[tuple[str, str, list[str]]]:
    """(experiment, setup, changes) for `dvc exp show --json`'s rows: the workspace against the
    baseline after it (HEAD), each baseline itself, then its experiments against it."""
    for i, entry in enumerate(shown_json):
        params = _params(entry)
        name = entry.get("name") or str(entry.get("rev", ""))[:7]
        if entry.get("rev") == "workspace":
            base = _params(shown_json[i + 1]) if i + 1 < len(shown_json) else None
            if params is not None:
                yield "workspace", str(params.get("setup")), changes(params, base, compose) if base else []
            continue
        if params is None:
            yield name, "?", ["(no params.yaml at this commit)"]
            continue
        yield name, str(params.get("setup")), []
        for exp in entry.get("experiments") or []:
            for rev in exp.get("revs") or []:
                mine = _params(rev)
                label = "└── " + (rev.get("name") or exp.get("name") or str(rev.get("rev", ""))[:7])
                if mine is None:
                    yield label, "?", [f"(failed: {rev.get('error') or 'no params'})"]
                else:
                    yield label, str(mine.get("setup")), changes(mine, params, compose)


def table(found: Sequence[tuple[str, str, list[str]]], width: int = WIDTH) -> str:
    """The rows as fixed-width text, the changes wrapped at `; ` to stay within `width`."""
    first = max(len(HEADER[0]), *(len(r[0]) for r in found)) if found else len(HEADER[0])
    second = max(len(HEADER[1]), *(len(r[1]) for r in found)) if found else len(HEADER[1])
    left = first + 2 + second + 2
    room = max(width - left, 20)
    lines = [f"{HEADER[0]:<{first}}  {HEADER[1]:<{second}}  {HEADER[2]}".rstrip()]
    for name, setup, changed in found:
        text = "; ".join(changed) if changed else "-"
        wrapped = textwrap.wrap(text, room, break_on_hyphens=False) or ["-"]
        lines.append(f"{name:<{first}}  {setup:<{second}}  {wrapped[0]}".rstrip())
        lines += [" " * left + more for more in wrapped[1:]]
    return "\n".join(lines)


def exp_show_json(options: Sequence[str]) -> list[dict]:
    """`dvc exp show --json` with `options`, parsed; a UserError with DVC's message if it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json", *options], capture_output=True, text=True
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise UserError("dvc exp show", lines[-1] if lines else f"exited {proc.returncode}")
    return json.loads(proc.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import run_cli

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.overrides",
        description="Print what each DVC experiment changed: one row per experiment, with its "
        "setup and the overrides that turn its baseline commit into it, within 160 columns. "
        "Run it in the repository's root.",
    )
    parser.add_argument(
        "-A",
        "--all-commits",
        action="store_true",
        help="Show the experiments of every commit, not only HEAD's.",
    )
    parser.add_argument(
        "--rev", action="append", default=[], help="Show the experiments of this commit (repeatable)."
    )
    parser.add_argument(
        "-n", "--num", type=int, default=None, help="Show this many commits before each --rev."
    )
    parser.add_argument(
        "--width",
        type=int,
        default=None,
        help="Wrap at this many columns (default: 160, or a narrower terminal's).",
    )
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")

    def body(args: argparse.Namespace) -> int:
        options = ["-A"] if args.all_commits else []
        options += [arg for rev in args.rev for arg in ("--rev", rev)]
        options += ["-n", str(args.num)] if args.num is not None else []
        width = args.width or min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
        print(table(list(rows(exp_show_json(options))), width))
        return 0

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
