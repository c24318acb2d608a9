"""Small hand-made stage outputs for the compare and report tests: two layers of three heads.

Layer 0: head 0 previous_token, head 1 recent_window, head 2 other.
Layer 1: heads 0 and 1 induction, head 2 other.

Planted excess (score - baseline_mean), times `scale` (seeds differ only by it):
    true K          induction <- previous_token 0.30 (1.0 <- 0.0) and 0.25 (1.1 <- 0.0)
                    induction <- recent_window  0.20 (1.0 <- 0.1) and 0.05 (1.1 <- 0.1)
    true V          other <- other 0.35: the strongest true composition, so true selectivity < 0
    errata K        induction <- previous_token 0.50 and 0.40 (rotated denominators), 0.050 and
                    0.040 (true denominators: the same pairs, ten times smaller); all else 0.01
    all else        0.02 (true) or 0.01 (errata)
    invariant K     induction <- previous_token 0.30 and 0.25, induction <- recent_window 0.20 and
                    0.05 (as true); all else 0.02 (invariant.csv); projection.csv likewise
z is excess / baseline_std with baseline_std = 0.01 (true, invariant, projection), 0.001 (errata).
Discoveries (every seed alike; z_cal 5, p 0.001, q 0.01; the rest z_cal 0, p 0.4, q 0.5):
    true            K 1.0 <- 0.0, 1.1 <- 0.0, 1.0 <- 0.1 (induction <- recent_window); V 1.2 <- 0.2: 4
    errata          K 1.0 <- 0.0, 1.1 <- 0.0; B C D A (both denominators) also Q 1.2 <- 0.2: 3 and 2
    invariant       K 1.0 <- 0.0, 1.1 <- 0.0: 2 (projection likewise)
so (b) = 1 (and not absent: a pair of the cell has p 0.001, times 2 pairs below the fdr),
(b_inv) = 0, (m) = K 3 - 2 against either rotation (Q 0 - 1 and 0 - 0, V 1 - 0),
(m_inv) = K 2 - 2 against either. placebo.csv: three pairs (1.h -> 0.h) per
kind and measure, one of them discovered for K errata_dabc (a false-positive rate of 1/3).
Agreement with the ablation (heads summary.json): of the pair-specific parts (interaction, what
(c) reads) 0.5 (true), 0.1 and 0.2 (the rotations), 0.4 (invariant), 0.3 (projection), the log
effect's main share 0.9; Spearman of the raw effect 0.6 (true), 0.2 and 0.3 (the rotations), 0.5
(invariant), 0.45 (projection); top source, every effect and kind: 2 of 2 later heads (true,
invariant), 1 of 2 (errata); PR-AUC of the causal edges (2 of 9) 0.8 (true), 0.5 and 0.6 (the
rotations), 0.7 (invariant), 0.65 (projection), ROC-AUC 0.1 above each; so (c) = 0.5 - 0.2 =
0.3, (c_inv) = 0.4 - 0.2, (c_proj) = 0.3 - 0.2, and the raw comparison c_raw = 0.6 - 0.3.
The role-only ranker's PR-AUC on the same edges: 0.4, every effect and kind. The pattern effect
cut at each threshold (by_threshold): at 0.01 and 0.02 as above; at 0.05 one causal edge, PR-AUC
1.0 (true), 0.25 (errata), 0.5 (invariant), the role-only ranker 0.5; at 0.1 no causal edge
(every PR-AUC null).

Channels (channels.csv, every seed alike): the K pairs induction <- previous_token 1.0 <- 0.0 and
1.1 <- 0.0 have alignment 0.5 and 0.25, query_chance 0.125, anisotropy 1, output_query_share
0.0625, effective channels 2 and 4, top share 0.6 and 0.4, and the first is a channel discovery;
every other K pair alignment 0.125, anisotropy 1. So the circuit's alignment is mean(ln 4, ln 2) =
1.5 ln 2, its writer's other reader (1.2, not induction) is at chance (0), and (e) = 1.5 ln 2; the excess
= excess_alignment = 1/2 (-1.5 ln 2 + 3 ln 2) = 0.75 ln 2, excess_anisotropy 0, output_query
-ln 2, effective channels 3, top share 0.5, 1 channel discovery; heads summary.json's
channel_ablation: causal shares 0.9 (1.0 <- 0.0) and 0.5 (1.1 <- 0.0), median 0.7.

Calibration (calibration.json, every seed alike): on each null (surrogates, chimeras, untrained), 6
families of each measure, none with a discovery but the invariant measure's surrogates, 3 of 6
(so over 3 seeds 9 of 18: uncalibrated, and (b_inv), (m_inv) get no verdict); the non-composing K
pairs' mean p 0.5 against the bulk, 0.8 the test's; the keys plant found from strength 0.2 by every
measure (raw z 7), the mixed from 0.1 (raw z 6); (e) on surrogates 0.05 (max 0.1), 1.5 ln 2 on the model.

Dynamics (steps.tsv, every seed alike), checkpoints at steps 0, 100, .., 500: induction
reaches 0.5 at step 300 (the phase step). The pair's K z clears 3 (there its q is 0.01, else 0.5:
a discovery) for good at step 400 (true), 300 (B C D A: it crosses at 100 and falls back
first), 200 (D A B C) and 300 (invariant, projection): lags +100, 0, -100, 0, 0; claim (t) = 400 - 300 = +100
against B C D A and 400 - 200 = +200 against D A B C. z growth over steps 0-300, per 100 steps:
0.7 (true), 1.3 (B C D A), 1.8
(D A B C): the ratio of the slower rotation, 13 / 7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pipeline.compare.read import SeedInputs
from pipeline.tables import CHANNELS_COLUMNS, INVARIANT, KINDS, MEASURES, OTHER_MEASURES, STEPS_COLUMNS

ROLES = {
    (0, 0): "previous_token",
    (0, 1): "recent_window",
    (0, 2): "other",
    (1, 0): "induction",
    (1, 1): "induction",
    (1, 2): "other",
}
BASELINE = {
    "true": (0.1, 0.01),
    "errata_bcda": (0.02, 0.001),
    "errata_dabc": (0.03, 0.001),
    "errata_bcda_trueden": (0.002, 0.001),
    "errata_dabc_trueden": (0.003, 0.001),
    "invariant": (0.2, 0.01),
    "projection": (0.125, 0.01),
}
PLANTED = {
    ("K", "true"): {(0, 0): 0.30, (1, 0): 0.25, (0, 1): 0.20, (1, 1): 0.05},  # {(dst_head, src_head): excess}
    ("V", "true"): {(2, 2): 0.35},
    ("K", "errata_bcda"): {(0, 0): 0.50, (1, 0): 0.40},
    ("K", "errata_dabc"): {(0, 0): 0.50, (1, 0): 0.40},
    ("K", "errata_bcda_trueden"): {(0, 0): 0.050, (1, 0): 0.040},
    ("K", "errata_dabc_trueden"): {(0, 0): 0.050, (1, 0): 0.040},
    ("K", "invariant"): {(0, 0): 0.30, (1, 0): 0.25, (0, 1): 0.20, (1, 1): 0.05},
    ("K", "projection"): {(0, 0): 0.30, (1, 0): 0.25, (0, 1): 0.20, (1, 1): 0.05},
}
DISCOVERED = {  # {(kind, variant): {(dst_head, src_head)}}
    ("K", "true"): {(0, 0), (1, 0), (0, 1)},
    ("V", "true"): {(2, 2)},
    **{("K", v): {(0, 0), (1, 0)} for v in ("errata_bcda", "errata_dabc", "errata_bcda_trueden",
                                            "errata_dabc_trueden", "invariant", "projection")},
    ("Q", "errata_bcda"): {(2, 2)},
    ("Q", "errata_bcda_trueden"): {(2, 2)},
}  # fmt: skip
PR_AUC = {
    "true": 0.8,
    "errata_bcda": 0.5,
    "errata_dabc": 0.6,
    "errata_bcda_trueden": 0.5,
    "errata_dabc_trueden": 0.6,
    "invariant": 0.7,
    "projection": 0.65,
}
RHO = {
    "true": 0.6,
    "errata_bcda": 0.2,
    "errata_dabc": 0.3,
    "errata_bcda_trueden": 0.2,
    "errata_dabc_trueden": 0.3,
    "invariant": 0.5,
    "projection": 0.45,
}
INTERACTION = {
    "true": 0.5,
    "errata_bcda": 0.1,
    "errata_dabc": 0.2,
    "errata_bcda_trueden": 0.1,
    "errata_dabc_trueden": 0.2,
    "invariant": 0.4,
    "projection": 0.3,
}
TOP = {v: {"match": 2 if v in ("true", INVARIANT) else 1, "heads": 2} for v in MEASURES}
Z_THROUGH_TRAINING = {
    "true": [0, 1, 2, 2, 4, 6],
    "errata_bcda": [0, 4, 2, 5, 6, 7],
    "errata_dabc": [0, 1, 4, 5, 6, 7],
    "invariant": [0, 0, 1, 4, 5, 5],
    "projection": [0, 0, 1, 4, 5, 5],
}
RANKING = {v: {"pr_auc": a, "roc_auc": a + 0.1, "causal": 2, "pairs": 9} for v, a in PR_AUC.items()}
ROLE_BASELINE = {"pr_auc": 0.4, "roc_auc": 0.6, "causal": 2, "pairs": 9}


def _cut(pr_auc: dict[str, float | None], role: float | None, causal: int) -> dict:
    """One threshold's agreement: each measure's ranking and the role-only ranker's, every kind."""
    ranked = {v: {"pr_auc": a, "roc_auc": a, "causal": causal, "pairs": 9} for v, a in pr_auc.items()}
    role_ranked = {"pr_auc": role, "roc_auc": role, "causal": causal, "pairs": 9}
    return {"ranking": {k: ranked for k in KINDS}, "role_baseline": {k: role_ranked for k in KINDS}}


