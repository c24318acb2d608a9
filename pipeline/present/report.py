"""Renders the report page from the compare stage's tables and the figures.

One self-contained HTML page that leads with the answer: a line per claim with its verdict and the
first seed's errata diagram, then a table of contents, the verdicts, the run's calibration, claim
(c)'s comparison, then each seed with its errata diagram first; the long tables (every statistic
across seeds, each seed's roles and role groups, the config) fold away in <details>. Its words about
the method are read from where the method is computed (the claims' registry,
significance.DESCRIPTION, the measures' MEASURE_WORDS, the figure modules' CAPTIONS, the verdict and
calibration rules), never typed here. Images are embedded as data: URIs and the style is inline; the
page has no script and no link outside itself, so it reads the same offline, from a mail attachment
or a USB stick.

Numbers are printed in each statistic's one format (`compare.formats.Formats`: its decimals
from its scale, every interval clipped to the statistic's range). Every figure has a caption and
an alt text that say what it shows (`captions`: the figure modules' CAPTIONS).

`render` is pure (tables and bytes in, text out); the environment table it is given
(`present.environment`) is the only part that is not a function of the pipeline's outputs and
config.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import io
from ..circuits import significance
from ..compare import calibration
from ..compare.claims import CLAIMS, HYPOTHESIS_LABELS, NONE, STATISTICS
from ..compare.formats import CLIPPING, Format, Formats, fixed, missing, places
from ..compare.stats import VERDICT_WORDS
from ..errors import UserError
from ..tables import CAUSAL_THRESHOLDS, DIMENSIONS, KINDS, MEASURE_WORDS, MEASURES, threshold_key
from .environment import ENVIRONMENT_NOTE
from .figures import Caption
from .figures import channels as channel_figures
from .figures import compare as compare_figures
from .figures import composition as composition_figures
from .figures import dynamics as dynamics_figures
from .figures import heads as heads_figures

MIME = {
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 1.5em auto; \
padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
nav { background: #f7f7f7; padding: .4em 1em .6em; margin: 1em 0; }
nav h2 { border: 0; margin: .3em 0; font-size: 1.1em; } nav ol { margin: 0; padding-left: 1.4em; }
nav li { margin: .15em 0; } nav .figures { font-size: .9em; color: #555; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: .2em .5em; text-align: left; vertical-align: top; \
font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; } td.num, th.num { text-align: right; } td.iv { white-space: nowrap; }
figure { margin: .5em 0 1.8em; } figcaption { font-size: .85em; color: #444; max-width: 60em; }
figcaption .file { color: #888; font-family: monospace; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
details { margin: .5em 0 1em; } summary { cursor: pointer; font-weight: 600; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
.scroll { overflow-x: auto; max-width: 100%; }
.holds { color: #1a7f37; font-weight: bold; } .fails { color: #cf222e; font-weight: bold; }
.uncalibrated { color: #6e7781; font-style: italic; }
.inconclusive, .untestable { color: #9a6700; font-weight: bold; }
.absent { color: #0550ae; font-weight: bold; }
.note { font-size: .9em; color: #555; }
"""


# --- figures and their captions ------------------------------------------------------


def captions() -> dict[str, Caption]:
    """Image stem -> its caption, from the module that draws it (read when the page is built); a
    stem not here is captioned by `_uncaptioned`, which says so."""
    return {
        **compare_figures.CAPTIONS,
        **composition_figures.CAPTIONS,
        **channel_figures.CAPTIONS,
        **dynamics_figures.CAPTIONS,
        **heads_figures.CAPTIONS,
    }


# the order figures are shown in: the answer first (the claims; each seed's errata diagram and its
# channels), the dense scatter grids last; a stem not here follows, by name
ORDER = (
    "claims", "timing", "curves", "roles",
    "errata_diagram", "discoveries_map", "channels", "dynamics",
    "composition_K", "composition_Q", "composition_V",
    "attention_patterns", "copying_vs_qk",
    "ablation_pattern", "ablation_attn", "ablation_loss", "ablation_heldout_loss",
)  # fmt: skip


