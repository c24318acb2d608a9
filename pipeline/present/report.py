"""One self-contained HTML page that leads with the answer: a table of contents, the verdicts on
the errata's claims, then each seed with its errata diagram first; the long tables (every
statistic across seeds, each seed's roles and role groups, the config) fold away in <details>.
Images are embedded as data: URIs and the style is inline; the page has no script and no link
outside itself, so it reads the same offline, from a mail attachment or a USB stick.

Numbers have one format per statistic (`Formats`): its decimals come from its scale, every
interval is clipped to the statistic's range (`DOMAINS`: PR-AUC to [0, 1], Spearman rho to
[-1, 1], counts to >= 0), and no zero carries a sign. Every figure has a caption and an alt text
that say what it shows (`FIGURES`).

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
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import io
from ..compare.claims import CLAIMS, HYPOTHESIS_LABELS, NONE, PRIMARY_EFFECT, STATISTICS
from ..errors import UserError
from ..tables import CAUSAL_THRESHOLDS, DIMENSIONS, KINDS, MEASURES, threshold_key

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
.note { font-size: .9em; color: #555; }
"""


# --- figures and their captions ------------------------------------------------------


@dataclass(frozen=True)
class Caption:
    """What a figure shows: `short` links it from the contents, `title` is its alt text and the
    caption's first sentence, `text` the rest of the caption."""

    short: str
    title: str
    text: str