ONE_EDGE = {v: 1.0 if v == "true" else 0.5 if v in OTHER_MEASURES else 0.25 for v in PR_AUC}
BY_THRESHOLD = {
    "0.01": _cut(PR_AUC, 0.4, 2),
    "0.02": _cut(PR_AUC, 0.4, 2),
    "0.05": _cut(ONE_EDGE, 0.5, 1),
    "0.1": _cut(dict.fromkeys(PR_AUC), None, 0),
}
AGREEMENT = {
    effect: {
        "interaction": {k: dict(INTERACTION) for k in KINDS},
        "main_share": dict.fromkeys(KINDS, 0.9),
        "spearman": {k: dict(RHO) for k in KINDS},
        "top_source": {k: dict(TOP) for k in KINDS},
        "ranking": {k: dict(RANKING) for k in KINDS},
        "role_baseline": {k: dict(ROLE_BASELINE) for k in KINDS},
        **({"by_threshold": BY_THRESHOLD} if effect == "pattern_effect" else {}),
    }
    for effect in ("heldout_loss_effect", "loss_effect", "attn_effect", "pattern_effect")
}


ROLE_ABLATION = {
    "induction": {"heads": ["1.0"], "heldout_loss_effect": 0.05, "probe_loss_effect": 1.2,
                  "batches": {"heldout_loss_effect": [0.05], "probe_loss_effect": [1.2]},
                  "placebo_sets": [["1.1"], ["1.2"], ["1.3"]], "placebo_exact": True,
                  "placebo_heldout_loss_effects": [0.01, 0.06, 0.01],
                  "placebo_p": 0.5, "placebo_p_lower": 0.75, "serves_heldout": False},
    "previous_token": {"heads": [], "heldout_loss_effect": None, "probe_loss_effect": None,
                       "batches": {"heldout_loss_effect": [], "probe_loss_effect": []},
                       "placebo_sets": None, "placebo_exact": None, "placebo_heldout_loss_effects": None,
                       "placebo_p": None, "placebo_p_lower": None, "serves_heldout": None},
}  # fmt: skip


