"""Composition through training: at every checkpoint train saved, every composition score
(five variants and the invariant measure, with baselines and z), every head's attention
scores and the held-out loss: composition.csv, heads.csv, steps.tsv (one row per
checkpoint), summary.json (the pair followed, the phase change, when each measure clears
its null).

    python -m stages.dynamics --checkpoints outputs/train/seed0/checkpoints \
        --config outputs/train/seed0/config.json --tokenized outputs/tokenizer \
        --seed 0 --out outputs/dynamics/seed0
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from pipeline import checkpoint, data, dynamics, heads, io, memory, params, tl_checkpoint
from pipeline.cli import run_cli, stage_parser


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.dynamics", __doc__)
    parser.add_argument("--checkpoints", required=True, help="train's checkpoints/ (index.json and files)")
    parser.add_argument("--config", required=True, help="config.json of the model they checkpoint")
    parser.add_argument("--tokenized", help="the tokenizer stage's directory (data.source = text)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the baselines, nulls and batches (the training seed)"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    def body(args) -> None:
        cfg = params.load(args.params)
        h = cfg.analysis.heads
        entries = checkpoint.read_index(args.checkpoints)
        shape = tl_checkpoint.read_tl_config(args.config)  # before anything is read whole or allocated
        heads.require_lengths_fit(shape.n_ctx, h)
        memory.require_fits(memory.heads_stage(shape, h, cfg.data, args.config), memory.available_bytes())
        dataset = data.load(cfg.data, shape, args.seed, h.eval_sequences, args.tokenized, need_train=False)
        repeated = data.repeated_probe(dataset, h.eval_sequences, h.repeat_length, shape.d_vocab, args.seed)
        show = not args.no_progress and sys.stderr.isatty()
        bar = (lambda xs: tqdm(xs, desc=f"dynamics seed {args.seed}", unit="checkpoint")) if show else None
        result = dynamics.analyse(
            entries, args.checkpoints, args.config, repeated, dataset.eval, cfg, args.seed, bar
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
