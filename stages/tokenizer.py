"""Train the BPE tokenizer on the training part of the text and encode all of it:
tokenizer.json, tokens.npy, manifest.json (data.source = text; otherwise a manifest
that says the stage is unused, and empty files).

    python -m stages.tokenizer --out outputs/tokenizer
"""

from __future__ import annotations

import sys

import numpy as np

from pipeline import config, io, params
from pipeline.cli import run_cli, stage_parser
from pipeline.data import tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.tokenizer", __doc__)
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        result, manifest = tokenizer.from_config(cfg.data, cfg.model.n_ctx)
        for line in config.notes(cfg, "data"):  # a pretrained tokenizer named for data it never reads
            print(line, file=sys.stderr)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        tokens = result.tokens if result else np.zeros(0, dtype=np.uint16)
        io.write_npy(out / "tokens.npy", tokens)
        io.write_text(out / "tokenizer.json", result.tokenizer_json if result else "null\n")
        io.write_json(out / "manifest.json", manifest)
        if result:
            print(f"tokenizer: {result.vocab} tokens; {manifest['train_tokens']} training and "
                  f"{manifest['eval_tokens']} held-out tokens", file=sys.stderr)  # fmt: skip

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
