"""Record where one seed's model comes from: origin.json ({"source": "train"}, or the
checkpoint and its config.json with sha256, for train.source = load).

    python -m stages.origin --seed 0 --out outputs/origin/seed0
"""

from __future__ import annotations

import sys

from pipeline import config, io, params
from pipeline.cli import run_cli, stage_parser
from pipeline.model import origin


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.origin", __doc__)
    parser.add_argument(
        "--seed", type=int, required=True, help="The seed, which replaces '{seed}' in train.checkpoint."
    )
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        chosen = origin.choose(cfg.train, args.seed)
        for line in config.notes(cfg, "train"):  # a checkpoint named while training from scratch
            print(line, file=sys.stderr)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        io.write_json(out / "origin.json", chosen)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
