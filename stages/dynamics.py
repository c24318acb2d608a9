"""Follow composition through training: at every checkpoint train saved, compute every
composition score (five variants and the invariant measure, with baselines and z), every
head's attention scores and the held-out loss, and write composition.csv, heads.csv,
steps.tsv (one row per checkpoint) and summary.json (the pair followed, the phase change,
when each measure clears its null).

    python -m stages.dynamics --checkpoints outputs/train/seed0/checkpoints \\
        --config outputs/train/seed0/config.json --tokenized outputs/tokenizer \\
        --seed 0 --out outputs/dynamics/seed0
"""

from __future__ import annotations

import sys

from pipeline import io, params
from pipeline.behaviour import dynamics
from pipeline.cli import (
    keep_freed_memory,
    progress_mode,
    resolve_device,
    run_cli,
    showing_progress,
    stage_parser,
    use_threads,
    with_progress,
)


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.dynamics", __doc__)
    parser.add_argument(
        "--checkpoints",
        required=True,
        help="The train stage's checkpoints/ directory: index.json and the files it lists.",
    )
    parser.add_argument("--config", required=True, help="The config.json of the model they checkpoint.")
    parser.add_argument("--tokenized", help="The tokenizer stage's directory, read when data.source = text.")
    parser.add_argument(
        "--seed", type=int, default=0, help="The seed of the baselines, nulls and batches: the training seed."
    )
    parser.add_argument("--out", required=True, help="The directory to write.")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="Show no progress (else a bar on a terminal, a line per checkpoint without one, as under DVC).",
    )

    def body(args) -> None:
        cfg = params.load(args.params)
        use_threads(cfg.analysis.threads)
        keep_freed_memory()  # each checkpoint's large temporaries, reused
        device = str(resolve_device(cfg.analysis.device, "analysis.device"))  # before any file is read
        mode = progress_mode(args.no_progress)  # a bar on a terminal, a line a checkpoint under DVC

        def progress(entries):
            step = lambda e: f" (step {e['step']})"  # noqa: E731
            return with_progress(entries, f"dynamics seed {args.seed}", mode, "checkpoint", step)

        # the calls inside each checkpoint (the composition null, the path ablation): a bar of their
        # own on a terminal; under DVC the line per checkpoint is the stage's only line
        with showing_progress(None if mode == "lines" else mode):
            result = dynamics.run(
                args.checkpoints, args.config, cfg, args.seed, args.tokenized, progress, device
            )
        summary = dynamics.summarize(result, cfg.analysis.composition.fdr)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_csv(out / "composition.csv", result.composition)
        io.write_csv(out / "heads.csv", result.heads)
        io.write_csv(out / "steps.tsv", result.steps, sep="\t")
        io.write_json(out / "summary.json", summary)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
