"""Known answers for the code around the maths: which head the heads stage reads for QK
positivity, which batches each ablation effect comes from, thresholds reached exactly, agreement
on the size of an effect (not its sign) and on the first of tied sources, the effect each ranking
is built from, claims whose rotations (and cells) differ, verdicts and seed counts at the
threshold, the compare stage's reader, the dynamics stage's pair, a discovery exactly at the FDR,
and the timing figure's points (replacing a count of its tick labels). Each fixture is asymmetric
where a wrong column, rotation, cell or sign would otherwise give the right answer."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import planted
import pytest
import synthetic_seeds as syn
import torch
from test_compare import long_table, value  # one seed's long table (EDGE 0.1, FDR 0.05), a cell of it

from pipeline.behaviour import ablation, agreement, heads
from pipeline.circuits import composition, significance, weights
from pipeline.compare import stats as compare
from pipeline.compare.claims import CLAIM_KIND, PRIMARY_EFFECT
from pipeline.config import CompareConfig, CompositionConfig, HeadsConfig, RoleThresholds
from pipeline.data import datasets
from pipeline.model.transformer import AttnOnlyTransformer

LENGTH = 7
EDGE, FDR = 0.1, 0.05


# --- the heads stage: a previous-token head that is not head 0, and its batches --------------

# layer 0's heads reordered: head 0 is now the duplicate-token head, head 2 the previous-token one
ORDER = [2, 1, 0]


def reordered_state() -> dict[str, torch.Tensor]:
    state = planted.state_dict()
    for name in [n for n in state if n.startswith("blocks.0.attn.") and n != "blocks.0.attn.b_O"]:
        state[name] = state[name][ORDER].clone()
    return state


@pytest.fixture(scope="module")
def reordered():
    state = reordered_state()
    model = AttnOnlyTransformer(planted.CONFIG).to(torch.float64)
    model.load_state_dict(state)
    model.eval()
    hw = weights.from_state_dict(state)
    scores = composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)
    repeated, heldout = planted.repeated(16, LENGTH, 0), planted.random_tokens(16, planted.N_CTX, 1)
    cfg = HeadsConfig(eval_sequences=16, repeat_length=LENGTH, window_length=planted.WINDOW)
    return model, scores, repeated, heldout, heads.analyse_batches(model, hw, repeated, heldout, cfg, scores)


def test_qk_positivity_reads_the_best_k_source_when_it_is_not_head_0(reordered):
    _, scores, _, _, result = reordered
    by_head = result.table.set_index(["layer", "head"])
    assert (
        by_head.loc[(0, 2), "role"] == "previous_token" and by_head.loc[(0, 0), "role"] == "duplicate_token"
    )
    # only 0.2 -> 1.0 composes (through keys); every Q score is 0, so a source picked by Q would be
    # the first head, 0.0, whose output the induction head's keys never read: NaN, not 1
    assert heads.best_sources(scores)[(1, 0)] == (0, 2)
    assert by_head.loc[(1, 0), "qk_positivity"] == pytest.approx(1.0)
    assert by_head.loc[(1, 0), "role"] == "induction" and by_head.loc[(1, 0), "induction"] > 0.99


def test_each_ablation_effect_comes_from_its_own_batch(reordered):
    model, _, repeated, heldout, result = reordered
    on_probe = ablation.path_ablation(model, repeated, LENGTH)
    on_text = ablation.path_ablation(model, heldout, None)
    got = result.ablation
    assert got[list(ablation.COLUMNS[:5])].equals(on_probe[list(ablation.COLUMNS[:5])])
    np.testing.assert_array_equal(got["loss_effect"], on_probe["loss_effect"])
    np.testing.assert_array_equal(got["attn_effect"], on_probe["attn_effect"])
    np.testing.assert_array_equal(got["heldout_loss_effect"], on_text["loss_effect"])
    np.testing.assert_array_equal(got["pattern_effect"], on_text["pattern_effect"])  # role-free: held-out
    assert not np.array_equal(on_probe["pattern_effect"], on_text["pattern_effect"])
    # the planted edge: cutting 0.2 -> 1.0 through keys costs far more on the probe than on random text
    edge = (got["kind"] == "K") & (got["src_head"] == 2) & (got["dst_layer"] == 1) & (got["dst_head"] == 0)
    assert got.loc[edge, "loss_effect"].item() > got.loc[edge, "heldout_loss_effect"].item() + 1.0


def test_analyse_ablates_each_held_out_batch_with_its_own_probe(reordered):
    """`ablation_batches` disjoint held-out batches of `eval_sequences`, batch b with the probe of
    batch b: each batch's effects are those of its own pair of batches."""
    model, scores, _, _, _ = reordered
    n, seed = 4, 5
    text = planted.random_tokens(3 * n, planted.N_CTX, 2)
    dataset = datasets.Dataset(train=None, eval=text, heldout=None, manifest={})
    cfg = HeadsConfig(
        eval_sequences=n, repeat_length=LENGTH, window_length=planted.WINDOW, ablation_batches=3
    )
    hw = weights.from_state_dict(reordered_state())
    batches = heads.analyse(model, hw, dataset, cfg, seed, scores).batches
    assert sorted(set(batches["batch"])) == [0, 1, 2]
    for b in range(3):
        probe = datasets.repeated_probe(dataset, n, LENGTH, planted.V, seed, batch=b)
        mine = batches[batches["batch"] == b].reset_index(drop=True)
        on_probe = ablation.path_ablation(model, probe, LENGTH)
        on_text = ablation.path_ablation(model, text[b * n : (b + 1) * n], None)
        np.testing.assert_array_equal(mine["loss_effect"], on_probe["loss_effect"])
        np.testing.assert_array_equal(mine["heldout_loss_effect"], on_text["loss_effect"])