_ABLATION = (
    "Each dot is a head pair: across, its composition score minus its random-matrix baseline; up, how "
    "much mean-ablating the earlier head's output in the later head's {input} alone changes {effect}. "
    "A row per kind, a column per variant (the corrected score, then the four original ones); each "
    "panel's title gives Spearman's rho between the two over its pairs. A score that predicts the "
    "ablation puts its dots on a rising line."
)
# image stem -> its caption; a stem not here is captioned by `_uncaptioned`, which says so
FIGURES: dict[str, Caption] = {
    "claims": Caption(
        "the claims",
        "The errata's claims across seeds",
        "A panel per claim: a grey dot per seed, the mean over seeds (black bar) and its t interval "
        "(red, as computed: the tables clip it to the statistic's range), and the threshold the claim must "
        "clear (dashed). (a) the original score's selectivity for K induction <- previous-token minus the "
        "corrected score's; (b) discoveries of K induction <- recent-window, with the corrected and the "
        "basis-invariant score; (m) K discoveries, corrected (or invariant) minus each rotation's; (d) 1 "
        "when the paper's plotting draws K edges only, from one layer-0 head; (c) the PR-AUC of each "
        "measure as a ranking of the causal K edges.",
    ),
    "timing": Caption(
        "timing",
        "When each measure sees the induction circuit, across seeds",
        "Left: for each measure, the step from which the K-composition of the top induction <- "
        "previous-token pair stays a discovery, minus the step at which induction reaches 0.5 (below 0: "
        "the measure sees the circuit before the phase change). Right: claim (t), the corrected score's "
        "clear step minus each rotation's (above 0: the original sees it earlier). Dots: seeds; bar: "
        "mean; red: t interval.",
    ),
    "curves": Caption(
        "training curves",
        "Training curves of every seed",
        "Held-out loss, the best induction score and the best previous-token score against tokens seen: "
        "a thin line per seed, the mean over seeds thick.",
    ),
    "roles": Caption(
        "head roles",
        "Heads of each role across seeds",
        "How many heads each seed's classifier gives each role (a grey dot per seed), with the mean and "
        "its t interval. Heads are compared across seeds by role, not by index.",
    ),
    "errata_diagram": Caption(
        "errata diagram",
        "The errata diagram: which heads compose, original score beside corrected",
        "The paper's composition diagram drawn twice from this seed's scores: on the left the original "
        "score (the rotated strand of analysis.figures.errata_variant), on the right the corrected one. "
        "Dots are heads, a column per layer, labelled layer.head and role; a line joins an earlier head "
        "to a later one where the pair composes, coloured by kind (Q blue, K red, V green) and as wide "
        "as its strength, on one scale for both panels. Both panels draw a pair by the same rule, named "
        "in the figure's title (analysis.figures.edges; by default a discovery at the configured FDR), "
        "and each panel's title counts its edges per kind. The errata says the original figure shows only "
        "K-composition, from one layer-0 head (claim d).",
    ),
    "channels": Caption(
        "channels",
        "Channel tables: where each discovered pair composes",
        # replaced from channels.json (`channels_caption`), which gives the counts
        "Each discovered pair's corrected score split into writer channel x reader channel shares.",
    ),
    "dynamics": Caption(
        "through training",
        "Composition through training",
        "Top: the best induction and previous-token scores and the held-out loss (right axis) at each "
        "checkpoint. Bottom: the K-composition of the top induction <- previous-token pair under every "
        "measure, -log10 of its Benjamini-Hochberg q, with the discovery line at the FDR. The vertical "
        "line marks the induction phase change (induction first reaches 0.5); claim (t) compares the "
        "steps from which each measure's curve stays above the line.",
    ),
    **{
        f"composition_{kind}": Caption(
            f"{kind}-composition",
            f"{kind}-composition of every head pair, score minus baseline",
            "A row per variant (the corrected score, then the four original ones), a column per pair of "
            "layers; each cell a later head (row) reading from an earlier head (column). Red: above the "
            "random-matrix baseline of its variant, blue: below; each panel has its own symmetric colour "
            "scale, since the variants' scales differ up to about 30 times.",
        )
        for kind in ("K", "Q", "V")
    },
    "attention_patterns": Caption(
        "attention patterns",
        "Every head's attention on one repeated random sequence",
        "A panel per head, a row per layer, titled layer.head and its role; query positions down, key "
        "positions across, darker blue for more attention. The sequence is a first token, a random span "
        "and the span again; the dotted red line marks the induction targets (the token after the "
        "earlier copy of the current one), where an induction head's attention sits.",
    ),
    "copying_vs_qk": Caption(
        "copying vs QK",
        "Copying against positive QK, every head of layer 1 and later",
        "Across: copying, sum(lambda) / sum(|lambda|) of the head's OV circuit in token space (1: it "
        "copies the tokens it attends to). Up: the same positivity of the QK term of its K-composition "
        "with its best-composing earlier head. Induction heads sit top right, as in the paper's figure; "
        "colours are roles.",
    ),
    "ablation_pattern": Caption(
        "ablation: pattern",
        "Path ablation against composition: the later head's attention pattern",
        _ABLATION.format(
            input="query, key or value input",
            effect="the later head's attention pattern on held-out text (total variation; for V, the "
            "relative change of its output). Claim (c) reads the K row",
        ),
    ),
    "ablation_attn": Caption(
        "ablation: induction score",
        "Path ablation against composition: the later head's induction score",
        _ABLATION.format(
            input="query or key input", effect="its induction score on the repeated probe (Q and K only)"
        ),
    ),
    "ablation_loss": Caption(
        "ablation: probe loss",
        "Path ablation against composition: the loss on the repeated probe",
        _ABLATION.format(input="query, key or value input", effect="the model's loss on the repeated probe"),
    ),
    "ablation_heldout_loss": Caption(
        "ablation: held-out loss",
        "Path ablation against composition: the loss on held-out text",
        _ABLATION.format(input="query, key or value input", effect="the model's loss on held-out text"),
    ),
}
# the order figures are shown in: the answer first (the claims; each seed's errata diagram and its
# channels), the dense scatter grids last; a stem not here follows, by name
ORDER = (
    "claims", "timing", "curves", "roles",
    "errata_diagram", "channels", "dynamics", "composition_K", "composition_Q", "composition_V",
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
        f"{shown[0].upper()}{shown[1:]} pairs whose corrected score is a discovery "
        f"({counts}){leftover}, one heat map each. Rows: the writer's channels i, the singular directions "
        "of its OV circuit; columns: the reader's channels j, the singular directions along which its "
        "query (Q), key (K) or value (V) input reads the residual stream; both strongest first"
        f"{view}. Share (i, j) is the fraction of the pair's squared corrected numerator "
        "||OV^a N^b||^2 carried by writer channel i into reader channel j, s_i^2 t_j^2 (w_i . k_j)^2 "
        "over its sum: the shares are non-negative and sum to 1, so every panel has one colour scale, "
        "0 to 1. Directions whose singular values are near-equal (each within "
        "analysis.composition.channel_tolerance of the one before) form a block, where the split between "
        "directions is not defined: a channel is then the block, its share spread evenly over its cells. "
        "Each panel names its top channel (i, j; a range of directions for a block), outlines its cells, "
        "and gives its share and its effective number of channels "
        "(1 / sum of squared shares: 1 when one channel carries it all). A star and a red frame: a "
        f"channel discovery ({facts['channel_discoveries']} shown), a pair that composes mainly through "
        "its top channel (its top share against a randomly rotated reader, FDR-controlled)."
    )


