"""pipeline/behaviour/heads.py: head roles, weight-based head scores and the role ablation.

Classification on the planted model (tests/planted.py), copying and QK positivity against dense
float64, reproducibility and device independence, the placebo sets of the role ablation, and the
summary's counts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import planted
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import random_model, random_models

from pipeline import memory, params
from pipeline.behaviour import ablation, agreement, heads
from pipeline.circuits import composition, weights
from pipeline.config import (
    CompositionConfig,
    DataConfig,
    HeadsConfig,
    ModelConfig,
    RoleThresholds,
)
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint, transformer
from pipeline.model.transformer import Transformer
from pipeline.tables import ABLATION_COLUMNS, KINDS, ROLES, VARIANTS

LENGTH, CFG, PLANTED_ROLES, scores_of = planted.LENGTH, planted.HEADS, planted.ROLES, planted.scores_of


@pytest.fixture(scope="module")
def planted_scores():
    return scores_of(weights.from_state_dict(planted.state_dict()))


@pytest.fixture(scope="module")
def planted_result(planted_scores):
    return planted.analysed(planted_scores)


def dense_positivity(M: torch.Tensor) -> float:
    lam = torch.linalg.eigvals(M)
    return float(lam.sum().real / lam.abs().sum())


def hand_result() -> tuple[heads.HeadsResult, pd.DataFrame]:
    """Heads 0.0 (previous_token), 1.0 (induction), 1.1 (other); edges 0.0 -> 1.0 with every effect
    0.3 and 0.0 -> 1.1 with every effect 0.03, the same on three batches; every score 1 into 1.0
    and 0 into 1.1."""
    table = pd.DataFrame(
        {"layer": [0, 1, 1], "head": [0, 0, 1], "role": ["previous_token", "induction", "other"]}
    )
    for n, name in enumerate(heads.SCORES):
        table[name] = [0.1 * n, 0.2 * n, np.nan if name == "copying" else 0.3 * n]
    edges = [(k, 0, 0, 1, b) for k in KINDS for b in (0, 1)]
    ablation = pd.DataFrame(edges, columns=list(ABLATION_COLUMNS[:5]))
    for effect in ABLATION_COLUMNS[5:]:
        ablation[effect] = [0.3 if b == 0 else 0.03 for *_, b in edges]
    batches = pd.concat([ablation.assign(batch=b) for b in range(3)], ignore_index=True)
    scores = pd.DataFrame(
        [
            dict(zip(agreement.PAIR, e, strict=True), variant=v, score=float(e[-1] == 0))
            for e in edges
            for v in VARIANTS
        ]
    )
    result = heads.HeadsResult(table, ablation, {}, batches, {"induction": {"heads": ["1.0"]}})
    return result, scores


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


def test_qk_positivity_source_is_the_best_k_composer(planted_scores):
    sources = heads.best_sources(planted_scores)
    assert sources[(1, 0)] == (0, 0) and set(sources) == {(1, 0), (1, 1), (1, 2)}  # layer 0 reads none


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


@pytest.mark.parametrize("min_effect, counted", [(0.01, 2), (0.1, 1)])
def test_summary_records_its_min_effect_and_counts_by_it(min_effect, counted):
    result, scores = hand_result()
    got = heads.summarize(result, scores, min_effect)
    assert got["min_effect"] == min_effect
    assert got["n_heads"] == 3 and got["roles"] == {
        r: int(r in ("previous_token", "induction", "other")) for r in ROLES
    }
    assert got["heads_by_role"]["induction"] == ["1.0"] and got["heads_by_role"]["other"] == ["1.1"]
    assert got["max"]["copying"] == pytest.approx(0.2 * heads.SCORES.index("copying"))
    assert got["role_ablation"] == {"induction": {"heads": ["1.0"]}}
    top = got["agreement"]["loss_effect"]["top_source"]["K"]["true"]
    assert top == {"match": counted, "heads": counted}  # later heads whose top effect reaches min_effect
    causal = got["agreement"]["loss_effect"]["ranking"]["K"]["true"]["causal"]
    assert causal == counted  # the edges whose effect reaches min_effect (no spread over batches)
    json.dumps(got, allow_nan=False)


def test_role_ablations_placebo_sets_are_drawn_from_the_runs_seed():
    """The same seed draws the same placebo sets; another seed, others (the `placebo_sets` stream)."""
    import torch
    from models import random_model

    from pipeline.config import HeadsConfig

    model = random_model("tiny", seed=3, n_heads=6, n_ctx=16, d_vocab=32)
    text = [torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(0))]
    table = pd.DataFrame(
        [
            {"layer": l, "head": h, "role": "induction" if (l, h) == (1, 0) else "other"}
            for l in (0, 1)
            for h in range(6)
        ]
    )
    cfg = HeadsConfig(placebo_sets=3)

    def drawn(seed):
        return heads.role_ablation(model, table, text, text, cfg, seed=seed)["induction"]["placebo_sets"]

    assert drawn(0) == drawn(0)
    assert len({json.dumps(drawn(s)) for s in range(4)}) > 1


def test_pattern_scores_example_is_the_first_repeated_sequence_and_its_own_patterns():
    """The example drawn is sequence 0 of the probe (two different sequences here): its tokens, and
    each layer's [head, q, k] patterns of that sequence, equal to the model run on it alone."""
    import torch
    from models import random_model

    model = random_model("tiny")
    span = torch.randint(1, 20, (2, 4), generator=torch.Generator().manual_seed(1))
    repeated = torch.cat([torch.zeros(2, 1, dtype=torch.long), span, span], 1)
    assert not torch.equal(repeated[0], repeated[1])
    _, example = heads.pattern_scores(model, repeated, repeated, 4, 2)
    assert torch.equal(example["tokens"], repeated[0])
    _, alone = model.run_with_cache(repeated[:1])
    want = torch.stack([p[0] for p in alone.pattern])  # [layer, head, q, k]
    assert example["pattern"].shape == (2, 3, 9, 9)
    assert torch.allclose(example["pattern"], want, rtol=0, atol=1e-12)