# --- roles: a score exactly at its threshold ---------------------------------------------


def test_a_score_at_its_threshold_takes_the_role_and_one_just_below_does_not():
    thresholds = RoleThresholds()  # previous_token 0.5, recent_window 0.5, induction 0.3, ...
    rows = []
    for role, score in heads.ROLE_SCORE.items():
        at = getattr(thresholds, role)
        for x in (at, np.nextafter(at, 0.0)):
            rows.append({name: 0.0 for name in heads.SCORES[:6]} | {score: x})
    both = {name: 0.0 for name in heads.SCORES[:6]} | {"prev_token": 0.5, "induction": 0.9}
    table = pd.DataFrame([*rows, both]).assign(layer=0, copying=np.nan, qk_positivity=np.nan)
    table["head"] = range(len(table))
    out = heads.classify(table, thresholds)
    for k, role in enumerate(heads.ROLE_SCORE):
        assert out.loc[2 * k, "role"] == role and out.loc[2 * k, f"is_{role}"], role
        assert out.loc[2 * k + 1, "role"] == "other" and not out.loc[2 * k + 1, f"is_{role}"], role
    # a head that takes both nesting roles is a previous-token head (FIRST's order)
    assert out.iloc[-1]["role"] == "previous_token" and out.iloc[-1]["is_induction"]


# --- agreement: sizes, not signs; each effect its own ranking ------------------------------


def pair_rows(kind: str, values: dict[tuple[int, int], float], column: str) -> pd.DataFrame:
    """{(src_head, dst_head): value} of layer 0 -> layer 1 pairs as table rows."""
    return pd.DataFrame(
        [
            {"kind": kind, "src_layer": 0, "src_head": a, "dst_layer": 1, "dst_head": b, column: v}
            for (a, b), v in values.items()
        ]
    )


