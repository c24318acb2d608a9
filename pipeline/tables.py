"""The tables stages hand each other (CSV): their vocabularies and columns, defined once
here (torch-free, so the compare and report stages import no model code), and reading them
with one-line errors naming the file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from pipeline.errors import UserError

KINDS = ("Q", "K", "V")  # composition kinds
VARIANTS = ("true", "errata_bcda", "errata_dabc")  # the correct score, and the errata's two rotations
ERRATA = VARIANTS[1:]
ROLES = (
    "previous_token",
    "recent_window",
    "induction",
    "duplicate_token",
    "current_token",
    "first_token",
    "other",
)

SCORES_COLUMNS = (
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
ABLATION_COLUMNS = ("kind", "src_layer", "src_head", "dst_layer", "dst_head", "attn_effect", "loss_effect")
CURVE_COLUMNS = ("step", "tokens", "train_loss", "eval_loss", "induction", "prev_token", "icl")


def excess(scores: pd.DataFrame) -> pd.Series:
    """Score minus the random-matrix baseline of its variant (what the paper plots)."""
    return scores["score"] - scores["baseline_mean"]


def read_csv(path: str | Path, required: Sequence[str] = (), sep: str = ",") -> pd.DataFrame:
    """A CSV (or, with sep="\\t", TSV) table that must exist, parse, and have the `required` columns."""
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
    return frame
