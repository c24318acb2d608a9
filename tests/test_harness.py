"""The test harness's own parts (tests/conftest.py): the order in which `make test`'s pytest-xdist
workers take the test files, and a run in one process left in pytest's own order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import LONGEST_FIRST, longest_files_first, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_hands_out_the_named_files_first_in_their_order_each_file_whole():
    nodeids = ["tests/test_a.py::x", "tests/test_b.py::y", "tests/test_c.py::z", "tests/test_a.py::w"]
    # c then b as named; a, not named, after them, x still before w; a named file not here is no matter
    assert longest_files_first(nodeids, ("test_c.py", "test_gone.py", "test_b.py")) == [
        "tests/test_c.py::z",
        "tests/test_b.py::y",
        "tests/test_a.py::x",
        "tests/test_a.py::w",
    ]


def test_the_files_make_test_runs_first_exist_and_appear_once():
    """A renamed file would drop out of LONGEST_FIRST silently (make test slower, nothing failing)."""
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [n for n in LONGEST_FIRST if not (ROOT / "tests" / n).is_file()] == []
    make = (ROOT / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in make  # else xdist reorders by test count


@pytest.mark.parametrize("on_a_worker", [True, False])
def test_only_an_xdist_worker_reorders_the_collected_tests(on_a_worker):
    first, other = LONGEST_FIRST[0], "test_not_named.py"
    items = [SimpleNamespace(nodeid=f"tests/{other}::a"), SimpleNamespace(nodeid=f"tests/{first}::b")]
    config = SimpleNamespace(workerinput={"workerid": "gw0"}) if on_a_worker else SimpleNamespace()
    pytest_collection_modifyitems(config, items)
    got = [i.nodeid for i in items]
    want = (
        [f"tests/{first}::b", f"tests/{other}::a"]
        if on_a_worker
        else [f"tests/{other}::a", f"tests/{first}::b"]
    )
    assert got == want