def significance(found: bool) -> dict:
    return (
        {"z_cal": 5.0, "p": 0.001, "q": 0.01, "discovery": True}
        if found
        else {"z_cal": 0.0, "p": 0.4, "q": 0.5, "discovery": False}
    )


def scale_of(seed: int) -> float:
    return 1.0 + 0.1 * seed


def scores(scale: float = 1.0) -> pd.DataFrame:
    rows = []
    for kind in KINDS:
        for variant in MEASURES:
            mean, std = BASELINE[variant]
            background = 0.02 if variant in ("true", *OTHER_MEASURES) else 0.01
            for src in range(3):
                for dst in range(3):
                    excess = scale * PLANTED.get((kind, variant), {}).get((dst, src), background)
                    found = (dst, src) in DISCOVERED.get((kind, variant), ())
                    rows.append(
                        {
                            "kind": kind,
                            "variant": variant,
                            "src_layer": 0,
                            "src_head": src,
                            "dst_layer": 1,
                            "dst_head": dst,
                            "score": mean + excess,
                            "baseline_mean": mean,
                            "baseline_std": std,
                            "z": excess / std,
                            **significance(found),
                        }
                    )
    return pd.DataFrame(rows)


def placebo() -> pd.DataFrame:
    """placebo.csv: pairs 1.h -> 0.h of every kind and measure; one false discovery (module doc)."""
    rows = []
    for kind in KINDS:
        for variant in MEASURES:
            for h in range(3):
                found = (kind, variant, h) == ("K", "errata_dabc", 0)
                rows.append({
                    "kind": kind, "variant": variant, "src_layer": 1, "src_head": h, "dst_layer": 0,
                    "dst_head": h, "score": 0.1, "baseline_mean": 0.1, "baseline_std": 0.01, "z": 0.0,
                    **significance(found),
                })  # fmt: skip
    return pd.DataFrame(rows)


