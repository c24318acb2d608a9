"""Score every head by where it attends: heads.csv, summary.json.

    python -m stages.heads --model outputs/train/seed0/model.safetensors \
        --config outputs/train/seed0/config.json --seed 0 --out outputs/heads/seed0
"""

from __future__ import annotations

import sys

import torch

from pipeline import checkpoint, heads, io, params
from pipeline.cli import run_cli, stage_parser


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.heads", __doc__)
    parser.add_argument("--model", required=True, help="checkpoint (.safetensors)")
    parser.add_argument("--config", required=True, help="its config.json")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation batches")
    parser.add_argument("--out", required=True, help="output directory")

    def body(args) -> None:
        cfg = params.load(args.params)
        model = checkpoint.load_model(args.model, args.config).to(torch.float64)
        table = heads.head_scores(model, cfg.analysis.heads, args.seed)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_csv(out / "heads.csv", table)
        best = table.loc[table.groupby("layer")["induction"].idxmax()]
        io.write_json(out / "summary.json", {"max_induction": float(table["induction"].max()), "max_prev_token": float(table["prev_token"].max()), "best_induction_head": best[["layer", "head"]].values.tolist()})

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
