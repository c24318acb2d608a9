"""Write the offline report: one self-contained HTML page (images embedded, no network).

    python -m stages.report --compare outputs/compare --figures outputs/figures \\
        --out outputs/report/index.html

Shows the seeds listed in params.yaml: a table of contents, the verdicts on the claims, the
compare stage's tables and figures, each seed's images under `<figures>/seed<N>/` (its errata
diagram first, each with its caption from the module that draws it), every statistic
across seeds (folded), the config and the environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import io, params
from pipeline.cli import run_cli, stage_parser
from pipeline.present import environment, report
from pipeline.tables import CLAIMS_COLUMNS, GROUP_COLUMNS, STATS_COLUMNS, read_csv


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.report", __doc__)
    parser.add_argument(
        "--compare",
        required=True,
        help="The compare stage's directory: its tables, verdicts.json and figures/.",
    )
    parser.add_argument(
        "--figures", required=True, help="The figures stage's directory, with seed<N>/*.png and *.svg."
    )
    parser.add_argument("--out", required=True, help="The HTML file to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        c = Path(args.compare)
        page = report.render(
            title=cfg.analysis.report.title,
            config_text=Path(args.params).read_text(),
            env=environment.environment(cfg.train.threads),
            summary=io.read_json(c / "verdicts.json"),
            ci=cfg.analysis.compare.ci,
            stats=read_csv(c / "stats.csv", STATS_COLUMNS),
            claims=read_csv(c / "claims.csv", CLAIMS_COLUMNS),
            roles=read_csv(c / "roles.csv", ["seed", "layer", "head", "role"]),
            groups=read_csv(c / "groups.csv", ["seed", *GROUP_COLUMNS]),
            compare_images=report.read_images(c / "figures"),
            seed_images={seed: report.read_images(Path(args.figures) / f"seed{seed}") for seed in cfg.seeds},
        )
        io.write_text(args.out, page)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
