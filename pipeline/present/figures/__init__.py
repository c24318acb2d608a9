"""Figures: pure functions from analysis tables to matplotlib figures, plus `save`.

One module per subject (`composition`, `channels`, `heads`, `dynamics`, `compare`), so each DVC stage
depends only on the drawing code it uses. `save` writes PNG and SVG
deterministically (no dates, fixed SVG ids) and atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless, and the same bytes on every run
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ... import io  # noqa: E402

plt.rcParams["svg.hashsalt"] = "attn-circuits"  # stable element ids in SVG
FORMATS = ("png", "svg")


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
