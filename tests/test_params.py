"""Config flow (pipeline/params.py): conf/ (Hydra) -> params.yaml -> validated schema; the
inputs a config names, checked before params.yaml is written; `python -m pipeline.params`
in-process and as a process (its help, `--check`, its notes); and the one-line refusals of an
override, a params file or a missing input, naming the key, file and value."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
import yaml
from refusals import NO_VALUE, refused, refused_line

from pipeline import params
from pipeline.config import Config, TrainConfig
from pipeline.config import notes as schema_notes
from pipeline.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("model", "data", "train", "analysis")


def test_committed_params_equal_a_fresh_compose_of_conf():
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert committed == params.compose(conf_dir=ROOT / "conf")


@pytest.mark.parametrize(
    "group,option",
    [(g, p.stem) for g in GROUPS for p in sorted((ROOT / "conf" / g).glob("*.yaml"))],
)
def test_every_config_group_option_composes_and_validates(group, option):
    # the text sources need a model whose vocabulary is the tokenizer's
    partner = ["model=text"] if (group, option) in (("data", "kjv"), ("data", "text")) else []
    partner += ["data=synthetic"] if group == "model" and option != "text" else []
    composed = params.compose([f"{group}={option}", *partner], conf_dir=ROOT / "conf")
    cfg = params.from_dict(composed)
    # every value the option's file sets reaches the validated config (interpolations resolved)
    own = yaml.safe_load((ROOT / "conf" / group / f"{option}.yaml").read_text())
    checked = 0
    for path, want in _leaves(own):
        if isinstance(want, str) and want.startswith("${"):
            want = _lookup(composed, want[2:-1].split("."))
        got = _lookup(getattr(cfg, group), path)
        assert (list(got) if isinstance(got, tuple) else got) == want, (group, option, path)
        checked += 1
    assert checked >= 1


def _leaves(tree: dict, prefix: tuple[str, ...] = ()):
    """(key path, value) of every leaf of a conf/ file, its defaults list left out."""
    for key, value in tree.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _lookup(node, path):
    for key in path:
        node = node[key] if isinstance(node, dict) else getattr(node, key)
    return node


def test_overrides_reach_the_schema():
    cfg = params.from_dict(params.compose(["model.n_heads=4", "seeds=[0,1]"], conf_dir=ROOT / "conf"))
    assert cfg.model.n_heads == 4 and cfg.seeds == [0, 1]


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.n_head=4", "model.n_head"),  # typo: unknown key
        ("model.n_heads=four", "model.n_heads"),  # wrong type
        ("train.lr=fast", "train.lr"),
        ("model.d_model=0", "model.d_model"),  # zero size
        ("model.n_layers=1", "model.n_layers"),  # no pair of layers to compose
        ("model.d_head=-8", "model.d_head"),  # negative size
        ("model.d_head=64", "model.d_head"),  # n_heads x d_head > d_model
        ("model.positional_embedding_type=alibi", "model.positional_embedding_type"),
        ("data.source=web", "data.source"),
        ("seeds=[]", "seeds"),
        ("seeds=[1,1]", "seeds"),
        ("model.n_ctx=16", "analysis.heads.repeat_length"),  # evaluation longer than the context
        ("train.source=load", "train.checkpoint"),  # load needs a checkpoint
        ("analysis.threads=0", "analysis.threads"),
        ("analysis.device=gpu", "analysis.device"),
    ],
)
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(UserError) as caught:
        params.from_dict(params.compose([override], conf_dir=ROOT / "conf"))
    assert key in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("override", ["model=4", "setup=null", "model=[1,2]", "model={a:1}"])
def test_a_group_set_to_anything_but_an_options_name_is_one_line_naming_the_group(override):
    """Hydra's own refusal names no key (`model=4`: a ValueError) or ends in a TypeError."""
    group = override.split("=")[0]
    with pytest.raises(UserError) as caught:
        params.compose([override], conf_dir=ROOT / "conf")
    message = refused(caught, f"override: {group}", caught.value.value)
    assert all(f" {p.stem}" in message for p in (ROOT / "conf" / group).glob("*.yaml"))  # its options


