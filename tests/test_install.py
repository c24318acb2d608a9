"""The library installs beside a user's torch; `make` installs exactly the pinned one.

pyproject.toml asks for a torch range (so `pip install -e .` into a CUDA notebook keeps its
torch); constraints.txt holds the reproducible environment's exact pin, inside that range; and
every install the Makefile does (`make repro`, `make test`, CI's .ci/run) goes through it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from pipeline.data.corpus import CORPORA

ROOT = Path(__file__).resolve().parents[1]


def requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, deps) if r.name == name)


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    found = (re.fullmatch(r"([\w.-]+)==([\w.+]+)", line.strip()) for line in lines)
    return {m.group(1): m.group(2) for m in found if m}


def test_pyproject_asks_for_a_torch_range_and_constraints_pin_one_inside_it():
    torch = requirement("torch")
    assert not any(s.operator in ("==", "===") for s in torch.specifier), torch  # a range, not a pin
    assert torch.specifier.contains("2.11.0") and not torch.specifier.contains("3.0.0")
    pinned = pins()["torch"]
    assert torch.specifier.contains(pinned)
    # the default corpus is the pinned wheel's sources
    assert (CORPORA["torch-py"].package, CORPORA["torch-py"].version) == ("torch", pinned)


def test_every_make_install_goes_through_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    pip = re.search(r"^PIP\s*:=(.*)$", makefile, re.M)
    assert pip and "-m pip install" in pip.group(1) and "-c constraints.txt" in pip.group(1)
    tl4 = re.search(r"^PIP_TL4\s*:=(.*)$", makefile, re.M)  # TransformerLens 4.x's own venv, same pin
    assert tl4 and "-m pip install" in tl4.group(1) and "-c constraints.txt" in tl4.group(1)
    commands = [line for line in makefile.splitlines() if not line.lstrip().startswith("#")]
    installs = [line for line in commands if "pip install" in line or "$(PIP)" in line]
    assert all("$(PIP)" in line or line.startswith("PIP") for line in installs), installs
    assert "\t$(PIP_TL4) -e '.[dev,interop4]'" in makefile
    for target in ("repro", "test"):  # both install first (test through lint's .installed-dev)
        assert re.search(rf"^{target}:.*(\.installed|lint)", makefile, re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
