"""Figures of one seed: a composition heatmap per kind (PNG and SVG).

    python -m stages.figures --scores outputs/composition/seed0/scores.csv --out outputs/figures/seed0
"""

from __future__ import annotations

import sys

import pandas as pd

from pipeline import figures, io, params
from pipeline.figures import composition as composition_figures
from pipeline.cli import run_cli, stage_parser
from pipeline.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.figures", __doc__)
    parser.add_argument("--scores", required=True, help="scores.csv of the composition stage")
    parser.add_argument("--out", required=True, help="output directory")

    def body(args) -> None:
        cfg = params.load(args.params).analysis.figures
        try:
            scores = pd.read_csv(args.scores)
        except (OSError, pd.errors.ParserError) as e:
            raise UserError(args.scores, f"cannot read scores ({e})") from None
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        for kind in composition_figures.KINDS:
            figures.save(composition_figures.composition_heatmap(scores, kind), out / f"composition_{kind}", dpi=cfg.dpi)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
