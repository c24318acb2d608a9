"""Head classification on the planted model (tests/planted.py), the weight-based scores
against dense float64, reproducibility, and the heads stage end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import torch
from models import random_model

from pipeline import checkpoint, params, tables
from pipeline.behaviour import agreement, heads
from pipeline.circuits import composition, significance, weights
from pipeline.config import CompositionConfig, DataConfig, HeadsConfig, RoleThresholds
from pipeline.data import datasets
from pipeline.model import tl_checkpoint
from pipeline.tables import ABLATION_COLUMNS, VARIANTS

ROOT = Path(__file__).resolve().parents[1]
LENGTH = 7
CFG = HeadsConfig(eval_sequences=32, repeat_length=LENGTH, window_length=planted.WINDOW)
PLANTED_ROLES = {
    (0, 0): "previous_token", (0, 1): "first_token", (0, 2): "duplicate_token",
    (1, 0): "induction", (1, 1): "current_token", (1, 2): "recent_window",
}  # fmt: skip


def scores_of(hw: weights.HeadWeights) -> pd.DataFrame:
    return composition.composition_scores(hw, CompositionConfig(baseline_samples=8, null_samples=4), seed=0)


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


@pytest.fixture(scope="module")
def planted_result(planted_scores):
    model, hw = planted.model(), weights.from_state_dict(planted.state_dict())
    repeated, heldout = planted.repeated(32, LENGTH, 0), planted.random_tokens(32, planted.N_CTX, 1)
    return heads.analyse_batches(model, hw, repeated, heldout, CFG, planted_scores)


def test_planted_heads_get_their_roles(planted_result):
    table = planted_result.table
    assert list(table.columns) == heads.COLUMNS
    assert (
        dict(zip(zip(table["layer"], table["head"], strict=True), table["role"], strict=True))
        == PLANTED_ROLES
    )
    by_head = table.set_index(["layer", "head"])
    assert by_head.loc[(0, 0), "prev_token"] > 0.99 and by_head.loc[(1, 0), "induction"] > 0.99
    # only the planted heads take those roles, even as secondary flags
    assert table.loc[table["is_previous_token"], ["layer", "head"]].values.tolist() == [[0, 0]]
    assert table.loc[table["is_induction"], ["layer", "head"]].values.tolist() == [[1, 0]]
    assert by_head.loc[(0, 0), "is_recent_window"]  # a previous-token head also fills the window


def test_planted_copying_and_qk_positivity(planted_result):
    by_head = planted_result.table.set_index(["layer", "head"])
    # the induction head copies (+1), the current-token head writes minus its token (-1);
    # the rest write where W_U does not read: no eigenvalues, NaN
    assert by_head.loc[(1, 0), "copying"] == pytest.approx(1.0)
    assert by_head.loc[(1, 1), "copying"] == pytest.approx(-1.0)
    assert by_head.loc[[(0, 0), (0, 1), (0, 2), (1, 2)], "copying"].isna().all()
    # the induction head's K-composition term with the previous-token head: query t seeks PREV = t
    assert by_head.loc[(1, 0), "qk_positivity"] == pytest.approx(1.0)
    assert by_head.loc[0, "qk_positivity"].isna().all()  # layer 0 reads no earlier head


def test_planted_pair_has_the_largest_true_k_composition(planted_scores):
    scores = planted_scores
    true_k = scores[(scores["kind"] == "K") & (scores["variant"] == "true")]
    best = true_k.loc[true_k["score"].idxmax()]
    assert (best["src_layer"], best["src_head"], best["dst_layer"], best["dst_head"]) == (0, 0, 1, 0)
    assert best["score"] == pytest.approx(0.25)  # two rank-16 isometries: 1 / sqrt(16)
    others = true_k.drop(best.name)["score"].dropna()
    assert len(others) > 0 and others.abs().max() < 1e-12


def test_qk_positivity_source_is_the_best_k_composer(planted_scores):
    sources = heads.best_sources(planted_scores)
    assert sources[(1, 0)] == (0, 0) and set(sources) == {(1, 0), (1, 1), (1, 2)}  # layer 0 reads none


# --- weight-based scores against dense float64 -------------------------------------


def dense_positivity(M: torch.Tensor) -> float:
    lam = torch.linalg.eigvals(M)
    return float(lam.sum().real / lam.abs().sum())


def test_copying_and_qk_positivity_equal_dense_float64():
    model = random_model("three_layers", seed=3)
    hw = weights.from_state_dict(model.state_dict())
    sources = heads.best_sources(scores_of(hw))  # read from scores.csv, as the stage does
    copying, qk = heads.copying(hw), heads.qk_positivity(hw, sources)
    K = composition.true_scores(hw, "K")["K"]
    for layer in range(3):
        for h in range(3):
            OV = hw.W_V[layer, h] @ hw.W_O[layer, h]  # [d_model, d_model]
            assert copying[layer, h] == pytest.approx(dense_positivity(hw.W_E @ OV @ hw.W_U), abs=1e-10)
            if layer == 0:
                continue
            i, a = divmod(int(K[:layer, :, layer, h].reshape(-1).argmax()), 3)  # best earlier K-composer
            assert sources[(layer, h)] == (i, a)
            QK = hw.W_Q[layer, h] @ hw.W_K[layer, h].T
            M = hw.W_E @ QK @ (hw.W_V[i, a] @ hw.W_O[i, a]).T @ hw.W_E.T  # [d_vocab, d_vocab]
            assert qk[layer, h] == pytest.approx(dense_positivity(M), abs=1e-10)


# --- roles ---------------------------------------------------------------------------


def test_primary_role_nesting_roles_first_then_highest_score_and_nan_takes_none():
    scores = pd.DataFrame(
        [  # prev, current, first, window, duplicate, induction
            (0.9, 0.0, 0.0, 0.95, 0.0, 0.0),  # previous-token beats recent-window
            (0.0, 0.0, 0.6, 0.0, 0.0, 0.4),  # induction beats first-token (no match: first token)
            (0.2, 0.0, 0.0, 0.8, 0.0, 0.0),  # smeared over the window
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.29),  # below every threshold
            (np.nan, np.nan, np.nan, np.nan, np.nan, np.nan),
            (0.0, 0.0, 0.95, 0.0, 0.5, 0.0),  # first-token beats duplicate (token 0 recurs)
            (0.0, 0.0, 0.1, 0.55, 0.9, 0.0),  # a duplicate-token head in repetitive text
            (0.0, 0.6, 0.0, 0.0, 0.6, 0.0),  # a tie goes to the earlier role in ROLES
        ],
        columns=heads.SCORES[:6],
    )
    table = scores.assign(layer=0, head=range(len(scores)), role="", copying=np.nan, qk_positivity=np.nan)
    out = heads.classify(table, RoleThresholds(recent_window=0.5))
    assert out["role"].tolist() == [
        "previous_token", "induction", "recent_window", "other", "other",
        "first_token", "duplicate_token", "duplicate_token",
    ]  # fmt: skip
    assert out["is_recent_window"].tolist() == [True, False, True, False, False, False, True, False]
    assert out["is_first_token"].tolist() == [False, True, False, False, False, True, False, False]
    assert out["is_duplicate_token"].tolist() == [False] * 5 + [True, True, True]
    assert out[list(heads.FLAGS)].dtypes.eq(bool).all()


# --- determinism -----------------------------------------------------------------------


def test_scores_are_invariant_to_the_order_of_the_evaluation_batches():
    model = random_model(seed=1)
    hw = weights.from_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(0)
    rep = torch.cat(
        [
            torch.zeros(16, 1, dtype=torch.long),
            torch.randint(0, model.cfg.d_vocab, (16, LENGTH), generator=gen).repeat(1, 2),
        ],
        1,
    )
    held = torch.randint(0, model.cfg.d_vocab, (16, model.cfg.n_ctx), generator=gen)
    perm = torch.randperm(16, generator=gen)
    scores = scores_of(hw)
    a = heads.analyse_batches(model, hw, rep, held, CFG, scores)
    b = heads.analyse_batches(model, hw, rep[perm], held[perm], CFG, scores)
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=False, rtol=0, atol=1e-12)
    pd.testing.assert_frame_equal(a.ablation, b.ablation, check_exact=False, rtol=0, atol=1e-12)
    assert a.ablation["loss_effect"].abs().max() > 1e-4  # the comparison is not of zeros
    assert a.ablation["heldout_loss_effect"].abs().max() > 1e-4


def test_analysis_is_reproducible_for_a_seed():
    model = random_model(seed=2)
    hw = weights.from_state_dict(model.state_dict())
    scores = scores_of(hw)

    def analyse(seed: int) -> heads.HeadsResult:
        dataset = datasets.load(
            DataConfig(n_train_sequences=200), model.cfg, seed, CFG.eval_sequences, need_train=False
        )
        return heads.analyse(model, hw, dataset, CFG, seed, scores)

    first, again = analyse(5), analyse(5)
    pd.testing.assert_frame_equal(first.table, again.table, check_exact=True)
    pd.testing.assert_frame_equal(first.ablation, again.ablation, check_exact=True)
    other = analyse(6)
    assert not np.allclose(first.table["prev_token"], other.table["prev_token"])  # the seed matters


# --- summary -------------------------------------------------------------------------


def test_summary_counts_roles(planted_result, planted_scores):
    summary = heads.summarize(planted_result, planted_scores, min_effect=0.01)
    assert summary["roles"] == {role: (0 if role == "other" else 1) for role in heads.ROLES}
    assert summary["heads_by_role"]["induction"] == ["1.0"]
    assert set(summary["agreement"]) == set(agreement.EFFECTS)
    for measures in summary["agreement"].values():
        assert set(measures["spearman"]) == {"Q", "K", "V"} and set(measures["spearman"]["K"]) == set(
            VARIANTS
        )
    # the planted circuit serves the probe: ablating its induction head, or the previous-token head it
    # reads, raises the loss there; on random held-out tokens it copies confidently where nothing
    # repeats (its logits are scaled by 20), so ablating it lowers the loss: the sign a circuit that
    # does not serve the text gets
    ablated = summary["role_ablation"]
    assert [ablated[r]["heads"] for r in ("induction", "previous_token")] == [["1.0"], ["0.0"]]
    assert (
        ablated["induction"]["probe_loss_effect"] > 0.3
        and ablated["previous_token"]["probe_loss_effect"] > 0.3
    )
    assert ablated["induction"]["heldout_loss_effect"] < -1
    assert ablated["induction"]["batches"]["probe_loss_effect"] == [ablated["induction"]["probe_loss_effect"]]
    # the planted edge 0.0 -> 1.0 (K) is the one the ablation and every score agree on
    assert summary["agreement"]["attn_effect"]["top_source"]["K"]["true"]["match"] >= 1
    # the role-free effect: on random held-out tokens only cutting 0.0 from 1.0's keys moves a head
    # (1.0's pattern by ~0.39 > 0.1), so it is the one causal K edge at every threshold; the true
    # score and the role-only ranker (a previous-token head into an induction head) both rank it first
    pattern = summary["agreement"]["pattern_effect"]
    assert list(pattern["by_threshold"]) == ["0.01", "0.02", "0.05", "0.1"]
    for cut in (pattern, *pattern["by_threshold"].values()):
        assert cut["ranking"]["K"]["true"] == {"pr_auc": 1.0, "roc_auc": 1.0, "causal": 1, "pairs": 9}
        assert cut["role_baseline"]["K"] == {"pr_auc": 1.0, "roc_auc": 1.0, "causal": 1, "pairs": 9}
        assert cut["role_baseline"]["V"]["causal"] == 0 and cut["role_baseline"]["V"]["pr_auc"] is None
    assert "by_threshold" not in summary["agreement"]["attn_effect"]  # only the role-free effect is cut
    assert set(summary["agreement"]["attn_effect"]["role_baseline"]) == {"Q", "K", "V"}
    json.dumps(summary, allow_nan=False)  # valid JSON: undefined values are null


def test_analysis_on_analysis_device_equals_the_cpu_default(planted_result, planted_scores):
    """analysis.device: the forward passes, the path ablation and the role ablation run there and
    come back to the CPU: every table and effect equals the default's, bit for bit on the CPU and
    to float64 rounding on CUDA (where present; the same code runs on the CPU otherwise)."""
    hw = weights.from_state_dict(planted.state_dict())
    repeated, heldout = planted.repeated(32, LENGTH, 0), planted.random_tokens(32, planted.N_CTX, 1)
    for device in ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]:
        got = heads.analyse_batches(
            planted.model(), hw, repeated, heldout, CFG, planted_scores, device=device
        )
        exact = {"check_exact": True} if device == "cpu" else {"rtol": 1e-9, "atol": 1e-12}
        pd.testing.assert_frame_equal(got.table, planted_result.table, **exact)
        pd.testing.assert_frame_equal(got.batches, planted_result.batches, **exact)
        assert got.example["pattern"].device.type == "cpu"
        assert got.example["pattern"].allclose(planted_result.example["pattern"], rtol=0, atol=1e-12)
        for role, want in planted_result.role_ablation.items():
            assert got.role_ablation[role]["heads"] == want["heads"]
            assert got.role_ablation[role]["placebo_sets"] == want["placebo_sets"]
            assert got.role_ablation[role]["heldout_loss_effect"] == pytest.approx(
                want["heldout_loss_effect"], abs=1e-12
            )
            assert got.role_ablation[role]["placebo_p"] == want["placebo_p"]


def test_placebo_sets_known_answers():
    """As many heads of each layer as the role has there, from all the layer's heads: every other
    set while there are at most n (exact), else n distinct sets other than the role's, drawn from
    the run's stream."""
    rng = np.random.default_rng(0)
    assert heads._placebo_sets([(1, 0)], 3, 19, rng) == ([[(1, 1)], [(1, 2)]], True)
    two_layers = heads._placebo_sets([(0, 0), (1, 0)], 2, 19, rng)
    assert two_layers == ([[(0, 0), (1, 1)], [(0, 1), (1, 0)], [(0, 1), (1, 1)]], True)
    assert heads._placebo_sets([(1, 0), (1, 1), (1, 2)], 3, 19, rng) == (None, False)  # no other set
    assert heads._placebo_sets([], 3, 19, rng) == (None, False)
    drawn, exact = heads._placebo_sets([(1, 0), (1, 3)], 8, 5, np.random.default_rng(1))  # 27 others > 5
    assert not exact and len(drawn) == 5 and all(len(set(s)) == 2 and s == sorted(s) for s in drawn)
    assert all(layer == 1 and 0 <= h < 8 for s in drawn for layer, h in s)
    assert len({tuple(s) for s in drawn}) == 5 and [(1, 0), (1, 3)] not in drawn  # distinct, never the role's
    assert drawn == heads._placebo_sets([(1, 0), (1, 3)], 8, 5, np.random.default_rng(1))[0]
    assert drawn != heads._placebo_sets([(1, 0), (1, 3)], 8, 5, np.random.default_rng(2))[0]
    # at the bound exactly (27 others), every set: the test is exact
    every, exact = heads._placebo_sets([(1, 0), (1, 3)], 8, 27, np.random.default_rng(1))
    assert exact and len(every) == 27 and len({tuple(s) for s in every}) == 27


