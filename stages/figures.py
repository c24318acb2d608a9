"""Figures of one seed (PNG and SVG): the errata diagram, original and corrected side by
side, and a heatmap of score minus baseline per composition kind.

    python -m stages.figures --scores outputs/composition/seed0/scores.csv \
        --heads outputs/heads/seed0/heads.csv --out outputs/figures/seed0
"""

from __future__ import annotations

import sys

from pipeline import figures, io, params, tables
from pipeline.cli import run_cli, stage_parser
from pipeline.figures import composition as composition_figures


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.figures", __doc__)
    parser.add_argument("--scores", required=True, help="scores.csv of the composition stage")
    parser.add_argument("--heads", help="heads.csv of the heads stage (labels heads by role)")
    parser.add_argument("--out", required=True, help="output directory")

    def body(args) -> None:
        cfg = params.load(args.params).analysis.figures
        scores = tables.read_csv(args.scores, tables.SCORES_COLUMNS)
        roles = tables.read_csv(args.heads, ("layer", "head")) if args.heads else None
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        diagram = composition_figures.errata_diagram(scores, cfg.edge_threshold, roles, (cfg.errata_variant, "true"))
        figures.save(diagram, out / "errata_diagram", dpi=cfg.dpi)
        for kind in composition_figures.KINDS:
            figures.save(composition_figures.composition_heatmap(scores, kind), out / f"composition_{kind}", dpi=cfg.dpi)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
