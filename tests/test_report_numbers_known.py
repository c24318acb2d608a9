"""The report's numbers and its environment table on inputs written by hand: intervals clipped
to a statistic's range, each statistic's decimals from its largest mean or interval end over
every row, a measurement column's format, the claims' interval cell, the across-seeds table of a
tiny long table, and the environment's rows (threads, variables, the git revision or why not)."""

from __future__ import annotations

import html
import math
import re
import subprocess

import pandas as pd

from pipeline.compare.claims import CLAIMS, HYPOTHESIS_LABELS, NONE
from pipeline.present import report
from pipeline.tables import MEASURES

# --- ranges and formats ------------------------------------------------------------------


def test_an_interval_is_clipped_to_the_statistics_range_and_a_missing_end_stays_missing():
    assert report.UNIT.clip(-0.2, 1.03) == (0.0, 1.0)
    assert report.UNIT.clip(0.2, 0.7) == (0.2, 0.7)
    assert report.COUNT.clip(-3.0, 5.0) == (0.0, 5.0)
    lo, hi = report.UNIT.clip(math.nan, 1.5)
    assert math.isnan(lo) and hi == 1.0
    assert report.UNIT.clip(None, None) == (None, None)


def test_a_format_prints_the_mean_and_its_clipped_interval_or_the_mean_alone():
    unit = report.Format(report.UNIT, 2)
    assert unit.interval(0.84, 0.65, 1.03) == "0.84 [0.65, 1.00]"
    assert unit.interval(0.84, math.nan, 1.03) == "0.84"
    assert unit.interval(0.84, 0.5, None) == "0.84"
    count = report.Format(report.COUNT, 1)
    assert (count.value(3.0), count.mean(2.25)) == ("3", "2.2")


def stats_rows(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["claim", "statistic", "mean", "lo", "hi"])


def test_each_statistics_decimals_come_from_its_largest_number_over_every_row():
    stats = stats_rows(
        ("e", "excess", 12.3, 10.0, 14.6),  # REAL: unbounded; the largest, 14.6 -> one decimal
        ("e", "excess", 0.05, 0.01, 0.09),  # a later, smaller row does not lower it
        ("e", "relative", -0.5, -0.9, 0.002),
        ("e", "excess_anisotropy", -0.5, -500.0, 10.0),  # the lower end the largest: 500 -> none
        ("e", "z_growth", 0.05, 0.01, 0.09),  # small: 0.09 -> 0.0900, four decimals
        ("t", "lag", 150.0, 90.0, 210.0),  # WHOLE: the mean of steps, none from 100 on
        ("c", "pr_auc_at_0.05", 0.8, 0.7, 1.2),  # UNIT: two decimals, whatever the interval
    )
    formats = report.Formats(stats)
    assert formats("e", "excess").places == 1
    assert formats("e", "relative").places == 3
    assert formats("e", "excess_anisotropy").places == 0
    assert formats("e", "z_growth").places == 4
    assert formats("t", "lag") == report.Format(report.WHOLE, 0)
    assert formats("c", "pr_auc_at_0.05") == report.Format(report.UNIT, 2)
    assert formats("e", "never_seen") == report.Format(report.REAL, 2)


def test_a_clipped_end_does_not_set_the_decimals():
    # a PR-AUC-like UNIT row cannot, but an unbounded one with a range: causal_share >= 0
    stats = stats_rows(("e", "causal_share", 0.05, -30.0, 0.09))
    assert report.Formats(stats)("e", "causal_share").places == 4  # -30 clipped to 0: 0.09 sets it


def test_a_clipped_end_is_clipped_to_its_own_claims_range_for_training_and_roles_rows():
    stats = stats_rows(
        # training's eval_loss is >= 0 (its own range, not the default's): -40 clipped to 0, 5.0 sets
        # three significant digits -> two decimals (unclipped, 40 would give one)
        ("training", "eval_loss", 2.5, -40.0, 5.0),
        # every statistic of roles is a count >= 0: -150 clipped to 0, 9 < 100 -> a tenth (not none)
        ("roles", "induction", 2.0, -150.0, 9.0),
    )
    formats = report.Formats(stats)
    assert formats("training", "eval_loss") == report.Format(report.NONNEGATIVE, 2)
    assert formats("training", "eval_loss").interval(2.5, -40.0, 5.0) == "2.50 [0.00, 5.00]"
    assert formats("roles", "induction") == report.Format(report.COUNT, 1)
    assert formats("roles", "induction").interval(2.0, -150.0, 9.0) == "2.0 [0.0, 9.0]"


