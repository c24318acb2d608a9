"""Is the composition test calibrated and powered on this model? calibration.json: the share of
families with a (false) discovery on surrogates, on chimeras (this model's layer 0 with another
seed's later layers) and on untrained models of this shape, per measure; the p-values of the
model's own non-composing later pairs; its detection limits; the smallest planted K composition
each measure finds, into the least- and the most-read layer-1 head; the channel statistic on the
nulls; claim (e)'s statistics on surrogates. power.csv: every planted pair tried
(pipeline/behaviour/calibration.py).

    python -m stages.calibrate --weights outputs/weights --seed 0 \\
        --config outputs/train/seed0/config.json --composition outputs/composition/seed0 \\
        --heads outputs/heads/seed0 --out outputs/calibration/seed0
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import io, params, tables
from pipeline.behaviour import calibration
from pipeline.circuits import weights
from pipeline.cli import run_cli, stage_parser, use_threads
from pipeline.model import tl_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.calibrate", __doc__)
    parser.add_argument(
        "--weights",
        required=True,
        help="The weights stage's directory, with seed<N>/heads.safetensors of every seed.",
    )
    parser.add_argument("--seed", type=int, required=True, help="The seed whose model is calibrated.")
    parser.add_argument(
        "--config", required=True, help="The model's config.json (its shape, for the untrained models)."
    )
    parser.add_argument(
        "--composition", required=True, help="The composition stage's directory of this seed."
    )
    parser.add_argument("--heads", required=True, help="The heads stage's directory of this seed.")
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        use_threads(cfg.analysis.threads)
        root = Path(args.weights)
        hw, metadata = weights.load(root / f"seed{args.seed}" / "heads.safetensors")
        positions = weights.positions_of(metadata, source=str(root / f"seed{args.seed}"))
        partners = [
            weights.load(root / f"seed{s}" / "heads.safetensors")[0] for s in cfg.seeds if s != args.seed
        ]
        shape = tl_checkpoint.read_tl_config(args.config)
        untrained = calibration.untrained(shape, args.seed, cfg.analysis.calibration.untrained)
        composition, heads = Path(args.composition), Path(args.heads)
        measured = tables.join_measures(
            tables.read_csv(composition / "scores.csv", tables.SCORES_COLUMNS, empty_ok=False),
            {
                m: tables.read_csv(composition / f"{m}.csv", tables.INVARIANT_COLUMNS, empty_ok=False)
                for m in tables.OTHER_MEASURES
            },
        )
        placebo = tables.read_csv(composition / "placebo.csv", tables.SCORES_COLUMNS, empty_ok=False)
        roles = tables.read_csv(heads / "heads.csv", ("layer", "head", "role"), empty_ok=False)
        ablation = tables.read_csv(heads / "ablation.csv", tables.ABLATION_COLUMNS, empty_ok=False)
        result = calibration.calibrate(
            hw, positions, args.seed, cfg.analysis.composition, cfg.analysis.calibration,
            partners, untrained, measured, placebo, roles, ablation,
        )  # fmt: skip
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_json(out / "calibration.json", result.summary)
        io.write_csv(out / "power.csv", result.power)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