@dataclass
class Image:
    name: str  # the file's name, shown small after the caption
    data: bytes
    mime: str
    caption: Caption

    @property
    def stem(self) -> str:
        return Path(self.name).stem

    def uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


# image stem -> its caption's text, from `<stem>.json` beside the image (the figures stage writes it)
FACTS = {"channels": channel_figures.caption}


def _uncaptioned(stem: str) -> Caption:
    """A figure no one has described yet: said on the page, so that it gets a caption."""
    words = stem.replace("_", " ")
    return Caption(
        words, f"Figure: {words}", "No caption yet (add one to the CAPTIONS of the module that draws it)."
    )


def _rank(stem: str) -> tuple[int, str]:
    return (ORDER.index(stem) if stem in ORDER else len(ORDER), stem)


def read_images(directory: Path) -> list[Image]:
    """Every image in `directory`, in ORDER (then by name); an SVG only where no PNG of the same
    name exists; captioned by `captions`, with FACTS' text where its `<stem>.json` is there."""
    if not directory.is_dir():
        raise UserError(str(directory), "figure directory not found")
    files = sorted(
        (p for p in directory.iterdir() if p.suffix.lower() in MIME), key=lambda p: (_rank(p.stem), p.name)
    )
    pngs = {p.stem for p in files if p.suffix.lower() == ".png"}
    images = []
    for p in files:
        if p.suffix.lower() == ".svg" and p.stem in pngs:
            continue
        caption, facts = captions().get(p.stem) or _uncaptioned(p.stem), p.with_suffix(".json")
        if p.stem in FACTS and facts.is_file():
            try:
                text = FACTS[p.stem](io.read_json(facts))
            except (KeyError, TypeError, AttributeError) as e:
                raise UserError(str(facts), f"not the figures stage's facts of {p.name} ({e!r})") from None
            caption = Caption(caption.short, caption.title, text)
        images.append(Image(p.name, p.read_bytes(), MIME[p.suffix.lower()], caption))
    return images


# --- numbers in tables ---------------------------------------------------------------


STRUCTURAL = 1e-6  # below this fraction of its column's largest value, a measurement is zero


def column(values: pd.Series) -> list[str]:
    """A column of measurements (a head's scores, a role group's excess) to one format: three
    significant digits of its largest value; a value under STRUCTURAL of it is zero to float
    precision (a layer-0 head's induction score, 4.7e-09, is zero by construction) and shows as
    "–", like a missing one; booleans as "yes" or nothing; whole numbers as they are."""
    if values.dtype == bool:
        return ["yes" if v else "" for v in values]
    if not pd.api.types.is_float_dtype(values):
        return [ident(v) if not missing(v) else "–" for v in values]
    finite = values[values.notna() & values.abs().lt(math.inf)].abs()
    scale = float(finite.max()) if len(finite) else 0.0
    decimals = places(scale)
    return ["–" if missing(v) or abs(v) <= STRUCTURAL * scale else fixed(v, decimals) for v in values]


def _threshold(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "–"


# --- tables --------------------------------------------------------------------------


def ident(text) -> str:
    """Escaped, with a line-break chance after each underscore: names such as
    errata_bcda_trueden are a table's widest words, and a table is at least as wide as its widest
    words in every column (at 1400 px the across-seeds table overflowed on them)."""
    return html.escape(str(text)).replace("_", "_<wbr>")


def html_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: Sequence[int] = (),
    intervals: Sequence[int] = (),
) -> str:
    """A table of cells that are HTML already; the `numeric` columns right-aligned, the `intervals`
    too and kept on one line ("-3.0 [-10.5, 4.5]" broken over three lines reads as three numbers).
    In a box that scrolls sideways, should a narrow window be narrower than the table."""

    def cells(tag: str, row: Sequence[str]) -> str:
        kind = {i: "num" for i in numeric} | {i: "num iv" for i in intervals}
        return "".join(
            f'<{tag} class="{kind[i]}">{c}</{tag}>' if i in kind else f"<{tag}>{c}</{tag}>"
            for i, c in enumerate(row)
        )

    head = f"<thead><tr>{cells('th', header)}</tr></thead>"
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f'<div class="scroll"><table>{head}<tbody>{body}</tbody></table></div>'


