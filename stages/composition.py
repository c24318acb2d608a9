"""Score the Q-, K- and V-composition of every (earlier, later) head pair: scores.csv (Frobenius,
five variants), invariant.csv (in the whitened residual frame: unchanged by a change of
residual basis; pipeline/circuits/invariant.py), projection.csv (how far the subspaces a writer
writes into and a reader reads from overlap; pipeline/circuits/projection.py), placebo.csv
(every measure for the pairs that cannot compose), each with its raw z, calibrated z, p, q and
discovery (pipeline/circuits/significance.py); channels.csv (each later pair's corrected score
split into writer x reader channels: its top channel, that channel's share and its calibrated
discovery; pipeline/circuits/channel_null.py), channels_placebo.csv (the same for the pairs that
cannot compose), channels.safetensors (every later pair's normalised shares, one [pairs, d_head,
d_head] tensor per kind, channels.csv's order); and summary.json (discoveries per kind and
measure, the placebo pairs' false ones, per pair and per block's families, the detection limit:
the raw z a lone composing pair needs, and the channels').

Works on any weights file in TransformerLens's state-dict names, e.g.

    python -m stages.composition --weights outputs/weights/seed0/heads.safetensors \\
        --out outputs/composition/seed0
"""

from __future__ import annotations

import sys

from pipeline import checkpoint, io, params
from pipeline.circuits import analysis, weights
from pipeline.cli import keep_freed_memory, resolve_device, run_cli, stage_parser, use_threads


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.composition", __doc__)
    parser.add_argument(
        "--weights",
        required=True,
        help="The weights stage's heads.safetensors, or any attention-only checkpoint.",
    )
    parser.add_argument("--seed", type=int, default=0, help="The seed of the random baselines and nulls.")
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        use_threads(cfg.analysis.threads)
        keep_freed_memory()  # the null's large temporaries, reused
        device = str(resolve_device(cfg.analysis.device, "analysis.device"))  # before any file is read
        hw, metadata = weights.load(args.weights)
        positions = weights.positions_of(metadata, source=args.weights)  # as the weights stage recorded
        result = analysis.composition(hw, cfg.analysis.composition, args.seed, positions, device)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_csv(out / "scores.csv", result.scores)
        io.write_csv(out / "invariant.csv", result.invariant)
        io.write_csv(out / "projection.csv", result.projection)
        io.write_csv(out / "placebo.csv", result.placebo)
        io.write_csv(out / "channels.csv", result.channels)
        io.write_csv(out / "channels_placebo.csv", result.channels_placebo)
        meta = {"seed": args.seed, "rows": "channels.csv"}
        checkpoint.save_state(out / "channels.safetensors", result.shares, meta)
        io.write_json(out / "summary.json", result.summary)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
