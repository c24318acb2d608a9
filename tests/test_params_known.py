"""`python -m pipeline.params` in-process (`params.main`): its help, and the one-line refusal of an
override's value under a conf/ other than the repository's, which the Hydra plugin does not check
(hydra_plugins/ wraps the repository's conf/ only): `from_dict` then names the override."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline import params
from pipeline.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        params.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width
    for option, metavar in (("--check", ""), ("--debug", ""), ("--out", " OUT"), ("--conf", " CONF")):
        assert f"{option}{metavar} " in shown, option
    assert "(default: params.yaml)" in shown and "(default: conf)" in shown  # each default said


def test_a_bad_value_under_another_conf_is_one_line_naming_the_override(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    out = tmp_path / "params.yaml"
    assert params.main(["model.n_heads=0", "--conf", str(conf), "--out", str(out)]) == 2
    assert capsys.readouterr().err == "error: override: model.n_heads = 0: must be > 0\n"
    assert not out.exists()


def test_a_conf_dir_without_its_config_is_refused_naming_the_file(tmp_path):
    with pytest.raises(UserError) as caught:
        params.compose([], conf_dir=tmp_path)
    assert str(caught.value) == f"{tmp_path / (params.CONFIG_NAME + '.yaml')}: Hydra config not found"


def test_an_override_the_schema_refuses_names_the_override_once():
    with pytest.raises(UserError) as caught:
        params.compose(["model.n_heads=0"])
    assert str(caught.value) == "override: model.n_heads = 0: must be > 0"


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
    named = f"train.checkpoint = {cfg.train.checkpoint!r}: "
    first = Path(cfg.train.checkpoint_dir) / cfg.train.checkpoint.replace("{seed}", "0")
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert str(caught.value) == (
        f"{named}{first} not found (relative to train.checkpoint_dir = {cfg.train.checkpoint_dir!r})"
    )
    (tmp_path / first).parent.mkdir(parents=True)
    (tmp_path / first).write_bytes(b"x")
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert (
        str(caught.value)
        == f"{named}{first.parent / 'config.json'} not found (the checkpoint's config, beside it)"
    )


def test_the_usage_line_names_the_module_to_run(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["__main__.py"])  # what argparse would name it otherwise
    with pytest.raises(SystemExit):
        params.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m pipeline.params [-h]")


def test_local_text_whose_glob_matches_no_file_is_refused_naming_the_glob(tmp_path):
    """data.source = text without a corpus reads the files data.text.glob matches under data.dir:
    none (only a folder of that name) is refused; one file is enough."""
    from pipeline.config import Config, DataConfig, TextDataConfig

    cfg = Config(data=DataConfig(source="text", dir="mine", text=TextDataConfig(glob="*.txt")))
    (tmp_path / "mine" / "a folder.txt").mkdir(parents=True)
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert str(caught.value) == "data.text.glob = '*.txt': matches no files under data.dir = 'mine'"
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
    assert str(caught.value) == (
        f"override: In 'config': Could not find 'setup/nope' Available options in 'setup': {options}"
    )
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
    assert capsys.readouterr().out.splitlines()[-1] == f"{out} matches {conf}/"
    out.write_text(out.read_text().replace("lr: ", "lr: 1", 1))  # 0.001 -> 10.001: still valid
    assert params.main(["--check", "--conf", conf, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {out}: differs from a fresh compose of {conf}/: run python -m pipeline.params"
    )


def test_a_missing_data_dir_or_token_file_is_refused_naming_the_key_and_value(tmp_path):
    from pipeline.config import Config, DataConfig, TokensDataConfig

    cfg = Config(data=DataConfig(source="tokens", dir="mine", tokens=TokensDataConfig(path="ids.npy")))
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert str(caught.value) == "data.dir = 'mine': directory not found (data.source = 'tokens' reads it)"
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError) as caught:
        params.require_inputs(cfg, tmp_path)
    assert str(caught.value) == "data.tokens.path = 'ids.npy': file not found under data.dir = 'mine'"


def committed_params() -> dict:
    """The committed params.yaml as a plain dict, for a test to spoil one key of."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_a_params_file_that_is_not_a_mapping_is_refused_naming_its_type():
    with pytest.raises(UserError) as caught:
        params.from_dict([1], source="mine.yaml")
    assert str(caught.value) == "mine.yaml = 'list': must be a YAML mapping of config groups"


def test_an_empty_params_file_is_refused_saying_how_to_write_one():
    with pytest.raises(UserError) as caught:
        params.from_dict({}, source="mine.yaml")
    assert str(caught.value) == "mine.yaml: empty: python -m pipeline.params writes a full one from conf/"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("n_head", 2, "mine.yaml: model.n_head: unknown key"),
        ("n_heads", "four", "mine.yaml: model.n_heads = 'four': wrong type, expected int"),
        ("n_heads", "${nope}", "mine.yaml: model.n_heads: Interpolation key 'nope' not found"),
    ],
    ids=["unknown key", "wrong type", "unresolved interpolation"],
)
def test_a_bad_model_entry_in_a_params_file_is_refused_in_one_line_naming_it(key, value, message):
    """An unknown key, a value of the wrong type (named as the schema asks), an interpolation that
    does not resolve (OmegaConf's first line)."""
    raw = committed_params()
    raw["model"][key] = value
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    assert str(caught.value) == message


def test_a_params_file_missing_a_key_is_refused_naming_the_full_key():
    raw = committed_params()
    del raw["train"]["lr"]
    with pytest.raises(UserError) as caught:
        params.from_dict(raw, source="mine.yaml")
    assert str(caught.value) == (
        "mine.yaml: train.lr: missing (python -m pipeline.params writes a full one from conf/)"
    )


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
    assert str(caught.value) == (
        f"mine.yaml: {'.'.join(where)}: missing, the value is '???' "
        "(python -m pipeline.params writes a full one from conf/)"
    )


def test_a_params_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(UserError) as caught:
        params.load(path)
    assert str(caught.value) == f"{path}: params file not found"


def test_a_params_file_that_is_not_yaml_is_refused_with_the_parsers_first_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("model: [oops\n")
    with pytest.raises(UserError) as caught:
        params.load(path)
    assert str(caught.value) == f"{path}: not valid YAML (while parsing a flow sequence)"


def test_hydras_could_not_override_becomes_an_unknown_key_naming_the_override():
    text = "Could not override 'model.n_head'.\nTo append to your config use +model.n_head=4\nKey 'n_head'"
    assert str(params.hydra_error(ValueError(text))) == (
        "override: model.n_head: unknown key (check its spelling in conf/)"
    )


def test_load_without_a_path_reads_params_yaml_in_the_working_directory(tmp_path, monkeypatch):
    """The default path is `params.yaml`, relative: none in the working directory is refused
    naming it; the committed one copied there loads as the committed file itself."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        params.load()
    assert str(caught.value) == "params.yaml: params file not found"
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    assert params.load() == params.load(ROOT / "params.yaml")