def heads() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "layer": l,
                "head": h,
                "role": r,
                "prev_token": 0.9 if r == "previous_token" else 0.1,
                "induction": 0.8 if r == "induction" else 0.0,
            }
            for (l, h), r in ROLES.items()
        ]
    )


def curve(seed: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [0, 10, 20],
            "tokens": [0, 640, 1280],
            "train_loss": [float("nan"), 3.0, 2.5 - 0.1 * seed],
            "eval_loss": [4.0, 3.0, 2.0 - 0.1 * seed],
            "induction": [0.0, 0.3, 0.6 + 0.05 * seed],
            "prev_token": [0.1, 0.5, 0.9],
            "icl": [0.0, -0.2, -0.5],
        }
    )


def steps() -> pd.DataFrame:
    """The dynamics stage's steps.tsv (module doc); the _trueden variants share their rotation's z."""
    z = {m: Z_THROUGH_TRAINING[m.removesuffix("_trueden")] for m in MEASURES}
    table = pd.DataFrame(
        {
            "step": [0, 100, 200, 300, 400, 500],
            "tokens": [0, 6400, 12800, 19200, 25600, 32000],
            "eval_loss": [5.0, 4.5, 4.2, 4.0, 3.9, 3.85],
            "induction": [0.0, 0.1, 0.3, 0.6, 0.7, 0.7],
            "prev_token": [0.1, 0.3, 0.6, 0.9, 0.95, 0.95],
            **{f"z_{m}": [float(v) for v in z[m]] for m in MEASURES},
            **{f"q_{m}": [0.01 if v > 3 else 0.5 for v in z[m]] for m in MEASURES},
        }
    )
    return table[list(STEPS_COLUMNS)]


PREV_INDUCTION = {  # (src head, dst head) -> alignment, effective channels, top share, channel discovery
    (0, 0): (0.5, 2.0, 0.6, True),
    (0, 1): (0.25, 4.0, 0.4, False),
}
CHANNEL_ABLATION = {
    "effect": "pattern_effect",
    "n_pairs": 2,
    "median_causal_share": 0.7,
    "pairs": [
        {"src": "0.0", "dst": "1.0", "causal_share": 0.9},
        {"src": "0.0", "dst": "1.1", "causal_share": 0.5},
    ],
}


def calibration() -> dict:
    """calibration.json (module doc)."""
    import math

    def rates(hits: int) -> dict:
        return {"families": 6, "with_discovery": hits, "rate": hits / 6}

    families = {
        null: {m: rates(3 if (null, m) == ("surrogate", INVARIANT) else 0) for m in MEASURES}
        for null in ("surrogate", "chimera", "untrained")
    }
    spread = {"pairs": 5, "mean": 0.5, "deciles": [0.1 * i for i in range(1, 10)], "above_0.9": 0.1}
    found = lambda s, z: {"pair": "L0H2->L1H2", "strength": s, "raw_z": z}  # noqa: E731
    power = {
        plant: {reader: {m: found(s, z) for m in MEASURES if not m.endswith("_trueden")}
                for reader in ("least_read", "most_read")}
        for plant, s, z in (("keys", 0.2, 7.0), ("mixed", 0.1, 6.0))
    }  # fmt: skip
    return {
        "families": families,
        "placebo": {m: {"families": 9, "with_discovery": 0, "rate": 0.0} for m in MEASURES},
        "non_composing": {"K": {m: {"bulk_p": spread, "p": {**spread, "mean": 0.8}} for m in MEASURES}},
        "detection_limits": {k: {m: 5.0 for m in MEASURES} for k in KINDS},
        "power": power,
        "channels": {"surrogate": {k: rates(0) for k in KINDS}, "untrained": {k: rates(0) for k in KINDS}},
        "claim_e": {
            "model": {"e": 1.5 * math.log(2), "e_specific": 1.5 * math.log(2)},
            "surrogates": [{"e": 0.0, "e_specific": 0.1}, {"e": 0.0, "e_specific": 0.0}],
        },
    }