def test_spearman_and_top_source_rank_the_size_of_an_effect_not_its_sign():
    # the largest effect is negative: by size the ranks agree with the score exactly, by sign not
    effect = {(0, 0): -0.9, (1, 0): 0.5, (2, 0): -0.3, (0, 1): 0.1}
    score = {(0, 0): 4.0, (1, 0): 3.0, (2, 0): 2.0, (0, 1): 1.0}
    effects = pair_rows("K", effect, "loss_effect")
    scores = pair_rows("K", score, "score").assign(variant="true")
    assert agreement.spearman(effects, scores, "loss_effect")["K"]["true"] == pytest.approx(1.0)
    # later head 1.0: its largest |effect| is from 0.0, its top score too; 1.1's only source 0.0,
    # whose effect 0.1 is exactly min_effect: counted (reaches)
    top = agreement.top_source(effects, scores, "loss_effect", min_effect=0.1)
    assert top["K"]["true"] == {"match": 2, "heads": 2}


def test_a_tie_in_scores_makes_the_first_earlier_head_the_top_source():
    # into 1.0, sources 0.0 and 0.1 score the same; the ablation's top source is 0.0
    effects = pair_rows("K", {(0, 0): 0.5, (1, 0): 0.2}, "loss_effect")
    scores = pair_rows("K", {(0, 0): 1.0, (1, 0): 1.0}, "score").assign(variant="true")
    assert agreement.top_source(effects, scores, "loss_effect", 0.01)["K"]["true"] == {"match": 1, "heads": 1}
    flipped = effects.assign(loss_effect=[0.2, 0.5])  # the ablation's top source is now 0.1
    assert agreement.top_source(flipped, scores, "loss_effect", 0.01)["K"]["true"] == {"match": 0, "heads": 1}


def test_an_edge_at_min_effect_and_beyond_its_one_sided_noise_is_causal():
    effects = {  # three batches each; min_effect 0.25 (exact in binary)
        0: [0.25, 0.25, 0.25],  # exactly min_effect, no spread: causal
        1: [0.25, 0.5, 0.75],  # mean 0.5, sd 0.25: t = 3.46, above t_{0.95, 2} = 2.92 (below 4.30)
        2: [0.0, 0.5, 1.0],  # mean 0.5, sd 0.5: t = 1.73, within its noise
        3: [0.125, 0.125, 0.125],  # below min_effect
    }
    batches = pd.DataFrame(
        [
            {"batch": b, "kind": "K", "src_layer": 0, "src_head": a, "dst_layer": 1, "dst_head": 0,
             "loss_effect": e}
            for a, es in effects.items()
            for b, e in enumerate(es)
        ]
    )  # fmt: skip
    got = agreement.causal_edges(batches, "loss_effect", min_effect=0.25).set_index("src_head")
    assert got["causal"].to_dict() == {0: True, 1: True, 2: False, 3: False}
    assert got.loc[1, "sd"] == pytest.approx(0.25) and got.loc[0, "mean"] == 0.25


def test_each_effects_ranking_is_built_from_that_effect():
    # four sources into 1.0; each effect makes a different one causal; the score ranks 0 > 1 > 2 > 3
    rows = []
    for a, effect in enumerate(agreement.EFFECTS):
        for b in range(3):
            sizes = {e: 0.5 if e == effect else 0.0 for e in agreement.EFFECTS}
            rows.append({"batch": b, "kind": "K", "src_layer": 0, "src_head": a, "dst_layer": 1,
                         "dst_head": 0, **sizes})  # fmt: skip
    batches = pd.DataFrame(rows)
    effects = batches.groupby(agreement.PAIR, sort=False)[list(agreement.EFFECTS)].mean().reset_index()
    scores = pair_rows("K", {(0, 0): 4.0, (1, 0): 3.0, (2, 0): 2.0, (3, 0): 1.0}, "score").assign(
        variant="true"
    )
    summary = agreement.summarize(effects, scores, 0.01, batches)
    # the causal edge at rank 1, 2, 3, 4: average precision 1, 1/2, 1/3, 1/4; ROC-AUC 1, 2/3, 1/3, 0
    want = {"heldout_loss_effect": (1.0, 1.0), "loss_effect": (0.5, 2 / 3), "attn_effect": (1 / 3, 1 / 3),
            "pattern_effect": (1 / 4, 0.0)}  # fmt: skip
    assert list(want) == list(agreement.EFFECTS)
    for effect, (pr, roc) in want.items():
        ranked = summary[effect]["ranking"]["K"]["true"]
        assert (ranked["causal"], ranked["pairs"]) == (1, 4), effect
        assert ranked["pr_auc"] == pytest.approx(pr) and ranked["roc_auc"] == pytest.approx(roc), effect
    # the pattern effect cut at each threshold: its edge (0.5) is causal up to 0.1
    for cut in summary["pattern_effect"]["by_threshold"].values():
        assert cut["ranking"]["K"]["true"]["causal"] == 1 and cut["ranking"]["K"]["true"]["pr_auc"] == 0.25


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


