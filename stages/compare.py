"""Compare the seeds of params.yaml: the long table of per-seed statistics (claims.csv), each
across seeds with a t interval (stats.csv), composition between role groups (groups.csv),
every head's role (roles.csv), mean training curves (curves.tsv), every verdict with its
interval and per-seed values (verdicts.json), the headline (summary.json, DVC metrics: a
verdict and a mean per claim, the training means) and figures; the claims under the
basis-invariant measure, and when each measure sees the induction circuit form (dynamics).

    python -m stages.compare --train outputs/train --composition outputs/composition \\
        --heads outputs/heads --dynamics outputs/dynamics --calibration outputs/calibration \\
        --out outputs/compare
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import io, params
from pipeline.cli import run_cli, stage_parser
from pipeline.compare import read, stats
from pipeline.present import figures
from pipeline.present.figures import compare as compare_figures


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.compare", __doc__)
    parser.add_argument(
        "--train", required=True, help="The train stage's directory, with seed<N>/metrics.json and curve.tsv."
    )
    parser.add_argument(
        "--composition", required=True, help="The composition stage's directory, with seed<N>/scores.csv."
    )
    parser.add_argument(
        "--heads", required=True, help="The heads stage's directory, with seed<N>/heads.csv and summary.json."
    )
    parser.add_argument(
        "--dynamics", required=True, help="The dynamics stage's directory, with seed<N>/steps.tsv."
    )
    parser.add_argument(
        "--calibration",
        required=True,
        help="The calibrate stage's directory, with seed<N>/calibration.json.",
    )
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        cfg = params.load(args.params)
        c = cfg.analysis.compare
        dirs = Path(args.train), Path(args.composition), Path(args.heads), Path(args.dynamics)
        for stale in read.stale_seed_dirs(dirs, cfg.seeds):
            print(
                f"note: {stale} is not in seeds {cfg.seeds}: left out (delete it to keep outputs/ tidy)",
                file=sys.stderr,
            )
        inputs = [read.read_seed(seed, *dirs, Path(args.calibration)) for seed in cfg.seeds]
        result = stats.compare(inputs, c, cfg.analysis.figures.edge_threshold, cfg.analysis.composition.fdr)
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        for name in ("claims", "stats", "groups", "roles"):
            io.write_csv(out / f"{name}.csv", getattr(result, name))
        io.write_csv(out / "curves.tsv", result.mean_curve, sep="\t")
        io.write_text(out / "verdicts.json", stats.summary_json(result.summary))
        io.write_text(out / "summary.json", stats.summary_json(result.headline))
        figs = io.ensure_dir(out / "figures")
        io.clean_stale(figs)
        claims_fig = compare_figures.claims_figure(result.claims, result.stats, c.ci)
        figures.save(claims_fig, figs / "claims", dpi=c.dpi)
        figures.save(compare_figures.roles_figure(result.claims, result.stats), figs / "roles", dpi=c.dpi)
        figures.save(
            compare_figures.curves_figure(result.curves, result.mean_curve), figs / "curves", dpi=c.dpi
        )
        timing_fig = compare_figures.timing_figure(result.claims, result.stats, c.ci)
        figures.save(timing_fig, figs / "timing", dpi=c.dpi)

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
