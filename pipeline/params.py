"""Read and write `params.yaml`, the composed config every stage reads.

`conf/` (Hydra) is the source of truth. `dvc exp run -S key=value` composes it into
`params.yaml`; `dvc repro` does not. To apply overrides without an experiment:

    python -m pipeline.params model.n_heads=4 'seeds=[0,1]'

which composes `conf/` with the overrides, validates the result and rewrites
`params.yaml` atomically (nothing is written if it does not validate).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .config import Config, Section, notes
from .errors import UserError, within

CONF_DIR = "conf"
CONFIG_NAME = "config"


def from_dict(raw: Any, source: str = "params.yaml") -> Config:
    """Validate a plain dict against the schema: keys, types, then values.

    Raises `UserError` naming `source` and the full key.
    """
    if not isinstance(raw, dict):
        raise UserError(source, "must be a YAML mapping of config groups", type(raw).__name__)
    if not raw:
        raise UserError(source, f"empty: {_FULL}")
    with within(source):
        _require_every_key(raw, Config)
        cfg = merged(Config, raw)
    assert isinstance(cfg, Config)
    return cfg


S = TypeVar("S", bound=Section)


def merged(section: type[S] | S, raw: Mapping[str, Any], prefix: str = "") -> S:
    """`section` (a schema of pipeline/config.py, or a section of one) with `raw` merged in through
    OmegaConf, as params.yaml is: an unknown key or a value of the wrong type is refused naming its
    key (under `prefix`: `analysis.composition`), then every value is checked (`validate`). The one
    way a config is read: params.yaml, overrides, and the API's keyword settings."""
    where = lambda key: f"{prefix}.{key}" if prefix and key else prefix or key  # noqa: E731
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section), raw))
    except ConfigKeyError as e:
        raise UserError(where(e.full_key), "unknown key") from None
    except ValidationError as e:  # UnsupportedValueType too: a value YAML cannot hold
        key = where(e.full_key)
        raise UserError(key, f"wrong type, expected {_schema_type(key)}", e.value) from None
    except OmegaConfBaseException as e:
        raise UserError(where(getattr(e, "full_key", "")) or "?", str(e).splitlines()[0]) from None
    assert isinstance(cfg, Section)
    cfg.validate(prefix)
    return cfg  # type: ignore[return-value]


_FULL = "python -m pipeline.params writes a full one from conf/"


def require_inputs(cfg: Config, root: str | Path = ".") -> None:
    """Refuse, in one line naming the key and the value, a config whose inputs a stage would
    refuse: data.dir where data.source reads it (local text, a token file), the files under it,
    and each seed's local checkpoint with its config.json for train.source = load; paths
    relative to `root`, the repository. A named corpus's package is the corpus code's to check
    (pipeline/data/corpus.py `require_package`: hydra_plugins/ calls it beside this one).

    Called where a config is composed (`python -m pipeline.params`, and `dvc exp run -S`
    through hydra_plugins/) before params.yaml is written: a failed experiment would otherwise
    leave params.yaml changed and stop in a stage. Not in `load`: a stage run by hand checks
    its own inputs, relative to where it runs. Snapshots in the Hugging Face cache (`hf:`) are
    the origin and tokenizer stages' to check (they need huggingface_hub)."""
    root = Path(root)
    d = cfg.data
    if d.source == "tokens" or (d.source == "text" and d.text.corpus is None):
        data_dir = root / d.dir
        if not data_dir.is_dir():
            raise UserError("data.dir", f"directory not found (data.source = {d.source!r} reads it)", d.dir)
        if d.source == "tokens" and not (data_dir / str(d.tokens.path)).is_file():
            raise UserError("data.tokens.path", f"file not found under data.dir = {d.dir!r}", d.tokens.path)
        if d.source == "text" and not any(p.is_file() for p in data_dir.glob(str(d.text.glob))):
            raise UserError("data.text.glob", f"matches no files under data.dir = {d.dir!r}", d.text.glob)
    t = cfg.train
    if t.source == "load" and t.checkpoint is not None and not t.checkpoint.startswith("hf:"):
        for seed in cfg.seeds:  # "{seed}" in it: each seed's own file
            shown = Path(t.checkpoint_dir) / t.checkpoint.replace("{seed}", str(seed))
            if (root / shown).is_dir():  # a saved model's directory (pipeline/model/origin.py)
                shown = shown / "model.safetensors"
            if not (root / shown).is_file():
                problem = f"{shown} not found (relative to train.checkpoint_dir = {t.checkpoint_dir!r})"
                raise UserError("train.checkpoint", problem, t.checkpoint)
            if not (root / shown.parent / "config.json").is_file():
                problem = f"{shown.parent / 'config.json'} not found (the checkpoint's config, beside it)"
                raise UserError("train.checkpoint", problem, t.checkpoint)