def test_role_ablation_reads_each_role_against_placebo_sets(planted_result):
    """The planted model's induction head is ranked among the other heads of layer 1. On random
    tokens it lowers the loss by more than 1 nat, below both: it does not serve that text. On
    repeated text it raises the loss above both, p = 1/3: three heads cannot show more. With 17
    silent heads more in each layer it beats all 19 other heads of its layer: p = 1/20, serves."""
    model, table = planted.model(), planted_result.table
    ablated = planted_result.role_ablation["induction"]
    assert ablated["placebo_sets"] == [["1.1"], ["1.2"]]
    assert ablated["placebo_p"] == 1.0 and ablated["serves_heldout"] is False
    assert ablated["placebo_p_lower"] == pytest.approx(1 / 3) and ablated["placebo_exact"] is True
    assert max(ablated["placebo_heldout_loss_effects"]) > ablated["heldout_loss_effect"]
    repeated = planted.repeated(32, LENGTH, 0)
    small = heads.role_ablation(model, table, [repeated], [repeated], CFG, seed=0)
    assert small["induction"]["placebo_p"] == pytest.approx(1 / 3)
    assert small["induction"]["placebo_p_lower"] == 1.0
    assert small["induction"]["serves_heldout"] is False
    wide = pd.concat(
        [table[["layer", "head", "role"]]]
        + [pd.DataFrame({"layer": layer, "head": range(3, 20), "role": "other"}) for layer in (0, 1)],
        ignore_index=True,
    )
    served = heads.role_ablation(planted.wide_model(17), wide, [repeated], [repeated], CFG, seed=0)
    for role, head in (("induction", "1.0"), ("previous_token", "0.0")):  # 0.0: the head 1.0 reads
        assert served[role]["heads"] == [head]
        assert sorted(s for (s,) in served[role]["placebo_sets"]) == sorted(
            f"{head[0]}.{h}" for h in range(20) if h != 0
        )
        assert served[role]["placebo_p"] == pytest.approx(1 / 20)
        assert served[role]["serves_heldout"] is True
    # the silent heads change nothing: their sets' effects are exactly 0
    assert served["induction"]["placebo_heldout_loss_effects"][2:] == [0.0] * 17
    assert heads.role_ablation(planted.wide_model(17), wide, [repeated], [repeated], CFG, seed=0) == served