def table(frame: pd.DataFrame) -> str:
    """A frame of measurements as a table, each column to its own format (`column`)."""
    shown = [column(frame[c]) for c in frame.columns]
    rows = [list(r) for r in zip(*shown, strict=True)] if len(frame) else []
    numeric = [i for i, c in enumerate(frame.columns) if pd.api.types.is_float_dtype(frame[c])]
    return html_table([ident(c) for c in frame.columns], rows, numeric)


def figure(image: Image, anchor: str) -> str:
    """The image with its alt text and caption (`Caption`), the file's name last."""
    c = image.caption
    text = f" {html.escape(c.text)}" if c.text else ""
    return (
        f'<figure id="{anchor}"><img src="{image.uri()}" alt="{html.escape(c.title)}">'
        f"<figcaption><strong>{html.escape(c.title)}.</strong>{text} "
        f'<span class="file">{html.escape(image.name)}</span></figcaption></figure>'
    )


def _interval(stat: Mapping, fmt: Format) -> str:
    if not stat.get("seeds_tested"):
        return "–"
    if stat.get("lo") is None:
        return f"{fmt.mean(stat.get('mean'))} (no interval: fewer than two seeds)"
    return fmt.interval(stat["mean"], stat["lo"], stat["hi"])


def claims_table(summary: Mapping, ci: float, formats: Formats) -> str:
    """The verdicts: a row per claim and denominator hypothesis (or rotation): statement,
    statistic, threshold, each seed's value, the sign counts, the mean and its interval."""
    rows = []
    for name, claim in CLAIMS.items():
        fmt = formats(name, name)
        for hypothesis, s in summary["claims"][name].items():
            v = html.escape(s["verdict"])
            per_seed = ", ".join(fmt.value(x) for x in s.get("per_seed", {}).values())
            rows.append([
                f"({html.escape(name)})", html.escape(claim.statement),
                html.escape(HYPOTHESIS_LABELS[hypothesis]), html.escape(claim.statistic),
                f"&gt; {_threshold(s['threshold'])}", per_seed,
                f"{s['seeds_holding']} / {s.get('seeds_failing', 0)} / {s['seeds_tested']}",
                _interval(s, fmt), f'<span class="{v}">{v}</span>',
            ])  # fmt: skip
    head = [
        "claim", "statement", "denominators or rotation", "statistic (per seed)", "holds when", "per seed",
        "seeds above / below / tested", f"mean [{ci:.0%} t interval]", "verdict",
    ]  # fmt: skip
    return html_table(head, rows, numeric=[5], intervals=[7])


def _claim_c_cell(c: pd.DataFrame, formats: Formats, statistic: str, effect: str, variant: str = NONE) -> str:
    """One statistic of claim (c)'s K rows across seeds: mean [t interval], or "–"."""
    row = c[(c["statistic"] == statistic) & (c["effect"] == effect) & (c["variant"] == variant)]
    if row.empty or pd.isna(row["mean"].iloc[0]):
        return "–"
    r = row.iloc[0]
    return formats("c", statistic).interval(r["mean"], r["lo"], r["hi"])


def ranking_table(stats: pd.DataFrame, formats: Formats | None = None) -> str:
    """Claim (c): per effect and measure, the mean PR-AUC and ROC-AUC of the K scores as rankings of
    the causal edges, with the number of causal edges and PR-AUC's chance level, and the role-only
    ranker's PR-AUC after each effect's measures (the baseline a score must beat)."""
    formats = formats or Formats(stats)
    c = stats[(stats["claim"] == "c") & (stats["kind"] == "K")]
    if c.empty:
        return "<p>No ablation.</p>"

    def cell(statistic: str, effect: str, variant: str = NONE) -> str:
        return _claim_c_cell(c, formats, statistic, effect, variant)

    rows = []
    for effect in dict.fromkeys(c["effect"]):
        edges = [cell("causal_edges", effect), cell("causal_fraction", effect)]
        for v in MEASURES:
            rows.append(
                [ident(effect), ident(v), *edges, cell("pr_auc", effect, v), cell("roc_auc", effect, v)]
            )
        rows.append([ident(effect), "role-only baseline", *edges, cell("role_pr_auc", effect), "–"])
    head = ["effect", "measure", "causal edges", "chance (causal fraction)", "PR-AUC", "ROC-AUC"]
    return html_table(head, rows, intervals=[2, 3, 4, 5])


