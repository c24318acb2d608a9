"""Classify every head and check composition against a causal path ablation:
heads.csv, ablation.csv (each effect averaged over the disjoint batches), ablation_batches.csv (every
batch: the ablation's noise), patterns.safetensors (one probe sequence), summary.json; with
--channels, also channel_ablation.csv (each discovered K pair's top channel cut alone, beside
the whole path, every batch: pipeline/behaviour/channel_check.py) and its summary.json entry.

    python -m stages.heads --model outputs/train/seed0/model.safetensors \\
        --config outputs/train/seed0/config.json --weights outputs/weights/seed0/heads.safetensors \\
        --scores outputs/composition/seed0/scores.csv \\
        --invariant outputs/composition/seed0/invariant.csv \\
        --projection outputs/composition/seed0/projection.csv \\
        --channels outputs/composition/seed0/channels.csv --tokenized outputs/tokenizer \\
        --seed 0 --out outputs/heads/seed0
"""

from __future__ import annotations

import sys

from pipeline import checkpoint, io, params, tables
from pipeline.behaviour import channel_check, heads
from pipeline.circuits import weights
from pipeline.cli import keep_freed_memory, resolve_device, run_cli, stage_parser, use_threads
from pipeline.data import datasets


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.heads", __doc__)
    parser.add_argument("--model", required=True, help="The checkpoint, a .safetensors file.")
    parser.add_argument("--config", required=True, help="The checkpoint's config.json.")
    parser.add_argument(
        "--weights", required=True, help="The weights stage's analysis-ready heads.safetensors."
    )
    parser.add_argument("--scores", required=True, help="The composition stage's scores.csv.")
    parser.add_argument(
        "--invariant",
        help="The composition stage's invariant.csv, whose agreement with the ablation is measured too.",
    )
    parser.add_argument(
        "--projection",
        help="The composition stage's projection.csv: its agreement with the ablation is measured too.",
    )
    parser.add_argument(
        "--channels",
        help="The composition stage's channels.csv: each discovered K pair's top channel is then cut alone.",
    )
    parser.add_argument("--tokenized", help="The tokenizer stage's directory, read when data.source = text.")
    parser.add_argument(
        "--seed", type=int, default=0, help="The seed of the evaluation batches: the training seed."
    )
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        use_threads(cfg.analysis.threads)
        keep_freed_memory()  # the ablation's large temporaries, reused
        device = str(resolve_device(cfg.analysis.device, "analysis.device"))  # before any file is read
        h = cfg.analysis.heads
        model = heads.load_model(args.model, args.config, h, cfg.data)  # its shape checked first
        hw, _ = weights.load(args.weights)
        scores = tables.read_csv(args.scores, tables.SCORES_COLUMNS, empty_ok=False)
        measured = scores  # the agreement with the ablation: of every measure given
        others = {
            measure: tables.read_csv(path, tables.INVARIANT_COLUMNS, empty_ok=False)
            for measure, path in ((tables.INVARIANT, args.invariant), (tables.PROJECTION, args.projection))
            if path
        }
        if others:
            measured = tables.join_measures(scores, others)
        channels = None  # read before the analysis: a bad file fails at once
        if args.channels:
            channels = tables.read_csv(args.channels, tables.CHANNELS_COLUMNS, empty_ok=False)
        dataset = datasets.load(  # one batch of held-out windows per ablation batch
            cfg.data,
            model.cfg,
            args.seed,
            h.eval_sequences * h.ablation_batches,
            args.tokenized,
            need_train=False,
        )
        sources = (args.model, args.weights)
        result = heads.analyse(model, hw, dataset, h, args.seed, scores, sources, device)
        summary = heads.summarize(result, measured, h.min_effect)
        checked = None
        if channels is not None:  # on the batches of the whole-path cuts in result.batches
            checked = channel_check.analyse(
                model, hw, channels, dataset, h, args.seed, result.batches, device, args.channels
            )
            summary["channel_ablation"] = channel_check.summarize(checked)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_csv(out / "heads.csv", result.table)
        io.write_csv(out / "ablation.csv", result.ablation)
        io.write_csv(out / "ablation_batches.csv", result.batches)
        if checked is not None:
            io.write_csv(out / "channel_ablation.csv", checked)
        else:  # no check this run: none of an earlier run's left beside this summary
            (out / "channel_ablation.csv").unlink(missing_ok=True)
        checkpoint.save_state(out / "patterns.safetensors", result.example, {"seed": args.seed})
        io.write_json(out / "summary.json", summary)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
