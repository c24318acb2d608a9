"""Write a checkpoint's analysis-ready head weights: heads.safetensors and summary.json.

    python -m stages.weights --model outputs/train/seed0/model.safetensors \\
        --config outputs/train/seed0/config.json --out outputs/weights/seed0
"""

from __future__ import annotations

import json
import sys

from pipeline import io, params
from pipeline.circuits import weights
from pipeline.cli import run_cli, stage_parser
from pipeline.model import tl_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.weights", __doc__)
    parser.add_argument("--model", required=True, help="The checkpoint, a .safetensors file.")
    parser.add_argument(
        "--config", required=True, help="The checkpoint's config.json, in HookedTransformerConfig fields."
    )
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        params.load(args.params)  # validated, though this stage reads no params
        model_cfg, state = tl_checkpoint.read_checkpoint(args.model, args.config)  # names, shapes, finite
        hw, steps = weights.prepare(state, model_cfg, source=args.model)
        extra = weights.positional_terms(state, model_cfg)
        config = tl_checkpoint.tl_config(model_cfg)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        weights.save(
            out / "heads.safetensors",
            hw,
            {"steps": json.dumps(steps), "config": json.dumps(config, sort_keys=True)},
            extra,
        )
        io.write_json(
            out / "summary.json", {"steps": steps, "config": config, "extra_tensors": sorted(extra)}
        )

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
