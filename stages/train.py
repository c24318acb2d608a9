"""Train one seed's model: model.safetensors, config.json, metrics.json, curve.tsv.

    python -m stages.train --seed 0 --out outputs/train/seed0
"""

from __future__ import annotations

import sys

from pipeline import checkpoint, io, params, train
from pipeline.cli import run_cli, stage_parser


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.train", __doc__)
    parser.add_argument("--seed", type=int, required=True, help="training seed")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    def body(args) -> None:
        cfg = params.load(args.params)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        result = train.train(cfg, args.seed, progress=not args.no_progress)
        checkpoint.save_state(out / "model.safetensors", result.model.state_dict(), {"seed": args.seed})
        io.write_json(out / "config.json", checkpoint.tl_config(cfg.model))
        io.write_csv(out / "curve.tsv", result.curve, sep="\t")
        io.write_json(out / "metrics.json", result.metrics)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