def test_a_setup_whose_defaults_name_no_group_is_blamed_not_an_override(tmp_path):
    """A group misspelt in a setup file's defaults list names the file and its entry, not an
    override the user never gave."""
    import shutil

    conf = shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (conf / "setup" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /modle: small\nsetup: mine\n"
    )
    with pytest.raises(UserError) as caught:
        params.compose(["setup=mine"], conf_dir=conf)
    assert "'modle'" in refused(caught, "conf/setup/mine.yaml: defaults: override /modle")


def test_a_loaded_model_is_not_held_to_the_unused_model_section():
    """train.source=load takes its shape from the checkpoint: model.n_ctx does not limit the
    evaluation lengths (the train and heads stages check them against the loaded model)."""
    cfg = params.from_dict(
        params.compose(
            ["train.source=load", "train.checkpoint=tl.safetensors", "model.n_ctx=16"], conf_dir=ROOT / "conf"
        )
    )
    assert cfg.model.n_ctx == 16 and 2 * cfg.analysis.heads.repeat_length + 1 > 16


def test_bad_params_file_names_file_and_key(tmp_path):
    bad = yaml.safe_load((ROOT / "params.yaml").read_text())
    bad["model"]["n_head"] = 4
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(UserError) as caught:
        params.load(path)
    refused(caught, f"{path}: model.n_head")


