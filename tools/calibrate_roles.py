"""Calibrate the role ablation's placebo test (docs/training.md, "Does the circuit serve the
text?") on a run's outputs: after `make repro`, from the repository root. Outside the suite: it
needs trained models, and minutes per seed.

    python tools/calibrate_roles.py --seeds 0            # seed 0's trained model
    python tools/calibrate_roles.py --seeds 0 --step 0   # the same model untrained (step 0)

Per seed, `--draws` times: a pseudo-role of `--size` heads of layer `--layer` (default 1, the
induction role's), read exactly as the heads stage reads a role
(`pipeline.behaviour.heads.role_ablation`): ranked among analysis.heads.placebo_sets sets drawn
by `heads._placebo_sets` from all of the layer's heads, the pseudo-role's own included, on the
heads stage's held-out batches. `--pool all` (default) draws the pseudo-role from all of the
layer's heads: the test's null, under which `serves_heldout` (the effect reaches
analysis.heads.min_effect and p <= 1 / (1 + placebo_sets)) is a false positive at most that
often. `--pool non-circuit` draws it from the heads of neither role (by the trained model's
heads.csv): not the null, but a question, whether heads outside the circuit serve the text more
than random sets of their layer. Prints every draw, then per seed and in all: the mean p, the
draws at the smallest p, and how often `serves_heldout` held.

Each set is ablated once however often it is drawn (under a second per set and batch on 2 cores
for the text shape): a seed costs at most C(heads per layer, size) x analysis.heads.ablation_batches
ablations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import params  # noqa: E402
from pipeline.behaviour import ablation, heads  # noqa: E402
from pipeline.data import datasets  # noqa: E402
from pipeline.tables import ABLATED_ROLES  # noqa: E402


def held_out_batches(cfg, model, seed: int, tokenized: Path) -> list:
    """The heads stage's held-out batches for `seed` (stages/heads.py, `heads.analyse`)."""
    h = cfg.analysis.heads
    n = h.eval_sequences
    dataset = datasets.load(cfg.data, model.cfg, seed, n * h.ablation_batches, tokenized, need_train=False)
    return [dataset.eval[b * n : (b + 1) * n] for b in range(h.ablation_batches) if len(dataset.eval) > b * n]


def calibrate_seed(
    cfg, outputs: Path, seed: int, step: int | None, draws: int, size: int, layer: int, non_circuit: bool
) -> pd.DataFrame:
    h = cfg.analysis.heads
    train = outputs / "train" / f"seed{seed}"
    name = "model.safetensors" if step is None else f"checkpoints/step{step:07d}.safetensors"
    model = heads.load_model(train / name, train / "config.json", h, cfg.data)
    heldout = held_out_batches(cfg, model, seed, outputs / "tokenizer")
    table = pd.read_csv(outputs / "heads" / f"seed{seed}" / "heads.csv")
    pool = table[table["layer"] == layer]
    if non_circuit:
        pool = pool[~pool["role"].isin(list(ABLATED_ROLES))]
    pool_heads = list(zip(pool["layer"].tolist(), pool["head"].tolist(), strict=True))
    if not 0 < size < min(len(pool_heads) + 1, model.cfg.n_heads):
        sys.exit(f"calibrate_roles: --size {size}: layer {layer}'s pool has {len(pool_heads)} heads")
    rng = np.random.default_rng([seed, 20261205])  # the tool's own draws, not a pipeline stream
    effects: dict[tuple, list[float]] = {}  # a set's effect per batch, ablated once however often drawn

    def measure(sets: list[list[tuple[int, int]]]) -> list[list[float]]:
        missing = list(dict.fromkeys(tuple(sorted(s)) for s in sets if tuple(sorted(s)) not in effects))
        if missing:  # one clean pass per batch for all of them (ablation.heads_loss_effects)
            per_batch = [ablation.heads_loss_effects(model, t, missing) for t in heldout]
            for i, key in enumerate(missing):
                effects[key] = [batch[i] for batch in per_batch]
        return [effects[tuple(sorted(s))] for s in sets]

    rows = []
    for draw in range(draws):
        chosen = sorted(pool_heads[i] for i in rng.choice(len(pool_heads), size, replace=False))
        sets = heads._placebo_sets(chosen, model.cfg.n_heads, h.placebo_sets, rng)
        mine, *theirs = measure([chosen, *sets])
        # read exactly as the heads stage reads a role: its p and serves_heldout
        read = heads._placebo(
            sets, [list(batch) for batch in zip(*theirs, strict=True)], {"heldout_loss_effect": mine}, h
        )
        rows.append({
            "seed": seed, "draw": draw, "heads": " ".join(f"{l}.{i}" for l, i in sorted(chosen)),
            "heldout_loss_effect": float(np.mean(mine)),
            "placebo_min": min(read["placebo_heldout_loss_effects"]),
            "placebo_max": max(read["placebo_heldout_loss_effects"]),
            "placebo_p": read["placebo_p"], "serves_heldout": read["serves_heldout"],
        })  # fmt: skip
        print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def describe(frame: pd.DataFrame, smallest: float) -> str:
    return (
        f"{len(frame)} draws: mean p {frame['placebo_p'].mean():.2f}, "
        f"{int((frame['placebo_p'] <= smallest + 1e-12).sum())} at the smallest p ({smallest:.2f}), "
        f"serves_heldout {int(frame['serves_heldout'].sum())} "
        f"({frame['serves_heldout'].mean():.1%}); effects {frame['heldout_loss_effect'].min():+.4f}.."
        f"{frame['heldout_loss_effect'].max():+.4f} nats"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--outputs", default="outputs", type=Path)
    ap.add_argument("--step", type=int, help="a checkpoint step (0: untrained) instead of the final model")
    ap.add_argument("--draws", type=int, default=20, help="pseudo-roles per seed")
    ap.add_argument("--seeds", type=int, nargs="*", help="these seeds (default: params.yaml's)")
    ap.add_argument("--size", type=int, default=3, help="heads per pseudo-role")
    ap.add_argument("--layer", type=int, default=1, help="the layer the pseudo-roles' heads lie in")
    ap.add_argument(
        "--pool", choices=("all", "non-circuit"), default="all", help="the heads pseudo-roles come from"
    )
    args = ap.parse_args()
    cfg = params.load(args.params)
    smallest = 1 / (1 + cfg.analysis.heads.placebo_sets)
    frames = []
    for seed in args.seeds or cfg.seeds:
        frame = calibrate_seed(
            cfg, args.outputs, seed, args.step, args.draws, args.size, args.layer, args.pool == "non-circuit"
        )
        print(frame.to_string(index=False, float_format=lambda x: f"{x:+.4f}"), flush=True)
        print(f"seed {seed}: {describe(frame, smallest)}\n", flush=True)
        frames.append(frame)
    print(f"all seeds: {describe(pd.concat(frames), smallest)}")


if __name__ == "__main__":
    main()
