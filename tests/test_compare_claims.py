"""`@claim` registers a claim with every setting it is given, and with its documented defaults
(one side, no rotations, resting on no measure's discoveries, no absence) when none is given;
the side a verdict reads follows."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
import synthetic_seeds as syn
from refusals import one_line

from pipeline.compare import claims
from pipeline.compare import stats as compare
from pipeline.compare.claims import CLAIM_KIND, CLAIMS, NONE, PRIMARY_EFFECT, Claim, claim, selectivity
from pipeline.config import CompareConfig
from pipeline.tables import HYPOTHESES


def compute(seed):
    return iter(())


def test_a_claim_is_registered_with_every_setting_it_names(monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", {})  # the real claims stay as they are
    registered = claims.claim(
        "z", "its words", "its number", 0.5, by_hypothesis=True, auxiliary={"x": "an x"},
        restates="c", versus=("true",), rests_on=("true",), absent="x",
    )(compute)  # fmt: skip
    assert registered is compute
    z = claims.CLAIMS["z"]
    settings = (0.5, True, compute, {"x": "an x"}, "c", ("true",), ("true",), "x")
    assert z == Claim("z", "its words", "its number", *settings)
    assert z.sides() == (("variant", "true"),)
    claims.claim("h", "words", "number", 0.0, by_hypothesis=True)(compute)
    assert claims.CLAIMS["h"].hypotheses() == tuple(HYPOTHESES)
    assert claims.CLAIMS["h"].sides() == tuple(("hypothesis", h) for h in HYPOTHESES)


def test_a_claim_given_no_settings_has_the_documented_defaults(monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", {})
    claims.claim("y", "words", "number", 0.0)(compute)
    y = claims.CLAIMS["y"]
    assert y == Claim("y", "words", "number", 0.0, False, compute, {}, None, (), (), None)
    assert y.rests_on == () and y.absent is None and y.versus == () and y.hypotheses() == (NONE,)
    assert list(claims.CLAIMS) == ["y"]


def test_the_agreement_cut_at_a_threshold_and_its_absence():
    """An effect's agreement cut at min_effect is its own entry, at a threshold its "by_threshold"
    entry; whatever is absent reads as NaN, never an error (a seed without the heads)."""
    at_05 = {"ranking": {"K": {"true": {"pr_auc": 0.75}}}, "role_baseline": {"K": {"pr_auc": 0.5}}}
    effect = {"ranking": {"K": {"true": {"pr_auc": 0.25}}}, "by_threshold": {"0.05": at_05}}
    inp = SimpleNamespace(agreement={"pattern_effect": effect, "bare": {}})
    assert claims._cut(inp, "pattern_effect", None) is effect
    assert claims._cut(inp, "pattern_effect", 0.05) is at_05
    assert claims._ranking(inp, "pattern_effect", "K", "true", "pr_auc") == 0.25
    assert claims._ranking(inp, "pattern_effect", "K", "true", "pr_auc", threshold=0.05) == 0.75
    assert claims._role_pr_auc(inp, "pattern_effect", "K", threshold=0.05) == 0.5
    assert claims._cut(inp, "bare", 0.05) == {} and claims._cut(inp, "absent", 0.05) == {}
    assert math.isnan(claims._ranking(inp, "bare", "K", "true", "pr_auc", threshold=0.05))
    assert math.isnan(claims._role_pr_auc(inp, "bare", "K", threshold=0.05))
    assert math.isnan(claims._role_pr_auc(inp, "pattern_effect", "K", threshold=0.1))


def test_mean_log_of_a_ratio_reads_both_columns_as_floats():
    """mean ln(a / c): ln 2 and ln 4 average to 1.5 ln 2, whatever dtype the columns hold (an
    object column, as a frame built from JSON or with None in it holds); a missing value or a
    non-positive ratio gives NaN."""
    import pandas as pd

    frame = pd.DataFrame({"a": [1.0, 8.0], "c": pd.Series([0.5, 2.0], dtype=object)})
    assert claims._mean_log(frame, "a", "c") == pytest.approx(1.5 * math.log(2))
    assert claims._mean_log(frame, "a") == pytest.approx(0.5 * math.log(8))
    missing = pd.DataFrame({"a": [1.0, 8.0], "c": pd.Series([0.5, None], dtype=object)})
    assert math.isnan(claims._mean_log(missing, "a", "c"))
    assert math.isnan(claims._mean_log(pd.DataFrame({"a": [1.0, -8.0]}), "a"))
    assert math.isnan(claims._mean_log(pd.DataFrame({"a": []}, dtype=float), "a"))


def test_selectivity_is_zero_when_both_maxima_are_zero():
    """(T - O) / (|T| + |O|) with T = O = 0: no cell singled out, 0 (not a division by zero)."""
    import pandas as pd

    rows = [("true", "K", "induction", "previous_token", 0.0), ("true", "V", "other", "other", 0.0)]
    scored = pd.DataFrame(rows, columns=["variant", "kind", "dst_role", "src_role", "excess"])
    assert claims.selectivity(scored, "true") == 0.0
    scored.loc[0, "excess"] = 0.25
    assert claims.selectivity(scored, "true") == 1.0


def test_only_k_from_one_layer0_head_needs_one_head_of_layer_0():
    """Claim (d): 1.0 only when every drawn edge is K and they all leave one head, of layer 0. Two
    heads of layer 0 are two sources (0.0); one head of layer 1 (head 0) is not of layer 0 (0.0);
    head 0.1 alone is (1.0), with a V edge beside it it is not (0.0), and nothing drawn is 0.0."""

    def drawn(*edges):
        return pd.DataFrame(edges, columns=["kind", "src_layer", "src_head", "dst_layer", "dst_head"])

    assert claims.only_k_from_one_layer0_head(drawn(("K", 0, 0, 1, 0), ("K", 0, 1, 1, 1))) == 0.0
    assert claims.only_k_from_one_layer0_head(drawn(("K", 1, 0, 2, 0), ("K", 1, 0, 2, 1))) == 0.0
    assert claims.only_k_from_one_layer0_head(drawn(("K", 0, 1, 1, 0), ("K", 0, 1, 1, 2))) == 1.0
    assert claims.only_k_from_one_layer0_head(drawn(("K", 0, 1, 1, 0), ("V", 0, 1, 1, 2))) == 0.0
    assert claims.only_k_from_one_layer0_head(drawn()) == 0.0


def test_discoveries_without_a_kind_counts_every_kinds_discoveries_of_the_variant():
    """_discoveries(scored, variant): the variant's discoveries over every kind (K 2, Q 1, V 0 of
    "true": 3), not a count of rows whose kind is None; with a kind, that kind's only."""
    scored = pd.DataFrame(
        {
            "variant": ["true", "true", "true", "true", "true", "errata_bcda"],
            "kind": ["K", "K", "Q", "V", "Q", "K"],
            "discovery": [True, True, True, False, False, True],
        }
    )
    assert claims._discoveries(scored, "true") == 3
    assert claims._discoveries(scored, "true", "K") == 2
    assert claims._discoveries(scored, "errata_bcda") == 1


