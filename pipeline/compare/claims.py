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

from pipeline.tables import ABLATED_ROLES, HYPOTHESES

CLAIM_KIND = "K"  # the errata is about induction heads' K-composition
# claim (c): what K-composition predicts is the later head's attention, so the ablation's effect on it
# (b's induction score on the probe); the loss effects, on the probe and on held-out text, are
# reported beside it (on the default models no K edge's ablation raises held-out loss beyond its noise)
PRIMARY_EFFECT = "attn_effect"
NO_HYPOTHESIS = "-"  # a claim that does not depend on the denominators


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str  # the errata's (or the paper's) words
    statistic: str  # what the per-seed number is
    threshold: str  # "zero" or "half" (a count: at least one; a 0-or-1 indicator: yes)
    by_hypothesis: bool  # tested under each denominator hypothesis

    def hypotheses(self) -> tuple[str, ...]:
        return tuple(HYPOTHESES) if self.by_hypothesis else (NO_HYPOTHESIS,)


CLAIMS = {
    claim.name: claim
    for claim in (
        Claim(
            "a",
            "The original score singles out induction <- previous-token K-composition, more than the "
            "corrected score does.",
            "selectivity of K induction <- previous_token, (T - O) / (|T| + |O|): T its max excess, O the "
            "max excess of every other kind and head pair of the variant (> 0: the strongest of all); "
            "the original's (the less selective rotation) minus the corrected score's",
            "zero",
            True,
        ),
        Claim(
            "b",
            "The corrected score also shows induction heads composing with a recent-window head.",
            "discoveries (FDR analysis.composition.fdr, against the model's own null) among the true "
            "K-composition pairs induction <- recent_window (> 0.5: at least one)",
            "half",
            False,
        ),
        Claim(
            "m",
            "The corrected score finds more composition than the original.",
            "discoveries, every kind: corrected minus original, the rotation finding more (a discovery "
            "does not depend on the denominators)",
            "zero",
            False,
        ),
        Claim(
            "d",
            "The original figure shows only significant K-composition, and only with one layer 0 head.",
            "1 when the paper's plotting of the original (score - baseline > analysis.figures."
            "edge_threshold, its absolute threshold) draws K edges only, all from one layer-0 head, under "
            "both rotations, else 0; decides the denominators only where one hypothesis holds and the "
            "other fails",
            "half",
            True,
        ),
        Claim(
            "c",
            "The corrected score agrees better with the causal ablation than the original.",
            "K, the later head's induction score on the probe: PR-AUC of the score as a ranking of the "
            "causal edges (the ablation's effect beyond its batch-to-batch spread), corrected minus the "
            "better rotation",
            "zero",
            True,
        ),
        # the claims about the corrected score, with the basis-invariant measure in its place
        # (invariant.csv): (a) and (d) are about the original score alone
        Claim(
            "b_inv",
            "(b) with the basis-invariant measure as the corrected score: induction heads also compose "
            "with a recent-window head.",
            "discoveries among the invariant K-composition pairs induction <- recent_window (> 0.5: at "
            "least one)",
            "half",
            False,
        ),
        Claim(
            "m_inv",
            "(m) with the basis-invariant measure as the corrected score: it finds more composition "
            "than the original.",
            "discoveries, every kind: invariant minus original, the rotation finding more",
            "zero",
            False,
        ),
        Claim(
            "c_inv",
            "(c) with the basis-invariant measure as the corrected score: it agrees better with the "
            "causal ablation than the original.",
            "K, the later head's induction score: PR-AUC of the causal edges, invariant minus the better "
            "rotation",
            "zero",
            True,
        ),
        # through training (the dynamics stage; pipeline.phases): not the errata's claim, the
        # question it raises
        Claim(
            "t",
            "The original score sees the induction circuit form earlier than the corrected one.",
            "steps from the original's clear step to the corrected's (clear step: the first checkpoint "
            "from which the top induction <- previous-token pair's K-composition is a discovery at "
            "every later one), the rotation clearing later (> 0: the original is earlier)",
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
    **{
        f"{role}_{effect}_loss_effect": f"loss change (nats) on {where} when every {role} head is "
        "mean-ablated at once (positive: the heads lower the loss there)"
        for role in ABLATED_ROLES
        for effect, where in (("heldout", "held-out text"), ("probe", "the repeated probe"))
    },
    "selectivity": "selectivity of K induction <- previous_token (claim a) of one variant",
    "relative": "max excess of K induction <- recent_window over induction <- previous_token",
    "discoveries": "pairs discovered at FDR analysis.composition.fdr (pipeline/significance.py)",
    "placebo_rate": "discoveries among the pairs that cannot compose, per pair: the false-positive rate",
    "raw_z_above_3": "pairs whose raw z against the Haar null exceeds 3 (the uncalibrated rule)",
    "drawn": "pairs the paper's plotting draws (excess > analysis.figures.edge_threshold)",
    "layer0_k_sources": "distinct layer-0 heads with a drawn K edge",
    "only_k_one_source": (
        "1 when the drawn edges are K only, all from one layer-0 head (claim d, one variant)"
    ),
    "pr_auc": "average precision of the score as a ranking of the causal edges (chance: causal_fraction)",
    "roc_auc": "P(a causal edge outscores a non-causal one)",
    "causal_edges": "edges whose ablation effect reaches min_effect and exceeds its batch-to-batch spread",
    "causal_fraction": "causal edges over all pairs of the kind: PR-AUC's chance level",
    "top_source": "fraction of later heads whose top ablation source is their top-scoring source",
    "spearman": "Spearman rho between |ablation effect| and the score, over every pair",
    "heads": "heads with this role",
    "phase_step": "the first checkpoint at which the best induction score reaches 0.5 (dynamics)",
    "clear_step": "the first checkpoint from which the pair's K-composition stays a discovery (dynamics)",
    "lag": "clear step minus phase step, in steps (< 0: the measure sees the circuit first)",
    "z_growth": "slope of the pair's raw K z per 100 steps over the 500 steps before the phase step",
    "z_growth_ratio": "z growth of the original (the slower rotation) over the corrected score's",
    "final": "final value of training (metrics.json)",
}


def threshold(claim: Claim) -> float:
    return {"zero": 0.0, "half": 0.5}[claim.threshold]
