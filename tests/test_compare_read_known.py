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