def test_a_column_of_measurements_has_one_format_and_structural_zeros_as_a_dash():
    assert report.column(pd.Series([0.84, 0.0123, 4.7e-9, math.nan, -0.0001])) == [
        "0.840",
        "0.012",
        "–",
        "–",
        "0.000",  # above 1e-6 of 0.84, so measured: zero at three decimals, and no zero has a sign
    ]
    assert report.column(pd.Series([True, False, True])) == ["yes", "", "yes"]
    assert report.column(pd.Series(["previous_token", None])) == ["previous_<wbr>token", "–"]
    assert report.column(pd.Series([3, 12])) == ["3", "12"]


def test_a_claims_interval_cell_says_when_there_is_no_interval():
    fmt = report.Format(report.UNIT, 2)
    assert report._interval({"seeds_tested": 0, "mean": 0.5}, fmt) == "–"
    assert report._interval({"seeds_tested": 1, "mean": 0.5, "lo": None}, fmt) == (
        "0.50 (no interval: fewer than two seeds)"
    )
    assert (
        report._interval({"seeds_tested": 3, "mean": 0.5, "lo": 0.2, "hi": 1.3}, fmt) == "0.50 [0.20, 1.00]"
    )


def test_a_frame_becomes_a_table_with_its_float_columns_right_aligned():
    frame = pd.DataFrame({"head_name": ["a_b", "c"], "score": [0.5, 0.25]})
    assert report.table(frame) == (
        '<div class="scroll"><table><thead><tr><th>head_<wbr>name</th><th class="num">score</th></tr>'
        '</thead><tbody><tr><td>a_<wbr>b</td><td class="num">0.500</td></tr><tr><td>c</td>'
        '<td class="num">0.250</td></tr></tbody></table></div>'
    )


def test_the_across_seeds_table_has_a_row_per_statistic_with_each_seeds_value_n_and_interval():
    dims = {"hypothesis": NONE, "kind": NONE, "variant": NONE, "effect": NONE}
    claims = pd.DataFrame(
        [
            {"claim": "e", **dims, "statistic": "excess", "seed": s, "value": v}
            for s, v in ((1, 0.25), (0, 0.5))
        ]
    )
    stats = pd.DataFrame(
        [{"claim": "e", **dims, "statistic": "excess", "n": 2, "mean": 0.375, "lo": 0.1, "hi": 0.6}]
    )
    page = report.cross_seed_table(claims, stats)
    assert page.startswith('<details id="all-e"><summary>')
    assert '<span class="note">(1 statistics)</span>' in page
    header = (
        '<thead><tr><th>statistic</th><th>meaning</th><th class="num">per seed (1, 0)</th>'
        '<th class="num">n</th>'
        '<th class="num iv">mean [interval]</th></tr></thead>'
    )
    assert header in page
    row = (
        f"<tr><td>excess</td><td>{report.html.escape(report.describe('e', 'excess'))}</td>"
        '<td class="num">0.250, 0.500</td><td class="num">2</td>'
        '<td class="num iv">0.375 [0.100, 0.600]</td></tr>'
    )
    assert row in page


def test_the_across_seeds_tables_of_rows_that_are_no_claims_are_summarised_in_words():
    dims = {"hypothesis": NONE, "kind": NONE, "variant": NONE, "effect": NONE}
    names = [("training", "eval_loss"), ("roles", "induction"), ("role_ablation", "induction_loss_effect")]
    names += [("unknown_rows", "x")]
    claims = pd.DataFrame([{"claim": c, **dims, "statistic": s, "seed": 0, "value": 1.0} for c, s in names])
    stats = pd.DataFrame(
        [{"claim": c, **dims, "statistic": s, "n": 1, "mean": 1.0, "lo": None, "hi": None} for c, s in names]
    )
    page = report.cross_seed_table(claims, stats)
    summaries = re.findall(r'<details id="all-([^"]*)"><summary>(.*?)</summary>', page)
    assert summaries == [
        ("training", "training: the final values of every seed&#x27;s run " + NOTE_ONE),
        ("roles", "roles: heads of each role " + NOTE_ONE),
        ("role_ablation", "role ablation: every head of a role mean-ablated at once " + NOTE_ONE),
        ("unknown_rows", "unknown_rows " + NOTE_ONE),
    ]


