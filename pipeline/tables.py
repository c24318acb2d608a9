"""The tables stages hand each other (CSV): their vocabularies and columns, defined once
here (torch-free, so the compare and report stages import no model code; pandas-free at
import, so the config schemas can name them), and reading them with one-line errors
naming the file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:  # pandas is imported where a table is read: the config schemas import this module
    import pandas as pd

KINDS = ("Q", "K", "V")  # composition kinds
# The correct score, and the errata's two rotations of the numerator, each with the
# denominators rotated too or kept true: two hypotheses about the paper's library
# (pipeline/circuits/composition.py).
VARIANTS = ("true", "errata_bcda", "errata_dabc", "errata_bcda_trueden", "errata_dabc_trueden")
ERRATA = VARIANTS[1:]
HYPOTHESES = {  # denominators -> the errata variants computed under that hypothesis
    "rotated": ("errata_bcda", "errata_dabc"),
    "true": ("errata_bcda_trueden", "errata_dabc_trueden"),
}
ROLES = (
    "previous_token",
    "recent_window",
    "induction",
    "duplicate_token",
    "current_token",
    "first_token",
    "other",
)
# Whether the circuit serves the text (heads summary.json "role_ablation", pipeline/behaviour/heads.py): the
# heads of each role, ablated together, from its first layer (layer 0 reads no earlier head, so an
# "induction" head there is not the circuit's); the loss change on held-out text and on the probe;
# then the held-out effect ranked among placebo sets of as many heads of the same layers (the role's
# own included): the rank test's p, and whether the role serves the text (min_effect and p <=
# 1 / (1 + placebo_sets)). Each is a statistic of compare's.
ABLATED_ROLES = {"induction": 1, "previous_token": 0}
ROLE_EFFECTS = ("heldout_loss_effect", "probe_loss_effect")
ROLE_STATISTICS = (*ROLE_EFFECTS, "placebo_p", "serves_heldout")

# what a measure computes per pair (pipeline/circuits/composition.py, .../invariant.py): z is
# the raw z against the rotated-writer (Haar) null, kept so that users can see what calibration changes
RAW_SCORES_COLUMNS = (
    "kind",
    "variant",
    "src_layer",
    "src_head",
    "dst_layer",
    "dst_head",
    "score",
    "baseline_mean",
    "baseline_std",
    "z",
)
# and its significance (pipeline/circuits/significance.py): z_cal (z standardised by its block's
# empirical null), p (conformal, against the placebo pairs), q (Benjamini-Hochberg), discovery
SIGNIFICANCE_COLUMNS = ("z_cal", "p", "q", "discovery")
SCORES_COLUMNS = (*RAW_SCORES_COLUMNS, *SIGNIFICANCE_COLUMNS)  # scores.csv, placebo.csv
# invariant.csv: composition measured in the whitened residual frame (pipeline/circuits/invariant.py),
# unchanged by the residual stream's GL(d_model) symmetry; one measure, so no variant column
INVARIANT_COLUMNS = tuple(c for c in SCORES_COLUMNS if c != "variant")
# invariant.csv's scores where they join scores.csv's as one more variant (the dynamics
# table, the agreement with the ablation, compare)
INVARIANT = "invariant"
MEASURES = (*VARIANTS, INVARIANT)
# channels.csv (pipeline/circuits/channels.py): per kind and later pair, its corrected score's top
# channel, a writer block x a reader block (a block: consecutive singular directions whose values
# lie within analysis.composition.channel_tolerance; by descending singular value), named by each
# block's first direction (writer_channel, reader_channel) and its size in directions
# (writer_block, reader_block; 1: a single direction), and that channel's share;
# effective_channels = 1 / sum of squared block shares; z the top share's raw z against the
# rotated reader (Haar) and its significance, tested only where the whole pair is a discovery
# (pair_discovery, the true score's); K rows also: the errata's rotated strand against the true one,
# rotated^2 / true^2 = alignment x anisotropy, and the writer's output share in the query span
CHANNEL_STATISTICS = ("alignment", "anisotropy", "output_query_share", "query_chance")
CHANNELS_COLUMNS = (
    "kind", "src_layer", "src_head", "dst_layer", "dst_head", "writer_channel", "reader_channel",
    "writer_block", "reader_block", "top_share", "effective_channels", "null_mean", "null_std", "z",
    *SIGNIFICANCE_COLUMNS, "pair_discovery", *CHANNEL_STATISTICS,
)  # fmt: skip
# the dynamics stage: composition at every checkpoint (every kind and measure), the head
# scores and the loss at every checkpoint, and one row per checkpoint for the figure and
# `dvc plots` (the top induction <- previous-token pair's K z under each measure)
STEP_KEYS = ("step", "tokens")
DYNAMICS_COLUMNS = (*STEP_KEYS, *SCORES_COLUMNS, "excess")
# the heads stage's attention scores (pipeline/behaviour/heads.py)
PATTERN_SCORES = ("prev_token", "current_token", "first_token", "recent_mass", "duplicate_token", "induction")
DYNAMICS_HEADS_COLUMNS = (*STEP_KEYS, "layer", "head", *PATTERN_SCORES)
STEPS_COLUMNS = (
    *STEP_KEYS,
    "eval_loss",
    "induction",
    "prev_token",
    *(f"z_{m}" for m in MEASURES),  # the raw z
    *(f"q_{m}" for m in MEASURES),  # BH's q at that checkpoint: a discovery when <= analysis.composition.fdr
)
ABLATION_COLUMNS = (
    "kind",
    "src_layer",
    "src_head",
    "dst_layer",
    "dst_head",
    "attn_effect",  # the later head's induction score, clean minus ablated (repeated probe)
    "loss_effect",  # loss ablated minus clean, repeated probe
    "heldout_loss_effect",  # loss ablated minus clean, held-out text
    # held-out text, role-free: Q, K: b's attention pattern, total variation clean vs ablated, mean over
    # query positions; V: b's output, ||ablated - clean|| / ||clean||, mean over positions (ablation.py)
    "pattern_effect",
)
# the pattern effect's causal edges at each of these thresholds besides analysis.heads.min_effect
# (heads summary.json "by_threshold"; claim (c)'s rows "pr_auc_at_0.05", ...): how the verdict
# depends on where an edge starts to count
CAUSAL_THRESHOLDS = (0.01, 0.02, 0.05, 0.1)
# the compare stage's tables: composition between role groups, and the long table of
# per-seed statistics (claims.csv) with its summary across seeds (stats.csv)
GROUP_KEYS = ("kind", "variant", "dst_role", "src_role")
GROUP_COLUMNS = (*GROUP_KEYS, "n_pairs", "max_excess", "mean_excess", "max_z", "discoveries")
DIMENSIONS = ("claim", "hypothesis", "kind", "variant", "effect", "statistic")
CLAIMS_COLUMNS = ("seed", *DIMENSIONS, "value")
STATS_COLUMNS = (*DIMENSIONS, "n", "mean", "sd", "lo", "hi")
# the induction phase change: the first step at which the best layer >= 1 head's induction
# score reaches this (metrics.json of train; the dynamics stage and compare)
INDUCTION_THRESHOLD = 0.5
CURVE_COLUMNS = ("step", "tokens", "train_loss", "eval_loss", "induction", "prev_token", "icl")


def threshold_key(threshold: float) -> str:
    """One of CAUSAL_THRESHOLDS as the heads summary.json's key and claim (c)'s statistic names
    spell it: 0.05 -> "0.05"."""
    return f"{threshold:g}"


def excess(scores: pd.DataFrame) -> pd.Series:
    """Score minus the random-matrix baseline of its variant (what the paper plots)."""
    return scores["score"] - scores["baseline_mean"]


def join_measures(scores: pd.DataFrame, invariant: pd.DataFrame) -> pd.DataFrame:
    """scores.csv's rows, then invariant.csv's as variant INVARIANT: one table of every measure
    (SCORES_COLUMNS, or RAW_SCORES_COLUMNS for tables not yet calibrated)."""
    import pandas as pd

    columns = [c for c in SCORES_COLUMNS if c in scores.columns]
    return pd.concat([scores[columns], invariant.assign(variant=INVARIANT)[columns]], ignore_index=True)


def split_measures(measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """join_measures undone: (scores.csv's rows, invariant.csv's rows)."""
    invariant = measured["variant"] == INVARIANT
    return (
        measured[~invariant].reset_index(drop=True),
        measured[invariant].drop(columns="variant").reset_index(drop=True),
    )


def read_csv(
    path: str | Path, required: Sequence[str] = (), sep: str = ",", empty_ok: bool = True
) -> pd.DataFrame:
    """A CSV (or, with sep="\\t", TSV) table that must exist, parse, and have the `required`
    columns; and, unless `empty_ok`, a row (a stage's table always has one: a header alone is a
    partial or hand-edited file, whose analysis would be silently empty)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "file not found")
    try:
        frame = pd.read_csv(path, sep=sep)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(str(path), f"not a readable table ({str(e).splitlines()[0]})") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise UserError(
            str(path), f"missing column {missing[0]!r} (has {', '.join(map(str, frame.columns))})"
        )
    if not empty_ok and frame.empty:
        raise UserError(str(path), "no rows, only a header: not a complete table of its stage")
    return frame
