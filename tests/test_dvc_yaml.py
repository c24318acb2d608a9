"""dvc.yaml stays exact: each stage depends on the pipeline/ modules its script imports
(transitively) and on no others; its params keys exist, and are exactly what the stage
reads of params.yaml when its dvc.yaml command runs (recorded on the tiny config)."""

from __future__ import annotations

import ast
import shutil
from dataclasses import fields
from functools import cache
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
import yaml
from dvc_repo import TINY, TINY_TEXT
from matplotlib.figure import Figure

from pipeline import config, params

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
    """pipeline.present.figures.heads -> [pipeline, pipeline.present, pipeline.present.figures]:
    importing runs their __init__."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module an import names, a relative one (`from ..config import X` inside pipeline/,
    which is installed as attn_circuits) resolved against the package of `path`."""
    if node.level == 0:
        return node.module or ""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]  # pipeline/circuits/x.py -> pipeline.circuits
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@cache
def imported_by(path: Path) -> frozenset[str]:
    """Modules of pipeline/ that importing `path` imports, transitively (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, path)
            names = [module] + [f"{module}.{a.name}" for a in node.names]
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
    expected = {str(module_file(m).relative_to(ROOT)) for m in imported_by(script)} | {
        str(script.relative_to(ROOT))
    }
    listed = {d for d in stage["deps"] if d.endswith(".py")}
    assert listed == expected, (
        f"{name}: missing {sorted(expected - listed)}, extra {sorted(listed - expected)}"
    )


@pytest.mark.parametrize("name", sorted(DVC["stages"]))
def test_stage_params_exist(name):
    for key in DVC["stages"][name].get("params", []):
        node = PARAMS
        for part in str(key).split("."):
            assert isinstance(node, dict) and part in node, f"{name}: params key {key} not in params.yaml"
            node = node[part]


def test_long_stages_report_progress_under_dvc():
    """DVC runs stages without a terminal: train and dynamics then print a plain line per
    evaluation or checkpoint (pipeline.cli.progress_mode), unless dvc.yaml silences them."""
    for name in ("train", "dynamics"):
        assert "--no-progress" not in DVC["stages"][name]["cmd"], name


# per-seed stages whose result depends on the other seeds by design: calibrate's chimeras join
# this seed's layer 0 with every other seed's later layers
CROSS_SEED = {"calibrate"}


def test_per_seed_stages_do_not_depend_on_the_seed_list():
    """Growing `seeds` must run only the new seeds' stages, but for those that read the others."""
    for name, stage in DVC["stages"].items():
        if "matrix" in stage:
            assert ("seeds" in stage.get("params", [])) == (name in CROSS_SEED), name


def expanded_stages(dvc: dict, seeds: list[int]) -> set[str]:
    """dvc.yaml's stage names as DVC expands them: a stage with a matrix over `seeds`, once a seed."""
    names = set()
    for name, stage in dvc["stages"].items():
        if "matrix" in stage:
            assert stage["matrix"] == {"seed": "${seeds}"}, f"{name}: a matrix over seeds alone"
            names |= {f"{name}@{seed}" for seed in seeds}
        else:
            names.add(name)
    return names


def test_dvc_lock_holds_exactly_the_stages_params_yaml_asks_for():
    """The committed dvc.lock records dvc.yaml's stages over params.yaml's seeds, no more: DVC
    keeps a stage's entry when its seed leaves `seeds`, so a lock regenerated from scratch
    (`rm dvc.lock && dvc repro`: the run cache restores what is unchanged) is what passes."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())
    locked = set(lock["stages"])
    expected = expanded_stages(DVC, PARAMS["seeds"])
    assert locked == expected, f"missing {sorted(expected - locked)}, extra {sorted(locked - expected)}"


def test_expanded_stages_of_a_matrix_and_a_plain_stage():
    dvc = {"stages": {"a": {"matrix": {"seed": "${seeds}"}, "cmd": "x"}, "b": {"cmd": "y"}}}
    assert expanded_stages(dvc, [0, 3]) == {"a@0", "a@3", "b"}


# --- what each stage reads of params.yaml, recorded while its real dvc.yaml command runs ----


def declared_params(stage: dict) -> set[str]:
    return {str(k) for k in stage.get("params", [])}


def command_argv(stage: dict, seed: int) -> tuple[str, list[str]]:
    """dvc.yaml's `python -m stages.<name> ARGS` for one seed: (module, ARGS)."""
    words = stage["cmd"].replace("${item.seed}", str(seed)).split()
    assert words[:2] == ["python", "-m"], stage["cmd"]
    return words[2], words[3:]