def test_role_ablation_has_no_placebo_when_the_role_holds_its_whole_layer(planted_result):
    """Every head of layer 1 an induction head: nothing to compare with, so no verdict (null), not
    a pass."""
    model, table = planted.model(), planted_result.table.copy()
    table.loc[table["layer"] == 1, "role"] = "induction"
    ablated = heads.role_ablation(
        model,
        table,
        [planted.repeated(8, LENGTH, 0)],
        [planted.random_tokens(8, planted.N_CTX, 1)],
        CFG,
        seed=0,
    )
    assert ablated["induction"]["heads"] == ["1.0", "1.1", "1.2"]
    assert ablated["induction"]["heldout_loss_effect"] is not None
    assert ablated["induction"]["placebo_p"] is None and ablated["induction"]["serves_heldout"] is None


def test_role_ablation_placebo_p_is_uniform_when_the_role_is_any_other_heads():
    """Calibration on untrained weights: a random set of layer-1 heads named the role is drawn as
    the placebo sets are, so p <= 0.1 at most 10% of the time with 9 sets (the rank test is exact
    under exchangeability; a set equal to the role's counts against it, 1 draw in 15), and the
    rule (which also needs min_effect) passes none."""
    model = random_model("tiny", seed=3, n_heads=6, n_ctx=16, d_vocab=32)
    rng = np.random.default_rng(0)
    text = [torch.randint(0, 32, (16, 16), generator=torch.Generator().manual_seed(b)) for b in range(2)]
    ps, passed = [], 0
    for draw in range(60):
        role = {(1, int(h)) for h in rng.choice(6, 2, replace=False)}
        table = pd.DataFrame(
            [
                {"layer": l, "head": h, "role": "induction" if (l, h) in role else "other"}
                for l in range(2)
                for h in range(6)
            ]
        )
        cfg = HeadsConfig(placebo_sets=9)
        out = heads.role_ablation(model, table, text, text, cfg, seed=draw)["induction"]
        ps.append(out["placebo_p"])
        passed += out["serves_heldout"]
    assert set(ps) <= {k / 10 for k in range(1, 11)}
    assert 1 <= sum(p <= 0.1 for p in ps) <= 14  # 10% of 60 is 6; 14 lies beyond 3 binomial sd
    assert 0.42 < np.mean(ps) < 0.68  # uniform on 0.1 .. 1: mean 0.55, sd of the mean 0.037
    assert passed == 0


