"""`heads.summarize` on a hand-built result: one earlier head into two later ones, every kind,
with effects chosen so that `min_effect` decides which later heads the agreement counts; the
summary records the `min_effect` it was given beside what it decided."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.behaviour import agreement, heads
from pipeline.tables import ABLATION_COLUMNS, KINDS, ROLES, VARIANTS


def hand_result() -> tuple[heads.HeadsResult, pd.DataFrame]:
    """Heads 0.0 (previous_token), 1.0 (induction), 1.1 (other); edges 0.0 -> 1.0 with every effect
    0.3 and 0.0 -> 1.1 with every effect 0.03, the same on three batches; every score 1 into 1.0
    and 0 into 1.1."""
    table = pd.DataFrame(
        {"layer": [0, 1, 1], "head": [0, 0, 1], "role": ["previous_token", "induction", "other"]}
    )
    for n, name in enumerate(heads.SCORES):
        table[name] = [0.1 * n, 0.2 * n, np.nan if name == "copying" else 0.3 * n]
    edges = [(k, 0, 0, 1, b) for k in KINDS for b in (0, 1)]
    ablation = pd.DataFrame(edges, columns=list(ABLATION_COLUMNS[:5]))
    for effect in ABLATION_COLUMNS[5:]:
        ablation[effect] = [0.3 if b == 0 else 0.03 for *_, b in edges]
    batches = pd.concat([ablation.assign(batch=b) for b in range(3)], ignore_index=True)
    scores = pd.DataFrame(
        [
            dict(zip(agreement.PAIR, e, strict=True), variant=v, score=float(e[-1] == 0))
            for e in edges
            for v in VARIANTS
        ]
    )
    result = heads.HeadsResult(table, ablation, {}, batches, {"induction": {"heads": ["1.0"]}})
    return result, scores


@pytest.mark.parametrize("min_effect, counted", [(0.01, 2), (0.1, 1)])
def test_summary_records_its_min_effect_and_counts_by_it(min_effect, counted):
    result, scores = hand_result()
    got = heads.summarize(result, scores, min_effect)
    assert got["min_effect"] == min_effect
    assert got["n_heads"] == 3 and got["roles"] == {
        r: int(r in ("previous_token", "induction", "other")) for r in ROLES
    }
    assert got["heads_by_role"]["induction"] == ["1.0"] and got["heads_by_role"]["other"] == ["1.1"]
    assert got["max"]["copying"] == pytest.approx(0.2 * heads.SCORES.index("copying"))
    assert got["role_ablation"] == {"induction": {"heads": ["1.0"]}}
    top = got["agreement"]["loss_effect"]["top_source"]["K"]["true"]
    assert top == {"match": counted, "heads": counted}  # later heads whose top effect reaches min_effect
    causal = got["agreement"]["loss_effect"]["ranking"]["K"]["true"]["causal"]
    assert causal == counted  # the edges whose effect reaches min_effect (no spread over batches)
    json.dumps(got, allow_nan=False)


def test_role_ablations_placebo_sets_are_drawn_from_the_runs_seed():
    """The same seed draws the same placebo sets; another seed, others (the `placebo_sets` stream)."""
    import torch
    from models import random_model

    from pipeline.config import HeadsConfig

    model = random_model("tiny", seed=3, n_heads=6, n_ctx=16, d_vocab=32)
    text = [torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(0))]
    table = pd.DataFrame(
        [
            {"layer": l, "head": h, "role": "induction" if (l, h) == (1, 0) else "other"}
            for l in (0, 1)
            for h in range(6)
        ]
    )
    cfg = HeadsConfig(placebo_sets=3)

    def drawn(seed):
        return heads.role_ablation(model, table, text, text, cfg, seed=seed)["induction"]["placebo_sets"]

    assert drawn(0) == drawn(0)
    assert len({json.dumps(drawn(s)) for s in range(4)}) > 1


def test_pattern_scores_example_is_the_first_repeated_sequence_and_its_own_patterns():
    """The example drawn is sequence 0 of the probe (two different sequences here): its tokens, and
    each layer's [head, q, k] patterns of that sequence, equal to the model run on it alone."""
    import torch
    from models import random_model

    model = random_model("tiny")
    span = torch.randint(1, 20, (2, 4), generator=torch.Generator().manual_seed(1))
    repeated = torch.cat([torch.zeros(2, 1, dtype=torch.long), span, span], 1)
    assert not torch.equal(repeated[0], repeated[1])
    _, example = heads.pattern_scores(model, repeated, repeated, 4, 2)
    assert torch.equal(example["tokens"], repeated[0])
    _, alone = model.run_with_cache(repeated[:1])
    want = torch.stack([p[0] for p in alone.pattern])  # [layer, head, q, k]
    assert example["pattern"].shape == (2, 3, 9, 9)
    assert torch.allclose(example["pattern"], want, rtol=0, atol=1e-12)


def test_role_ablation_refuses_more_probes_than_held_out_batches():
    """Probe b goes with held-out batch b: two probes and one held-out batch are refused (zip's
    strict check), not cut down to one pair."""
    import torch
    from models import random_model

    from pipeline.config import HeadsConfig

    model = random_model("tiny")
    text = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    table = pd.DataFrame(
        [
            {"layer": l, "head": h, "role": "induction" if (l, h) == (1, 0) else "other"}
            for l in (0, 1)
            for h in range(3)
        ]
    )
    with pytest.raises(ValueError) as caught:
        heads.role_ablation(model, table, [text, text], [text], HeadsConfig(placebo_sets=1), seed=0)
    assert str(caught.value) == "zip() argument 2 is shorter than argument 1"