def under(key: str, prefixes: set[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> dict[str, set[str]]:
    """Run every stage's dvc.yaml command in order, in-process on the tiny config (seed 0) and
    on the tiny text config (a slice of the corpus through the tokenizer stage), a token
    file (data.source = tokens) and a loaded checkpoint (train.source = load), recording
    each config field a stage reads after `params.load` has validated the file (validation
    reads every key; what matters for DVC's cache is what the stage computes with). A stage
    reads the union over the configs: a key may be read by one source only."""
    found: dict[str, set[str]] = {}
    first = None
    for overrides in (TINY, TINY_TEXT, [*TINY, "data=tokens"], [*TINY, "train=load"]):
        # the stages after the model's own (calibrate, figures, compare, report) read the model's
        # outputs and no data or training setting: they run once, on the first config
        skip = SOURCE_FREE if first is not None else ()
        work = tmp_path_factory.mktemp("reads")
        (work / "data").mkdir()
        ids = np.random.default_rng(0).integers(0, 16, size=4000)  # TINY's d_vocab
        np.save(work / "data" / "tokens.npy", ids)
        if first is not None:  # train=load reads the first run's model as seed 0's checkpoint
            shutil.copytree(first / "outputs" / "train" / "seed0", work / "checkpoints" / "seed0")
        for name, keys in _record_reads(work, overrides, skip).items():
            found.setdefault(name, set()).update(keys)
        first = first or work
    return found


SOURCE_FREE = ("calibrate", "figures", "compare", "report")


def _record_reads(work: Path, overrides: list[str], skip: tuple[str, ...] = ()) -> dict[str, set[str]]:
    (work / "params.yaml").write_text(params.dump(params.compose(overrides, conf_dir=ROOT / "conf")))
    seen: set[str] = set()
    paths: dict[int, str] = {}  # id(section) -> its dotted key
    real_load, real_getattribute = params.load, config.Section.__getattribute__

    def index(section: config.Section, prefix: str) -> None:
        for f in fields(section):
            child = getattr(section, f.name)
            if isinstance(child, config.Section):
                index(child, f"{prefix}.{f.name}".lstrip("."))
        paths[id(section)] = prefix  # after reading its fields: indexing is not the stage reading

    loaded: list[config.Config] = []  # kept alive, so that no other object takes their ids

    def recording_load(*args, **kwargs):
        cfg = real_load(*args, **kwargs)
        loaded.append(cfg)
        index(cfg, "")
        return cfg

    def recording_getattribute(self, name):
        value = real_getattribute(self, name)
        prefix = paths.get(id(self))
        if (
            prefix is not None
            and name in type(self).__dataclass_fields__
            and not isinstance(value, config.Section)
        ):
            seen.add(f"{prefix}.{name}".lstrip("."))
        return value

    found: dict[str, set[str]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setattr(params, "load", recording_load)
        mp.setattr(config.Section, "__getattribute__", recording_getattribute)
        # Rendering reads no config (pipeline/present/figures/ takes values, never a config), and it
        # is most of the figures and compare stages' time: each figure is laid out, its file written
        # empty (what the report stage embeds)
        mp.setattr(Figure, "savefig", lambda self, fname, **kwargs: Path(fname).write_bytes(b""))
        for name, stage in DVC["stages"].items():  # dvc.yaml lists them in dependency order
            if name in skip:
                continue
            module, argv = command_argv(stage, seed=0)
            seen.clear()
            assert import_module(module).main(argv) == 0, name
            found[name] = set(seen)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DVC["stages"]))
def test_stage_reads_no_param_it_does_not_declare(name, reads):
    """Else changing that key would leave the stage's cached outputs stale."""
    undeclared = {k for k in reads[name] if not under(k, declared_params(DVC["stages"][name]))}
    assert not undeclared, f"{name} reads {sorted(undeclared)} but dvc.yaml does not list them"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", sorted(set(DVC["stages"]) - {"report"})
)  # the report prints params.yaml whole
def test_stage_declares_no_param_it_does_not_read(name, reads):
    """Else changing that key would rerun the stage for nothing."""
    unread = {p for p in declared_params(DVC["stages"][name]) if not any(under(k, {p}) for k in reads[name])}
    assert not unread, f"{name} lists {sorted(unread)} in dvc.yaml but never reads them"
