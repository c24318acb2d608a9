"""Classify every head and check composition against a causal path ablation:
heads.csv, ablation.csv, patterns.safetensors (one repeated sequence), summary.json.

    python -m stages.heads --model outputs/train/seed0/model.safetensors \
        --config outputs/train/seed0/config.json --weights outputs/weights/seed0/heads.safetensors \
        --scores outputs/composition/seed0/scores.csv --seed 0 --out outputs/heads/seed0
"""

from __future__ import annotations

import sys

import torch

from pipeline import checkpoint, heads, io, params, tables, weights
from pipeline.cli import run_cli, stage_parser
from pipeline.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.heads", __doc__)
    parser.add_argument("--model", required=True, help="checkpoint (.safetensors)")
    parser.add_argument("--config", required=True, help="its config.json")
    parser.add_argument(
        "--weights", required=True, help="analysis-ready heads.safetensors of the weights stage"
    )
    parser.add_argument("--scores", required=True, help="scores.csv of the composition stage")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the evaluation batches (the training seed)"
    )
    parser.add_argument("--out", required=True, help="output directory")

    def body(args) -> None:
        cfg = params.load(args.params)
        model = checkpoint.load_model(args.model, args.config, dtype=torch.float64)
        hw, _ = weights.load(args.weights)
        if (hw.n_layers, hw.n_heads) != (model.cfg.n_layers, model.cfg.n_heads):
            shape = f"{model.cfg.n_layers} layers x {model.cfg.n_heads} heads"
            raise UserError(
                args.weights, f"has {hw.n_layers} layers x {hw.n_heads} heads, but {args.model} has {shape}"
            )
        scores = tables.read_csv(args.scores, tables.SCORES_COLUMNS)
        result = heads.analyse(model, hw, cfg.data, cfg.analysis.heads, args.seed, source=args.model)
        summary = heads.summarize(result, scores)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_csv(out / "heads.csv", result.table)
        io.write_csv(out / "ablation.csv", result.ablation)
        checkpoint.save_state(out / "patterns.safetensors", result.example, {"seed": args.seed})
        io.write_json(out / "summary.json", summary)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
