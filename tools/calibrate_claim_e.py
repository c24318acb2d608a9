"""Claim (e) on surrogates of a run's models: does the alignment it measures arise by chance?

    python tools/calibrate_claim_e.py              # after make repro: 100 surrogates per seed
    python tools/calibrate_claim_e.py --surrogates 20 --seeds 0

(e) is the mean, over a seed's discovered previous-token -> induction K pairs, of
ln(alignment / chance) (pipeline/compare/claims.py `claim_e`; docs/maths.md "The errata's
reading"). A surrogate (`scoring.surrogate`) puts the later layer in a Haar-random basis of the
residual stream: its heads kept, their alignment with layer 0 broken. The same pairs are read on
each surrogate (`channels.rotation_statistics`). Prints each seed's value on the model and on the
surrogates, and how many surrogate triples (surrogate i of every seed) the verdict rule of
compare would call "holds" (every seed above 0 and the 95% t interval of the mean above 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's pipeline/

from pipeline import params  # noqa: E402
from pipeline.circuits import channels, scoring, weights  # noqa: E402


def circuit_pairs(outputs: Path, seed: int) -> tuple[torch.Tensor, ...]:
    """The seed's discovered previous-token -> induction K pairs, as claim (e) reads them."""
    k = pd.read_csv(outputs / f"composition/seed{seed}/channels.csv")
    k = k[(k["kind"] == "K") & k["pair_discovery"].astype(bool)]
    role = pd.read_csv(outputs / f"heads/seed{seed}/heads.csv").set_index(["layer", "head"])["role"]
    src = role.reindex(pd.MultiIndex.from_frame(k[["src_layer", "src_head"]])).to_numpy()
    dst = role.reindex(pd.MultiIndex.from_frame(k[["dst_layer", "dst_head"]])).to_numpy()
    k = k[(src == "previous_token") & (dst == "induction")]
    return tuple(torch.tensor(k[c].to_numpy()) for c in ("src_layer", "src_head", "dst_layer", "dst_head"))


def claim_e(hw, pairs) -> float:
    s = channels.rotation_statistics(hw, pairs)
    return float(np.mean(np.log((s["alignment"] / s["query_chance"]).double().numpy())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--outputs", default="outputs", type=Path)
    ap.add_argument("--seeds", type=int, nargs="*", help="these seeds (default: params.yaml's)")
    ap.add_argument("--surrogates", type=int, default=100)
    args = ap.parse_args()
    seeds = args.seeds or params.load(args.params).seeds
    values = []
    for seed in seeds:
        hw, _ = weights.load(args.outputs / f"weights/seed{seed}/heads.safetensors")
        pairs = circuit_pairs(args.outputs, seed)
        fake = [
            claim_e(scoring.surrogate(hw, torch.Generator().manual_seed(i)), pairs)
            for i in range(args.surrogates)
        ]
        values.append(fake)
        print(
            f"seed {seed}: {len(pairs[0])} pairs, e = {claim_e(hw, pairs):.3f}; "
            f"on {args.surrogates} surrogates: mean {np.mean(fake):.3f}, sd {np.std(fake):.3f}, "
            f"max {np.max(fake):.3f}"
        )
    v = np.array(values)  # [seeds, surrogates]
    if len(seeds) >= 2:
        half = stats.t.ppf(0.975, len(seeds) - 1) * v.std(0, ddof=1) / np.sqrt(len(seeds))
        holds = (v > 0).all(0) & (v.mean(0) - half > 0)
        print(f"surrogate triples that hold: {int(holds.sum())} of {v.shape[1]}")


if __name__ == "__main__":
    main()