def test_role_ablation_refuses_more_probes_than_held_out_batches():
    """Probe b goes with held-out batch b: two probes and one held-out batch are refused (zip's
    strict check), not cut down to one pair."""
    import torch
    from models import random_model

    from pipeline.config import HeadsConfig

    model = random_model("tiny")
    text = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    table = pd.DataFrame(
        [
            {"layer": l, "head": h, "role": "induction" if (l, h) == (1, 0) else "other"}
            for l in (0, 1)
            for h in range(3)
        ]
    )
    with pytest.raises(ValueError):  # zip(..., strict=True): one held-out batch per probe
        heads.role_ablation(model, table, [text, text], [text], HeadsConfig(placebo_sets=1), seed=0)


def test_a_role_serves_held_out_text_only_where_few_enough_placebo_sets_reach_it():
    """39 placebo sets, the role's effect 0.3: p = (1 + sets at or above it) / 40, p_lower the same
    from below; it serves at p <= heads.SERVES_LEVEL (0.05: at most one set reaching it)."""
    sets = [[(0, i)] for i in range(39)]
    cfg = HeadsConfig(placebo_sets=39, min_effect=0.01)
    role = {"heldout_loss_effect": [0.3]}
    for above, p, serves in ((0, 1 / 40, True), (1, 2 / 40, True), (2, 3 / 40, False)):
        effects = [0.5] * above + [0.1] * (39 - above)
        out = heads._placebo(sets, [effects], role, cfg, exact=True)
        assert (out["placebo_p"], out["serves_heldout"], out["placebo_exact"]) == (p, serves, True)
        assert out["placebo_p_lower"] == (1 + 39 - above) / 40
    below_min = heads._placebo(sets, [[0.0] * 39], {"heldout_loss_effect": [0.005]}, cfg, exact=False)
    assert below_min["placebo_p"] == 1 / 40 and below_min["serves_heldout"] is False  # under min_effect


