"""`@claim` registers a claim with every setting it is given, and with its documented defaults
(one side, no rotations, calibrated) when none is given; the side a verdict reads follows."""

from __future__ import annotations

from pipeline.compare import claims
from pipeline.compare.claims import NONE, Claim
from pipeline.tables import HYPOTHESES


def compute(seed):
    return iter(())


def test_a_claim_is_registered_with_every_setting_it_names(monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", {})  # the real claims stay as they are
    registered = claims.claim(
        "z", "its words", "its number", 0.5, by_hypothesis=True, auxiliary={"x": "an x"},
        restates="c", versus=("true",), calibrated=False,
    )(compute)  # fmt: skip
    assert registered is compute
    z = claims.CLAIMS["z"]
    settings = (0.5, True, compute, {"x": "an x"}, "c", ("true",), False)
    assert z == Claim("z", "its words", "its number", *settings)
    assert z.sides() == (("variant", "true"),)
    claims.claim("h", "words", "number", 0.0, by_hypothesis=True)(compute)
    assert claims.CLAIMS["h"].hypotheses() == tuple(HYPOTHESES)
    assert claims.CLAIMS["h"].sides() == tuple(("hypothesis", h) for h in HYPOTHESES)


def test_a_claim_given_no_settings_has_the_documented_defaults(monkeypatch):
    monkeypatch.setattr(claims, "CLAIMS", {})
    claims.claim("y", "words", "number", 0.0)(compute)
    y = claims.CLAIMS["y"]
    assert y == Claim("y", "words", "number", 0.0, False, compute, {}, None, (), True)
    assert y.calibrated is True and y.versus == () and y.hypotheses() == (NONE,)
    assert list(claims.CLAIMS) == ["y"]
