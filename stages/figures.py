"""Draw one seed's figures (PNG and SVG): the errata diagram, original and corrected side by
side, and a heatmap of score minus baseline per composition kind; with the heads stage's
outputs, every head's attention pattern titled with its role, copying vs QK positivity,
and the path-ablation effects against each composition variant; with the dynamics stage's
outputs, composition through training (dynamics); with the composition stage's channel
tables, each discovered pair's shares by writer x reader channel (channels, and channels.json:
the counts the report's caption gives).

    python -m stages.figures --scores outputs/composition/seed0/scores.csv \\
        --heads outputs/heads/seed0/heads.csv --ablation outputs/heads/seed0/ablation.csv \\
        --heads-summary outputs/heads/seed0/summary.json \\
        --patterns outputs/heads/seed0/patterns.safetensors \\
        --dynamics outputs/dynamics/seed0 --channels outputs/composition/seed0/channels.csv \\
        --channel-shares outputs/composition/seed0/channels.safetensors --out outputs/figures/seed0
"""

from __future__ import annotations

import sys

from pipeline import io, params, tables
from pipeline.cli import run_cli, stage_parser
from pipeline.errors import UserError
from pipeline.present import figures
from pipeline.present.figures import channels as channel_figures
from pipeline.present.figures import composition as composition_figures
from pipeline.present.figures import dynamics as dynamics_figures
from pipeline.present.figures import heads as heads_figures

FIGURE_EFFECTS = {
    "heldout_loss_effect": "heldout_loss",
    "loss_effect": "loss",
    "attn_effect": "attn",
    "pattern_effect": "pattern",
}


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("python -m stages.figures", __doc__)
    parser.add_argument("--scores", required=True, help="The composition stage's scores.csv.")
    parser.add_argument("--heads", help="The heads stage's heads.csv, which labels the heads by role.")
    parser.add_argument("--ablation", help="The heads stage's ablation.csv.")
    parser.add_argument(
        "--heads-summary", help="The heads stage's summary.json, with the Spearman correlations."
    )
    parser.add_argument("--patterns", help="The heads stage's patterns.safetensors.")
    parser.add_argument(
        "--dynamics", help="The dynamics stage's directory of this seed, with steps.tsv and summary.json."
    )
    parser.add_argument(
        "--channels", help="The composition stage's channels.csv, given with --channel-shares."
    )
    parser.add_argument(
        "--channel-shares", help="The composition stage's channels.safetensors, given with --channels."
    )
    parser.add_argument("--out", required=True, help="The directory to write.")

    def body(args) -> None:
        analysis = params.load(args.params).analysis
        cfg = analysis.figures
        # every input is read (and checked) before anything is written
        scores = tables.read_csv(args.scores, tables.SCORES_COLUMNS, empty_ok=False)
        heads = (
            tables.read_csv(args.heads, ("layer", "head", "role", "copying", "qk_positivity"), empty_ok=False)
            if args.heads
            else None
        )
        pattern = (
            heads_figures.read_example(args.patterns) if args.heads and args.patterns else None
        )  # [layer, head, pos, pos]
        effects = (
            tables.read_csv(args.ablation, tables.ABLATION_COLUMNS, empty_ok=False) if args.ablation else None
        )
        summary = io.read_json(args.heads_summary) if args.heads_summary else {}
        rhos = heads_figures.spearman_of(summary, str(args.heads_summary))
        if args.dynamics:
            steps = tables.read_csv(
                f"{args.dynamics}/steps.tsv", tables.STEPS_COLUMNS, sep="\t", empty_ok=False
            )
            pair, fdr = dynamics_figures.read_summary(f"{args.dynamics}/summary.json")
        if bool(args.channels) != bool(args.channel_shares):  # the table names the pairs, the file holds them
            raise UserError("--channels, --channel-shares", "give both or neither")
        if args.channels:
            channels = tables.read_csv(args.channels, tables.CHANNELS_COLUMNS, empty_ok=False)
            shares = channel_figures.read_shares(args.channel_shares)
            picked = channel_figures.discovered(channels, shares, scores, source=str(args.channel_shares))
        out = io.ensure_dir(args.out)
        io.clean_stale(out)
        diagram = composition_figures.errata_diagram(
            scores,
            cfg.edges,
            cfg.edge_z,
            cfg.edge_threshold,
            heads,
            (cfg.errata_variant, "true"),
            analysis.composition.fdr,
        )
        figures.save(diagram, out / "errata_diagram", dpi=cfg.dpi)
        if scores["dst_layer"].max() >= 2:  # more than one layer pair
            variants = (cfg.errata_variant, "true")
            fig = composition_figures.discoveries_map(scores, variants)
            figures.save(fig, out / "discoveries_map", dpi=cfg.dpi)
        for kind in composition_figures.KINDS:
            figures.save(
                composition_figures.composition_heatmap(scores, kind),
                out / f"composition_{kind}",
                dpi=cfg.dpi,
            )
        if heads is not None:
            figures.save(heads_figures.copying_vs_qk(heads), out / "copying_vs_qk", dpi=cfg.dpi)
            if pattern is not None:  # pos = 1 + 2 x span
                fig = heads_figures.attention_patterns(pattern, heads, (pattern.shape[-1] - 1) // 2)
                figures.save(fig, out / "attention_patterns", dpi=cfg.dpi)
        if effects is not None:
            for effect, name in FIGURE_EFFECTS.items():
                kinds = ("Q", "K") if effect == "attn_effect" else ("Q", "K", "V")  # V cannot move a pattern
                fig = heads_figures.ablation_vs_composition(effects, scores, effect, rhos.get(effect), kinds)
                figures.save(fig, out / f"ablation_{name}", dpi=cfg.dpi)
        if args.dynamics:
            fig = dynamics_figures.dynamics_figure(steps, pair, fdr)
            figures.save(fig, out / "dynamics", dpi=cfg.dpi)
        if args.channels:
            figures.save(channel_figures.channel_maps(picked, shares), out / "channels", dpi=cfg.dpi)
            io.write_json(out / "channels.json", picked.facts())

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