NOTE_ONE = '<span class="note">(1 statistics)</span>'


# --- the environment -----------------------------------------------------------------------


def test_the_environment_names_threads_variables_and_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = report.environment(3, tmp_path)
    assert list(env) == [
        "python",
        *report.PACKAGES,
        "platform",
        "cpus (visible / total)",
        "torch threads (train.threads)",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "git revision",
    ]
    assert env["torch threads (train.threads)"] == "3"
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "unset")
    assert env["git revision"] == "unknown (not a git checkout)"
    default = report.environment(None, tmp_path)["torch threads (train.threads)"]
    assert default == "torch's default (one per physical core)"


def test_the_environment_gives_each_packages_installed_version_or_says_it_is_not_installed(
    monkeypatch, tmp_path
):
    installed = {"numpy": "1.2.3", "torch": "9.8.7+cpu"}

    def version(name):
        if name not in installed:
            raise report.importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(report.importlib.metadata, "version", version)
    env = report.environment(1, tmp_path)
    assert {name: env[name] for name in report.PACKAGES} == {
        name: installed.get(name, "not installed") for name in report.PACKAGES
    }


def test_the_environment_counts_the_cpus_this_process_may_use_of_the_machines(monkeypatch, tmp_path):
    asked = []

    def affinity(pid):
        asked.append(pid)
        return {0, 3, 5}

    monkeypatch.setattr(report.os, "sched_getaffinity", affinity, raising=False)
    monkeypatch.setattr(report.os, "cpu_count", lambda: 8)
    assert report.environment(1, tmp_path)["cpus (visible / total)"] == "3 / 8"
    assert asked == [0]  # this process
    monkeypatch.delattr(report.os, "sched_getaffinity")  # macOS and Windows have no affinity call
    assert report.environment(1, tmp_path)["cpus (visible / total)"] == "? / 8"


def test_the_environment_reads_the_git_revision_or_says_git_is_missing(monkeypatch, tmp_path, capfd):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    capfd.readouterr()
    assert report.environment(1, tmp_path)["git revision"] == head.strip()
    assert capfd.readouterr() == ("", "")  # git's own output is captured, not printed

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(report.subprocess, "run", no_git)
    assert report.environment(1, tmp_path)["git revision"] == "unknown (git not available)"


# --- the verdicts and claim (c)'s tables ----------------------------------------------------


def _text(cell: str) -> str:
    """A cell's text, a no-break space read as a space."""
    return cell.replace("&nbsp;", " ")