# image stem -> its caption's text, from `<stem>.json` beside the image (the figures stage writes it)
FACTS = {"channels": channels_caption}


def _uncaptioned(stem: str) -> Caption:
    """A figure no one has described yet: said on the page, so that it gets a caption."""
    words = stem.replace("_", " ")
    return Caption(
        words, f"Figure: {words}", "No caption yet (add one to FIGURES in pipeline/present/report.py)."
    )


def _rank(stem: str) -> tuple[int, str]:
    return (ORDER.index(stem) if stem in ORDER else len(ORDER), stem)


def read_images(directory: Path) -> list[Image]:
    """Every image in `directory`, in ORDER (then by name); an SVG only where no PNG of the same
    name exists; captioned by FIGURES, with FACTS' text where its `<stem>.json` is there."""
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
        caption, facts = FIGURES.get(p.stem) or _uncaptioned(p.stem), p.with_suffix(".json")
        if p.stem in FACTS and facts.is_file():
            try:
                text = FACTS[p.stem](io.read_json(facts))
            except (KeyError, TypeError, AttributeError) as e:
                raise UserError(str(facts), f"not the figures stage's facts of {p.name} ({e!r})") from None
            caption = Caption(caption.short, caption.title, text)
        images.append(Image(p.name, p.read_bytes(), MIME[p.suffix.lower()], caption))
    return images


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