def test_a_verdict_needs_the_whole_interval_beyond_the_threshold():
    """Every seed above 0, but the interval's lower end exactly at 0: inconclusive, not holds (nor,
    mirrored, fails)."""
    holds_but_touches = {"n": 3, "lo": 0.0, "hi": 0.4}
    assert compare.verdict(holds_but_touches, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "inconclusive"
    assert compare.verdict({"n": 3, "lo": 1e-9, "hi": 0.4}, 0.0, [0.1, 0.2, 0.3], min_seeds=3) == "holds"
    assert compare.verdict({"n": 3, "lo": -0.4, "hi": 0.0}, 0.0, [-0.1, -0.2, -0.3], 3) == "inconclusive"


def test_a_seeds_files_are_read_into_their_own_fields(tmp_path):
    """synthetic_seeds' tables written where the stages write them, read back by the compare
    stage's reader: each file in its own field, invariant.csv's rows as variant "invariant"."""
    from pipeline.compare import read

    dirs = syn.write_stage_outputs(tmp_path, [1])
    got = read.read_seed(1, dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    want = syn.seed_inputs(1)

    def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b[list(a.columns)].reset_index(drop=True),
                                      check_dtype=False)  # fmt: skip

    order = ["variant", "kind", "src_head", "dst_head"]
    same(got.scores.sort_values(order), want.scores.sort_values(order))
    assert set(got.scores["variant"]) == set(syn.MEASURES)
    same(got.placebo, want.placebo)
    assert got.placebo["discovery"].sum() == 1 and (got.placebo["dst_layer"] == 0).all()
    same(got.heads, want.heads)
    same(got.curve, want.curve)
    same(got.steps, want.steps)
    assert got.agreement == json.loads(json.dumps(want.agreement))
    assert got.metrics == pytest.approx(want.metrics)


# --- dynamics: the pair followed through training -----------------------------------------


def test_the_top_pairs_source_is_in_an_earlier_layer():
    """The best induction head of layers >= 1 (1.1), and the best previous-token head of the layers
    before it: 0.1, although 1.0's previous-token score is higher."""
    from pipeline.behaviour import dynamics

    final = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "prev_token": [0.2, 0.6, 0.9, 0.0],
                          "induction": [0.9, 0.0, 0.1, 0.8]})  # fmt: skip
    assert dynamics.top_pair(final) == {"src": [0, 1], "dst": [1, 1]}


# --- significance: a q exactly at the FDR -------------------------------------------------


