"""Named random streams: one derivation, known answers, independence of names, indices and
seeds, and every stream the code draws from is named in `streams.STREAMS` (and used)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.streams import STREAMS, seed_of

ROOT = Path(__file__).resolve().parents[1]


def test_known_answers():
    """SeedSequence(seed, spawn_key=(crc32(name), *index)), its first 64-bit word halved:
    computed here by hand, so a change to the derivation (which changes every draw) fails."""
    import zlib

    for seed, name, index in [(0, "init", ()), (7, "probe", (2,)), (3, "invariant.null", ())]:
        key = (zlib.crc32(name.encode()), *index)
        word = np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)[0]
        assert seed_of(seed, name, *index) == int(word) // 2
    assert seed_of(0, "init") == seed_of(0, "init")
    assert 0 <= seed_of(0, "batches") < 2**63


def test_names_indices_and_seeds_give_distinct_streams():
    keys = [(name, ()) for name in STREAMS] + [("probe", (b,)) for b in range(1, 8)]
    seeds = [seed_of(s, name, *index) for s, (name, index) in itertools.product(range(100), keys)]
    assert len(set(seeds)) == len(seeds)
    # what seeds derived by adding an index to the run's seed would share: probe batch 1 of seed 0
    # with seed 1's batch 0, init of seed 1 with seed 0's batches
    assert seed_of(0, "probe", 1) != seed_of(1, "probe", 0)
    assert seed_of(1, "init") != seed_of(0, "batches")


def stream_names_in_code() -> set[str]:
    """The string literals passed to streams.seed_of anywhere in pipeline/."""
    names = set()
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "seed_of":
                name = node.args[1]
                assert isinstance(name, ast.Constant), f"{path}: a stream's name is a literal"
                names.add(name.value)
    return names


@pytest.mark.source
def test_every_stream_is_declared_and_used():
    assert stream_names_in_code() == set(STREAMS)


SEEDERS = {"manual_seed", "default_rng", "SeedSequence", "Generator", "RandomState"}


@pytest.mark.source
def test_no_generator_is_seeded_from_the_run_seed_itself():
    """No `manual_seed(seed)` or `(seed + 1)` in pipeline/: a run's seed reaches a generator
    only through `seed_of` (streams.py itself derives them)."""
    for path in (ROOT / "pipeline").rglob("*.py"):
        if path.name == "streams.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in SEEDERS and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Call) and getattr(arg.func, "attr", None) == "seed_of":
                    continue
                uses = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
                assert "seed" not in uses, f"{path.relative_to(ROOT)}:{node.lineno} seeds from the run seed"


def test_the_two_measures_draw_different_numbers():
    """Composition's and invariant's baselines used to start from the same draws."""
    firsts = {
        name: torch.randn(4, generator=torch.Generator().manual_seed(seed_of(0, name)))
        for name in STREAMS
        if name.startswith(("composition.", "invariant."))
    }
    for a, b in itertools.combinations(firsts, 2):
        assert not torch.equal(firsts[a], firsts[b]), (a, b)


def test_an_unknown_stream_is_refused_naming_every_stream():
    with pytest.raises(KeyError) as caught:
        seed_of(0, "nul")
    [message] = caught.value.args
    assert "'nul'" in message and all(name in message for name in STREAMS), message
