"""`python -m pipeline.params` in-process (`params.main`): its help, and the one-line refusal of an
override's value under a conf/ other than the repository's, which the Hydra plugin does not check
(hydra_plugins/ wraps the repository's conf/ only): `from_dict` then names the override."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline import params

ROOT = Path(__file__).resolve().parents[1]


def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        params.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width
    assert "--check only check that --out equals a fresh compose" in shown
    assert "--debug show tracebacks" in shown
    assert "--out OUT file to write (default: params.yaml)" in shown


def test_a_bad_value_under_another_conf_is_one_line_naming_the_override(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    out = tmp_path / "params.yaml"
    assert params.main(["model.n_heads=0", "--conf", str(conf), "--out", str(out)]) == 2
    assert capsys.readouterr().err == "error: override: model.n_heads = 0: must be > 0\n"
    assert not out.exists()
