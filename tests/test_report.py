"""The report: one self-contained HTML page that opens offline and shows every figure.

The page is built by the real compare and report stages from the hand-made outputs of
`synthetic_seeds`; headless Chromium (Debian package `chromium`) opens it with every
network request sent to a dead proxy and reports any image that did not load.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import channel_tables
import pandas as pd
import pytest
import synthetic_seeds as syn

from pipeline import io, params, tables
from pipeline.present import figures, report
from pipeline.present.figures import channels as channel_figures
from stages import compare as compare_stage
from stages import report as report_stage

SEEDS = [0, 1]
CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
)


class Page(HTMLParser):
    """Tags and attributes of a page, and the text of its <style>."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.style = ""
        self._in_style = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data


# synthetic_seeds' true discoveries, each with its one channel; the first a channel discovery
CHANNELS = {
    ("K", 0, 0, 1, 0): (0, 0),
    ("K", 0, 0, 1, 1): (1, 0),
    ("K", 0, 1, 1, 0): (0, 2),
    ("V", 0, 2, 1, 2): (3, 1),
}


def draw_channels(figures_dir: Path, seeds=SEEDS) -> None:
    """Each seed's channel figure and its facts, as the figures stage writes them."""
    frame, shares = channel_tables.tables(CHANNELS, CHANNELS, channel_discovery=[("K", 0, 0, 1, 0)])
    for seed in seeds:
        picked = channel_figures.discovered(frame, shares, syn.scores(syn.scale_of(seed)))
        figures.save(
            channel_figures.channel_maps(picked, shares), figures_dir / f"seed{seed}" / "channels", dpi=40
        )
        io.write_json(figures_dir / f"seed{seed}" / "channels.json", picked.facts())


def build(root: Path, seeds=SEEDS) -> Path:
    dirs = syn.write_stage_outputs(root / "outputs", seeds)
    draw_channels(dirs["figures"], seeds)
    p = root / "params.yaml"
    p.write_text(
        params.dump(
            params.compose([f"seeds={seeds}", "analysis.compare.dpi=40", "analysis.compare.min_seeds=2"])
        )
    )
    compare_out = root / "outputs" / "compare"
    assert (
        compare_stage.main(
            [
                "--params",
                str(p),
                "--train",
                str(dirs["train"]),
                "--composition",
                str(dirs["composition"]),
                "--heads",
                str(dirs["heads"]),
                "--dynamics",
                str(dirs["dynamics"]),
                "--out",
                str(compare_out),
            ]
        )
        == 0
    )
    page = root / "outputs" / "report" / "index.html"
    assert (
        report_stage.main(
            [
                "--params",
                str(p),
                "--compare",
                str(compare_out),
                "--figures",
                str(dirs["figures"]),
                "--out",
                str(page),
            ]
        )
        == 0
    )
    return page


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("report"))


def expected_images(root: Path) -> dict[str, bytes]:
    """What the page must embed: every PNG of the compare stage and of each seed's figures
    (SVGs have a PNG twin)."""
    out = {p.name: p.read_bytes() for p in sorted((root / "compare" / "figures").glob("*.png"))}
    for seed in SEEDS:
        out.update(
            {
                f"seed{seed}/{p.name}": p.read_bytes()
                for p in sorted((root / "figures" / f"seed{seed}").glob("*.png"))
            }
        )
    return out


def test_page_is_self_contained(page):
    html = Page(page.read_text())
    tags = [t for t, _ in html.tags]
    assert not {"script", "link", "iframe", "object", "embed", "base"} & set(tags)
    for tag, attrs in html.tags:
        for name in ("src", "href", "srcset", "poster", "data"):
            if name in attrs:
                assert tag == "img" and name == "src" and attrs[name].startswith("data:"), (
                    tag,
                    name,
                    attrs[name][:60],
                )
    assert "url(" not in html.style and "@import" not in html.style
    assert not re.search(r"https?://", page.read_text().split("<body", 1)[1].split("<pre>", 1)[0])


def test_page_embeds_every_figure_byte_for_byte(page):
    root = page.parents[1]
    images = [a for t, a in Page(page.read_text()).tags if t == "img"]
    embedded = sorted(base64.b64decode(a["src"].split(",", 1)[1]) for a in images)
    expected = expected_images(root)
    # claims, curves, roles, timing; each seed's errata diagram and channel figure
    assert len(expected) == 4 + 2 * len(SEEDS)
    assert embedded == sorted(expected.values())
    assert all(a["alt"] for a in images)