def test_selectivity_of_an_empty_cell_of_a_nullable_float_excess_is_nan():
    """An excess column of pandas' nullable Float64 whose cell holds only <NA>: the cell has no
    maximum, so the selectivity is NaN (not an error on float(<NA>)); the other cell's 0.5 is read."""
    scored = pd.DataFrame(
        {
            "variant": ["true", "true"],
            "kind": ["K", "K"],
            "dst_role": ["induction", "other"],
            "src_role": ["previous_token", "other"],
            "excess": pd.array([pd.NA, 0.5], dtype="Float64"),
        }
    )
    assert math.isnan(claims.selectivity(scored, "true"))
    assert claims._nanmax(scored["excess"]) == 0.5
    assert math.isnan(claims._nanmax(scored["excess"].iloc[:1]))


CFG = CompareConfig()


FDR = 0.05


def scored(seed: int = 0) -> pd.DataFrame:
    inp = syn.seed_inputs(seed)
    return compare.with_roles(inp.scores, inp.heads)


EDGE = 0.1  # the paper's plotting threshold on the excess, for claims (m) and (d)


def long_table(inp) -> pd.DataFrame:
    s = compare.with_roles(inp.scores, inp.heads)
    return compare.seed_statistics(inp, s, compare.group_composition(s), EDGE, FDR)


def value(table: pd.DataFrame, **where) -> float:
    rows = table
    for column, v in where.items():
        rows = rows[rows[column] == v]
    assert len(rows) == 1, where
    return float(rows["value"].iloc[0])


