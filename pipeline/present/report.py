"""One self-contained HTML page: the claims with their intervals, the cross-seed table,
every figure of every seed, the roles and composition tables, the config and the
environment. Images are embedded as data: URIs and the style is inline; the page has no
script and no link, so it reads the same offline, from a mail attachment or a USB stick.

`render` is pure (tables and bytes in, text out). `environment` describes the machine
and commit building the page; it is the only part that is not a function of the
pipeline's outputs and config (see ENVIRONMENT_NOTE).
"""

from __future__ import annotations

import base64
import html
import importlib.metadata
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline import io
from pipeline.compare.claims import CLAIMS, HYPOTHESIS_LABELS, PRIMARY_EFFECT, STATISTICS
from pipeline.errors import UserError
from pipeline.tables import CAUSAL_THRESHOLDS, DIMENSIONS, KINDS, MEASURES, threshold_key

MIME = {
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
PACKAGES = (
    "torch",
    "numpy",
    "pandas",
    "scipy",
    "matplotlib",
    "hydra-core",
    "omegaconf",
    "dvc",
    "safetensors",
    "transformer-lens",
)
ENVIRONMENT_NOTE = (
    "This table describes the machine and the git commit that built this page, not necessarily those "
    "that trained the models (DVC rebuilds the page only when its inputs change, and may restore it "
    "from its cache). It is the only part of the page that depends on the machine; nothing on the page "
    "records the time, so the same outputs, config, commit and machine give the same bytes."
)
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 1.5em auto; \
padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: .2em .5em; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
figure { margin: .5em 0 1.2em; } figcaption { font-size: .85em; color: #555; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
.scroll { overflow-x: auto; max-width: 100%; }
.holds { color: #1a7f37; font-weight: bold; } .fails { color: #cf222e; font-weight: bold; }
.uncalibrated { color: #6e7781; font-style: italic; }
.inconclusive, .untestable { color: #9a6700; font-weight: bold; }
.note { font-size: .9em; color: #555; }
"""


@dataclass
class Image:
    name: str  # shown as the caption and the alt text
    data: bytes
    mime: str
    caption: str = ""  # what the figure shows, after its name (`CAPTIONS`)

    def uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def channels_caption(facts: Mapping) -> str:
    """The channel figure's caption, from the counts the figures stage wrote beside it
    (pipeline/present/figures/channels.py, `Discovered.facts`)."""
    found = facts["discovered"]
    total = sum(found.values())
    if not total:
        return "No pair's corrected score is a discovery in this seed, so there is no channel table to show."
    counts = ", ".join(f"{k} {found[k]}" for k in ("K", "Q", "V") if k in found)
    left = facts["left_out"]
    shown = f"all {total}" if not left else f"{facts['shown']} of the {total}"
    leftover = f"; the {left} with the lowest calibrated z are left out" if left else ""
    d, n = facts["d_head"], facts["channels_shown"]
    view = f" (all {d})" if n == d else f" (the leading {n} of {d}, widened to every panel's top channel)"
    return (
        f"Where each discovered pair composes: {shown} pairs whose corrected score is a discovery "
        f"({counts}){leftover}, one heat map each. Rows: the writer's channels i, the singular directions "
        "of its OV circuit; columns: the reader's channels j, the singular directions along which its "
        "query (Q), key (K) or value (V) input reads the residual stream; both strongest first"
        f"{view}. Share (i, j) is the fraction of the pair's squared corrected numerator "
        "||OV^a N^b||^2 carried by writer channel i into reader channel j, s_i^2 t_j^2 (w_i . k_j)^2 "
        "over its sum: the shares are non-negative and sum to 1, so every panel has one colour scale, "
        "0 to 1. Each panel names its top channel (i, j) and share and its effective number of channels "
        "(1 / sum of squared shares: 1 when one channel carries it all). A star and a red frame: a "
        f"channel discovery ({facts['channel_discoveries']} shown), a pair that composes mainly through "
        "its top channel (its top share against a randomly rotated reader, FDR-controlled)."
    )


# image stem -> its caption, from `<stem>.json` beside the image (the figures stage writes it)
CAPTIONS = {"channels": channels_caption}
# images drawn right after another, whose subject they continue (else: by name)
FOLLOWS = {"channels": "errata_diagram"}


def _ordered(images: list[Image]) -> list[Image]:
    """By name, except that an image of FOLLOWS comes right after the one it follows."""
    stems = [Path(img.name).stem for img in images]
    out = [img for img, stem in zip(images, stems, strict=True) if FOLLOWS.get(stem) not in stems]
    for img, stem in zip(images, stems, strict=True):
        if FOLLOWS.get(stem) in stems:
            after = next(i for i, o in enumerate(out) if Path(o.name).stem == FOLLOWS[stem])
            out.insert(after + 1, img)
    return out


def read_images(directory: Path) -> list[Image]:
    """Every image in `directory`, sorted by name (FOLLOWS aside); an SVG only where no PNG of the
    same name exists; captioned by CAPTIONS where its `<stem>.json` is there."""
    if not directory.is_dir():
        raise UserError(str(directory), "figure directory not found")
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in MIME)
    pngs = {p.stem for p in files if p.suffix.lower() == ".png"}
    images = []
    for p in files:
        if p.suffix.lower() == ".svg" and p.stem in pngs:
            continue
        caption, facts = "", p.with_suffix(".json")
        if p.stem in CAPTIONS and facts.is_file():
            try:
                caption = CAPTIONS[p.stem](io.read_json(facts))
            except (KeyError, TypeError, AttributeError) as e:
                raise UserError(str(facts), f"not the figures stage's facts of {p.name} ({e!r})") from None
        images.append(Image(p.name, p.read_bytes(), MIME[p.suffix.lower()], caption))
    return _ordered(images)


def environment(train_threads: int | None, cwd: str | Path = ".") -> dict[str, str]:
    """Versions, threads and git revision of the process building the report.

    Versions come from package metadata: nothing is imported (torch alone takes seconds).
    """
    env = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            env[name] = "not installed"
    env["platform"] = f"{platform.system()} {platform.machine()}"
    visible = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    env["cpus (visible / total)"] = f"{visible} / {os.cpu_count()}"
    env["torch threads (train.threads)"] = (
        str(train_threads) if train_threads else "torch's default (one per physical core)"
    )
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # they change torch's default
        env[var] = os.environ.get(var, "unset")
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=30
        )
        env["git revision"] = rev.stdout.strip() if rev.returncode == 0 else "unknown (not a git checkout)"
    except (OSError, subprocess.TimeoutExpired):
        env["git revision"] = "unknown (git not available)"
    return env


# --- rendering -----------------------------------------------------------------------


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value))


def _number(value, decimals: int | None = None) -> str:
    """A number to `decimals` places, else to three significant digits; a dash when missing."""
    if _missing(value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{decimals}f}" if decimals is not None else f"{value:.3g}"
    return str(value)


def decimals(lo, hi) -> int | None:
    """The places an interval supports: its width to two significant digits (0.21 wide: two
    places, "0.63 [0.55, 0.76]"); None (three significant digits) when there is no width."""
    if _missing(lo) or _missing(hi) or not hi > lo:
        return None
    return max(0, 1 - math.floor(math.log10(hi - lo)))


def interval(mean, lo, hi) -> str:
    """ "0.63 [0.55, 0.76]": the mean and its interval, rounded to what the interval supports."""
    places = decimals(lo, hi)
    if _missing(lo) or _missing(hi):
        return _number(mean)
    return f"{_number(mean, places)} [{_number(lo, places)}, {_number(hi, places)}]"


def table(frame: pd.DataFrame) -> str:
    """An HTML table that scrolls sideways inside the page when wider than it; numbers to three
    significant digits (rows with an interval are rounded before, `cross_seed_table`)."""
    html_table = frame.to_html(index=False, border=0, na_rep="–", float_format=_number, escape=True)
    return f'<div class="scroll">{html_table}</div>'


def figure(image: Image) -> str:
    name = html.escape(image.name)
    caption = f"<strong>{name}</strong>: {html.escape(image.caption)}" if image.caption else name
    return f'<figure><img src="{image.uri()}" alt="{name}"><figcaption>{caption}</figcaption></figure>'


def _interval(stat: Mapping) -> str:
    if not stat.get("seeds_tested"):
        return "–"
    if stat.get("lo") is None:
        return f"{_number(stat.get('mean'))} (no interval: fewer than two seeds)"
    return interval(stat["mean"], stat["lo"], stat["hi"])


def claims_table(summary: Mapping, ci: float) -> str:
    """A row per claim and denominator hypothesis: statement, statistic, threshold, verdict."""
    rows = []
    for name, claim in CLAIMS.items():
        for hypothesis, s in summary["claims"][name].items():
            v = html.escape(s["verdict"])
            places = decimals(s.get("lo"), s.get("hi"))
            per_seed = ", ".join(_number(x, places) for x in s.get("per_seed", {}).values())
            rows.append(
                f"<tr><td>({name})</td><td>{html.escape(claim.statement)}</td>"
                f"<td>{html.escape(HYPOTHESIS_LABELS[hypothesis])}</td>"
                f"<td>{html.escape(claim.statistic)}</td>"
                f"<td>&gt; {_number(s['threshold'])}</td>"
                f"<td>{html.escape(per_seed)}</td>"
                f"<td>{s['seeds_holding']} / {s.get('seeds_failing', 0)} / {s['seeds_tested']}</td>"
                f'<td>{html.escape(_interval(s))}</td><td class="{v}">{v}</td></tr>'
            )
    head = (
        "<tr><th>claim</th><th>statement</th><th>denominators or rotation</th><th>statistic (per seed)</th>"
        "<th>holds when</th><th>per seed</th>"
        f"<th>seeds above / below / tested</th><th>mean [{ci:.0%} t interval]</th><th>verdict</th></tr>"
    )
    return f'<div class="scroll"><table>{head}{"".join(rows)}</table></div>'


def _claim_c_cell(c: pd.DataFrame, statistic: str, effect: str, variant: str = "-") -> str:
    """One statistic of claim (c)'s K rows across seeds: mean [t interval], or "–"."""
    row = c[(c["statistic"] == statistic) & (c["effect"] == effect) & (c["variant"] == variant)]
    if row.empty or pd.isna(row["mean"].iloc[0]):
        return "–"
    r = row.iloc[0]
    return interval(r["mean"], r["lo"], r["hi"])


def ranking_table(stats: pd.DataFrame) -> str:
    """Claim (c): per effect and measure, the mean PR-AUC and ROC-AUC of the K scores as rankings of
    the causal edges, with the number of causal edges and PR-AUC's chance level, and the role-only
    ranker's PR-AUC after each effect's measures (the baseline a score must beat)."""
    c = stats[(stats["claim"] == "c") & (stats["kind"] == "K")]
    if c.empty:
        return "<p>No ablation.</p>"

    rows = []
    for effect in dict.fromkeys(c["effect"]):
        edges = {
            "causal edges": _claim_c_cell(c, "causal_edges", effect),
            "chance (causal fraction)": _claim_c_cell(c, "causal_fraction", effect),
        }
        for v in MEASURES:
            rows.append({
                "effect": effect, "measure": v, **edges, "PR-AUC": _claim_c_cell(c, "pr_auc", effect, v),
                "ROC-AUC": _claim_c_cell(c, "roc_auc", effect, v),
            })  # fmt: skip
        rows.append({"effect": effect, "measure": "role-only baseline", **edges,
                     "PR-AUC": _claim_c_cell(c, "role_pr_auc", effect), "ROC-AUC": "–"})  # fmt: skip
    return table(pd.DataFrame(rows))


def threshold_table(stats: pd.DataFrame) -> str:
    """Claim (c) at each of CAUSAL_THRESHOLDS (the effects cut there): per threshold, the causal K
    edges, the role-only ranker's PR-AUC and each measure's; empty when no effect was cut."""
    c = stats[(stats["claim"] == "c") & (stats["kind"] == "K")]
    rows = []
    for effect in dict.fromkeys(c["effect"]):
        for t in CAUSAL_THRESHOLDS:
            key = threshold_key(t)
            if not ((c["statistic"] == f"causal_edges_at_{key}") & (c["effect"] == effect)).any():
                continue
            rows.append({
                "effect": effect, "causal when the effect reaches": key,
                "causal edges": _claim_c_cell(c, f"causal_edges_at_{key}", effect),
                "role-only baseline": _claim_c_cell(c, f"role_pr_auc_at_{key}", effect),
                **{v: _claim_c_cell(c, f"pr_auc_at_{key}", effect, v) for v in MEASURES},
            })  # fmt: skip
    return table(pd.DataFrame(rows)) if rows else ""


def describe(claim: str, statistic: str) -> str:
    """What a statistic of the long table is, in words."""
    if claim in CLAIMS and statistic == claim:
        return f"claim ({claim}): {CLAIMS[claim].statistic}"
    if claim == "roles":
        return "heads with this role"
    if claim == "training":
        return "final value of training (metrics.json)"
    return STATISTICS.get(statistic, "")


def composition_table(groups: pd.DataFrame) -> str:
    """Max excess per role-group pair (rows) and kind x variant (columns), with the pair count."""
    if groups.empty:
        return "<p>No head pairs.</p>"
    wide = groups.pivot_table(
        index=["dst_role", "src_role"],
        columns=["kind", "variant"],
        values="max_excess",
        sort=False,
        dropna=False,
    )
    wide = wide.reindex(columns=[(k, v) for k in KINDS for v in MEASURES if (k, v) in wide.columns])
    wide.columns = [f"{k} {v}" for k, v in wide.columns]
    n_pairs = groups.drop_duplicates(["dst_role", "src_role"]).set_index(["dst_role", "src_role"])["n_pairs"]
    wide.insert(0, "pairs", n_pairs.reindex(wide.index).astype(int))
    wide.index = [f"{dst} <- {src}" for dst, src in wide.index]
    return table(wide.rename_axis("later <- earlier").reset_index())


def cross_seed_table(claims: pd.DataFrame, stats: pd.DataFrame) -> str:
    """A row per statistic of the long table: its dimensions, what it is, its value in each
    seed, then n, mean, lo and hi across seeds (a pivot of claims.csv, joined to stats.csv)."""
    dims = list(DIMENSIONS)
    # Not pivot_table(dropna=False): over six index levels it emits every combination of their
    # values (125,000 rows for 200 statistics), most of them empty. Rows keep claims.csv's order.
    order = claims.drop_duplicates(dims).set_index(dims).index
    wide = claims.set_index([*dims, "seed"])["value"].unstack("seed").reindex(order)
    wide = wide[list(claims["seed"].unique())]
    wide.columns = [f"seed {s}" for s in wide.columns]
    joined = wide.join(stats.set_index(dims)[["n", "mean", "lo", "hi"]]).reset_index()
    numbers = [*wide.columns, "mean", "lo", "hi"]  # each row to the places its interval supports
    places = [decimals(lo, hi) for lo, hi in zip(joined["lo"], joined["hi"], strict=True)]
    joined = joined.astype({c: object for c in numbers})
    joined[numbers] = [
        [_number(v, p) for v in row]
        for row, p in zip(joined[numbers].itertuples(index=False), places, strict=True)
    ]
    joined.insert(
        len(dims),
        "meaning",
        [describe(c, s) for c, s in zip(joined["claim"], joined["statistic"], strict=True)],
    )
    return table(joined)


def render(
    title: str,
    config_text: str,
    env: Mapping[str, str],
    summary: Mapping,
    ci: float,
    stats: pd.DataFrame,
    claims: pd.DataFrame,
    roles: pd.DataFrame,
    groups: pd.DataFrame,
    compare_images: Sequence[Image],
    seed_images: Mapping[int, Sequence[Image]],
) -> str:
    """The whole page. Seeds appear in the order of `seed_images`."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(seed_images)} seed(s): {', '.join(map(str, seed_images))}. Composition is measured as "
        "score minus the random-matrix baseline of its variant (<em>excess</em>); heads are compared across "
        "seeds through their roles, not their indices. <em>true</em> is the corrected score; "
        "<em>errata_bcda</em> and <em>errata_dabc</em> are the two rotated strands the errata says the "
        "original library computed, with rotated denominators; the <em>_trueden</em> variants divide the "
        "same numerators by the true ones. The errata names only the numerators, so claims that depend on "
        "the original score's scale are tested under both hypotheses. <em>invariant</em> is composition "
        "measured in the frame where the residual stream's token paths are white: unlike every Frobenius "
        "score it does not change when the residual basis does (claims <em>_inv</em> put it in the "
        "corrected score's place). Claim (t) follows composition through training: at every checkpoint, "
        "when each measure's K-composition of the top induction &lt;- previous-token pair becomes a "
        "discovery, "
        "against the step at which induction reaches 0.5 (each seed's <em>dynamics</em> figure).</p>",
        '<h2 id="claims">The errata\'s claims</h2>',
        claims_table(summary, ci),
        f'<p class="note">Intervals: {ci:.0%} Student t interval of the mean over seeds (valid for a '
        f"handful of seeds). Verdict: {html.escape(summary.get('rule', ''))}; <em>untestable</em> when no "
        "seed has the heads the claim needs. A pair counts as composing when it is a <em>discovery</em>: "
        "Benjamini-Hochberg at the configured FDR against the model's own empirical null (its raw z "
        "standardised by its block's median and MAD, tested against the pairs that cannot compose).</p>",
        '<h3 id="causal">(c) Which score ranks the causal edges</h3>',
        "<p>The path ablation runs on disjoint held-out batches; an edge is causal when its mean effect "
        "reaches analysis.heads.min_effect and exceeds its batch-to-batch spread (one-sided t test, 5%). "
        f"Claim (c) reads <em>{PRIMARY_EFFECT}</em>: how far cutting the edge moves the later head's "
        "attention pattern on held-out text (total variation, mean over query positions), whatever the "
        "head's role; the probe's induction score (attn_effect) counts only composition that serves "
        "induction. Each score ranks every K pair; PR-AUC's chance level is the fraction of causal "
        "edges; the role-only baseline ranks the pairs by the heads' roles alone (previous-token or "
        "recent-window into induction first, then pairs of named roles). Mean over "
        f"seeds [{ci:.0%} t interval].</p>",
        ranking_table(stats),
    ]
    thresholds = threshold_table(stats)
    if thresholds:
        parts += [
            "<p>The same, an edge causal from each threshold of its effect on (and beyond its noise): "
            "the causal edges, the role-only baseline's PR-AUC and each measure's.</p>",
            thresholds,
        ]
    parts += [figure(img) for img in compare_images]
    parts += [
        '<h2 id="across-seeds">Across seeds</h2>',
        f"<p>Every per-seed statistic (claims.csv, one long table), then its mean and {ci:.0%} interval "
        "over seeds (stats.csv; n: seeds where it is defined). '-': the dimension does not apply.</p>",
        cross_seed_table(claims, stats),
    ]
    for seed, images in seed_images.items():
        parts.append(f'<h2 id="seed{seed}">Seed {seed}</h2>')
        parts += [figure(img) for img in images]
        parts.append("<h3>Head roles</h3>")
        parts.append(table(roles[roles["seed"] == seed].drop(columns="seed")))
        parts.append("<h3>Composition between role groups (max excess over the group's head pairs)</h3>")
        parts.append(composition_table(groups[groups["seed"] == seed]))
    parts += [
        '<h2 id="config">Config (params.yaml)</h2>',
        f"<pre>{html.escape(config_text)}</pre>",
        '<h2 id="environment">Environment</h2>',
        table(pd.DataFrame(list(env.items()), columns=["", "value"])),
        f'<p class="note">{html.escape(ENVIRONMENT_NOTE)}</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