def test_page_shows_claims_tables_config_and_environment(page):
    text = page.read_text()
    summary = json.loads((page.parents[1] / "compare" / "verdicts.json").read_text())
    verdicts = [s["verdict"] for claim in summary["claims"].values() for s in claim.values()]
    assert summary["claims"]["a"]["rotated"]["verdict"] == "holds" and "inconclusive" in verdicts
    # planted (synthetic_seeds): a, c and c_inv under both hypotheses, b, m and t against both
    # rotations, d (rotated), e; b_inv and m_inv rest on an uncalibrated measure: no verdict
    assert text.count('class="holds">holds<') == verdicts.count("holds") == 13
    assert text.count('class="uncalibrated">uncalibrated<') == verdicts.count("uncalibrated") == 3
    assert "against B C D A" in text and "against D A B C" in text  # (m) and (t), a row per rotation
    assert "rotated denominators" in text and "true denominators" in text  # both hypotheses, side by side
    for seed in SEEDS:
        assert f'<h2 id="seed{seed}">Seed {seed}</h2>' in text
    assert (
        "induction &lt;- previous_token" in text and "recent_window" in text
    )  # composition and roles tables
    assert "dpi: 40" in text  # the config
    assert f"<td>{importlib.metadata.version('torch')}</td>" in text and "git revision" in text


def test_each_seed_shows_its_channel_figure_with_its_caption_after_the_errata_diagram(page):
    text = page.read_text()
    for seed in SEEDS:
        section = text.split(f'<h2 id="seed{seed}">', 1)[1].split("<h2", 1)[0]
        alts = [a["alt"] for t, a in Page(section).tags if t == "img"]
        assert alts == ["errata_diagram.png", "channels.png"]  # continues the diagram's subject
        caption = section.split('alt="channels.png"><figcaption>', 1)[1].split("</figcaption>", 1)[0]
        assert caption.startswith("<strong>channels.png</strong>: Where each discovered pair composes")
        for words in (
            "all 4 pairs whose corrected score is a discovery (K 3, Q 0, V 1)",  # how many
            "Rows: the writer&#x27;s channels i",  # the axes
            "columns: the reader&#x27;s channels j",
            "(all 4)",  # d_head 4: every channel shown
            "Share (i, j) is the fraction of the pair&#x27;s squared corrected numerator",  # a share
            "sum to 1",
            "channel discovery (1 shown)",
        ):
            assert words in caption, words


def test_channel_caption_counts_what_was_left_out_and_says_when_nothing_was_found():
    facts = {
        "discovered": {"K": 20, "Q": 3, "V": 7}, "shown": 24, "left_out": 6, "channel_discoveries": 5,
        "d_head": 64, "channels_shown": 16,
    }  # fmt: skip
    caption = report.channels_caption(facts)
    assert "24 of the 30 pairs" in caption and "(K 20, Q 3, V 7)" in caption
    assert "the 6 with the lowest calibrated z are left out" in caption and "leading 16 of 64" in caption
    none = {**facts, "discovered": {"K": 0, "Q": 0, "V": 0}, "shown": 0, "left_out": 0}
    assert report.channels_caption(none).startswith("No pair's corrected score is a discovery")


def test_a_broken_channel_facts_file_is_named(page, tmp_path, capsys):
    root = page.parents[1]
    shutil.copytree(root / "figures", tmp_path / "figures")
    (tmp_path / "figures" / "seed1" / "channels.json").write_text('{"shown": 3}')
    args = ["--params", str(root.parent / "params.yaml"), "--compare", str(root / "compare")]
    code = report_stage.main(
        [*args, "--figures", str(tmp_path / "figures"), "--out", str(tmp_path / "i.html")]
    )
    assert code != 0 and "seed1/channels.json: not the figures stage's facts" in capsys.readouterr().err


def test_cross_seed_table_has_one_row_per_statistic_in_claims_order():
    """A known answer: two statistics, two seeds, one value missing. (pivot_table with
    dropna=False once emitted every combination of the six dimensions: 125,000 rows.)"""
    a = ("a", "rotated", "K", "true", "-", "mean")  # claim, hypothesis, kind, variant, effect, statistic
    b = ("b", "-", "-", "-", "-", "x")
    claims = pd.DataFrame(
        [(1, *b, 3.0), (1, *a, 2.0), (0, *b, float("nan")), (0, *a, 1.0)], columns=tables.CLAIMS_COLUMNS
    )
    stats = pd.DataFrame(
        [(*a, 2, 1.5, 0.7, 1.0, 2.0), (*b, 1, 3.0, float("nan"), 3.0, 3.0)], columns=tables.STATS_COLUMNS
    )
    text = report.cross_seed_table(claims, stats)
    assert text.count("<tr") == 3  # the header and one row per statistic
    body = [re.findall(r"<td>(.*?)</td>", r) for r in text.split("<tbody>")[1].split("</tr>")[:-1]]
    assert [r[:6] + r[7:] for r in body] == [
        ["b", "-", "-", "-", "-", "x", "3", "–", "1", "3", "3", "3"],
        ["a", "rotated", "K", "true", "-", "mean", "2.0", "1.0", "2", "1.5", "1.0", "2.0"],  # to 0.1: [1, 2]
    ]
    assert re.findall(r"<th>(seed \d)</th>", text) == ["seed 1", "seed 0"]