# --- numbers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """The values a statistic can take: its range, and whether each seed's value is a whole
    number (a count, a step); the mean over seeds of either is a fraction."""

    lo: float = -math.inf
    hi: float = math.inf
    whole: bool = False

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def clip(self, lo: float, hi: float) -> tuple[float, float]:
        """An interval inside the range. The t interval is symmetric about the mean and knows no
        bound, so a PR-AUC of 0.84 over three seeds can reach 1.03; the value itself cannot. Clipping
        never changes whether the interval lies above a threshold inside the range (a verdict)."""
        return (lo if _missing(lo) else max(lo, self.lo), hi if _missing(hi) else min(hi, self.hi))


UNIT = Domain(0.0, 1.0)  # fractions, rates, shares, PR-AUC and ROC-AUC, p-values
INDICATOR = Domain(0.0, 1.0, whole=True)  # 0 or 1 per seed; its mean, the fraction of seeds with 1
CORRELATION = Domain(-1.0, 1.0)  # Spearman's rho, selectivity ((T - O) / (|T| + |O|))
DIFFERENCE = Domain(-2.0, 2.0)  # one of those minus another
COUNT = Domain(0.0, whole=True)  # pairs, edges, heads, discoveries, steps
WHOLE = Domain(whole=True)  # a difference of counts or of steps
NONNEGATIVE = Domain(0.0)
REAL = Domain()

# Every statistic of the long table (pipeline/compare/claims.py STATISTICS, and each claim's own)
# and the values it can take: the one place that decides how its intervals are clipped and whether
# its values are whole. `tests/test_report.py` checks that every statistic is here.
DOMAINS: dict[str, Domain] = {
    # the claims' own numbers
    "a": DIFFERENCE, "b": COUNT, "b_inv": COUNT, "c": DIFFERENCE, "c_inv": DIFFERENCE, "d": INDICATOR,
    "e": REAL, "m": WHOLE, "m_inv": WHOLE, "t": WHOLE,
    # (a), (b)
    "selectivity": CORRELATION, "relative": REAL,
    # (m)
    "discoveries": COUNT, "m_kind": WHOLE, "placebo_rate": UNIT, "raw_z_above_3": COUNT,
    "detection_limit": REAL,
    # (d)
    "drawn": COUNT, "layer0_k_sources": COUNT, "only_k_one_source": INDICATOR,
    # (c), and each of its `_at_<threshold>` statistics
    "pr_auc": UNIT, "roc_auc": UNIT, "role_pr_auc": UNIT, "causal_edges": COUNT, "causal_fraction": UNIT,
    "top_source": UNIT, "spearman": CORRELATION,
    # (e)
    "excess": REAL, "excess_alignment": REAL, "excess_anisotropy": REAL, "output_query": REAL,
    "pairs": COUNT, "effective_channels": Domain(1.0), "top_share": UNIT, "channel_discoveries": COUNT,
    "causal_share": NONNEGATIVE,
    # (t)
    "phase_step": COUNT, "clear_step": COUNT, "lag": WHOLE, "z_growth": REAL, "z_growth_ratio": REAL,
}  # fmt: skip
# the rows that are not a claim's: training's final values (a name that means another thing in
# another claim), the role ablation's by their ending (one statistic per ablated role), the roles'
CLAIM_DOMAINS: dict[str, dict[str, Domain]] = {
    "training": {"eval_loss": NONNEGATIVE, "induction": UNIT, "prev_token": UNIT},
}
SUFFIX_DOMAINS = {"_loss_effect": REAL, "_placebo_p": UNIT, "_serves_heldout": INDICATOR}
WHOLE_CLAIMS = ("roles",)  # every statistic a count (heads with the role)
AT_THRESHOLD = re.compile(r"_at_[0-9.]+$")  # claim (c) again at a threshold: the same statistic


def base_statistic(statistic: str) -> str:
    """`pr_auc_at_0.05` -> `pr_auc`: a statistic at a threshold is the same statistic."""
    return AT_THRESHOLD.sub("", statistic)


def domain(claim: str, statistic: str, default: Domain | None = REAL) -> Domain | None:
    """The values `statistic` of `claim` can take (DOMAINS); `default` for one not listed."""
    if claim in WHOLE_CLAIMS:
        return COUNT
    if statistic in CLAIM_DOMAINS.get(claim, {}):
        return CLAIM_DOMAINS[claim][statistic]
    for end, found in SUFFIX_DOMAINS.items():
        if claim == "role_ablation" and statistic.endswith(end):
            return found
    return DOMAINS.get(base_statistic(statistic), default)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


SIGNIFICANT = 3  # digits of a statistic's largest number; its other numbers get as many decimals
MAX_PLACES = 6


def places(scale: float, whole: bool = False) -> int:
    """Decimals for the numbers of one statistic whose largest magnitude is `scale`: three
    significant digits there (0.84 -> 0.840; 12.3; 1234), so a statistic's numbers share one
    format whatever their own size. The mean of whole numbers: a tenth (none from 100 on)."""
    if whole:
        return 0 if scale >= 100 else 1
    if not (scale > 0 and math.isfinite(scale)):
        return 2
    return min(MAX_PLACES, max(0, SIGNIFICANT - 1 - math.floor(math.log10(scale))))


def fixed(value, decimals: int) -> str:
    """`value` to `decimals` places; a dash when missing; never a signed zero ("-0.00": a small
    negative number rounded, or -0.0, is just zero at this precision)."""
    if _missing(value):
        return "–"
    if isinstance(value, bool):
        return str(value)
    text = f"{float(value):.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


@dataclass(frozen=True)
class Format:
    """How every number of one statistic is printed."""

    domain: Domain
    places: int  # decimals of the mean and its interval (and of each seed's value, unless whole)

    def value(self, x) -> str:
        """One seed's value: a whole number without decimals."""
        return fixed(x, 0 if self.domain.whole else self.places)

    def mean(self, x) -> str:
        return fixed(x, self.places)

    def interval(self, mean, lo, hi) -> str:
        """ "0.84 [0.65, 1.00]": the mean and its interval, clipped to the statistic's range."""
        if _missing(lo) or _missing(hi):
            return self.mean(mean)
        lo, hi = self.domain.clip(lo, hi)
        return f"{self.mean(mean)} [{self.mean(lo)}, {self.mean(hi)}]"