def _require_every_key(raw: dict, schema: Any, prefix: str = "") -> None:
    """Every key of the schema is in `raw`, with a value: params.yaml is a whole composition of
    conf/, and the schema's defaults are not conf/'s, so a missing key must not fall back to them.
    Nor must OmegaConf's mandatory-value marker `???`: a merge keeps the schema's value under it."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        if f.name not in raw:
            raise UserError(key, f"missing ({_FULL})")
        if raw[f.name] == MISSING:
            raise UserError(key, f"missing, the value is {MISSING!r} ({_FULL})")
        child = f.default_factory() if callable(f.default_factory) else None
        if dataclasses.is_dataclass(child) and isinstance(raw[f.name], dict):
            _require_every_key(raw[f.name], type(child), f"{key}.")


def _schema_type(full_key: str) -> str:
    """The annotated type of a key in the schema, as written there ('int', 'str | None'); for an
    element of a list (`seeds[0]`), the element type."""
    node: Any = Config
    annotation: Any = "a different type"
    for part in full_key.split("."):
        name, _, index = part.partition("[")
        hints = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if name not in hints:
            break
        annotation = hints[name].type
        node = hints[name].default_factory() if callable(hints[name].default_factory) else None
        if index and isinstance(annotation, str) and annotation.startswith("list["):
            annotation = annotation.removeprefix("list[").removesuffix("]")  # e.g. list[int] -> int
    return str(annotation)


def load(path: str | Path = "params.yaml") -> Config:
    """Load and validate `params.yaml`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "params file not found")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # YAML syntax errors come in many types
        raise UserError(str(path), f"not valid YAML ({str(e).splitlines()[0]})") from None
    return from_dict(raw, source=str(path))


# True while `compose` runs: hydra_plugins/ then checks the values alone, not the inputs
# (`require_inputs`), as `compose` composes configs that need not run here (tests, --check);
# `main` checks the inputs itself before it writes params.yaml.
composing = False


def compose(overrides: Sequence[str] = (), conf_dir: str | Path = CONF_DIR) -> dict:
    """Compose `conf/` with Hydra overrides into a plain dict (as `dvc exp run -S` does)."""
    global composing
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    conf_dir = Path(conf_dir).resolve()
    if not (conf_dir / f"{CONFIG_NAME}.yaml").is_file():
        raise UserError(str(conf_dir / f"{CONFIG_NAME}.yaml"), "Hydra config not found")
    check_group_overrides(overrides, conf_dir)
    composing = True
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except UserError:  # ours (hydra_plugins/), already one line
        raise
    except (HydraException, OmegaConfBaseException, ValueError, TypeError, KeyError) as e:
        # Hydra reports some composition failures as plain Python errors (a group set to a list
        # of numbers: TypeError) that would otherwise end in a traceback
        raise hydra_error(e) from None
    finally:
        composing = False
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out


def check_group_overrides(overrides: Sequence[str], conf_dir: str | Path) -> None:
    """Refuse, naming the group and its options, an override that sets a config group of
    `conf_dir` (`model`, `setup`, ...) to anything but an option's name (`model=4`, `setup=null`,
    `model={a: 1}`): Hydra's own refusal names no key ("Config group override must be a string or
    a list. Got int") or blames another ("Could not override 'model'"). Overrides Hydra cannot
    parse, sweeps and deletions are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    conf_dir = Path(conf_dir)
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return  # `compose` reports Hydra's own message in one line (`hydra_error`)
    for override in parsed:
        group = override.key_or_group
        if override.package or override.is_delete() or override.is_sweep_override():
            continue
        if not (conf_dir / group).is_dir():
            continue
        value = override.value()
        if not all(isinstance(v, str) for v in (value if isinstance(value, list) else [value])):
            options = ", ".join(sorted(p.stem for p in (conf_dir / group).glob("*.yaml")))
            problem = f"a config group takes the name of one of its options: {options}"
            raise UserError(f"override: {group}", problem, value)


def hydra_error(e: Exception) -> UserError:
    """Hydra's multi-line composition error (or a plain Python error it raised while composing)
    as a one-line `UserError` naming the key."""
    text = str(e)
    in_file = re.search(r"In '([^']+)': Could not override '([^']+)'", text)
    if in_file:  # a config file's defaults list names a group that does not exist: the file is at fault
        where, group = in_file.groups()
        problem = f"no config group {group!r} to override (check its spelling in conf/)"
        return UserError(f"conf/{where}.yaml: defaults: override /{group}", problem)
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        return UserError(f"override: {unknown.group(1)}", "unknown key (check its spelling in conf/)")
    if text.startswith("override: "):  # already ours (hydra_plugins/attn_circuits_params.py)
        where, _, problem = text.removeprefix("override: ").partition(": ")
        return UserError(f"override: {where}", problem)
    text = text.split("Config search path")[0]  # Hydra appends its whole search path
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return UserError("override", text or type(e).__name__)


def dump(params: dict) -> str:
    """`params.yaml` text: block style, keys in schema order."""
    return OmegaConf.to_yaml(OmegaConf.create(params))


def main(argv: Sequence[str] | None = None) -> int:
    from . import io
    from .cli import run_cli

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.params",
        description="Compose conf/ with Hydra overrides, validate, and write params.yaml "
        "(what `dvc exp run -S` does, without running an experiment).",
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, such as model.n_heads=4 'seeds=[0,1]'."
    )
    parser.add_argument("--conf", default=CONF_DIR, help="The Hydra config directory (default: conf).")
    parser.add_argument("--out", default="params.yaml", help="The file to write (default: params.yaml).")
    parser.add_argument(
        "--check", action="store_true", help="Only check that --out equals a fresh composition."
    )
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")

    def body(args: argparse.Namespace) -> int:
        params = compose(args.overrides, args.conf)
        cfg = from_dict(params, source="override")
        if args.check:
            if load(args.out) != cfg:
                raise UserError(
                    args.out, f"differs from a fresh compose of {args.conf}/: run python -m pipeline.params"
                )
            print(f"{args.out} matches {args.conf}/")
            return 0
        require_inputs(cfg, Path(args.conf).resolve().parent)  # what a stage would refuse, now
        for line in notes(cfg):  # names nothing reads (a checkpoint while training from scratch)
            print(line, file=sys.stderr)
        io.write_text(args.out, dump(params))
        print(f"wrote {args.out}")
        return 0

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
