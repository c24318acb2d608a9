"""The errata's claims, in words: what each says, which per-seed statistic tests it, and
the threshold it must clear. Prose only (the report and summary.json read it); the
numbers are computed in `pipeline.compare.stats`.

The errata (docs/errata.md) says the library took the Frobenius norm of a cyclically
rotated strand; it names the numerators only. Claims that depend on the scale of the
original score are tested under both hypotheses about its denominators (`HYPOTHESES`:
rotated too, or true), each over both rotations (B C D A and D A B C): a claim holds
for a hypothesis when it holds whichever rotation the library used (the worse of the two).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.tables import HYPOTHESES

CLAIM_KIND = "K"  # the errata is about induction heads' K-composition
PRIMARY_EFFECT = "heldout_loss_effect"  # claim (c): the ablation's loss change on held-out text
NO_HYPOTHESIS = "-"  # a claim that does not depend on the denominators


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str  # the errata's (or the paper's) words
    statistic: str  # what the per-seed number is
    threshold: str  # "zero", "half" or "z" (analysis.compare.z_threshold)
    by_hypothesis: bool  # tested under each denominator hypothesis

    def hypotheses(self) -> tuple[str, ...]:
        return tuple(HYPOTHESES) if self.by_hypothesis else (NO_HYPOTHESIS,)


CLAIMS = {
    claim.name: claim
    for claim in (
        Claim(
            "a",
            "The original score singles out induction <- previous-token K-composition.",
            "selectivity of K induction <- previous_token, (T - O) / (|T| + |O|): T its max excess, O the "
            "max excess of every other kind and head pair of the variant (> 0: the strongest of all); "
            "the worse rotation",
            "zero",
            True,
        ),
        Claim(
            "b",
            "The corrected score also shows induction heads composing with a recent-window head.",
            "max z (against the spectrum-preserving null) of true K-composition induction <- recent_window",
            "z",
            False,
        ),
        Claim(
            "m",
            "The corrected figure shows more composition than the original.",
            "pairs drawn with the paper's plotting (score - baseline > analysis.figures.edge_threshold, "
            "one absolute threshold, every kind): corrected minus original, the rotation drawing more",
            "zero",
            True,
        ),
        Claim(
            "mz",
            "The corrected score finds more composition than the original, on a scale-free criterion.",
            "pairs with z > analysis.compare.z_threshold, every kind: corrected minus original, the "
            "rotation finding more (z is the same under both denominator hypotheses)",
            "zero",
            False,
        ),
        Claim(
            "d",
            "The original figure shows only significant K-composition, and only with one layer 0 head.",
            "1 when the paper's plotting of the original draws K edges only, all from one layer-0 head, "
            "under both rotations, else 0 (a fraction of seeds across seeds)",
            "half",
            True,
        ),
        Claim(
            "c",
            "The corrected score agrees better with the causal ablation than the original.",
            "K, held-out text: the fraction of later heads whose top source by ablation is also their "
            "top-scoring source, corrected minus the better rotation",
            "zero",
            True,
        ),
        # the claims about the corrected score, with the basis-invariant measure in its place
        # (invariant.csv): (a) and (d) are about the original score alone, and (m)'s absolute
        # threshold on the excess has no meaning on another measure's scale
        Claim(
            "b_inv",
            "(b) with the basis-invariant measure as the corrected score: induction heads also compose "
            "with a recent-window head.",
            "max z (against its rotated-writer null in the whitened frame) of invariant K-composition "
            "induction <- recent_window",
            "z",
            False,
        ),
        Claim(
            "mz_inv",
            "(mz) with the basis-invariant measure as the corrected score: it finds more composition "
            "than the original.",
            "pairs with z > analysis.compare.z_threshold, every kind: invariant minus original, the "
            "rotation finding more",
            "zero",
            False,
        ),
        Claim(
            "c_inv",
            "(c) with the basis-invariant measure as the corrected score: it agrees better with the "
            "causal ablation than the original.",
            "K, held-out text: the fraction of later heads whose top source by ablation is also their "
            "top-scoring source, invariant minus the better rotation",
            "zero",
            True,
        ),
        # through training (the dynamics stage; pipeline.phases): not the errata's claim, the
        # question it raises
        Claim(
            "t",
            "The original score sees the induction circuit form earlier than the corrected one.",
            "steps from the original's clear step to the corrected's (clear step: the first checkpoint "
            "from which the K z of the top induction <- previous-token pair stays above "
            "analysis.compare.z_threshold), the rotation clearing later (> 0: the original is earlier)",
            "zero",
            False,
        ),
    )
}

HYPOTHESIS_LABELS = {
    "rotated": "rotated denominators (||B A|| ||D C||)",
    "true": "true denominators (||A B|| ||C D||)",
    NO_HYPOTHESIS: "either (does not depend on the denominators)",
}

# what the other statistics of the long table mean
STATISTICS = {
    "selectivity": "selectivity of K induction <- previous_token (claim a) of one variant",
    "relative": "max excess of K induction <- recent_window over induction <- previous_token",
    "drawn": "pairs the paper's plotting draws (excess > analysis.figures.edge_threshold)",
    "layer0_k_sources": "distinct layer-0 heads with a drawn K edge",
    "only_k_one_source": (
        "1 when the drawn edges are K only, all from one layer-0 head (claim d, one variant)"
    ),
    "pairs_z": "pairs with z > analysis.compare.z_threshold",
    "top_source": "fraction of later heads whose top ablation source is their top-scoring source",
    "spearman": "Spearman rho between |ablation effect| and the score, over every pair",
    "spearman_gain": "K, held-out text: Spearman rho of the corrected score minus the better rotation's",
    "heads": "heads with this role",
    "phase_step": "the first checkpoint at which the best induction score reaches 0.5 (dynamics)",
    "clear_step": "the first checkpoint from which the pair's K z stays above the threshold (dynamics)",
    "lag": "clear step minus phase step, in steps (< 0: the measure sees the circuit first)",
    "final": "final value of training (metrics.json)",
}


def threshold(claim: Claim, z_threshold: float) -> float:
    return {"zero": 0.0, "half": 0.5, "z": z_threshold}[claim.threshold]