class Formats:
    """One Format per statistic (claim and statistic, a threshold's alike), wherever on the page
    its numbers appear: its domain, and its decimals. A bounded statistic's come from its range
    (two for [0, 1], [-1, 1] and [-2, 2]: PR-AUC reads 0.84 and 1.00 in every row and run, the
    role-only ranker's beside it too); an unbounded one's from its largest mean or interval end
    over every row of stats.csv (each kind, variant and effect)."""

    def __init__(self, stats: pd.DataFrame):
        scale: dict[tuple[str, str], float] = {}
        for r in stats.itertuples(index=False):
            key = (r.claim, base_statistic(r.statistic))
            ends = domain(r.claim, r.statistic).clip(r.lo, r.hi)
            finite = [abs(float(x)) for x in (r.mean, *ends) if not _missing(x) and math.isfinite(x)]
            scale[key] = max([scale.get(key, 0.0), *finite])
        self._scale = scale

    def __call__(self, claim: str, statistic: str) -> Format:
        d = domain(claim, statistic)
        if d.bounded:
            return Format(d, places(max(abs(d.lo), abs(d.hi))))
        return Format(d, places(self._scale.get((claim, base_statistic(statistic)), 0.0), d.whole))


STRUCTURAL = 1e-6  # below this fraction of its column's largest value, a measurement is zero