def test_a_pair_whose_q_equals_the_fdr_is_a_discovery():
    # four later pairs into one reader; one stands beyond all 79 placebo pairs of its family, whose
    # top fifth is too thin for a tail (four values above zero: the conformal p alone), p = 1/80,
    # and as the first of its family's four, q = 4/80 = 0.05 exactly (scaling by 4 is exact in
    # binary). Another measure's four pairs are another family (pooled, q would be 8/80)
    real = pd.concat([
        pd.DataFrame({"kind": "K", "variant": variant, "src_layer": 0, "src_head": range(4),
                      "dst_layer": 1, "dst_head": 0, "z": z})
        for variant, z in (("true", [0.0, 1.0, 0.5, 100.0]), ("invariant", [0.0, 1.0, 0.5, 0.2]))
    ], ignore_index=True)  # fmt: skip
    z = np.r_[np.zeros(75), [1.0, 2.0, 3.0, 4.0]]
    placebo = pd.concat([
        pd.DataFrame({"kind": "K", "variant": variant, "src_layer": 1, "src_head": range(79),
                      "dst_layer": 1, "dst_head": 0, "z": z})
        for variant in ("true", "invariant")
    ], ignore_index=True)  # fmt: skip
    scores, _ = significance.calibrate(real, placebo, FDR)
    assert scores.loc[3, "p"] == 1 / 80 and scores.loc[3, "q"] == FDR
    assert scores["discovery"].tolist() == [False, False, False, True] + [False] * 4


# --- the timing figure: every seed's lag where it belongs --------------------------------


def test_timing_figure_places_every_seeds_lag_and_mean():
    """Replaces test_compare's tick count: the points and means drawn are the lags.
    Seed 0 as synthetic_seeds (clear steps 400, 300, 200, 300, 300 for true, B C D A, D A B C,
    invariant and projection; phase step 300); seed 1's true z clears at step 300: lag 0, claim (t) 0."""
    inputs = [syn.seed_inputs(s) for s in (0, 1)]
    steps = inputs[1].steps
    steps.loc[steps["step"] == 300, ["z_true", "q_true"]] = [4.0, 0.01]
    result = compare.compare(inputs, CompareConfig(), EDGE, FDR)
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    from pipeline.present.figures import compare as compare_figures

    fig = compare_figures.timing_figure(result.claims, result.stats, 0.95)
    try:
        left, right = fig.axes[:2]
        lags = {  # (seed 0, seed 1)
            "true": (100, 0),
            "errata_bcda": (0, 0),
            "errata_dabc": (-100, -100),
            "errata_bcda_trueden": (0, 0),
            "errata_dabc_trueden": (-100, -100),
            "invariant": (0, 0),
            "projection": (0, 0),  # the invariant measure's steps
        }
        assert [t.get_text() for t in left.get_xticklabels()] == [
            compare_figures.VARIANT_LABELS[m] for m in syn.MEASURES
        ]
        want = [
            (i + dx, lag)
            for i, m in enumerate(syn.MEASURES)
            for dx, lag in zip((-0.15, 0.15), lags[m], strict=True)
        ]
        np.testing.assert_allclose(dots(left), sorted(want), atol=1e-12)
        # (t) against each rotation: B C D A (seed 0 +100, seed 1 0), D A B C (+200, +100)
        np.testing.assert_allclose(
            dots(right), [(-0.15, 100.0), (0.15, 0.0), (0.85, 200.0), (1.15, 100.0)], atol=1e-12
        )
        # the mean of each column: a horizontal bar at its height (the intervals are vertical)
        bars = [
            seg for c in left.collections if not isinstance(c, PathCollection) for seg in c.get_segments()
        ]
        means = sorted(seg[0][1] for seg in bars if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0])
        assert means == pytest.approx(sorted([np.mean(v) for v in lags.values()]))
    finally:
        plt.close(fig)
    # claim (t): seed 0 at +100 holds; seed 1 at exactly the threshold (0) neither holds nor fails
    t = result.summary["claims"]["t"]["errata_bcda"]
    assert (t["seeds_holding"], t["seeds_failing"], t["seeds_tested"]) == (1, 0, 2)
    assert t["per_seed"] == {"0": 100.0, "1": 0.0}


def dots(ax) -> list[tuple[float, float]]:
    """Every scattered point (x, y) of an axis, sorted."""
    from matplotlib.collections import PathCollection

    points = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    return sorted((float(x), float(y)) for x, y in points)
