"""Train one seed's model, or load a checkpoint (train.source = load): model.safetensors,
config.json, metrics.json, curve.tsv, manifest.json, and checkpoints/ (the weights at every
step of train.save_every and train.save_steps, and the last; index.json lists them).

    python -m stages.train --seed 0 --out outputs/train/seed0

With train.source = load, train.checkpoint (under train.checkpoint_dir, "{seed}" replaced
by the seed) and the config.json beside it are converted into the same files; model.*
params are then not used (the shape comes from config.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import checkpoint, io, params
from pipeline.cli import progress_mode, run_cli, stage_parser
from pipeline.model import origin, tl_checkpoint, train


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.train", __doc__)
    parser.add_argument("--seed", type=int, required=True, help="The training seed.")
    parser.add_argument(
        "--origin", required=True, help="The origin stage's origin.json: train, or load a checkpoint."
    )
    parser.add_argument("--tokenized", help="The tokenizer stage's directory, read when data.source = text.")
    parser.add_argument("--out", required=True, help="The directory to write.")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="Show no progress (else a bar on a terminal, a line per evaluation without one, as under DVC).",
    )

    def body(args) -> None:
        cfg = params.load(args.params)
        progress = progress_mode(args.no_progress)  # a bar on a terminal, a line per evaluation under DVC
        chosen = origin.read(args.origin)
        out = Path(args.out)
        io.clean_stale(out)
        with io.atomic_dir(out / "checkpoints") as saved:  # whole, or not at all (nor `out`)
            writer = checkpoint.StepWriter(saved, args.seed)
            result = train.run(cfg, args.seed, chosen, args.tokenized, progress, writer)
            writer.write_index()
        meta = {"seed": args.seed, "source": chosen["source"]}
        checkpoint.save_state(out / "model.safetensors", result.model.state_dict(), meta)
        io.write_json(out / "config.json", tl_checkpoint.tl_config(result.model.cfg))
        io.write_csv(out / "curve.tsv", result.curve, sep="\t")
        io.write_json(out / "metrics.json", result.metrics)
        io.write_json(out / "manifest.json", result.manifest)
        m = result.metrics
        print(
            f"seed {args.seed}: induction {m['induction']:.2f} (>= 0.5 from step {m['induction_step']}), "
            f"prev_token {m['prev_token']:.2f}, eval_loss {m['eval_loss']:.3f}, {result.seconds:.0f} s",
            file=sys.stderr,
        )

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
