# Two commands on a fresh machine (README "Quick start"):
#   make repro   create .venv, install, run the whole pipeline (dvc repro)
#   make test    create .venv, install with the dev and interop extras, lint (ruff), run the tests
# torch is pinned to 2.13.0 (its CPU wheel is on these machines' disk); constraints.txt
# holds that pin while pip resolves the extras, so nothing pulls a CUDA build.

VENV   ?= .venv
PYTHON ?= python3
BIN    := $(abspath $(VENV))/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
export PATH := $(BIN):$(PATH)

.PHONY: repro test lint install install-dev bench clean-outputs

repro: $(VENV)/.installed
	dvc repro

test: lint
	python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	ruff check .
	ruff format --check .

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[dev,interop]'
	@touch $@ $(VENV)/.installed

bench: $(VENV)/.installed-dev
	python benchmarks/composition.py
	python benchmarks/training.py

clean-outputs:
	rm -rf outputs