def test_selectivity_known_values():
    s = scored()
    assert selectivity(s, "true") == pytest.approx((0.30 - 0.35) / (0.30 + 0.35))  # V other<-other wins
    assert selectivity(s, "errata_bcda") == pytest.approx((0.50 - 0.01) / (0.50 + 0.01))
    assert math.isnan(selectivity(s, "true", dst="induction", src="duplicate_token"))  # no such heads


def test_seed_statistics_claims_known_values():
    inp = syn.seed_inputs(2)
    t = long_table(inp)
    assert list(t.columns) == list(compare.LONG_COLUMNS) and set(t["seed"]) == {2}
    assert not t.duplicated(compare.DIMENSIONS).any()  # one row per statistic
    assert (
        value(t, claim="roles", statistic="induction") == 2
        and value(t, claim="roles", statistic="other") == 2
    )
    assert value(t, claim="training", statistic="eval_loss") == pytest.approx(1.8)
    # (a): true's strongest composition is V other <- other; each rotation singles out K induction <- prev,
    # the original's selectivity (the less selective rotation) minus the corrected one's
    assert value(t, claim="a", statistic="selectivity", variant="true") == pytest.approx(-1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51 + 1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="true") == pytest.approx(
        (0.05 - 0.01) / (0.05 + 0.01) + 1 / 13
    )
    # (b): one discovery among true K induction <- recent_window (1.0 <- 0.1, not 1.1 <- 0.1)
    assert value(t, claim="b", statistic="b") == 1
    assert value(t, claim="b", statistic="relative", variant="true") == pytest.approx(2 / 3)
    assert value(t, claim="b", statistic="relative", variant="errata_dabc") == pytest.approx(0.01 / 0.50)
    # (m): K discoveries, 3 true against 2 under each rotation, one row per rotation; Q and V beside
    # it (m_kind): Q 0 true against 1 (B C D A) and 0 (D A B C); V 1 against none
    assert value(t, claim="m", statistic="discoveries", kind="K", variant="true") == 3
    assert value(t, claim="m", statistic="discoveries", kind="Q", variant="errata_bcda") == 1
    for rotation in ("errata_bcda", "errata_dabc"):
        assert value(t, claim="m", statistic="m", variant=rotation) == 3 - 2
        assert value(t, claim="m", statistic="m_kind", kind="K", variant=rotation) == 3 - 2
    assert value(t, claim="m", statistic="m_kind", kind="Q", variant="errata_bcda") == -1
    assert value(t, claim="m", statistic="m_kind", kind="Q", variant="errata_dabc") == 0
    assert value(t, claim="m", statistic="m_kind", kind="V", variant="errata_dabc") == 1
    # beside them the raw rule: z > 3 for five true pairs (the 0.05 pair: z = 5 k) and every errata
    # pair (background z 10); and the placebo pairs' false-positive rate
    assert value(t, claim="m", statistic="raw_z_above_3", kind="K", variant="true") == 4
    assert value(t, claim="m", statistic="raw_z_above_3", kind="Q", variant="errata_bcda") == 9
    assert value(t, claim="m", statistic="placebo_rate", kind="K", variant="errata_dabc") == pytest.approx(
        1 / 3
    )
    assert value(t, claim="m", statistic="placebo_rate", kind="K", variant="errata_bcda") == 0
    # (d): the paper's plotting (excess > 0.1) draws three true K pairs and one V; only K edges, all
    # from head 0.0, under rotated denominators; nothing drawn under true ones
    assert value(t, claim="d", statistic="drawn", kind="K", variant="true") == 3
    assert value(t, claim="d", statistic="layer0_k_sources", variant="errata_bcda") == 1
    assert value(t, claim="d", statistic="d", hypothesis="rotated") == 1.0
    assert value(t, claim="d", statistic="d", hypothesis="true") == 0.0
    assert value(t, claim="d", statistic="only_k_one_source", variant="true") == 0.0  # V edges too
    # (c): PR-AUC 0.8 against the better rotation's 0.6 (every effect alike here); chance 2 / 9 beside it
    e = "heldout_loss_effect"
    assert value(t, claim="c", statistic="pr_auc", kind="K", variant="true", effect=e) == pytest.approx(0.8)
    assert value(
        t, claim="c", statistic="roc_auc", kind="K", variant="errata_dabc", effect=e
    ) == pytest.approx(0.7)
    assert value(t, claim="c", statistic="causal_edges", kind="K", effect=e) == 2
    assert value(t, claim="c", statistic="causal_fraction", kind="K", effect=e) == pytest.approx(2 / 9)
    assert value(t, claim="c", statistic="top_source", kind="K", variant="true", effect=e) == 1.0
    # (c) compares the pair-specific parts: 0.5 against the better rotation's 0.2, one value whatever
    # the denominators; the raw-effect comparison beside it, per hypothesis: 0.6 against 0.3
    assert value(t, claim="c", statistic="c") == pytest.approx(0.5 - 0.2)
    for h in ("rotated", "true"):
        assert value(t, claim="c", statistic="c_raw", hypothesis=h) == pytest.approx(0.6 - 0.3)
    assert value(t, claim="c", statistic="interaction", kind="K", variant="projection", effect=e) == 0.3
    assert value(t, claim="c", statistic="main_share", kind="V", effect=e) == 0.9
    # (e): the two discovered induction <- previous_token pairs' alignment 4 and 2 times chance, their
    # writer's other reader (1.2) at chance; the rotated-over-true excess is all alignment
    ln2 = math.log(2)
    assert value(t, claim="e", statistic="e", kind="K") == pytest.approx(1.5 * ln2)
    assert value(t, claim="e", statistic="alignment", kind="K") == pytest.approx(1.5 * ln2)
    assert value(t, claim="e", statistic="other_alignment", kind="K") == pytest.approx(0.0, abs=1e-12)
    assert value(t, claim="e", statistic="excess", kind="K") == pytest.approx(0.75 * ln2)
    assert value(t, claim="e", statistic="excess_alignment", kind="K") == pytest.approx(0.75 * ln2)
    assert value(t, claim="e", statistic="excess_anisotropy", kind="K") == pytest.approx(0.0, abs=1e-12)
    assert value(t, claim="e", statistic="output_query", kind="K") == pytest.approx(-ln2)
    assert value(t, claim="e", statistic="pairs", kind="K") == 2
    assert value(t, claim="e", statistic="effective_channels", kind="K") == 3.0
    assert value(t, claim="e", statistic="top_share", kind="K") == pytest.approx(0.5)
    assert value(t, claim="e", statistic="channel_discoveries", kind="K") == 1
    assert value(t, claim="e", statistic="causal_share", kind="K") == pytest.approx(0.7)


