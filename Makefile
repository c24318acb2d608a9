# Two commands on a fresh machine (README "Quick start"; in full: docs/testing.md):
#   make repro   create .venv, install, run the whole pipeline (dvc repro)
#   make test    create .venv, install with the dev and interop extras, lint (ruff), run every test
#                (the interop4 ones, TransformerLens 4.x, in .venv-tl4 with the dev and interop4 extras)
#                (installs Debian's chromium for the report test when it is missing and it can)
#   make test-fast   the maths, config and bad-input tier (no real training or dvc runs): the edit-test loop
#   make mutate-blind   the suite's mutation score: mutmut tests a seeded sample of the mutants it can
#                plant in pipeline/ and stages/; prints the sample's score per subpackage with its 95%
#                interval (outside make test: half an hour or more on 2 cores): docs/testing.md
# torch is pinned to 2.13.0 (its CPU wheel is on these machines' disk) in constraints.txt, not in
# pyproject.toml (which asks for a range, so `pip install -e .` keeps a notebook's own torch): every
# install below goes through `-c constraints.txt`, so make gets exactly that wheel, never a CUDA build.

VENV   ?= .venv
PYTHON ?= python3
BIN    := $(abspath $(VENV))/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
VENV_TL4 ?= .venv-tl4
TL4_BIN  := $(abspath $(VENV_TL4))/bin
PIP_TL4  := $(TL4_BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
export PATH := $(BIN):$(PATH)

.PHONY: repro test test-fast lint browser install install-dev bench mutate-blind clean-outputs results

repro: $(VENV)/.installed
	dvc repro

# On every core (pytest-xdist): a test module per worker at a time, so a module's fixtures are
# built once; the reproduced tiny projects are built once for all (tests/dvc_repo.py, reproduced).
# The longest modules go first, each builder of a shared fixture before its readers
# (tests/conftest.py, LONGEST_FIRST): --no-loadscope-reorder keeps that order.
# Bytecode is written (PYTHONDONTWRITEBYTECODE emptied, where a machine sets it): the ~100 stage
# processes the DVC tests start would otherwise each compile pipeline/ from source again.
# TransformerLens 4.x cannot share a venv with 3.9 (the interop extra): the interop4 tests run
# in their own venv, .venv-tl4, an overlay on .venv (below; it collects only the files that mark a
# test interop4, not the whole suite). The overlay installs TransformerLens 4.x and what it adds
# over .venv, where a venv of its own would install torch and the rest again (about 2 GB).
TEST_WORKERS ?= auto
# One torch (OpenMP) thread a process: a worker per core already fills the cores, and two workers'
# torch computing at once, two threads each, wait on each other's threads.
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
INTEROP4_FILES = $(shell grep -l 'mark\.interop4' tests/test_*.py)
test: lint browser $(VENV_TL4)/.installed
	ATTN_CIRCUITS_REQUIRE_BROWSER=1 PYTHONDONTWRITEBYTECODE= $(ONE_THREAD) python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not interop4" $(PYTEST_ARGS)
	ATTN_CIRCUITS_REQUIRE_TL4=1 PYTHONDONTWRITEBYTECODE= $(TL4_BIN)/python -m pytest -p no:xdist -q -m interop4 $(INTEROP4_FILES)

# The edit-test loop (docs/testing.md gives its time): the tests of the maths, the comparison across
# seeds, the config schemas, the errors, memory estimates, I/O and tables, on every core, that run no
# Hydra composition, real training, dvc or oracle: not the untrained paper-shape false-discovery
# rates (minutes), nor test_params and the bad-input catalogue (Hydra composes conf/ in each case):
# make test runs them.
FAST_TESTS := $(wildcard tests/test_circuits_*.py tests/test_compare_*.py) \
	$(patsubst %,tests/test_%.py,config errors memory io tables)
test-fast: $(VENV)/.installed-dev
	PYTHONDONTWRITEBYTECODE= $(ONE_THREAD) python -m pytest -q -n $(TEST_WORKERS) \
	  -m "not slow and not interop and not interop4" \
	  -k "not untrained_weights" $(FAST_TESTS) $(PYTEST_ARGS)

# The report test opens the page in headless Chromium (Debian's package `chromium`).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
		sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else \
		echo "make test: chromium is missing (the report test opens the page in it): install Debian's package chromium (sudo apt-get install chromium), or your system's chromium, then rerun" >&2; \
		exit 1; \
	fi

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

# .venv-tl4 is an overlay on .venv: a venv of .venv's own Python whose .pth file appends .venv's
# site-packages (and runs its .pth files) after its own, so pip finds torch, dvc, pytest and the rest
# installed and puts only what differs here: TransformerLens 4.3, which shadows .venv's 3.9 (its
# package and metadata come first on sys.path), and the project's editable install. pip uninstalls
# nothing outside the venv it installs into, so .venv keeps 3.9. --clear: a rebuild starts empty.
$(VENV_TL4)/.installed: pyproject.toml constraints.txt $(VENV)/.installed-dev
	$(BIN)/python -m venv --clear $(VENV_TL4)
	$(BIN)/python -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
		> "$$($(TL4_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/attn_circuits_venv.pth"
	$(PIP_TL4) -e '.[dev,interop4]'
	@touch $@

bench: $(VENV)/.installed-dev
	python benchmarks/composition.py
	python benchmarks/training.py

# Blind mutation testing: mutmut 3 (pyproject.toml [tool.mutmut]) writes every mutant it can plant in
# pipeline/ and stages/ into mutants/ (git-ignored); tools/mutation_score.py draws SAMPLE mutants per
# subpackage, uniformly by SEED (the same names on every machine for the same code), and mutmut runs
# each drawn mutant not yet caught against the fast tier's tests that call its function, one torch
# thread per worker (the workers already fill the cores). Then the sample's score per subpackage with
# its 95% interval; exit 1 below a target. SEED defaults to the commit, so that a commit that kills a
# sample's survivors is measured on a fresh sample; SEED=<an earlier seed> reruns that sample.
MUTATE_WORKERS ?= 2
SAMPLE ?= 50
SEED ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo 0)
mutate-blind: $(VENV)/.installed-dev
	mkdir -p mutants
	python tools/mutation_score.py --generate --sample $(SAMPLE) --seed $(SEED) --names > mutants/sample.txt.tmp
	mv mutants/sample.txt.tmp mutants/sample.txt
	if [ -s mutants/sample.txt ]; then OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 xargs -a mutants/sample.txt \
	  -d '\n' -s 2000000 mutmut run --max-children $(MUTATE_WORKERS); fi
	python tools/mutation_score.py --check --sample $(SAMPLE) --seed $(SEED)

# The generated blocks of README.md, docs/results.md (the run's verdicts.json), docs/claims.md (the
# claims' registry) and docs/maths.md (the null's procedure); a test checks the committed text.
# README's image is seed 0's errata diagram of the same run.
results: $(VENV)/.installed
	python -m pipeline.present.results outputs/compare/verdicts.json README.md docs/results.md docs/claims.md docs/maths.md
	cp outputs/figures/seed0/errata_diagram.png docs/img/errata_diagram.png

clean-outputs:
	rm -rf outputs