def column(values: pd.Series) -> list[str]:
    """A column of measurements (a head's scores, a role group's excess) to one format: three
    significant digits of its largest value; a value under STRUCTURAL of it is zero to float
    precision (a layer-0 head's induction score, 4.7e-09, is zero by construction) and shows as
    "–", like a missing one; booleans as "yes" or nothing; whole numbers as they are."""
    if values.dtype == bool:
        return ["yes" if v else "" for v in values]
    if not pd.api.types.is_float_dtype(values):
        return [ident(v) if not _missing(v) else "–" for v in values]
    finite = values[values.notna() & values.abs().lt(math.inf)].abs()
    scale = float(finite.max()) if len(finite) else 0.0
    decimals = places(scale)
    return ["–" if _missing(v) or abs(v) <= STRUCTURAL * scale else fixed(v, decimals) for v in values]


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
    head = ["effect", "causal when the effect reaches", "causal edges", "role-only baseline"]
    return html_table([*head, *map(ident, MEASURES)], rows, [1], list(range(2, 4 + len(MEASURES))))


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
            n = "–" if _missing(r["n"]) else str(int(r["n"]))
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
        '<a href="#causal">(c) Which score ranks the causal edges</a>',
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
    """The whole page: contents, verdicts, claim (c)'s rankings, the figures across seeds, each
    seed (its errata diagram first), every statistic, config, environment. Seeds appear in the
    order of `seed_images`."""
    formats = Formats(stats)
    leading = [img for img in compare_images if img.stem == "claims"]
    others = [img for img in compare_images if img.stem != "claims"]
    clipped = (
        "Intervals are clipped to the range the statistic can take (PR-AUC, ROC-AUC, shares, rates and "
        "0/1 indicators to [0, 1], Spearman's rho and selectivity to [-1, 1], their differences to "
        "[-2, 2], counts and steps to 0 or more): the t interval is symmetric about the mean and knows "
        "no bound. Every number of a statistic has the same decimals (three significant digits at its "
        "largest); counts per seed are whole."
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(seed_images)} seed(s): {', '.join(map(str, seed_images))}. The verdicts on the errata's "
        "claims come first, then each seed, its errata diagram first; the long tables are folded.</p>",
        _contents(seed_images, bool(others)),
        '<h2 id="claims">Verdicts: the errata\'s claims</h2>',
        claims_table(summary, ci, formats),
        f'<p class="note">Intervals: {ci:.0%} Student t interval of the mean over seeds (valid for a '
        f"handful of seeds). {clipped} Verdict: {html.escape(summary.get('rule', ''))}; <em>untestable</em> "
        "when no seed has the heads the claim needs. A pair counts as composing when it is a "
        "<em>discovery</em>: Benjamini-Hochberg at the configured FDR against the model's own empirical "
        "null (its raw z standardised by its block's median and MAD, tested against the pairs that "
        "cannot compose).</p>",
        '<p class="note">Composition is measured as score minus the random-matrix baseline of its variant '
        "(<em>excess</em>); heads are compared across seeds through their roles, not their indices. "
        "<em>true</em> is the corrected score; <em>errata_bcda</em> and <em>errata_dabc</em> are the two "
        "rotated strands the errata says the original library computed, with rotated denominators; the "
        "<em>_trueden</em> variants divide the same numerators by the true ones. The errata names only the "
        "numerators, so claims that depend on the original score's scale are tested under both "
        "hypotheses. <em>invariant</em> is composition measured in the frame where the residual stream's "
        "token paths are white: unlike every Frobenius score it does not change when the residual basis "
        "does (claims <em>_inv</em> put it in the corrected score's place). Claim (t) follows composition "
        "through training: at every checkpoint, when each measure's K-composition of the top induction "
        "&lt;- previous-token pair becomes a discovery, against the step at which induction reaches 0.5 "
        "(each seed's <em>dynamics</em> figure).</p>",
        *(figure(img, f"fig-{img.stem}") for img in leading),
        '<h2 id="causal">(c) Which score ranks the causal edges</h2>',
        "<p>The path ablation runs on disjoint held-out batches; an edge is causal when its mean effect "
        "reaches analysis.heads.min_effect and exceeds its batch-to-batch spread (one-sided t test, 5%). "
        f"Claim (c) reads <em>{PRIMARY_EFFECT}</em>: how far cutting the edge moves the later head's "
        "attention pattern on held-out text (total variation, mean over query positions), whatever the "
        "head's role; the probe's induction score (attn_effect) counts only composition that serves "
        "induction. Each score ranks every K pair; PR-AUC's chance level is the fraction of causal "
        "edges; the role-only baseline ranks the pairs by the heads' roles alone (previous-token or "
        "recent-window into induction first, then pairs of named roles). Mean over "
        f"seeds [{ci:.0%} t interval, clipped to the statistic's range].</p>",
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
        f"shown where it applies to a row of the claim ('-': not to this row). {clipped}</p>",
        cross_seed_table(claims, stats, formats),
        '<h2 id="config">Config (params.yaml)</h2>',
        f"<details><summary>params.yaml</summary><pre>{html.escape(config_text)}</pre></details>",
        '<h2 id="environment">Environment</h2>',
        table(pd.DataFrame(list(env.items()), columns=["", "value"])),
        f'<p class="note">{html.escape(ENVIRONMENT_NOTE)}</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