def test_page_has_one_across_seeds_row_per_statistic(page):
    stats = pd.read_csv(page.parents[1] / "compare" / "stats.csv")
    section = page.read_text().split('id="across-seeds"', 1)[1].split("<h2", 1)[0]
    assert section.count("<tr") == len(stats) + 1


def test_page_is_byte_stable(page, tmp_path):
    again = build(tmp_path)
    assert again.read_bytes() == page.read_bytes()


def test_missing_figures_are_named(page, tmp_path, capsys):
    root = page.parents[1]
    code = report_stage.main(
        [
            "--params",
            str(root.parent / "params.yaml"),
            "--compare",
            str(root / "compare"),
            "--figures",
            str(tmp_path / "nowhere"),
            "--out",
            str(tmp_path / "index.html"),
        ]
    )
    assert code == 2
    assert "nowhere/seed0" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()


@pytest.mark.parametrize("table,column", [("stats", "hi"), ("groups", "src_role")])
def test_a_compare_table_missing_a_column_is_named(page, tmp_path, capsys, table, column):
    root = page.parents[1]
    compare = tmp_path / "compare"
    shutil.copytree(root / "compare", compare)
    frame = pd.read_csv(compare / f"{table}.csv")
    frame.drop(columns=[column]).to_csv(compare / f"{table}.csv", index=False)
    code = report_stage.main(
        [
            "--params",
            str(root.parent / "params.yaml"),
            "--compare",
            str(compare),
            "--figures",
            str(root / "figures"),
            "--out",
            str(tmp_path / "index.html"),
        ]
    )
    err = capsys.readouterr().err
    assert (
        code == 2 and f"{table}.csv" in err and repr(column) in err and len(err.strip().splitlines()) == 1
    ), err
    assert not (tmp_path / "index.html").exists()


# --- in a browser --------------------------------------------------------------------

CHECK = """<script>
addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const bad = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  document.title = 'CHECK ' + JSON.stringify({n: imgs.length, bad: bad});
});
</script>"""


def chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium, offline: every network request goes to a proxy that is not there."""
    if CHROMIUM is None:
        if os.environ.get("CI") or os.environ.get("ATTN_CIRCUITS_REQUIRE_BROWSER"):
            # `make test` installs it or stops before pytest; here a skip would hide the test
            pytest.fail("chromium is not installed (make test installs the Debian package chromium)")
        pytest.skip(
            "chromium is not installed: apt-get install -y chromium (the Debian package) to run this test"
        )
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=<-loopback>",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def images_loaded(tmp_path: Path, page_text: str) -> dict:
    """{n: images on the page, bad: alt text of each that did not load}, as Chromium saw them."""
    probe = tmp_path / "probe.html"
    probe.write_text(page_text.replace("</body>", CHECK + "</body>"))
    proc = chromium(tmp_path, probe.as_uri(), "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r"<title>CHECK (.*?)</title>", proc.stdout)
    assert found, f"the check did not run (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(found.group(1))


@pytest.mark.slow
def test_chromium_detects_images_that_do_not_load(tmp_path):
    """The check can fail: a network image (offline) and a corrupt one are reported."""
    svg = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>').decode()
    text = (
        '<html><body><img alt="net" src="https://example.com/x.png">'
        '<img alt="corrupt" src="data:image/png;base64,AAAA">'
        f'<img alt="ok" src="data:image/svg+xml;base64,{svg}"></body></html>'
    )
    assert images_loaded(tmp_path, text) == {"n": 3, "bad": ["net", "corrupt"]}


@pytest.mark.slow
def test_report_opens_offline_in_chromium_with_every_image(page, tmp_path):
    n = len(expected_images(page.parents[1]))
    assert images_loaded(tmp_path, page.read_text()) == {"n": n, "bad": []}
    shot = tmp_path / "report.png"
    proc = chromium(
        tmp_path, page.as_uri(), "--window-size=1280,2400", "--hide-scrollbars", f"--screenshot={shot}"
    )
    assert shot.is_file(), proc.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    assert pixels.std() > 0.05  # not a blank page
    print(f"screenshot: {shot}")


LAYOUT = """<script>
addEventListener('load', () => {
  const width = document.documentElement.clientWidth;
  const over = Array.from(document.querySelectorAll('body *'))
    .filter(e => !e.closest('.scroll, pre') && e.getBoundingClientRect().right > width + 1)
    .map(e => e.tagName + ' ' + (e.alt || e.id || e.className || e.textContent.slice(0, 40)));
  const claims = Array.from(document.images).find(i => i.alt === 'claims.png');
  document.title = 'LAYOUT ' + JSON.stringify({
    width: width, scroll: document.documentElement.scrollWidth, over: over,
    claims_scale: claims.getBoundingClientRect().width / claims.naturalWidth,
  });
});
</script>"""


def layout(tmp_path: Path, page_text: str, width: int) -> dict:
    probe = tmp_path / "layout.html"
    probe.write_text(page_text.replace("</body>", LAYOUT + "</body>"))
    proc = chromium(
        tmp_path, probe.as_uri(), f"--window-size={width},1000", "--virtual-time-budget=10000", "--dump-dom"
    )
    found = re.search(r"<title>LAYOUT (.*?)</title>", proc.stdout)
    assert found, f"the check did not run (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(found.group(1))


@pytest.mark.slow
def test_page_fits_1400_pixels_and_the_claims_figure_stays_readable(page, tmp_path):
    """At 1400 px nothing overflows the page (wide tables scroll inside their box), and the claims
    figure is drawn at three quarters of its size or more: its 9-point labels stay readable."""
    found = layout(tmp_path, page.read_text(), 1400)
    assert found["scroll"] <= found["width"] and found["over"] == [], found
    assert found["claims_scale"] >= 0.75, found
    # the check can fail: in a narrow window, the page overflows without its scrolling boxes only
    assert layout(tmp_path, page.read_text(), 700)["over"] == []
    unboxed = page.read_text().replace('<div class="scroll">', "<div>")
    assert layout(tmp_path, unboxed, 700)["over"] != []


def test_numbers_are_rounded_to_what_their_interval_supports():
    assert report.interval(0.6312, 0.5523, 0.7634) == "0.63 [0.55, 0.76]"
    assert report.interval(0.4, -0.7105780420791173, 1.5105780420791173) == "0.4 [-0.7, 1.5]"
    assert report.interval(12.34, 11.2, 13.31) == "12.3 [11.2, 13.3]"
    assert report.interval(0.13570886, 0.08168197, 0.18973576) == "0.14 [0.08, 0.19]"
    assert report.interval(1.0, 1.0, 1.0) == "1 [1, 1]"  # no width: three significant digits
    assert report.interval(0.5, None, None) == "0.5"


def test_claim_c_tables_show_the_role_only_baseline_and_each_threshold():
    """synthetic_seeds' agreement (its docstring): after each effect's measures, the role-only
    ranker's PR-AUC (0.4); then the pattern effect at each threshold: at 0.05 one causal edge,
    the role-only ranker 0.5 and the corrected score 1; at 0.1 none, so nothing to rank."""
    from pipeline.compare import stats as compare
    from pipeline.config import CompareConfig

    result = compare.compare([syn.seed_inputs(s) for s in SEEDS], CompareConfig(), 0.1, 0.05)

    def rows(text: str) -> list[list[str]]:
        return [re.findall(r"<td>(.*?)</td>", r) for r in text.split("<tbody>")[1].split("</tr>")[:-1]]

    baseline = [r for r in rows(report.ranking_table(result.stats)) if r[1] == "role-only baseline"]
    assert [r[0] for r in baseline] == ["heldout_loss_effect", "loss_effect", "attn_effect", "pattern_effect"]
    assert {r[4] for r in baseline} == {"0.4 [0.4, 0.4]"} and {r[5] for r in baseline} == {"–"}
    by_threshold = {r[1]: r for r in rows(report.threshold_table(result.stats))}
    assert list(by_threshold) == ["0.01", "0.02", "0.05", "0.1"]
    assert {r[0] for r in by_threshold.values()} == {"pattern_effect"}
    assert by_threshold["0.05"][2:5] == ["1 [1, 1]", "0.5 [0.5, 0.5]", "1 [1, 1]"]  # edges, roles, true
    assert by_threshold["0.1"][2] == "0 [0, 0]" and set(by_threshold["0.1"][3:]) == {"–"}
