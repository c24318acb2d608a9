"""pipeline/config.py: analysis.composition.channel_tolerance is refused outside [0, 1) in one line
naming its key and value."""

from __future__ import annotations

import pytest
import yaml

from pipeline import params
from pipeline.errors import UserError


@pytest.mark.parametrize("value", [-0.01, 1.0, 2.5])
def test_the_tolerance_is_refused_outside_0_to_1_in_one_line_naming_its_key(value) -> None:
    raw = yaml.safe_load(params.dump(params.compose([])))
    raw["analysis"]["composition"]["channel_tolerance"] = value
    with pytest.raises(UserError) as caught:
        params.from_dict(raw)
    message = str(caught.value)
    assert "\n" not in message
    assert f"analysis.composition.channel_tolerance = {value}: " in message
