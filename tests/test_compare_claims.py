"""`@claim` registers a claim with every setting it is given, and with its documented defaults
(one side, no rotations, resting on no measure's discoveries, no absence) when none is given;
the side a verdict reads follows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.compare import claims
from pipeline.compare.claims import NONE, Claim
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