def rows_of(text: str) -> list[list[str]]:
    """The cells of each body row, tags inside a cell removed."""
    body = "".join(t.split("</tbody>")[0] for t in text.split("<tbody>")[1:])
    return [
        [_text(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
        for r in body.split("</tr>")[:-1]
    ]


def heads_of(text: str) -> list[str]:
    return re.findall(r"<th(?: [^>]*)?>(.*?)</th>", text)


def verdicts() -> dict:
    """A summary.json with a row per claim (the k-th: seeds 0.5 + k and 1.25 + k), (a) two."""
    summary = {"claims": {}}
    for k, name in enumerate(CLAIMS):
        summary["claims"][name] = {
            NONE: {
                "verdict": "holds" if k % 2 else "fails",
                "per_seed": {"0": 0.5 + k, "1": 1.25 + k},
                "threshold": CLAIMS[name].threshold,
                "seeds_holding": 2,
                "seeds_failing": 1,
                "seeds_tested": 3,
                "mean": 1.0 + k,
                "lo": 0.5 + k,
                "hi": 1.5 + k,
            }
        }
    summary["claims"]["a"]["true"] = {
        "verdict": "untestable",
        "threshold": 0.0,
        "seeds_holding": 0,
        "seeds_tested": 0,
    }
    return summary


def test_the_verdicts_table_has_a_row_per_claim_and_hypothesis_with_each_seeds_value():
    summary = verdicts()
    stats = pd.DataFrame(columns=["claim", "statistic", "mean", "lo", "hi"])
    text = report.claims_table(summary, 0.9, report.Formats(stats))
    assert heads_of(text) == [
        "claim", "statement", "denominators or rotation", "statistic (per seed)", "holds when", "per seed",
        "seeds above / below / tested", "mean [90% t interval]", "verdict",
    ]  # fmt: skip
    rows = rows_of(text)
    assert [r[0] for r in rows] == ["(a)", "(a)", *(f"({n})" for n in list(CLAIMS)[1:])]
    a, untested, b = rows[:3]
    assert a[2] == report.html.escape(HYPOTHESIS_LABELS[NONE]) and a[4] == "&gt; 0"
    assert a[1] == report.html.escape(CLAIMS["a"].statement)
    # (a) is a DIFFERENCE: two decimals; (b) a COUNT: each seed's value whole, its mean to a tenth
    assert a[5:] == ["0.50, 1.25", "2 / 1 / 3", "1.00 [0.50, 1.50]", "fails"]
    assert untested[5:] == ["", "0 / 0 / 0", "–", "untestable"]
    assert b[4:] == ["&gt; 0.5", "2, 2", "2 / 1 / 3", "2.0 [1.5, 2.5]", "holds"]
    assert '<td class="num">0.50, 1.25</td>' in text and '<td class="num iv">1.00 [0.50, 1.50]</td>' in text
    assert '<span class="fails">fails</span>' in text


def claim_c(*rows) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "claim": "c",
                "kind": kind,
                "effect": e,
                "variant": v,
                "statistic": s,
                "mean": m,
                "lo": m - 0.1,
                "hi": m + 0.1,
            }
            for kind, e, v, s, m in rows
        ]
    )


def test_the_ranking_table_reads_each_measures_pr_auc_and_the_role_only_baseline():
    rows = [
        ("K", "loss_effect", NONE, "causal_edges", 4.0),
        ("K", "loss_effect", NONE, "causal_fraction", 0.25),
    ]
    rows += [("K", "loss_effect", v, "pr_auc", 0.5 + 0.05 * k) for k, v in enumerate(MEASURES)]
    rows += [("K", "loss_effect", v, "roc_auc", 0.6) for v in MEASURES[:1]]
    rows += [("K", "loss_effect", NONE, "role_pr_auc", 0.4), ("Q", "loss_effect", "true", "pr_auc", 0.99)]
    text = report.ranking_table(claim_c(*rows))
    assert heads_of(text) == [
        "effect",
        "measure",
        "causal edges",
        "chance (causal fraction)",
        "PR-AUC",
        "ROC-AUC",
    ]
    table = rows_of(text)
    assert len(table) == len(MEASURES) + 1
    assert table[0] == [
        "loss_effect",
        "true",
        "4.0 [3.9, 4.1]",
        "0.25 [0.15, 0.35]",
        "0.50 [0.40, 0.60]",
        "0.60 [0.50, 0.70]",
    ]
    assert table[1][4:] == ["0.55 [0.45, 0.65]", "–"]
    assert table[-1] == [
        "loss_effect",
        "role-only baseline",
        "4.0 [3.9, 4.1]",
        "0.25 [0.15, 0.35]",
        "0.40 [0.30, 0.50]",
        "–",
    ]
    assert report.ranking_table(claim_c(("Q", "loss_effect", "true", "pr_auc", 0.9))) == "<p>No ablation.</p>"


def test_the_ranking_tables_causal_edges_take_claim_c_s_decimals_none_from_a_hundred_on():
    rows = [
        ("K", "loss_effect", NONE, "causal_edges", 150.0),
        ("K", "loss_effect", NONE, "causal_fraction", 0.5),
    ]
    rows += [("K", "loss_effect", v, "pr_auc", 0.6) for v in MEASURES]
    rows += [("K", "loss_effect", NONE, "role_pr_auc", 0.4)]
    table = rows_of(report.ranking_table(claim_c(*rows)))
    # a mean of counts: no decimals from 100 on (the largest, 150.1, is claim (c)'s own)
    assert [r[2] for r in table] == ["150 [150, 150]"] * (len(MEASURES) + 1)
    assert table[-1][3:] == ["0.50 [0.40, 0.60]", "0.40 [0.30, 0.50]", "–"]