def interaction_table(stats: pd.DataFrame, formats: Formats | None = None) -> str:
    """Claim (c)'s comparison for every measure: Spearman's rho between the pair-specific parts of
    its K scores and of the effect (each head's scale removed), and of the raw values beside it,
    mean over seeds [t interval], per effect."""
    formats = formats or Formats(stats)
    c = stats[(stats["claim"] == "c") & (stats["kind"] == "K")]
    rows = []
    for effect in dict.fromkeys(c["effect"]):
        if not ((c["statistic"] == "interaction") & (c["effect"] == effect)).any():
            continue
        for v in MEASURES:
            rows.append([
                ident(effect), ident(v), _claim_c_cell(c, formats, "interaction", effect, v),
                _claim_c_cell(c, formats, "spearman", effect, v),
            ])  # fmt: skip
    if not rows:
        return ""
    head = ["effect", "measure", "rho of the pair-specific parts (claim c)", "rho of the raw values"]
    return html_table(head, rows, intervals=[2, 3])


def threshold_table(stats: pd.DataFrame, formats: Formats | None = None) -> str:
    """Claim (c) at each of CAUSAL_THRESHOLDS (the effects cut there): per threshold, the causal K
    edges, the role-only ranker's PR-AUC and each measure's; empty when no effect was cut."""
    formats = formats or Formats(stats)
    c = stats[(stats["claim"] == "c") & (stats["kind"] == "K")]
    rows = []
    for effect in dict.fromkeys(c["effect"]):
        for t in CAUSAL_THRESHOLDS:
            key = threshold_key(t)
            if not ((c["statistic"] == f"causal_edges_at_{key}") & (c["effect"] == effect)).any():
                continue
            rows.append([
                ident(effect), key, _claim_c_cell(c, formats, f"causal_edges_at_{key}", effect),
                _claim_c_cell(c, formats, f"role_pr_auc_at_{key}", effect),
                *(_claim_c_cell(c, formats, f"pr_auc_at_{key}", effect, v) for v in MEASURES),
            ])  # fmt: skip
    if not rows:
        return ""
    # a column per measure: too many to keep each interval on the mean's line, so a cell may break
    # between the mean and its interval, never inside the interval
    rows = [[*r[:2], *(c.replace(", ", ",&nbsp;") for c in r[2:])] for r in rows]
    head = ["effect", "causal when the effect reaches", "causal edges", "role-only baseline"]
    return html_table([*head, *map(ident, MEASURES)], rows, list(range(1, 4 + len(MEASURES))))


def describe(claim: str, statistic: str) -> str:
    """What a statistic of the long table is, in words."""
    if claim in CLAIMS and statistic == claim:
        return f"claim ({claim}): {CLAIMS[claim].statistic}"
    if claim == "roles":
        return "heads with this role"
    if claim == "training":
        return "final value of training (metrics.json)"
    return STATISTICS.get(statistic, "")


def roles_table(roles: pd.DataFrame) -> str:
    """A seed's heads: layer, head, role and scores, then the roles whose criteria each head meets
    in one column (heads.csv's is_<role> flags: a column each made the table 1,270 px wide)."""
    flags = [c for c in roles.columns if c.startswith("is_") and roles[c].dtype == bool]
    shown = roles.drop(columns=flags)
    if flags:
        met = roles[flags].apply(lambda r: ", ".join(f[3:] for f in flags if r[f]), axis=1)
        shown = shown.assign(**{"meets the criteria of": met if len(roles) else []})
    return table(shown)


