"""pipeline/compare/read.py: the heads summary's channel_ablation entry, read as documented: {}
when absent, the entry when it has a list of pairs, else a one-line refusal naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.compare import read
from pipeline.errors import UserError

PATH = Path("outputs/heads/seed0/summary.json")
REFUSAL = f"{PATH}: channel_ablation: expected {{pairs: [...], median_causal_share}}"


def test_channel_ablation_entry_is_read_or_refused_by_name():
    assert read._channel_ablation({}, PATH) == {}
    assert read._channel_ablation({"channel_ablation": {}}, PATH) == {}
    entry = {"pairs": [], "median_causal_share": 0.5}
    assert read._channel_ablation({"channel_ablation": entry}, PATH) is entry
    for bad in ({"pairs": "none"}, {"median_causal_share": 0.5}, [1, 2], "pairs"):
        with pytest.raises(UserError) as caught:
            read._channel_ablation({"channel_ablation": bad}, PATH)
        assert str(caught.value) == REFUSAL


def test_every_table_of_a_seed_must_have_a_row(tmp_path):
    """A stage's table always has a row: each of the seven, cut to its header, is refused by path."""
    import synthetic_seeds as syn

    dirs = syn.write_stage_outputs(tmp_path, [1])
    tables = [dirs["train"] / "seed1" / "curve.tsv", dirs["heads"] / "seed1" / "heads.csv",
              dirs["dynamics"] / "seed1" / "steps.tsv"] + [
        dirs["composition"] / "seed1" / name
        for name in ("scores.csv", "invariant.csv", "placebo.csv", "channels.csv")
    ]  # fmt: skip
    args = (dirs["train"], dirs["composition"], dirs["heads"], dirs["dynamics"])
    read.read_seed(1, *args)
    for path in tables:
        whole = path.read_text()
        path.write_text(whole.splitlines(keepends=True)[0])
        with pytest.raises(UserError) as caught:
            read.read_seed(1, *args)
        assert str(caught.value) == f"{path}: no rows, only a header: not a complete table of its stage"
        path.write_text(whole)