def test_the_ranking_tables_four_number_columns_are_intervals_kept_on_one_line():
    rows = [("K", "loss_effect", NONE, s, 0.5) for s in ("causal_edges", "causal_fraction", "role_pr_auc")]
    rows += [("K", "loss_effect", v, s, 0.6) for v in MEASURES for s in ("pr_auc", "roc_auc")]
    text = report.ranking_table(claim_c(*rows))
    assert re.findall(r"<th(?: [^>]*)?>", text) == ["<th>"] * 2 + ['<th class="num iv">'] * 4
    first = text.split("<tbody><tr>")[1].split("</tr>")[0]
    assert first == (
        '<td>loss_<wbr>effect</td><td>true</td><td class="num iv">0.5 [0.4, 0.6]</td>'
        + '<td class="num iv">0.50 [0.40, 0.60]</td>'
        + '<td class="num iv">0.60 [0.50, 0.70]</td>' * 2
    )


def test_the_threshold_table_has_a_row_per_threshold_the_effect_was_cut_at():
    rows = [
        ("K", "pattern_effect", NONE, "causal_edges_at_0.05", 2.0),
        ("K", "pattern_effect", NONE, "role_pr_auc_at_0.05", 0.5),
    ]
    rows += [("K", "pattern_effect", v, "pr_auc_at_0.05", 0.7) for v in MEASURES]
    rows += [("Q", "pattern_effect", NONE, "causal_edges_at_0.1", 3.0)]
    text = report.threshold_table(claim_c(*rows))
    assert heads_of(text) == [
        "effect",
        "causal when the effect reaches",
        "causal edges",
        "role-only baseline",
        *map(report.ident, MEASURES),
    ]
    assert rows_of(text) == [
        [
            "pattern_effect",
            "0.05",
            "2.0 [1.9, 2.1]",
            "0.50 [0.40, 0.60]",
            *["0.70 [0.60, 0.80]"] * len(MEASURES),
        ]
    ]
    # right-aligned; a cell may break between the mean and its interval, never inside the interval
    assert '<td class="num">0.05</td>' in text and text.count('<td class="num">') == len(MEASURES) + 3
    assert text.count("[0.60,&nbsp;0.80]") == len(MEASURES)
    assert report.threshold_table(claim_c(("Q", "pattern_effect", NONE, "causal_edges_at_0.1", 3.0))) == ""


def test_a_seeds_heads_table_lists_the_criteria_each_head_meets_in_one_column():
    roles = pd.DataFrame(
        {
            "layer": [0, 1],
            "head": [1, 0],
            "role": ["previous_token", "induction"],
            "is_previous_token": [True, False],
            "is_induction": [True, True],
        }
    )
    text = report.roles_table(roles)
    assert heads_of(text) == ["layer", "head", "role", "meets the criteria of"]
    assert rows_of(text) == [
        ["0", "1", "previous_token", "previous_token, induction"],
        ["1", "0", "induction", "induction"],
    ]


def test_the_composition_tables_count_each_role_groups_pairs_k_first():
    groups = pd.DataFrame(
        [
            {
                "kind": kind,
                "variant": v,
                "dst_role": "induction",
                "src_role": "previous_token",
                "n_pairs": 3,
                "max_excess": x,
            }
            for kind in ("Q", "K")
            for v, x in (("errata_bcda", 0.5), ("true", 0.25))
        ]
    )
    text = report.composition_tables(groups)
    assert re.findall(r"<h4>(\w)-composition</h4>", text) == ["K", "Q"]  # K once, first; no V rows
    assert heads_of(text)[:4] == ["later &lt;- earlier", "pairs", "true", "errata_<wbr>bcda"]
    assert rows_of(text)[0] == ["induction &lt;- previous_token", "3", "0.250", "0.500"]
    assert report.composition_tables(groups.iloc[:0]) == "<p>No head pairs.</p>"


# --- the page --------------------------------------------------------------------------------


def image(stem: str) -> report.Image:
    return report.Image(f"{stem}.png", stem.encode(), "image/png", report.captions()[stem])