def composition_tables(groups: pd.DataFrame) -> str:
    """Per kind (K, the errata's, first), max excess per role-group pair (rows) and measure
    (columns), with the pair count: a table each, narrow enough for the page."""
    if groups.empty:
        return "<p>No head pairs.</p>"
    parts = []
    for kind in ("K", *(k for k in KINDS if k != "K")):
        mine = groups[groups["kind"] == kind]
        if mine.empty:
            continue
        wide = mine.pivot_table(
            index=["dst_role", "src_role"], columns="variant", values="max_excess", sort=False, dropna=False
        )
        wide = wide.reindex(columns=[v for v in MEASURES if v in wide.columns])
        n_pairs = mine.drop_duplicates(["dst_role", "src_role"]).set_index(["dst_role", "src_role"])[
            "n_pairs"
        ]
        # pivot_table's rows are every (later, earlier) role combination; only those with pairs are shown
        wide = wide[wide.index.isin(n_pairs.index)]
        wide.insert(0, "pairs", n_pairs.reindex(wide.index).astype(int))
        wide.index = [f"{dst} <- {src}" for dst, src in wide.index]
        parts += [f"<h4>{kind}-composition</h4>", table(wide.rename_axis("later <- earlier").reset_index())]
    return "\n".join(parts)


def _claim_words(claim: str) -> str:
    if claim in CLAIMS:
        return f"({claim}) {CLAIMS[claim].statement}"
    return {
        "training": "training: the final values of every seed's run",
        "roles": "roles: heads of each role",
        "role_ablation": "role ablation: every head of a role mean-ablated at once",
    }.get(claim, claim)


def cross_seed_table(claims: pd.DataFrame, stats: pd.DataFrame, formats: Formats | None = None) -> str:
    """A table per claim, folded (<details>), a row per statistic of the long table: the dimensions
    that apply to the claim, what it is, its value in each seed, then n and the mean with its
    interval across seeds (a pivot of claims.csv, joined to stats.csv). Rows keep claims.csv's order."""
    formats = formats or Formats(stats)
    dims = list(DIMENSIONS)
    # Not pivot_table(dropna=False): over six index levels it emits every combination of their
    # values (125,000 rows for 200 statistics), most of them empty.
    order = claims.drop_duplicates(dims).set_index(dims).index
    seeds = list(claims["seed"].unique())
    wide = claims.set_index([*dims, "seed"])["value"].unstack("seed").reindex(order)[seeds]
    joined = wide.join(stats.set_index(dims)[["n", "mean", "lo", "hi"]]).reset_index()
    parts = []
    for claim, rows in joined.groupby("claim", sort=False):
        shown = [d for d in dims[1:] if (rows[d] != NONE).any()]  # a dimension that applies
        body = []
        for r in rows.to_dict("records"):
            fmt = formats(claim, r["statistic"])
            per_seed = ", ".join(fmt.value(r[s]) for s in seeds)
            n = "–" if missing(r["n"]) else str(int(r["n"]))
            body.append([
                *(ident(r[d]) for d in shown), html.escape(describe(claim, r["statistic"])), per_seed, n,
                fmt.interval(r["mean"], r["lo"], r["hi"]),
            ])  # fmt: skip
        head = [*shown, "meaning", f"per seed ({', '.join(map(str, seeds))})", "n", "mean [interval]"]
        table_html = html_table(head, body, [len(shown) + 1, len(shown) + 2], [len(shown) + 3])
        summary = (
            f'{html.escape(_claim_words(str(claim)))} <span class="note">({len(rows)} statistics)</span>'
        )
        parts.append(
            f'<details id="all-{html.escape(str(claim))}"><summary>{summary}</summary>{table_html}</details>'
        )
    return "\n".join(parts)


def _contents(seed_images: Mapping[int, Sequence[Image]], has_compare_figures: bool) -> str:
    """The table of contents: the verdicts first, then each seed with a link to each figure."""
    items = [
        '<a href="#claims">Verdicts: the errata\'s claims</a>',
        '<a href="#calibration">Calibration and power of the test</a>',
        '<a href="#causal">(c) Which measure predicts which head reads which</a>',
    ]
    if has_compare_figures:
        items.append('<a href="#compare-figures">Across seeds: timing, training, head roles</a>')
    for seed, images in seed_images.items():
        links = " · ".join(
            f'<a href="#seed{seed}-{img.stem}">{html.escape(img.caption.short)}</a>' for img in images
        )
        items.append(
            f'<a href="#seed{seed}">Seed {seed}</a><br><span class="figures">{links}'
            f'{" · " if links else ""}<a href="#seed{seed}-tables">roles and role groups</a></span>'
        )
    items += [
        '<a href="#across-seeds">Every statistic across seeds</a>',
        '<a href="#config">Config (params.yaml)</a>',
        '<a href="#environment">Environment</a>',
    ]
    return (
        '<nav id="contents"><h2>Contents</h2><ol>' + "".join(f"<li>{i}</li>" for i in items) + "</ol></nav>"
    )