# --- the stage -------------------------------------------------------------------------


def stage_inputs(tmp_path):
    """The planted model's checkpoint, weights and composition scores, and a params.yaml."""
    model = planted.model()
    checkpoint.save_state(tmp_path / "model.safetensors", model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(planted.CONFIG)))
    hw = weights.from_state_dict(model.state_dict())
    weights.save(tmp_path / "heads.safetensors", hw)
    measured, _ = significance.measured(
        hw, CompositionConfig(baseline_samples=8, null_samples=4), 0, "shortformer"
    )
    tables.split_measures(measured)[0].to_csv(tmp_path / "scores.csv", index=False)
    overrides = [
        "setup=synthetic", "model.n_ctx=16", "model.d_vocab=16",
        "model.n_heads=3", "model.d_head=32", "model.d_model=96",
        "train.probe_length=7", "analysis.heads.repeat_length=7", "analysis.heads.eval_sequences=16",
        "data.n_train_sequences=1000",  # 50 held out: three ablation batches of 16
    ]  # fmt: skip
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(overrides, conf_dir=ROOT / "conf")))
    return [
        "--params", str(tmp_path / "params.yaml"), "--model", str(tmp_path / "model.safetensors"),
        "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "heads.safetensors"),
        "--scores", str(tmp_path / "scores.csv"), "--seed", "0",
    ]  # fmt: skip