def test_claim_c_reports_the_role_only_baseline_and_every_threshold():
    """synthetic_seeds' agreement (its docstring): beside each score's PR-AUC, the role-only
    ranker's (0.4), and for the pattern effect every variant's PR-AUC, the role-only ranker's and
    the causal edges at each threshold; at 0.1 no edge is causal, so every PR-AUC is undefined."""
    t = long_table(syn.seed_inputs(1))
    p = "pattern_effect"
    for e in ("heldout_loss_effect", "loss_effect", "attn_effect", p):
        assert value(t, claim="c", statistic="role_pr_auc", kind="K", effect=e) == pytest.approx(0.4)
    assert value(t, claim="c", statistic="causal_edges_at_0.05", kind="K", effect=p) == 1
    assert value(t, claim="c", statistic="causal_edges_at_0.01", kind="Q", effect=p) == 2
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="true", effect=p) == 1.0
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="errata_dabc", effect=p) == 0.25
    assert value(t, claim="c", statistic="pr_auc_at_0.05", kind="K", variant="invariant", effect=p) == 0.5
    assert value(t, claim="c", statistic="pr_auc_at_0.02", kind="K", variant="true", effect=p) == 0.8
    assert value(t, claim="c", statistic="role_pr_auc_at_0.05", kind="K", effect=p) == 0.5
    assert math.isnan(value(t, claim="c", statistic="role_pr_auc_at_0.1", kind="K", effect=p))
    assert math.isnan(value(t, claim="c", statistic="pr_auc_at_0.1", kind="K", variant="true", effect=p))
    # only the thresholded effect has rows per threshold; (c) itself reads min_effect's cut
    assert not ((t["statistic"] == "pr_auc_at_0.05") & (t["effect"] != p)).any()
    c = t[(t["claim"] == "c") & (t["statistic"] == "c")]
    assert set(c["effect"]) == {p} and c["value"].to_numpy() == pytest.approx([0.5 - 0.2])


