"""The tables stages hand each other (CSV): their vocabularies and columns, defined once
here (torch-free, so the compare and report stages import no model code; pandas-free at
import, so the config schemas can name them), and reading them with one-line errors
naming the file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
# then the held-out effect ranked among every other set of as many heads of the same layers (an
# exact permutation test): its p in each direction, and whether the role serves the text
# (min_effect and placebo_p <= SERVES_LEVEL). Each is a statistic of compare's.
ABLATED_ROLES = {"induction": 1, "previous_token": 0}
ROLE_EFFECTS = ("heldout_loss_effect", "probe_loss_effect")
ROLE_STATISTICS = (*ROLE_EFFECTS, "placebo_p", "placebo_p_lower", "serves_heldout")
SERVES_LEVEL = 0.05

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
# the measures beside the Frobenius variants, each in a file of its own (<measure>.csv,
# INVARIANT_COLUMNS): invariant.csv (pipeline/circuits/invariant.py) and projection.csv, the
# projection kernel of the heads' subspaces (pipeline/circuits/projection.py). Where they join
# scores.csv's rows (the dynamics table, the agreement with the ablation, compare) each is one
# more variant, named as here
INVARIANT = "invariant"
PROJECTION = "projection"
OTHER_MEASURES = (INVARIANT, PROJECTION)
MEASURES = (*VARIANTS, *OTHER_MEASURES)
# what each measure is, in a line (the report's legend; each module's doc has the maths)
MEASURE_WORDS = {
    "true": "the corrected score, ||A B C D|| / (||A B|| ||C D||) (pipeline/circuits/composition.py)",
    "errata_bcda": (
        "the original as the errata says the library computed it, ||B C D A||, rotated denominators"
    ),
    "errata_dabc": "the original's other rotation, ||D A B C||, rotated denominators",
    "errata_bcda_trueden": "B C D A over the true denominators ||A B|| ||C D||",
    "errata_dabc_trueden": "D A B C over the true denominators",
    INVARIANT: (
        "the corrected score in the frame where the residual stream's token paths are white: unchanged by "
        "a change of residual basis (pipeline/circuits/invariant.py)"
    ),
    PROJECTION: (
        "the projection kernel: how far the subspace the writer writes into and the one the reader reads "
        "from overlap, whatever the singular values (pipeline/circuits/projection.py)"
    ),
}
# channels.csv (pipeline/circuits/channel_null.py): per kind and later pair, its corrected score's top
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


def join_measures(scores: pd.DataFrame, others: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """scores.csv's rows, then each of `others`' (a measure of OTHER_MEASURES -> its table) as that
    variant, in OTHER_MEASURES' order: one table of every measure (SCORES_COLUMNS, or
    RAW_SCORES_COLUMNS for tables not yet calibrated)."""
    import pandas as pd

    columns = [c for c in SCORES_COLUMNS if c in scores.columns]
    parts = [others[m].assign(variant=m)[columns] for m in OTHER_MEASURES if m in others]
    return pd.concat([scores[columns], *parts], ignore_index=True)


def split_measures(measured: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """join_measures undone: (scores.csv's rows, {measure: its table} for each of OTHER_MEASURES
    that `measured` has)."""
    other = measured["variant"].isin(OTHER_MEASURES)
    return measured[~other].reset_index(drop=True), {
        m: measured[measured["variant"] == m].drop(columns="variant").reset_index(drop=True)
        for m in OTHER_MEASURES
        if (measured["variant"] == m).any()
    }


# What a column of the tables above holds, checked wherever a table is read (`read_csv`): an index
# (a layer, head, step, token count, batch or seed: an integer, never empty), a number (empty where
# undefined: NaN) or a flag (True or False; empty where not tested). A cut or hand-edited cell
# turns its column into text, which pandas would otherwise carry into the analysis as it is.
INDEX_COLUMNS = (
    "seed",
    "step",
    "tokens",
    "batch",
    "layer",
    "head",
    "src_layer",
    "src_head",
    "dst_layer",
    "dst_head",
)
NUMBER_COLUMNS = (
    *RAW_SCORES_COLUMNS[6:], *SIGNIFICANCE_COLUMNS[:3], "excess",
    *CHANNELS_COLUMNS[5:15], *CHANNEL_STATISTICS, *PATTERN_SCORES, "copying", "qk_positivity",
    *STEPS_COLUMNS[2:], *ABLATION_COLUMNS[5:], *CURVE_COLUMNS[2:], *GROUP_COLUMNS[4:],
    "n", "mean", "sd", "lo", "hi", "value",
)  # fmt: skip
FLAG_COLUMNS = ("discovery", "pair_discovery", *(f"is_{role}" for role in ROLES))


def read_csv(
    path: str | Path, required: Sequence[str] = (), sep: str = ",", empty_ok: bool = True
) -> pd.DataFrame:
    """A CSV (or, with sep="\\t", TSV) table that must exist, parse, end with a complete row, and
    have the `required` columns, each holding what its name says (INDEX_COLUMNS, NUMBER_COLUMNS,
    FLAG_COLUMNS); and, unless `empty_ok`, a row (a stage's table always has one: a header alone is
    a partial or hand-edited file, whose analysis would be silently empty)."""
    import io

    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "file not found")
    raw = path.read_bytes()
    try:
        frame = pd.read_csv(io.BytesIO(raw), sep=sep)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(str(path), f"not a readable table ({str(e).splitlines()[0]})") from None
    cut = _cut_short(raw, sep)
    if cut:
        raise UserError(str(path), f"{cut}: a partial file (rerun the stage that writes it)")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise UserError(
            str(path), f"missing column {missing[0]!r} (has {', '.join(map(str, frame.columns))})"
        )
    if not empty_ok and frame.empty:
        raise UserError(str(path), "no rows, only a header: not a complete table of its stage")
    for column in required:
        problem = _column_problem(frame[column])
        if problem:
            raise UserError(f"{path}: {column}", problem)
    return frame


def _cut_short(raw: bytes, sep: str) -> str | None:
    """Why the table's last row is not whole, or None: the stages end every row with a line end
    (pipeline/io.py `write_csv`), and pandas reads a row cut short as one with empty cells."""
    import csv

    if not raw.endswith(b"\n"):
        return "its last row is cut short (no line end)"
    lines = raw.rstrip(b"\r\n").split(b"\n")
    if len(lines) < 2:
        return None
    header, last = (
        next(csv.reader([line.decode("utf-8", "replace")], delimiter=sep)) for line in (lines[0], lines[-1])
    )
    if len(last) < len(header):
        return f"its last row (line {len(lines)}) has {len(last)} of the header's {len(header)} fields"
    return None


def _column_problem(column: pd.Series) -> str | None:
    """What is wrong with a column of a stage's table (INDEX_COLUMNS, NUMBER_COLUMNS,
    FLAG_COLUMNS), naming its first bad cell by line, or None."""
    import pandas as pd
    from pandas.api import types

    name = column.name
    if column.empty:  # a header alone: its columns read as text
        return None
    if name in FLAG_COLUMNS:
        bad = column.notna() & ~column.map(lambda v: isinstance(v, bool) or v in ("True", "False"))
        expected = "True or False"
    elif name in INDEX_COLUMNS or name in NUMBER_COLUMNS:
        if types.is_bool_dtype(column):
            bad = column.notna()
        else:
            numbers = pd.to_numeric(column, errors="coerce")
            bad = numbers.isna() & column.notna()
            if name in INDEX_COLUMNS:  # never empty, and whole
                bad |= column.isna() | (numbers.notna() & (numbers % 1 != 0))
        expected = "an integer" if name in INDEX_COLUMNS else "a number (empty where undefined)"
    else:
        return None
    if not bad.any():
        return None
    row = int(bad.to_numpy().argmax())
    value = column.iloc[row]
    shown = (
        "empty"
        if pd.isna(value)
        else repr(value if isinstance(value, str) else value.item() if hasattr(value, "item") else value)
    )
    return f"line {row + 2}: {shown}, expected {expected}"