@pytest.mark.slow
def test_stage_writes_the_interface_and_is_byte_identical_on_rerun(tmp_path):
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    out = tmp_path / "out"
    assert stage.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out / "heads.csv")
    assert list(table.columns[:3]) == ["layer", "head", "role"] and list(table.columns) == heads.COLUMNS
    assert (
        dict(zip(zip(table["layer"], table["head"], strict=True), table["role"], strict=True))
        == PLANTED_ROLES
    )
    ablated = pd.read_csv(out / "ablation.csv")
    assert list(ablated.columns) == list(ABLATION_COLUMNS)
    # three disjoint batches (analysis.heads.ablation_batches), ablation.csv their mean
    batches = pd.read_csv(out / "ablation_batches.csv")
    assert list(batches.columns) == ["batch", *ABLATION_COLUMNS] and sorted(set(batches["batch"])) == [
        0,
        1,
        2,
    ]
    mean = batches.groupby(list(ABLATION_COLUMNS[:5]), sort=False)[list(ABLATION_COLUMNS[5:])].mean()
    pd.testing.assert_frame_equal(ablated.set_index(list(ABLATION_COLUMNS[:5])), mean)
    assert batches.groupby("batch")["heldout_loss_effect"].sum().nunique() == 3  # different data each
    summary = json.loads((out / "summary.json").read_text())
    assert summary["roles"]["induction"] == 1
    assert summary["agreement"]["loss_effect"]["spearman"]["K"].keys() == set(VARIANTS)
    rho = summary["agreement"]["loss_effect"]["spearman"]["K"]["true"]
    assert rho is not None and rho > 0  # the one K edge with an effect is the one that composes
    example, _ = checkpoint.load_state(out / "patterns.safetensors")
    assert example["pattern"].shape == (2, 3, 2 * LENGTH + 1, 2 * LENGTH + 1) and example["tokens"].shape == (
        2 * LENGTH + 1,
    )

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert stage.main([*args, "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_stage_names_a_missing_input_in_one_line(tmp_path, capsys):
    from stages import heads as stage

    args = stage_inputs(tmp_path)
    (tmp_path / "scores.csv").unlink()
    assert stage.main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scores.csv" in err
    assert not (tmp_path / "out" / "heads.csv").exists()


# --- figures -----------------------------------------------------------------------------


def test_attention_pattern_panels_are_titled_with_roles(planted_result):
    from pipeline.present.figures import heads as heads_figures

    pattern = planted_result.example["pattern"].numpy()
    fig = heads_figures.attention_patterns(pattern, planted_result.table, LENGTH)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"{l}.{h} {role.replace('_', ' ')}" for (l, h), role in PLANTED_ROLES.items()]
    first = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(first, pattern[0, 0])  # the pattern itself, not a copy of another head's


def test_copying_vs_qk_places_the_induction_head_top_right_and_names_undefined_heads(planted_result):
    from pipeline.present.figures import heads as heads_figures

    fig = heads_figures.copying_vs_qk(planted_result.table)
    (ax,) = fig.axes
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(points, [[1.0, 1.0]])  # only 1.0 has both scores defined
    assert "undefined (not shown): 1.1, 1.2" in [t.get_text() for t in ax.texts]


def test_ablation_figure_shows_each_variants_rho(planted_result, planted_scores):
    from pipeline.present.figures import heads as heads_figures

    scores = planted_scores
    rho = {"K": {"true": 0.5, "errata_bcda": None}}
    fig = heads_figures.ablation_vs_composition(planted_result.ablation, scores, "attn_effect", rho, ("K",))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["K true: Spearman ρ = 0.50"] + [f"K {v}: Spearman ρ = undefined" for v in VARIANTS[1:]]
    k_true = fig.axes[0].collections[0].get_offsets()
    assert len(k_true) == 9 and k_true[:, 1].max() > 0.8  # 3 x 3 pairs; the planted edge's induction drop


@pytest.mark.slow
def test_figures_stage_draws_the_head_figures(tmp_path):
    from stages import figures as figures_stage
    from stages import heads as heads_stage

    args = stage_inputs(tmp_path)
    out = tmp_path / "heads"
    assert heads_stage.main([*args, "--out", str(out)]) == 0
    figure_args = [
        "--params", str(tmp_path / "params.yaml"), "--scores", str(tmp_path / "scores.csv"),
        "--heads", str(out / "heads.csv"), "--ablation", str(out / "ablation.csv"),
        "--heads-summary", str(out / "summary.json"), "--patterns", str(out / "patterns.safetensors"),
    ]  # fmt: skip
    assert figures_stage.main([*figure_args, "--out", str(tmp_path / "figures")]) == 0
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    for base in (
        "attention_patterns",
        "copying_vs_qk",
        "ablation_heldout_loss",
        "ablation_loss",
        "ablation_attn",
        "ablation_pattern",
    ):
        assert {f"{base}.png", f"{base}.svg"} <= names