def test_each_claim_is_one_unit_and_the_long_table_keeps_its_order():
    """A claim's rows are its own number under each of its hypotheses and the auxiliary statistics
    it describes (so the report can say what each is); a restatement with the invariant measure
    sits beside the claim it restates, hypothesis by hypothesis."""
    t = long_table(syn.seed_inputs(0))
    for name, c in CLAIMS.items():
        rows = t[t["claim"] == name]
        own = rows[rows["statistic"] == name]
        column = "variant" if c.versus else "hypothesis"  # one row per rotation, or per hypothesis
        assert list(own[column]) == [side for _, side in c.sides()], name
        assert set(rows["statistic"]) == {name, *c.auxiliary}, name
    order = [
        "training",
        "roles",
        "role_ablation",
        "a",
        "b",
        "b_inv",
        "m",
        "m_inv",
        "d",
        "c",
        "c_inv",
        "c_proj",
        "e",
        "t",
    ]
    assert list(dict.fromkeys(t["claim"])) == order
    own = t[t["statistic"].isin(["c", "c_inv", "c_proj"])]
    assert list(own["claim"]) == ["c", "c_inv", "c_proj"] and set(own["hypothesis"]) == {"-"}
    with pytest.raises(ValueError) as caught:  # a second claim under a name in use
        claim("a", "a copy", "its number", 0.0)(lambda seed: iter(()))
    one_line(caught, "'a'")


def test_seed_without_recent_window_heads_leaves_claim_b_out():
    inp = syn.seed_inputs(0)
    inp.heads.loc[inp.heads["role"] == "recent_window", "role"] = "other"
    inp.agreement = {"heldout_loss_effect": {"spearman": {"K": {"true": None}}, "top_source": {}}}
    t = long_table(inp)
    assert math.isnan(value(t, claim="b", statistic="b"))
    assert math.isnan(value(t, claim="b", statistic="relative", variant="true"))
    assert math.isnan(value(t, claim="c", statistic="c"))  # no agreement
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(49 / 51 + 1 / 13)


def test_claims_under_the_invariant_measure_known_values():
    long = long_table(syn.seed_inputs(0))
    assert value(long, claim="b_inv", statistic="b_inv", variant="invariant") == 0  # 1.0 <- 0.1 not found
    assert value(long, claim="m", statistic="discoveries", kind="K", variant="invariant") == 2
    assert value(long, claim="m", statistic="discoveries", kind="V", variant="invariant") == 0
    for rotation in ("errata_bcda", "errata_dabc"):  # K: 2 invariant against 2 of each rotation
        assert value(long, claim="m_inv", statistic="m_inv", variant=rotation) == 2 - 2
    assert value(long, claim="c_inv", statistic="c_inv") == pytest.approx(0.4 - 0.2)  # interaction rho
    assert value(long, claim="c_proj", statistic="c_proj") == pytest.approx(0.3 - 0.2)


def test_timing_through_training_known_values():
    long = long_table(syn.seed_inputs(0))
    assert value(long, claim="t", statistic="phase_step") == 300
    clear = {"true": 400, "errata_bcda": 300, "errata_dabc": 200, "invariant": 300}  # synthetic_seeds doc
    for m, step in clear.items():
        assert value(long, claim="t", statistic="clear_step", kind="K", variant=m) == step
        assert value(long, claim="t", statistic="lag", kind="K", variant=m) == step - 300
    assert (
        value(long, claim="t", statistic="clear_step", kind="K", variant="errata_dabc_trueden") == 200
    )  # same z
    assert value(long, claim="t", statistic="t", kind="K", variant="errata_bcda") == 400 - 300
    assert value(long, claim="t", statistic="t", kind="K", variant="errata_dabc") == 400 - 200
    assert value(long, claim="t", statistic="z_growth", kind="K", variant="true") == pytest.approx(0.7)
    assert value(long, claim="t", statistic="z_growth", kind="K", variant="errata_dabc") == pytest.approx(1.8)
    assert value(long, claim="t", statistic="z_growth_ratio", kind="K") == pytest.approx(1.3 / 0.7)
    result = compare.compare([syn.seed_inputs(s) for s in (0, 1, 2)], CFG, EDGE, FDR)
    for rotation, steps in (("errata_bcda", 100.0), ("errata_dabc", 200.0)):
        t = result.summary["claims"]["t"][rotation]
        assert (t["verdict"], t["seeds_holding"], t["mean"]) == ("holds", 3, steps)


