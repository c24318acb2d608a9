"""Calibrate and power the composition discoveries (pipeline/circuits/significance.py) on a run's
models: after `make repro`, from the repository root, or on any weights files. Outside the suite:
it needs trained models, and seconds per surrogate.

    python tools/calibrate_composition.py                       # params.yaml's seeds, final models
    python tools/calibrate_composition.py --step 0              # the same models untrained (step 0)
    python tools/calibrate_composition.py --weights a.safetensors b.safetensors   # any checkpoints
    python tools/calibrate_composition.py --untrained 20        # 20 fresh models of params.yaml's shape

Per model:
- surrogates (`scoring.surrogate`, `--surrogates` of them): the later layers in Haar-random bases
  of the residual stream, scored and calibrated exactly as the composition stage does; every
  discovery is a false one. The share of (surrogate, kind) families of each measure with any
  discovery, against the nominal analysis.composition.fdr;
- the placebo pairs' families with a discovery, per block (each block against the null of the
  others: `significance.family_summary`);
- the detection limit of each K measure (the raw z a lone pair needs) and a planted rank-2 K
  composition (`--strengths`) into the layer-1 head read least, from its least-read layer-0 head
  (tests/planted.py `plant_key_reading`): its raw z and whether it is a discovery, per measure.
- channels (pipeline/circuits/channels.py): the same per kind for the channel statistic, every later
  pair tested (`channels.every_pair_tested`: the channel null on its own): surrogates' families with
  a channel discovery, the placebo pairs' per block, and a planted channel (`tests/planted.py`
  `plant_key_channel`: the same reader's keys turned towards the writer's top output channel, every
  spectrum kept) at growing strength: the whole pair's raw z and discovery, its top channel, that
  channel's share, z and discovery as the stage tests it (only once the pair is a discovery).
`--untrained N`: instead, N freshly initialised models of params.yaml's shape (float32, as training
starts), and the share of their (model, kind) families of each measure with any discovery.
Prints markdown tables (docs/maths.md, "Calibration" holds their output).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from models import random_model  # noqa: E402
from planted import plant_key_channel, plant_key_reading  # noqa: E402

from pipeline import params  # noqa: E402
from pipeline.circuits import channels, scoring, significance, weights  # noqa: E402
from pipeline.model import tl_checkpoint  # noqa: E402
from pipeline.tables import HYPOTHESES, MEASURES  # noqa: E402

K_MEASURES = ("true", *HYPOTHESES["rotated"])  # a discovery does not depend on the denominators


def load(path: Path, config: Path):
    model_cfg, state = tl_checkpoint.read_checkpoint(path, config)
    hw, _ = weights.prepare(state, model_cfg)
    return hw, model_cfg.positional_embedding_type


def surrogate_rates(hw, c, seed: int, positions: str, n: int) -> pd.Series:
    """Per measure: the share of the n surrogates' (kind) families with any discovery."""
    found = []
    for i in range(n):
        fake = scoring.surrogate(hw, torch.Generator().manual_seed(i))
        scores, _ = significance.measured(fake, c, seed, positions)
        found.append(scores.groupby(["kind", "variant"], sort=False)["discovery"].any())
    return pd.concat(found, axis=1).mean(axis=1).groupby(level="variant").mean().reindex(list(MEASURES))


def channel_rates(models, c, seed: int) -> pd.Series:
    """Per kind: the share of the models' families with any channel discovery, every pair tested."""
    found = [channels.every_pair_tested(hw, c.fdr, seed, c.null_samples, c.channel_tolerance)
             .groupby("kind")["discovery"].any() for hw in models]  # fmt: skip
    return pd.concat(found, axis=1).mean(axis=1)


def quietest_pair(hw, c, seed: int, positions: str) -> tuple[int, int]:
    """(layer-0 head, layer-1 head): the layer-1 head read least (its largest corrected K raw z is
    the smallest) and its least-read writer: where a planted composition is measured."""
    raw = significance.raw_tables(hw, c, seed, positions)[0]
    k = raw[(raw["kind"] == "K") & (raw["variant"] == "true")]
    quiet = int(k.groupby("dst_head")["z"].max().idxmin())
    return int(k[k["dst_head"] == quiet].sort_values("z")["src_head"].iloc[0]), quiet


