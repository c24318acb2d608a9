"""Named random streams: every random draw of a run comes from one of these, each derived
from the run's seed and the stream's name here and nowhere else.

Before, each use seeded its generator with the seed or the seed plus a small number: the
composition and invariant measures drew the same first numbers, the heads stage's probe
batch 1 was training's batch generator, and seed 0's batch 1 was seed 1's batch 0. A
stream's seed is now numpy's SeedSequence of (run seed; crc32 of the name, indices), so
distinct names, indices and run seeds give independent streams (numpy's guarantee for
distinct spawn keys), and a new stream changes no other stream's draws.

Which draws are meant to be shared, and why, is said in the stream's line below.
"""

from __future__ import annotations

import zlib

import numpy as np

STREAMS = {
    "data": "the synthetic sequences and the copies written into them (data.source = synthetic)",
    "init": "the model's initial weights (torch's global generator, seeded once before the model is built)",
    "batches": "training batches, and the copies written into text and token batches",
    # The same measure on the same sequences: training's curve and the dynamics stage read
    # batch 0, so their last induction score is the heads stage's batch 0 score.
    "probe": "the repeated probe; index b: the heads stage's evaluation batch b",
    # A measure's baseline and its null are independent of each other and of the other
    # measure's. Placebo pairs are scored against the same draws as the real pairs, so the
    # two differ only in the pairs.
    "placebo_sets": "the random sets of heads a role's ablation is ranked among",
    "composition.baseline": "random factors of the heads' shapes: the Frobenius measures' baselines",
    "composition.null": "Haar rotations of the writer: the Frobenius measures' null",
    "invariant.baseline": "Gaussian heads in the whitened frames: the invariant measure's baselines",
    "invariant.null": "Haar rotations in the whitened frames: the invariant measure's null",
    "channels.null": "Haar blocks: how a writer's and a reader's channels meet under rotation",
    "calibration.surrogate": "index i: the random bases of surrogate i's later layers (the calibrate stage)",
    "calibration.untrained": "index i: the initial weights of untrained model i (the calibrate stage)",
}


def seed_of(seed: int, stream: str, *index: int) -> int:
    """The 63-bit seed of `stream` (with `index`, e.g. an evaluation batch) for run `seed`."""
    if stream not in STREAMS:
        raise KeyError(f"unknown random stream {stream!r}: one of {', '.join(STREAMS)}")
    key = (zlib.crc32(stream.encode()), *index)
    state = np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))  # torch and numpy both take it