def test_t_is_untestable_with_one_checkpoint():
    """A loaded model is its own only checkpoint: every measure "clears" at step 0, which is no
    order in time; (t) is untestable, not inconclusive at 0."""
    from dataclasses import replace

    one = syn.steps().iloc[[-1]].assign(step=0, tokens=0)  # discovered under every measure
    seeds = [replace(syn.seed_inputs(s), steps=one) for s in (0, 1, 2)]
    assert math.isnan(value(long_table(seeds[0]), claim="t", statistic="t", kind="K", variant="errata_bcda"))
    result = compare.compare(seeds, CFG, EDGE, FDR)
    for rotation in ("errata_bcda", "errata_dabc"):
        t = result.summary["claims"]["t"][rotation]
        assert (t["verdict"], t["seeds_tested"], t["mean"]) == ("untestable", 0, None), t


# --- claims whose rotations differ; verdicts; reading a seed ---------------------------------


def test_claims_a_and_d_take_the_worse_rotation():
    """synthetic_seeds, with one change: D A B C (rotated denominators) also gets a V edge
    other <- other of excess 0.25, so its selectivity drops to (0.5 - 0.25) / 0.75 = 1/3 while
    B C D A's stays 49/51, and it draws a V edge (not K only)."""
    inp = syn.seed_inputs(0)
    s = inp.scores
    row = (s["kind"] == "V") & (s["variant"] == "errata_dabc") & (s["src_head"] == 2) & (s["dst_head"] == 2)
    assert row.sum() == 1
    s.loc[row, "score"] = s.loc[row, "baseline_mean"] + 0.25
    t = long_table(inp)
    assert value(t, claim="a", statistic="selectivity", variant="errata_dabc") == pytest.approx(1 / 3)
    assert value(t, claim="a", statistic="selectivity", variant="errata_bcda") == pytest.approx(49 / 51)
    true_sel = value(t, claim="a", statistic="selectivity", variant="true")
    assert true_sel == pytest.approx(-1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="rotated") == pytest.approx(1 / 3 + 1 / 13)
    assert value(t, claim="a", statistic="a", hypothesis="true") == pytest.approx(2 / 3 + 1 / 13)
    assert value(t, claim="d", statistic="only_k_one_source", variant="errata_dabc") == 0.0
    assert value(t, claim="d", statistic="only_k_one_source", variant="errata_bcda") == 1.0
    assert value(t, claim="d", statistic="d", hypothesis="rotated") == 0.0


def test_claim_c_reads_the_interaction_of_its_effect_and_k_and_no_other_cell():
    """synthetic_seeds' agreement, changed everywhere but where claim (c) reads (the pair-specific
    parts' Spearman, "interaction", of its effect, claims.PRIMARY_EFFECT, and K): elsewhere, and in
    the raw Spearman of that very cell, the corrected score agrees worst and the rotations best,
    every PR-AUC and ROC-AUC favours the rotations. (c) stays 0.5 - 0.2, (c_inv) 0.4 - 0.2, (c_proj)
    0.3 - 0.2, the same under either denominator hypothesis."""
    inp = syn.seed_inputs(0)
    inp.agreement = json.loads(json.dumps(syn.AGREEMENT))  # its cells are shared dicts: unshare them
    ours = ("true", "invariant", "projection")
    for effect, per_effect in inp.agreement.items():
        for statistic in ("spearman", "interaction"):
            for kind, per_kind in per_effect[statistic].items():
                if (statistic, effect, kind) != ("interaction", PRIMARY_EFFECT, CLAIM_KIND):
                    for v in per_kind:
                        per_kind[v] = -0.9 if v in ours else 0.9
        for per_kind in per_effect["ranking"].values():
            for v, ranked in per_kind.items():
                ranked["pr_auc"] = ranked["roc_auc"] = 0.0 if v in ours else 1.0
    t = long_table(inp)
    assert value(t, claim="c", statistic="c") == pytest.approx(0.5 - 0.2)
    assert value(t, claim="c_inv", statistic="c_inv") == pytest.approx(0.4 - 0.2)
    assert value(t, claim="c_proj", statistic="c_proj") == pytest.approx(0.3 - 0.2)