def channel_power(hw, c, seed: int, positions: str, strengths: list[float]) -> pd.DataFrame:
    """The planted channel's pair and channel statistics per strength (module doc)."""
    src, quiet = quietest_pair(hw, c, seed, positions)
    rows = []
    for strength in strengths:
        fake = plant_key_channel(hw, src, quiet, strength)
        scores, _ = significance.measured(fake, c, seed, positions)
        later, _, _ = channels.measured_channels(fake, scores, c, seed)
        at = (later["kind"] == "K") & (later["src_layer"] == 0) & (later["src_head"] == src)
        r = later[at & (later["dst_head"] == quiet)].iloc[0]
        pair = scores[(scores["kind"] == "K") & (scores["variant"] == "true") & (scores["src_layer"] == 0)
                      & (scores["src_head"] == src) & (scores["dst_head"] == quiet)].iloc[0]  # fmt: skip
        rows.append({"pair": f"L0H{src}->L1H{quiet}", "strength": strength,
                     "pair raw z": f"{pair['z']:.1f}{' *' if pair['discovery'] else ''}",
                     "top channel": f"({r['writer_channel']}, {r['reader_channel']})",
                     "top share": round(float(r["top_share"]), 2),
                     "channel z": f"{r['z']:.1f}{' *' if r['discovery'] else ''}"})  # fmt: skip
    return pd.DataFrame(rows)


def power(hw, c, seed: int, positions: str, strengths: list[float]) -> pd.DataFrame:
    """The planted pair's raw z and discovery per strength and K measure, with the limit."""
    src, quiet = quietest_pair(hw, c, seed, positions)
    rows = []
    for strength in strengths:
        scores, placebo = significance.raw_tables(
            plant_key_reading(hw, src, quiet, strength), c, seed, positions
        )
        tested, _ = significance.calibrate(scores, placebo, c.fdr)
        limits = significance.detection_limits(scores, placebo, c.fdr)["K"]
        k = tested[(tested["kind"] == "K") & (tested["dst_layer"] == 1)]
        pair = k[(k["src_layer"] == 0) & (k["src_head"] == src) & (k["dst_head"] == quiet)].set_index(
            "variant"
        )
        for m in K_MEASURES:
            rows.append({"pair": f"L0H{src}->L1H{quiet}", "strength": strength, "measure": m,
                         "raw_z": pair.loc[m, "z"], "discovery": bool(pair.loc[m, "discovery"]),
                         "limit": limits[m]["raw_z"]})  # fmt: skip
    return pd.DataFrame(rows)