def test_missing_and_malformed_params_files(tmp_path):
    with pytest.raises(UserError) as caught:
        params.load(tmp_path / "absent.yaml")
    refused(caught, tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    with pytest.raises(UserError) as caught:
        params.load(tmp_path / "broken.yaml")
    refused(caught, tmp_path / "broken.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(UserError) as caught:
        params.load(tmp_path / "list.yaml")
    refused(caught, tmp_path / "list.yaml", "list")  # named by its type


def run_params_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.params", *args], cwd=cwd, capture_output=True, text=True
    )


def test_cli_writes_params_with_overrides(tmp_path):
    out = tmp_path / "params.yaml"
    done = run_params_cli("model.n_heads=4", "seeds=[0,1]", "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load(out.read_text())
    assert written["model"]["n_heads"] == 4 and written["seeds"] == [0, 1]
    assert run_params_cli("--check", "--out", str(out)).returncode != 0  # differs from conf/
    assert run_params_cli("--check").returncode == 0  # the committed file matches


def test_cli_error_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "params.yaml"
    out.write_text("untouched\n")
    done = run_params_cli("model.n_head=4", "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "model.n_head" in done.stderr and "Traceback" not in done.stderr
    assert out.read_text() == "untouched\n"
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


def test_the_paper_setup_is_the_papers_shape_on_natural_code_for_one_gpu():
    """setup=paper: 2 x 12 heads x 64, d_model 768, n_ctx 256, torch's Python sources with no
    copies, bf16 on CUDA with a batch of 128, 151M tokens; the analysis on the GPU where present.
    On a machine without CUDA the train stage's setup stops naming train.device."""
    from pipeline.model import train

    cfg = params.from_dict(params.compose(["setup=paper"], conf_dir=ROOT / "conf"))
    m, t = cfg.model, cfg.train
    assert (m.n_layers, m.n_heads, m.d_head, m.d_model, m.n_ctx) == (2, 12, 64, 768, 256)
    assert cfg.data.text.corpus == "torch-py" and cfg.data.copies.rate == 0
    assert (t.device, t.precision, t.batch_size) == ("cuda", "bf16", 128)
    assert t.steps * t.batch_size * m.n_ctx == 150_732_800
    assert cfg.analysis.device == "auto"
    assert train.training_estimate(cfg).bytes < 20 * 2**30  # fits a 24 GB GPU, let alone an H200
    if not torch.cuda.is_available():
        with pytest.raises(UserError) as caught:
            train._setup(t)
        refused(caught, "train.device", "cuda")


@pytest.mark.parametrize(
    "overrides,names",
    [  # the key and value the refusal names, and what else it names
        (["data.text.corpus=gutenberg"], ("data.text.corpus = 'gutenberg'", "kjv", "torch-py")),
        (["data=text", "data.dir=nowhere"], ("data.dir = 'nowhere'",)),
        (["data=text", "data.text.glob=*.nothing"], ("data.text.glob = '*.nothing'",)),
        (["data=tokens"], ("data.tokens.path = 'tokens.npy'", "data.dir = 'data'")),
        (["train=load", "seeds=[0]"], ("train.checkpoint = ", "checkpoints/seed0/model.safetensors")),
    ],
)
def test_cli_refuses_inputs_a_stage_would_refuse_before_writing(tmp_path, overrides, names):
    """A corpus, a path or a checkpoint that a stage would refuse: one line, nothing written."""
    out = tmp_path / "params.yaml"
    done = run_params_cli(*overrides, "--out", str(out))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert all(name in done.stderr for name in names) and "Traceback" not in done.stderr
    assert not out.exists()


def test_inputs_checks_each_seeds_checkpoint_and_its_config(tmp_path):
    cfg = params.from_dict(params.compose(["train=load", "seeds=[0,1]"], conf_dir=ROOT / "conf"))
    for seed in (0, 1):
        (tmp_path / "checkpoints" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"seed{seed}" / "model.safetensors").write_bytes(b"x")
    (tmp_path / "checkpoints" / "seed0" / "config.json").write_text("{}")
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert "checkpoints/seed1/config.json" in refused(caught, "train.checkpoint", cfg.train.checkpoint)
    (tmp_path / "checkpoints" / "seed1" / "config.json").write_text("{}")
    params.require_inputs(cfg, tmp_path)


def test_the_default_setup_anneals_its_copies_away_before_the_last_quarter():
    """setup=kjv-anneal, the default: the KJV, copies at 0.07 falling to zero over 70-75%
    of 2,000 steps. Copies are at most 25% of the training tokens and none in the last quarter:
    measured on the copy process itself, step by step, as the train stage counts them."""
    import numpy as np

    from pipeline.data import datasets

    cfg = params.from_dict(params.compose(conf_dir=ROOT / "conf"))
    c, steps = cfg.data.copies, cfg.train.steps
    assert (cfg.setup, cfg.data.text.corpus, steps) == ("kjv-anneal", "kjv", 2000)
    windows = np.zeros((64, cfg.model.n_ctx), dtype=np.int64)
    rng = np.random.default_rng(0)
    copied = [datasets.with_copies(windows, c, rng, datasets.copy_rate(c, s, steps))[1] for s in range(steps)]
    share = np.array(copied) / windows.size
    assert 0.2 < share.mean() <= 0.25  # 24% (docs/training.md)
    assert share[steps - steps // 4 :].max() == 0.0 and share[: int(0.7 * steps)].mean() > 0.3


def float_keys(schema: type = Config, prefix: str = "") -> list[str]:
    """Every float setting of the schema, dotted (a list[float] by its first element)."""
    keys = []
    for f in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[f.name]
        child = f.default_factory() if callable(f.default_factory) else None
        if dataclasses.is_dataclass(child):
            keys += float_keys(type(child), f"{prefix}{f.name}.")
        elif hint == list[float]:
            keys.append(f"{prefix}{f.name}[0]")
        elif float in (hint, *typing.get_args(hint)):
            keys.append(f"{prefix}{f.name}")
    return keys


def test_float_keys_cover_the_ones_the_issue_names():
    keys = float_keys()
    named = {"train.weight_decay", "train.lr", "train.betas[0]", "model.init_range",
             "analysis.composition.fdr",
             "analysis.heads.thresholds.induction", "analysis.figures.edge_z"}  # fmt: skip
    assert named <= set(keys)
    assert len(keys) >= 20


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_every_float_setting_refuses_inf_and_nan_naming_its_own_key(value):
    """One rule for every float key of the schema (pipeline/config.py `_finite`): params.yaml
    with `.inf` or `.nan` there is refused in one line naming that key, not a later one, by that
    rule (the refusal of an infinite weight decay, whose own rule `>= 0` inf passes)."""
    with pytest.raises(UserError) as finite:
        TrainConfig(weight_decay=math.inf).validate()
    good = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key in float_keys():
        raw = copy.deepcopy(good)
        *parents, last = key.replace("[0]", "").split(".")
        node = functools.reduce(lambda d, k: d[k], parents, raw)
        if key.endswith("[0]"):
            node[last][0] = value
        else:
            node[last] = value
        with pytest.raises(UserError) as caught:
            params.from_dict(raw)
        refused(caught, f"params.yaml: {key}", value)
        assert caught.value.problem == finite.value.problem, key


@pytest.mark.parametrize(
    "override", ["train.weight_decay=inf", "train.grad_clip=nan", "train.betas=[0.9,inf]"]
)
def test_an_infinite_override_names_its_key(override):
    """`dvc exp run -S` and `python -m pipeline.params` overrides (Hydra parses inf and nan as floats)."""
    key = override.split("=")[0] + ("[1]" if "betas" in override else "")
    with pytest.raises(UserError) as caught:
        params.from_dict(params.compose([override], conf_dir=ROOT / "conf"), source="override")
    refused(caught, f"override: {key}", float(override.split("=")[1].strip("[]").split(",")[-1]))


NOTE = schema_notes(Config(train=TrainConfig(checkpoint="hf:org/tiny")))[0]  # as the schema words it


def test_a_checkpoint_named_while_training_from_scratch_is_a_note_where_the_config_is_composed(
    tmp_path, capsys
):
    """Not a refusal (docs/bad-inputs.md: an unused checkpoint may stay while train=load is toggled,
    and editing it reruns only the origin stages), but never silent: one line on stderr from
    `python -m pipeline.params` and from DVC's composition (hydra_plugins/), none with train=load."""
    out = tmp_path / "params.yaml"
    done = run_params_cli("train.checkpoint=hf:org/tiny", "--out", str(out))
    assert done.returncode == 0 and done.stderr.splitlines() == [NOTE], done.stderr
    assert yaml.safe_load(out.read_text())["train"]["checkpoint"] == "hf:org/tiny"
    from hydra import compose, initialize_config_dir

    capsys.readouterr()
    for overrides, notes in ((["train.checkpoint=hf:org/tiny"], [NOTE]),
                             (["train=load", "train.checkpoint=hf:org/tiny"], [])):  # fmt: skip
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            compose(config_name="config", overrides=overrides)  # as DVC composes: the plugin's checks
        assert capsys.readouterr().err.splitlines() == notes


def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        params.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width
    for option, metavar in (("--check", ""), ("--debug", ""), ("--out", " OUT"), ("--conf", " CONF")):
        assert f"{option}{metavar} " in shown, option
    assert "params.yaml" in shown and str(params.CONF_DIR) in shown  # each default said


def test_a_bad_value_under_another_conf_is_one_line_naming_the_override(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    out = tmp_path / "params.yaml"
    assert params.main(["model.n_heads=0", "--conf", str(conf), "--out", str(out)]) == 2
    refused_line(capsys.readouterr().err, "override: model.n_heads", 0)
    assert not out.exists()


def test_a_conf_dir_without_its_config_is_refused_naming_the_file(tmp_path):
    with pytest.raises(UserError) as caught:
        params.compose([], conf_dir=tmp_path)
    refused(caught, tmp_path / (params.CONFIG_NAME + ".yaml"))


def test_an_override_the_schema_refuses_names_the_override_once():
    with pytest.raises(UserError) as caught:
        params.compose(["model.n_heads=0"])
    refused(caught, "override: model.n_heads", 0)


def omegaconf_literal(value) -> str:
    """`value` in OmegaConf's interpolation grammar (for `${oc.create:...}`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {omegaconf_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(omegaconf_literal(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"'{value}'" if isinstance(value, str) else repr(value)


def test_interpolations_in_a_params_file_resolve_as_it_is_loaded(tmp_path):
    """A hand-edited params.yaml may use OmegaConf's interpolations: a key given as another's value,
    a section given whole by `oc.create`; it loads as the file they stand for."""
    committed = params.load(ROOT / "params.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"]["eval_batch_size"] = "${train.batch_size}"
    raw["data"] = "${oc.create:" + omegaconf_literal(raw["data"]) + "}"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = params.load(path)
    assert cfg.data == committed.data
    assert cfg.train.eval_batch_size == cfg.train.batch_size == committed.train.batch_size


def test_a_missing_checkpoint_or_its_config_is_refused_naming_train_checkpoint(tmp_path):
    cfg = params.from_dict(params.compose(["train=load", "seeds=[0,1]"], conf_dir=ROOT / "conf"))
    first = Path(cfg.train.checkpoint_dir) / cfg.train.checkpoint.replace("{seed}", "0")
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    message = refused(caught, "train.checkpoint", cfg.train.checkpoint)
    assert f" {first} " in message and f"train.checkpoint_dir = {cfg.train.checkpoint_dir!r}" in message
    (tmp_path / first).parent.mkdir(parents=True)
    (tmp_path / first).write_bytes(b"x")
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert f" {first.parent / 'config.json'} " in refused(caught, "train.checkpoint", cfg.train.checkpoint)


def test_the_usage_line_names_the_module_to_run(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["__main__.py"])  # what argparse would name it otherwise
    with pytest.raises(SystemExit):
        params.main(["--help"])
    assert capsys.readouterr().out.split()[1:4] == ["python", "-m", "pipeline.params"]


def test_local_text_whose_glob_matches_no_file_is_refused_naming_the_glob(tmp_path):
    """data.source = text without a corpus reads the files data.text.glob matches under data.dir:
    none (only a folder of that name) is refused; one file is enough."""
    from pipeline.config import Config, DataConfig, TextDataConfig

    cfg = Config(data=DataConfig(source="text", dir="mine", text=TextDataConfig(glob="*.txt")))
    (tmp_path / "mine" / "a folder.txt").mkdir(parents=True)
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert "data.dir = 'mine'" in refused(caught, "data.text.glob", "*.txt")
    (tmp_path / "mine" / "psalms.txt").write_text("Praise ye the LORD.")
    params.require_inputs(cfg, tmp_path)


def test_hydras_error_under_another_conf_is_one_line_without_its_search_path(tmp_path):
    """Under a conf/ the Hydra plugin does not wrap, Hydra's own error for an unknown option lists
    the options one a line, then its whole config search path: the refusal is the error's lines
    joined, up to that search path."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    options = " ".join(sorted(p.stem for p in (conf / "setup").glob("*.yaml")))
    with pytest.raises(UserError) as caught:
        params.compose(["setup=nope"], conf_dir=conf)
    message = refused(caught, "override")  # Hydra's words, its lines joined
    assert "'setup/nope'" in message and options in message and str(conf) not in message
    text = "Could not load 'x'\n\n\tin a file\nConfig search path:\n\tprovider=main, path=file:///conf"
    assert str(params.hydra_error(ValueError(text))) == "override: Could not load 'x' in a file"


def test_a_keys_schema_type_is_the_list_for_the_key_and_its_element_for_an_index():
    """An override of the wrong type names the type the schema asks for: `seeds` a list[int],
    `seeds[0]` (and `train.save_steps[1]`) an int."""
    assert params._schema_type("seeds") == "list[int]"
    assert params._schema_type("train.save_steps") == "list[int]"
    assert params._schema_type("seeds[0]") == "int"
    assert params._schema_type("train.save_steps[1]") == "int"


def test_check_passes_on_a_fresh_compose_and_refuses_an_edited_params_file(tmp_path, capsys):
    conf, out = str(ROOT / "conf"), tmp_path / "params.yaml"
    assert params.main(["--conf", conf, "--out", str(out)]) == 0
    assert params.main(["--check", "--conf", conf, "--out", str(out)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert str(out) in last and f"{conf}/" in last
    out.write_text(out.read_text().replace("lr: ", "lr: 1", 1))  # 0.001 -> 10.001: still valid
    assert params.main(["--check", "--conf", conf, "--out", str(out)]) == 2
    assert f"{conf}/" in refused_line(capsys.readouterr().err, out)


def test_a_missing_data_dir_or_token_file_is_refused_naming_the_key_and_value(tmp_path):
    from pipeline.config import Config, DataConfig, TokensDataConfig

    cfg = Config(data=DataConfig(source="tokens", dir="mine", tokens=TokensDataConfig(path="ids.npy")))
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert "data.source = 'tokens'" in refused(caught, "data.dir", "mine")  # the key that reads it
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert "data.dir = 'mine'" in refused(caught, "data.tokens.path", "ids.npy")


def committed_params() -> dict:
    """The committed params.yaml as a plain dict, for a test to spoil one key of."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_a_params_file_that_is_not_a_mapping_is_refused_naming_its_type():
    with pytest.raises(UserError) as caught:
        params.from_dict([1], source="mine.yaml")
    refused(caught, "mine.yaml", "list")


def test_an_empty_params_file_is_refused_saying_how_to_write_one():
    with pytest.raises(UserError) as caught:
        params.from_dict({}, source="mine.yaml")
    assert "python -m pipeline.params" in refused(caught, "mine.yaml")  # the command that writes one


@pytest.mark.parametrize(
    "key, value, shown, names",
    [  # the entry, the value it names (NO_VALUE: none) and the further names the line holds
        ("n_head", 2, NO_VALUE, ()),
        ("n_heads", "four", "four", ("int",)),  # the type the schema asks for
        ("n_heads", "${nope}", NO_VALUE, ("'nope'",)),  # the key the interpolation lacks
    ],
    ids=["unknown key", "wrong type", "unresolved interpolation"],
)
def test_a_bad_model_entry_in_a_params_file_is_refused_in_one_line_naming_it(key, value, shown, names):
    """An unknown key, a value of the wrong type (named as the schema asks), an interpolation that
    does not resolve (OmegaConf's first line)."""
    raw = committed_params()
    raw["model"][key] = value
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    message = refused(caught, f"mine.yaml: model.{key}", shown)
    assert all(name in message for name in names)


def test_a_list_element_of_the_wrong_type_is_refused_naming_its_index():
    raw = committed_params()
    raw["seeds"] = [0.5]
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    assert refused(caught, "mine.yaml: seeds[0]", 0.5).endswith(" int")  # the type the schema asks for


def test_a_params_file_missing_a_key_is_refused_naming_the_full_key():
    raw = committed_params()
    del raw["train"]["lr"]
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    assert "'???'" not in refused(caught, "mine.yaml: train.lr")


@pytest.mark.parametrize("where", [("train", "lr"), ("model",)], ids=["a value", "a whole group"])
def test_a_params_file_with_omegaconfs_missing_marker_is_refused_not_given_the_schemas_default(where):
    """`???` in a hand-edited params.yaml: OmegaConf's merge would keep the schema's default under
    it (model.n_heads 8 where conf/ says otherwise), so it is refused as a missing key is."""
    raw = committed_params()
    node = raw
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = "???"
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    assert "'???'" in refused(caught, f"mine.yaml: {'.'.join(where)}")  # the marker, named


def test_a_params_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(UserError) as caught:
        params.load(path)
    refused(caught, path)


def test_a_params_file_that_is_not_yaml_is_refused_with_the_parsers_first_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("model: [oops\n")
    with pytest.raises(UserError) as caught:
        params.load(path)
    with pytest.raises(yaml.YAMLError) as parsed:
        yaml.safe_load(path.read_text())
    assert f"({str(parsed.value).splitlines()[0]})" in refused(caught, path)  # the parser's first line


def test_hydras_could_not_override_becomes_an_unknown_key_naming_the_override():
    text = "Could not override 'model.n_head'.\nTo append to your config use +model.n_head=4\nKey 'n_head'"
    refused(params.hydra_error(ValueError(text)), "override: model.n_head")


def test_load_without_a_path_reads_params_yaml_in_the_working_directory(tmp_path, monkeypatch):
    """The default path is `params.yaml`, relative: none in the working directory is refused
    naming it; the committed one copied there loads as the committed file itself."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        params.load()
    refused(caught, "params.yaml")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    assert params.load() == params.load(ROOT / "params.yaml")
