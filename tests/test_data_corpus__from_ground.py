"""A named corpus's pinned package (pipeline/data/corpus.py `require_package`): refused in one line
naming data.text.corpus and the corpus, with the pin and the version installed; torch's corpus
offers another corpus."""

from __future__ import annotations

import importlib.metadata
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline import params
from pipeline.config import CORPUS_NAMES
from pipeline.data import corpus
from pipeline.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def refused(caught: pytest.ExceptionInfo, name: str, *named: str) -> str:
    message = str(caught.value)
    assert "\n" not in message and caught.value.where == "data.text.corpus" and caught.value.value == name
    for word in named:
        assert word in message
    return message


def pin(monkeypatch, name: str, package: str, version: str) -> None:
    monkeypatch.setitem(corpus.CORPORA, name, replace(corpus.CORPORA[name], package=package, version=version))


def test_the_corpora_are_the_schemas_names():
    assert set(corpus.CORPORA) == set(CORPUS_NAMES)


def test_a_wrong_corpus_package_version_names_the_installed_one(monkeypatch):
    installed = importlib.metadata.version("torch")
    pin(monkeypatch, "torch-py", "torch", "0.0.1")
    with pytest.raises(UserError) as caught:
        corpus.require_package("torch-py")
    message = refused(caught, "torch-py", "torch==0.0.1", installed)
    assert "setup=kjv" in message  # another corpus, for torch's


def test_a_missing_corpus_package_is_refused_naming_the_pin(monkeypatch):
    pin(monkeypatch, "kjv", "attn-circuits-no-such-package", "1.0")
    with pytest.raises(UserError) as caught:
        corpus.require_package("kjv")
    refused(caught, "kjv", "attn-circuits-no-such-package==1.0")


def test_a_wrong_version_of_a_package_other_than_torch_offers_no_other_corpus(monkeypatch):
    installed = importlib.metadata.version("pytest")
    pin(monkeypatch, "kjv", "pytest", "0.0.1")
    with pytest.raises(UserError) as caught:
        corpus.require_package("kjv")
    message = refused(caught, "kjv", "pytest==0.0.1", installed)
    assert "setup=" not in message


def test_the_code_setups_corpus_is_the_installed_torch(monkeypatch):
    """The code setup's corpus is the pinned torch wheel's sources: here (make's pinned wheel)
    accepted; beside another torch (pip install -e . keeps the user's), refused naming the way out."""
    cfg = params.from_dict(params.compose(["setup=code"], conf_dir=ROOT / "conf"))
    corpus.require_package(cfg.data.text.corpus)
    pin(monkeypatch, "torch-py", "torch", "2.11.0")
    with pytest.raises(UserError) as caught:
        corpus.require_package(cfg.data.text.corpus)
    assert "setup=kjv" in refused(caught, "torch-py", "torch==2.11.0")