PROPERTY = settings(derandomize=True, max_examples=30, deadline=None)


RANDOM_N_CTX, RANDOM_LENGTH = 9, 4  # repeated sequences [first, span, span] of 1 + 2 x 4 tokens


COMPOSITION = CompositionConfig(baseline_samples=8, null_samples=8)


RANDOM_HEADS = HeadsConfig(eval_sequences=4, repeat_length=RANDOM_LENGTH, window_length=2)


@PROPERTY
@given(random_models(RANDOM_N_CTX), st.integers(0, 2**31 - 1))
def test_head_scores_are_in_range_and_finite_where_defined(model, seed):
    gen = torch.Generator().manual_seed(seed)
    span = torch.randint(0, model.cfg.d_vocab, (4, RANDOM_LENGTH), generator=gen)
    repeated = torch.cat(
        [torch.zeros(4, 1, dtype=torch.long), span, span], dim=1
    )  # [batch, 1 + 2 RANDOM_LENGTH]
    heldout = torch.randint(0, model.cfg.d_vocab, (4, RANDOM_N_CTX), generator=gen)
    hw = weights.from_state_dict(model.state_dict())
    scores = composition.composition_scores(hw, COMPOSITION, seed=1)
    result = heads.analyse_batches(model, hw, repeated, heldout, RANDOM_HEADS, scores)
    table = result.table
    fractions = table[list(heads.PATTERN_SCORES)].to_numpy()
    assert np.isfinite(fractions).all() and ((fractions >= 0) & (fractions <= 1 + 1e-12)).all()
    dup = table["duplicate_token"].to_numpy()
    assert (((dup >= 0) & (dup <= 1 + 1e-12)) | np.isnan(dup)).all()
    has_repeat = any(len(set(row.tolist())) < RANDOM_N_CTX for row in heldout)
    assert np.isnan(dup).all() != has_repeat  # undefined exactly when no query has an earlier copy
    for name in ("copying", "qk_positivity"):
        x = table[name].to_numpy()
        assert (((x >= -1 - 1e-12) & (x <= 1 + 1e-12)) | np.isnan(x)).all(), name
    assert np.isnan(table.loc[table["layer"] == 0, "qk_positivity"]).all()
    effects = result.ablation[["attn_effect", "loss_effect", "heldout_loss_effect"]].to_numpy()
    assert np.isfinite(effects).all()
    assert (result.ablation.loc[result.ablation["kind"] == "V", "attn_effect"] == 0).all()


ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)
L, H, dh, D, T, V = 2, 2, 4, 16, 20, 16
MODEL = ModelConfig(n_layers=L, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
C = "c/config.json"  # a checkpoint's config.json: its shape's keys are named by the file
E, R = "analysis.heads.eval_sequences", "analysis.heads.repeat_length"


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


def keyed(estimate: memory.Estimate) -> list[tuple[list[str], bool]]:
    return [([s.key for s in t.sizes], t.host) for t in estimate.terms]


def batches(model: ModelConfig, h: HeadsConfig, data: DataConfig) -> tuple[memory.Batch, memory.Batch]:
    s = memory.Shape(model, C)
    E_ = memory.size(E, h.eval_sequences)
    probe = memory.Batch(
        E_, memory.size(R, h.repeat_length), 1 + 2 * h.repeat_length, "the probe",
        ("eval_sequences", "1 + 2 repeat_length"),
    )  # fmt: skip
    held = memory.Batch(
        memory.Size(E, datasets.eval_count(data, h.eval_sequences), 64), s.n_ctx, model.n_ctx,
        "the held-out batch", ("eval_sequences", "n_ctx"),
    )  # fmt: skip
    return probe, held


WEIGHTS = [
    ([f"{C}: d_vocab", f"{C}: d_model"], False),
    ([f"{C}: n_ctx", f"{C}: d_model"], False),
    ([f"{C}: n_layers", f"{C}: n_heads", f"{C}: d_head", f"{C}: d_model"], False),
]


def test_the_heads_estimate_for_the_pattern_scores():
    """16 layers, a probe of 1 + 2 x 8 positions beside a held-out batch of 20 (token files: no
    synthetic data): both caches kept, with one layer's scores and the logits of the held-out
    batch beside them, outweigh either path ablation."""
    deep = ModelConfig(n_layers=16, n_heads=H, d_head=dh, d_model=D, n_ctx=T, d_vocab=V)
    h, data = HeadsConfig(eval_sequences=4, repeat_length=8), DataConfig(source="tokens")
    s, F64 = memory.Shape(deep, C), memory.FLOAT64
    probe, held = batches(deep, h, data)
    estimate = heads.memory_estimate(deep, h, data, C)
    assert estimate.terms == (
        *transformer.weight_terms(s, 3 * F64, "the model and the head weights in float64, and a copy"),
        *transformer.cache_terms(s, probe, F64),
        *transformer.cache_terms(s, held, F64),
        *transformer.forward_terms(s, held, F64),
    )
    assert keyed(estimate) == [
        *WEIGHTS,
        ([E, f"{C}: n_heads", R], False),
        ([E, R, f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_model"], False),
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_vocab"], False),
    ]


def test_the_heads_estimate_for_the_path_ablation():
    """2 layers on 64 synthetic sequences (3 held out): the path ablation of the held-out batch
    outweighs the pattern scores; its eval_sequences is the held-out part's, under the same key."""
    h, data = HeadsConfig(eval_sequences=4, repeat_length=6), DataConfig(n_train_sequences=64)
    s, F64 = memory.Shape(MODEL, C), memory.FLOAT64
    _, held = batches(MODEL, h, data)
    estimate = heads.memory_estimate(MODEL, h, data, C)
    assert estimate.terms == (
        *transformer.weight_terms(s, 3 * F64, "the model and the head weights in float64, and a copy"),
        *ablation.path_ablation_terms(s, held),
        *datasets.synthetic_terms(s, data),
    )
    assert keyed(estimate) == [
        *WEIGHTS,
        ([E, f"{C}: n_heads", f"{C}: n_ctx"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_model"], False),
        ([E, f"{C}: n_ctx", f"{C}: d_vocab"], False),
        ([E, f"{C}: n_ctx", f"{C}: n_heads", f"{C}: d_model"], False),
        (["data.n_train_sequences", f"{C}: n_ctx"], True),
    ]
    assert [(s.value, s.reference) for s in estimate.terms[3].sizes][0] == (3, 64)


def test_a_checkpoints_shape_is_named_by_its_file():
    cfg = cfg_of("setup=synthetic")
    shape = replace(cfg.model, n_ctx=10**6)
    with pytest.raises(UserError) as e:
        memory.require_fits(
            heads.memory_estimate(shape, cfg.analysis.heads, cfg.data, "c/config.json"), 10**9
        )
    assert e.value.where == "c/config.json: n_ctx" and e.value.value == 10**6


def test_the_heads_library_refuses_a_shape_before_reading_the_checkpoint(tmp_path, monkeypatch):
    """heads.load_model checks config.json's shape as the heads stage did: the checkpoint (absent
    here: reading it would fail otherwise) is never read."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    cfg = cfg_of("setup=synthetic")
    config = (
        tmp_path / "config.json"
    )  # a model whose analysis needs terabytes (its n_ctx), nothing else large
    config.write_text(json.dumps(tl_checkpoint.tl_config(replace(SMALL, n_ctx=10**7))))
    with pytest.raises(UserError) as e:
        heads.load_model(tmp_path / "absent.safetensors", config, cfg.analysis.heads, cfg.data)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7
    assert memory.human(8e9) in str(e.value) and "\n" not in str(e.value)  # against the memory given


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
    model = Transformer(planted.CONFIG).to(torch.float64)
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