def answer(summary: Mapping) -> str:
    """The errata's question answered in a line per claim that gets a verdict: its label, its words
    and its verdict (the first thing on the page)."""
    items = []
    for name, claim in CLAIMS.items():
        verdicts = list(dict.fromkeys(s["verdict"] for s in summary["claims"][name].values()))
        shown = " / ".join(f'<span class="{html.escape(v)}">{html.escape(v)}</span>' for v in verdicts)
        items.append(f"<li>({html.escape(name)}) {html.escape(claim.statement)} {shown}</li>")
    return f'<ul class="answer">{"".join(items)}</ul>'


def verdict_legend() -> str:
    return "; ".join(
        f'<span class="{v}">{v}</span>: {html.escape(words)}' for v, words in VERDICT_WORDS.items()
    )


def calibration_tables(calibrated: Mapping | None, formats: Formats) -> str:
    """The calibrate stage across seeds (compare.calibration): per measure, the share of families
    with a (false) discovery on each null and whether the run may trust the measure; the smallest
    planted strength each measure finds, per plant and reader, per seed; the mean p-value of the
    model's own non-composing K pairs, against their bulk and the test's."""
    if not calibrated or not calibrated.get("measures"):
        return "<p>No calibration in this run.</p>"
    rows = []
    for m, entry in calibrated["measures"].items():
        cells = []
        for null in calibration.NULLS:
            e = entry[null]
            cells.append("–" if not e["families"] else f"{e['with_discovery']} / {e['families']}")
        rows.append([ident(m), *cells, "yes" if entry["calibrated"] else "no"])
    parts = [
        f"<p>{html.escape(calibration.RULE)}.</p>",
        html_table(
            ["measure", *(f"{n}: families with a discovery" for n in calibration.NULLS), "calibrated"],
            rows,
            [1, 2, 3],
        ),
    ]
    power = calibrated.get("power", {})
    if power:
        rows = []
        for plant, readers in power.items():
            for reader, measures in readers.items():
                for m, cell in measures.items():
                    found = ", ".join(
                        "–" if s is None else f"{s:g} (z {fixed(cell['raw_z'][seed], 1)})"
                        for seed, s in cell["strength"].items()
                    )
                    rows.append([ident(plant), ident(reader), ident(m), found])
        seeds = ", ".join(next(iter(next(iter(power.values())).values()))["true"]["strength"])
        parts += [
            f"<p>{html.escape(calibration.POWER_WORDS)}</p>",
            html_table(["plant", "reader", "measure", f"smallest strength found (seeds {seeds})"], rows),
        ]
    spread = calibrated.get("non_composing", {})
    if spread:
        rows = [
            [ident(m), ", ".join(fixed(v, 2) for v in cell["bulk_p"].values()),
             ", ".join(fixed(v, 2) for v in cell["p"].values())]
            for m, cell in spread.items()
        ]  # fmt: skip
        parts += [
            f"<p>{html.escape(calibration.NON_COMPOSING_WORDS)}</p>",
            html_table(["measure", "mean p against the bulk", "mean p of the test"], rows, [1, 2]),
        ]
    return "\n".join(parts)


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
    """The whole page: the answer (a line per claim and the first seed's errata diagram), contents,
    verdicts, the run's calibration, claim (c)'s rankings, the figures across seeds, each seed (its
    errata diagram first), every statistic, config, environment. Seeds appear in the order of
    `seed_images`."""
    formats = Formats(stats)
    leading = [img for img in compare_images if img.stem == "claims"]
    others = [img for img in compare_images if img.stem != "claims"]
    first = next((img for imgs in seed_images.values() for img in imgs if img.stem == "errata_diagram"), None)
    c = CLAIMS["c"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>The errata's claims over {len(seed_images)} seed(s) ({', '.join(map(str, seed_images))}):</p>",
        answer(summary),
        *([figure(first, "answer-diagram")] if first is not None else []),
        _contents(seed_images, bool(others)),
        '<h2 id="claims">Verdicts: the errata\'s claims</h2>',
        claims_table(summary, ci, formats),
        f'<p class="note">Intervals: {ci:.0%} Student t interval of the mean over seeds (valid for a '
        f"handful of seeds). {CLIPPING} Verdict: {html.escape(summary.get('rule', ''))}. "
        f"{verdict_legend()}.</p>",
        f'<p class="note">{html.escape(significance.DESCRIPTION)}</p>',
        '<p class="note">The measures: '
        + "; ".join(f"<em>{ident(m)}</em>, {html.escape(w)}" for m, w in MEASURE_WORDS.items())
        + ". The errata names only the numerators, so claims that depend on the original score's "
        "scale are tested under both denominator hypotheses; composition is measured as score minus the "
        "random-matrix baseline of its measure (<em>excess</em>); heads are compared across seeds through "
        "their roles, not their indices.</p>",
        *(figure(img, f"fig-{img.stem}") for img in leading),
        '<h2 id="calibration">Is the test calibrated and powered in this run?</h2>',
        calibration_tables(summary.get("calibration"), formats),
        '<h2 id="causal">(c) Which measure predicts which head reads which</h2>',
        f"<p>Claim (c): {html.escape(c.statistic)}. Causal edges, for the rankings below: "
        f"{html.escape(c.auxiliary['causal_edges'])}; the role-only baseline: "
        f"{html.escape(c.auxiliary['role_pr_auc'])}. Mean over seeds [{ci:.0%} t interval, clipped to "
        "the statistic's range].</p>",
        interaction_table(stats, formats),
        ranking_table(stats, formats),
    ]
    thresholds = threshold_table(stats, formats)
    if thresholds:
        parts += [
            "<p>The same, an edge causal from each threshold of its effect on (and beyond its noise): "
            "the causal edges, the role-only baseline's PR-AUC and each measure's.</p>",
            thresholds,
        ]
    if others:
        parts.append('<h2 id="compare-figures">Across seeds: timing, training, head roles</h2>')
        parts += [figure(img, f"fig-{img.stem}") for img in others]
    for seed, images in seed_images.items():
        parts.append(f'<h2 id="seed{seed}">Seed {seed}</h2>')
        parts += [figure(img, f"seed{seed}-{img.stem}") for img in images]
        mine = roles[roles["seed"] == seed].drop(columns="seed")
        parts += [
            f'<h3 id="seed{seed}-tables">Seed {seed}: roles and role groups</h3>',
            f"<details><summary>Head roles ({len(mine)} heads)</summary>{roles_table(mine)}"
            '<p class="note">Scores to three significant digits of their column\'s largest; "–": missing, '
            "or zero to float precision (under a millionth of the column's largest, such as a layer-0 "
            "head's induction score).</p></details>",
            "<details><summary>Composition between role groups (max excess over the group's head pairs)"
            f"</summary>{composition_tables(groups[groups['seed'] == seed])}</details>",
        ]
    parts += [
        '<h2 id="across-seeds">Every statistic across seeds</h2>',
        f"<p>Every per-seed statistic (claims.csv, one long table), then its mean and {ci:.0%} interval "
        "over seeds (stats.csv; n: seeds where it is defined), folded by claim. A dimension column is "
        f"shown where it applies to a row of the claim ('-': not to this row). {CLIPPING}</p>",
        cross_seed_table(claims, stats, formats),
        '<h2 id="config">Config (params.yaml)</h2>',
        f"<details><summary>params.yaml</summary><pre>{html.escape(config_text)}</pre></details>",
        '<h2 id="environment">Environment</h2>',
        table(pd.DataFrame(list(env.items()), columns=["", "value"])),
        f'<p class="note">{html.escape(ENVIRONMENT_NOTE)}</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
