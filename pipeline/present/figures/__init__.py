"""Figures: pure functions from analysis tables to matplotlib figures, plus `save`.

One module per subject (`composition`, `channels`, `heads`, `dynamics`, `compare`), so each DVC stage
depends only on the drawing code it uses; each module's CAPTIONS say what its figures show (the
report reads them). `save` writes PNG and SVG
deterministically (no dates, fixed SVG ids) and atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless, and the same bytes on every run
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ... import io  # noqa: E402

plt.rcParams["svg.hashsalt"] = "attn-circuits"  # stable element ids in SVG
FORMATS = ("png", "svg")


@dataclass(frozen=True)
class Caption:
    """What a figure shows, said beside the function that draws it (each module's CAPTIONS, by the
    stem of the file the stage saves it as): `short` links it from the report's contents, `title`
    is its alt text and the caption's first sentence, `text` the rest of the caption."""

    short: str
    title: str
    text: str


def save(fig: Figure, base: str | Path, formats: Sequence[str] = FORMATS, dpi: int = 120) -> list[Path]:
    """Write `base.png` and `base.svg` atomically with fixed metadata; close the figure."""
    paths = []
    for fmt in formats:
        meta = {"Date": None} if fmt == "svg" else {"Software": None} if fmt == "png" else {}
        path = Path(f"{base}.{fmt}")
        io.write_with(path, lambda tmp, f=fmt, m=meta: fig.savefig(tmp, format=f, dpi=dpi, metadata=m))
        paths.append(path)
    plt.close(fig)
    return paths