def channels(scored: pd.DataFrame) -> pd.DataFrame:
    """channels.csv (module doc): every later pair of every kind, pair_discovery from the true rows."""
    true = scored[scored["variant"] == "true"]
    rows = []
    for r in true.itertuples():
        k = r.kind == "K"
        align, eff, top, found = PREV_INDUCTION.get((r.src_head, r.dst_head), (0.125, 10.0, 0.2, False))
        rows.append({
            "kind": r.kind, "src_layer": r.src_layer, "src_head": r.src_head, "dst_layer": r.dst_layer,
            "dst_head": r.dst_head, "writer_channel": 0, "reader_channel": 0, "writer_block": 1,
            "reader_block": 1, "top_share": top,
            "effective_channels": eff, "null_mean": -2.0, "null_std": 0.5, "z": 1.0,
            "z_cal": 1.0 if r.discovery else float("nan"), "p": 0.01 if r.discovery else float("nan"),
            "q": 0.01 if r.discovery else float("nan"), "discovery": bool(found and k and r.discovery),
            "pair_discovery": bool(r.discovery), "alignment": align if k else float("nan"),
            "anisotropy": 1.0 if k else float("nan"), "output_query_share": 0.0625 if k else float("nan"),
            "query_chance": 0.125 if k else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(CHANNELS_COLUMNS))


def seed_inputs(seed: int) -> SeedInputs:
    c = curve(seed)
    metrics = {k: float(c.iloc[-1][k]) for k in ("train_loss", "eval_loss", "induction", "prev_token", "icl")}
    scored = scores(scale_of(seed))
    return SeedInputs(
        seed=seed,
        scores=scored,
        placebo=placebo(),
        heads=heads(),
        agreement=AGREEMENT,
        role_ablation=ROLE_ABLATION,
        metrics=metrics,
        curve=c,
        steps=steps(),
        channels=channels(scored),
        channel_ablation=CHANNEL_ABLATION,
        calibration=calibration(),
    )


COMPARE_INPUTS = ("train", "composition", "heads", "dynamics", "calibration")


def compare_args(dirs: dict[str, Path]) -> list[str]:
    """The compare stage's input options for `write_stage_outputs`' directories."""
    return [arg for name in COMPARE_INPUTS for arg in (f"--{name}", str(dirs[name]))]


def write_stage_outputs(root: Path, seeds: list[int]) -> dict[str, Path]:
    """The files the train, composition, heads, dynamics and figures stages would write under `root`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = {
        name: root / name for name in ("train", "composition", "heads", "dynamics", "calibration", "figures")
    }
    for seed in seeds:
        inp = seed_inputs(seed)
        sub = {name: d / f"seed{seed}" for name, d in dirs.items()}
        for d in sub.values():
            d.mkdir(parents=True, exist_ok=True)
        inp.curve.to_csv(sub["train"] / "curve.tsv", sep="\t", index=False)
        (sub["train"] / "metrics.json").write_text(json.dumps(inp.metrics))
        other = inp.scores["variant"].isin(OTHER_MEASURES)
        inp.scores[~other].to_csv(sub["composition"] / "scores.csv", index=False)
        for m in OTHER_MEASURES:
            mine = inp.scores[inp.scores["variant"] == m].drop(columns="variant")
            mine.to_csv(sub["composition"] / f"{m}.csv", index=False)
        inp.placebo.to_csv(sub["composition"] / "placebo.csv", index=False)
        (sub["calibration"] / "calibration.json").write_text(json.dumps(inp.calibration))
        inp.channels.to_csv(sub["composition"] / "channels.csv", index=False)
        inp.steps.to_csv(sub["dynamics"] / "steps.tsv", sep="\t", index=False)
        inp.heads.to_csv(sub["heads"] / "heads.csv", index=False)
        (sub["heads"] / "summary.json").write_text(
            json.dumps(
                {
                    "roles": {},
                    "role_ablation": inp.role_ablation,
                    "agreement": inp.agreement,
                    "channel_ablation": inp.channel_ablation,
                }
            )  # fmt: skip
        )
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.plot([0, 1], [0, seed])
        fig.savefig(sub["figures"] / "errata_diagram.png", dpi=40)
        fig.savefig(sub["figures"] / "errata_diagram.svg")
        plt.close(fig)
    return dirs