def small_page(extra: tuple[dict, ...] = ()) -> str:
    """A page of two seeds; `extra`: more statistics (claim, kind, effect, statistic, mean), seed 0's
    value its mean, its interval the mean -+ 0.1."""
    dims = {"hypothesis": NONE, "kind": NONE, "variant": NONE, "effect": NONE}
    more = [dims | {"variant": NONE, **e} for e in extra]
    claims = pd.DataFrame(
        [{"claim": "e", **dims, "statistic": "excess", "seed": 0, "value": 0.5}]
        + [{k: v for k, v in e.items() if k != "mean"} | {"seed": 0, "value": e["mean"]} for e in more]
    )
    stats = pd.DataFrame(
        [{"claim": "e", **dims, "statistic": "excess", "n": 1, "mean": 0.5, "lo": None, "hi": None}]
        + [e | {"n": 1, "lo": e["mean"] - 0.1, "hi": e["mean"] + 0.1} for e in more]
    )
    roles = pd.DataFrame({"seed": [0, 1], "layer": [0, 0], "head": [0, 0], "role": ["other", "induction"]})
    groups = pd.DataFrame(
        columns=["seed", "kind", "variant", "dst_role", "src_role", "n_pairs", "max_excess"]
    )
    return report.render(
        "A title", "train: {}", {"python": "3.x"}, verdicts() | {"rule": "the rule"}, 0.95, stats, claims,
        roles, groups, [image("timing"), image("claims")], {0: [image("dynamics")], 1: []},
    )  # fmt: skip


def test_the_contents_link_every_section_of_the_page_in_its_order():
    page = small_page()
    links = re.findall(r'<a href="#([^"]+)">', page.split('<nav id="contents">')[1].split("</nav>")[0])
    assert links == [
        "claims", "calibration", "causal", "compare-figures", "seed0", "seed0-dynamics", "seed0-tables",
        "seed1", "seed1-tables", "across-seeds", "config", "environment",
    ]  # fmt: skip
    for anchor in links:
        assert f'id="{anchor}"' in page, anchor
    order = [f'id="{a}"' for a in links if a != "compare-figures"]
    assert [page.index(o) for o in order] == sorted(page.index(o) for o in order)
    assert page.count("<figure ") == 3  # no errata diagram in this page: no answer figure
    environment = page.split('<h2 id="environment">')[1]
    assert rows_of(environment) == [["python", "3.x"]]


def test_the_pages_words_about_the_method_are_the_registrys():
    """Provenance, in-process: the null's description, each measure's words, the verdict words and
    claim (c)'s statistic and causal-edge words are on the page as the registry says them."""
    from pipeline.circuits import significance
    from pipeline.compare.stats import VERDICT_WORDS
    from pipeline.tables import MEASURE_WORDS

    page = small_page()
    assert html.escape(significance.DESCRIPTION) in page
    for words in (*MEASURE_WORDS.values(), *VERDICT_WORDS.values()):
        assert html.escape(words) in page, words
    causal = page.split('<h2 id="causal">')[1].split("<h2")[0]
    c = report.CLAIMS["c"]
    assert html.escape(c.statistic) in causal and html.escape(c.auxiliary["causal_edges"]) in causal


def test_the_page_shows_the_threshold_table_only_when_an_effect_was_cut_at_a_threshold():
    assert "causal when the effect reaches" not in small_page()
    cut = {"claim": "c", "kind": "K", "effect": "pattern_effect"}
    page = small_page((
        cut | {"statistic": "causal_edges_at_0.05", "mean": 2.0},
        cut | {"statistic": "role_pr_auc_at_0.05", "mean": 0.5},
    ))  # fmt: skip
    tables = [t.split("</table>")[0] + "</table>" for t in page.split("<table>")[1:]]
    (table,) = [t for t in tables if "causal when the effect reaches" in t]
    table = "<table>" + table
    head = ["effect", "causal when the effect reaches", "causal edges", "role-only baseline"]
    assert heads_of(table) == [*head, *map(report.ident, MEASURES)]
    assert rows_of(table) == [
        ["pattern_effect", "0.05", "2.0 [1.9, 2.1]", "0.50 [0.40, 0.60]", *["–"] * len(MEASURES)]
    ]