def untrained_rates(cfg, n: int) -> tuple[pd.Series, pd.Series]:
    """(per measure, per kind of the channel statistic): the share of n fresh models' (kind)
    families with any discovery."""
    c, found, fresh_models = cfg.analysis.composition, [], []
    for seed in range(n):
        fresh = random_model(cfg.model, seed=seed, dtype=torch.float32, perturb_biases=False)
        hw, _ = weights.prepare(fresh.state_dict(), cfg.model)
        fresh_models.append(hw)
        scores, _ = significance.measured(hw, c, seed, cfg.model.positional_embedding_type)
        found.append(scores.groupby(["kind", "variant"], sort=False)["discovery"].any())
    by_measure = pd.concat(found, axis=1).mean(axis=1).groupby(level="variant").mean().reindex(list(MEASURES))
    return by_measure, channel_rates(fresh_models, c, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--outputs", default="outputs", type=Path)
    ap.add_argument("--seeds", type=int, nargs="*", help="these seeds (default: params.yaml's)")
    ap.add_argument("--step", type=int, help="a checkpoint step (0: untrained) instead of the final model")
    ap.add_argument("--weights", type=Path, nargs="*", help="checkpoints (config.json beside each) instead")
    ap.add_argument("--surrogates", type=int, default=20)
    ap.add_argument("--untrained", type=int, help="this many fresh models of params.yaml's shape instead")
    ap.add_argument("--strengths", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5, 1.0])
    ap.add_argument(
        "--part",
        choices=["all", "frobenius", "channels"],
        default="all",
        help="the Frobenius measures' checks, the channel statistic's, or both",
    )
    ap.add_argument("--channel-strengths", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5, 0.7, 1.0])
    args = ap.parse_args()
    cfg = params.load(args.params)
    c = cfg.analysis.composition
    if args.untrained:
        rates, channel = untrained_rates(cfg, args.untrained)
        print(f"## {args.untrained} untrained models: share of (model, kind) families with any discovery\n")
        print(rates.round(3).to_frame("families with a discovery").to_markdown())
        print("\n## The channel statistic, every later pair tested: per kind\n")
        print(channel.round(3).to_frame("families with a channel discovery").to_markdown())
        return
    if args.weights:
        models = [(p.parent.name or str(p), p, p.parent / "config.json", 0) for p in args.weights]
    else:
        models = []
        for seed in args.seeds if args.seeds is not None else cfg.seeds:
            train = args.outputs / "train" / f"seed{seed}"
            name = (
                "model.safetensors" if args.step is None else f"checkpoints/step{args.step:07d}.safetensors"
            )
            models.append((f"seed{seed}", train / name, train / "config.json", seed))
    surrogate, placebo, planted = {}, {}, []
    channel_surrogate, channel_placebo, channel_planted = {}, {}, []
    for label, path, config, seed in models:
        hw, positions = load(path, config)
        scores, tested = significance.measured(hw, c, seed, positions)
        if args.part != "channels":
            surrogate[label] = surrogate_rates(hw, c, seed, positions, args.surrogates)
            placebo[label] = {b: v["with_discovery"] for b, v in significance.family_summary(tested).items()}
            placebo[label]["later K discoveries (true)"] = int(
                scores[(scores["kind"] == "K") & (scores["variant"] == "true")]["discovery"].sum()
            )
            planted.append(power(hw, c, seed, positions, args.strengths).assign(model=label))
        if args.part == "frobenius":
            continue
        fakes = [scoring.surrogate(hw, torch.Generator().manual_seed(i)) for i in range(args.surrogates)]
        channel_surrogate[label] = channel_rates(fakes, c, seed)
        split, split_placebo, _ = channels.measured_channels(hw, scores, c, seed)
        summary = channels.channels_summary(split, split_placebo)
        channel_placebo[label] = {b: v["with_discovery"] for b, v in summary["placebo_families"].items()}
        for kind, v in summary["kinds"].items():
            channel_placebo[label][f"later {kind}: tested / channel discoveries"] = (
                f"{v['tested']} / {v['discoveries']}"
            )
        channel_planted.append(
            channel_power(hw, c, seed, positions, args.channel_strengths).assign(model=label)
        )
        print(f"{label}: done", file=sys.stderr)
    n, fdr = args.surrogates, c.fdr
    if args.part != "channels":
        frobenius_tables(surrogate, placebo, planted, n, fdr)
    if args.part != "frobenius":
        channel_tables(channel_surrogate, channel_placebo, channel_planted, n)


def frobenius_tables(surrogate: dict, placebo: dict, planted: list, n: int, fdr: float) -> None:
    print(
        f"## Surrogates: share of (surrogate, kind) families with any discovery ({n} each; nominal {fdr})\n"
    )
    print(pd.DataFrame(surrogate).round(3).to_markdown())
    print(
        "\n## Placebo families with a discovery, per block (18 families each), and the later K discoveries\n"
    )
    print(pd.DataFrame(placebo).to_markdown())
    print("\n## A planted K composition: raw z (discovery *), and the detection limit\n")
    table = pd.concat(planted)
    table["cell"] = table.apply(
        lambda r: f"{r['raw_z']:.1f}{' *' if r['discovery'] else ''} ({r['limit']:.1f})", axis=1
    )
    wide = table.pivot_table(
        index=["model", "pair", "strength"], columns="measure", values="cell", aggfunc="first"
    )
    print(wide[list(K_MEASURES)].to_markdown())


def channel_tables(channel_surrogate: dict, channel_placebo: dict, channel_planted: list, n: int) -> None:
    print(f"\n## Channels: surrogates' (surrogate, kind) families with a channel discovery ({n} each)\n")
    print(pd.DataFrame(channel_surrogate).round(3).to_markdown())
    print("\n## Channels: placebo families with a channel discovery per block (3 each), later pairs\n")
    print(pd.DataFrame(channel_placebo).to_markdown())
    print("\n## Channels: a planted channel (* a discovery)\n")
    print(pd.concat(channel_planted).set_index(["model", "pair", "strength"]).to_markdown())


if __name__ == "__main__":
    main()
