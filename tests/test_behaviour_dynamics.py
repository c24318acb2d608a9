"""pipeline/behaviour/dynamics.py: composition followed through training's checkpoints.

In-process on two hand-written checkpoints of random tiny models: `analyse` equal to the
composition stage's scores and the float64 heads at each checkpoint, its refusals of non-finite
weights, patterns or loss; `scores_at`, `steps_table` and `summarize` on known answers; and on the
tiny project's real run (tests/tiny_chain.py) the final checkpoint reproducing the composition and
heads stages exactly."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from models import random_model
from refusals import one_line

from pipeline import checkpoint, memory, params, tables
from pipeline.behaviour import dynamics, heads, phases
from pipeline.circuits import composition, invariant, significance, weights
from pipeline.config import ModelConfig
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import next_token_loss


@pytest.fixture(scope="module")
def chain(tiny_run) -> dict[str, Path]:
    return tiny_run


ROOT = Path(__file__).resolve().parents[1]


LENGTH = 5


STEPS = (0, 10)


@pytest.fixture(scope="module")
def cfg():
    overrides = [
        "setup=synthetic",
        "analysis.composition.baseline_samples=8",
        "analysis.composition.null_samples=4",
        f"analysis.heads.repeat_length={LENGTH}",
        "analysis.heads.eval_sequences=8",
    ]
    return params.from_dict(params.compose(overrides, conf_dir=ROOT / "conf"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """checkpoints/ (index.json, steps 0 and 10: the tiny random model of seeds 0 and 1, float32
    as train saves them), config.json, and the heads stage's two batches (a repeated probe
    [first, span, span] and held-out text)."""
    root = tmp_path_factory.mktemp("dynamics_known")
    models = [random_model("tiny", seed=s, dtype=torch.float32) for s in (0, 1)]
    writer = checkpoint.StepWriter(root / "checkpoints", seed=0)
    (root / "checkpoints").mkdir()
    for step, model in zip(STEPS, models, strict=True):
        writer(step, 8 * step, model.state_dict())
    writer.write_index()
    (root / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(models[0].cfg)))
    gen = torch.Generator().manual_seed(2)
    span = torch.randint(1, 20, (8, LENGTH), generator=gen)
    repeated = torch.cat([torch.zeros(8, 1, dtype=torch.long), span, span], 1)
    heldout = torch.randint(0, 20, (8, 16), generator=gen)
    return root, repeated, heldout


def head_scores(layers: int) -> pd.DataFrame:
    """Two heads per layer at steps 0 and 10: induction 0.1 x (layer + 1) + 0.01 x head + step / 100,
    prev_token 0.5 - 0.1 x layer + 0.01 x head + step / 100."""
    rows = [
        {"step": s, "layer": l, "head": h,
         "induction": 0.1 * (l + 1) + 0.01 * h + s / 100, "prev_token": 0.5 - 0.1 * l + 0.01 * h + s / 100}
        for s in STEPS for l in range(layers) for h in range(2)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def pair_rows(pair: tuple[int, int, int, int]) -> pd.DataFrame:
    """The pair's K rows at both steps under every measure: z = 1 + step, q = 0.5 / (1 + step)."""
    i, a, j, b = pair
    return pd.DataFrame([
        {"step": s, "kind": "K", "variant": m, "src_layer": i, "src_head": a, "dst_layer": j, "dst_head": b,
         "z": 1.0 + s, "q": 0.5 / (1 + s)}
        for s in STEPS for m in tables.MEASURES
    ])  # fmt: skip


def test_final_checkpoint_reproduces_the_composition_stage_exactly(chain):
    dyn = pd.read_csv(chain["dynamics"] / "composition.csv")
    assert list(dyn.columns) == list(tables.DYNAMICS_COLUMNS)
    assert sorted(dyn["step"].unique()) == [0, 10, 20]
    final = dyn[dyn["step"] == 20].drop(columns=["step", "tokens", "excess"]).reset_index(drop=True)
    stage = tables.join_measures(
        pd.read_csv(chain["composition"] / "scores.csv"),
        {m: pd.read_csv(chain["composition"] / f"{m}.csv") for m in tables.OTHER_MEASURES},
    )
    pd.testing.assert_frame_equal(final, stage, check_exact=True)
    assert set(dyn["variant"]) == set(tables.MEASURES)
    # the text files agree too: the same numbers, written the same way
    text = (chain["dynamics"] / "composition.csv").read_text().splitlines()
    stage_text = (chain["composition"] / "scores.csv").read_text().splitlines()[1:]
    cut = lambda line: ",".join(line.split(",")[2:-1])  # noqa: E731  (drop step, tokens, excess)
    final_text = {cut(line) for line in text[1:] if line.startswith("20,3200,")}
    assert set(stage_text) <= final_text


def test_final_checkpoint_reproduces_the_heads_stage_scores_exactly(chain):
    dyn = pd.read_csv(chain["dynamics"] / "heads.csv")
    assert list(dyn.columns) == list(tables.DYNAMICS_HEADS_COLUMNS)
    final = dyn[dyn["step"] == 20].drop(columns=["step", "tokens"]).reset_index(drop=True)
    stage = pd.read_csv(chain["heads"] / "heads.csv")[["layer", "head", *tables.PATTERN_SCORES]]
    pd.testing.assert_frame_equal(final, stage, check_exact=True)


def test_steps_table_follows_the_top_pair(chain):
    steps = pd.read_csv(chain["dynamics"] / "steps.tsv", sep="\t")
    summary = json.loads((chain["dynamics"] / "summary.json").read_text())
    assert list(steps.columns) == list(tables.STEPS_COLUMNS) and steps["step"].tolist() == [0, 10, 20]
    (i, a), (j, b) = summary["pair"]["src"], summary["pair"]["dst"]
    heads = pd.read_csv(chain["dynamics"] / "heads.csv")
    last = heads[heads["step"] == 20]
    assert (
        j >= 1
        and last.loc[last["layer"] >= 1, "induction"].idxmax()
        == last.index[(last["layer"] == j) & (last["head"] == b)][0]
    )
    comp = pd.read_csv(chain["dynamics"] / "composition.csv")
    for m in tables.MEASURES:
        pair = (
            (comp["src_layer"] == i)
            & (comp["src_head"] == a)
            & (comp["dst_layer"] == j)
            & (comp["dst_head"] == b)
        )
        rows = comp.loc[(comp["kind"] == "K") & (comp["variant"] == m) & pair]
        assert steps[f"z_{m}"].tolist() == rows["z"].tolist()
        assert steps[f"q_{m}"].tolist() == rows["q"].tolist()  # each checkpoint calibrated on its own
    best = heads.groupby("step").apply(
        lambda f: f.loc[f["layer"] >= 1, "induction"].max(), include_groups=False
    )
    assert steps["induction"].tolist() == best.tolist()
    assert summary["checkpoints"] == 3 and summary == {**summary, **phases.summary(steps, 0.05)}
    # 20 steps of the tiny model need not lower the loss (seed 0 does not); the untrained model's
    # is near uniform over 16 tokens
    assert (steps["eval_loss"] > 0).all() and steps["eval_loss"].iloc[0] == pytest.approx(
        math.log(16), abs=0.15
    )


def test_analyse_unwrapped_equals_the_composition_stage_and_the_float64_heads_at_each_checkpoint(run, cfg):
    """progress None: the checkpoints as they are. At each, the composition rows are
    `significance.measured`'s on the weights stage's weights of that checkpoint (seed 4), the
    tables indexed 0 .. n - 1 over both checkpoints, a steps row per checkpoint. The attention
    scores and held-out loss are those of the float32 model train saved there, widened to float64
    before it runs (the tiny random models of seeds 0 and 1 `.to(float64)`), to 1e-12: a float32
    run differs by ~1e-7."""
    root, repeated, heldout = run
    entries = checkpoint.read_index(root / "checkpoints")
    got = dynamics.analyse(entries, root / "checkpoints", root / "config.json", repeated, heldout, cfg, 4)
    for table in (got.composition, got.heads):
        assert table.index.equals(pd.RangeIndex(len(table)))
    assert list(got.composition.columns) == list(tables.DYNAMICS_COLUMNS)
    assert got.steps["step"].tolist() == list(STEPS) and got.heads["step"].tolist() == [0] * 6 + [10] * 6
    for entry in entries:
        model_cfg, state = tl_checkpoint.read_checkpoint(
            root / "checkpoints" / entry["file"], root / "config.json"
        )
        hw, _ = weights.prepare(state, model_cfg)
        expected = significance.measured(hw, cfg.analysis.composition, 4, "shortformer")[0]
        rows = got.composition[got.composition["step"] == entry["step"]].reset_index(drop=True)
        assert (rows["tokens"] == entry["tokens"]).all()
        pd.testing.assert_frame_equal(rows[list(expected.columns)], expected, check_dtype=False)
    h = cfg.analysis.heads
    for seed, step in enumerate(STEPS):
        model = random_model("tiny", seed=seed, dtype=torch.float32).to(torch.float64)
        with torch.no_grad():
            values, _ = heads.pattern_scores(model, repeated, heldout, h.repeat_length, h.window_length)
            loss = next_token_loss(model(heldout), heldout).item()
        rows = got.heads[got.heads["step"] == step]
        assert rows[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
        for name in tables.PATTERN_SCORES:
            expected = values[name].reshape(-1).tolist()
            assert rows[name].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15), name
        assert got.steps.loc[got.steps["step"] == step, "eval_loss"].item() == pytest.approx(loss, rel=1e-12)


def test_a_checkpoint_whose_weights_overflow_when_prepared_is_refused_naming_its_file(tmp_path, cfg):
    """A float64 checkpoint (finite, so read_checkpoint takes it) whose value bias 1e200 times W_O
    1e200 overflows when folded into b_O: the weights' refusal names the checkpoint's file."""
    model = random_model("tiny", seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["blocks.0.attn.b_V"][0] = 1e200
    state["blocks.0.attn.W_O"][0] = 1e200
    writer = checkpoint.StepWriter(tmp_path / "checkpoints", seed=0)
    (tmp_path / "checkpoints").mkdir()
    writer(0, 0, state)
    writer.write_index()
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(model.cfg)))
    entries = checkpoint.read_index(tmp_path / "checkpoints")
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(UserError) as e:
        dynamics.analyse(entries, tmp_path / "checkpoints", tmp_path / "config.json", tokens, tokens, cfg, 0)
    path = tmp_path / "checkpoints" / checkpoint.step_file(0)
    assert e.value.where == f"{path}: blocks.0.attn.b_O"  # the checkpoint's file, then the tensor
    one_line(e)


def test_analyse_loops_over_the_checkpoints_through_the_progress_wrapper(run, cfg):
    root, repeated, heldout = run
    entries = checkpoint.read_index(root / "checkpoints")
    seen = []

    def progress(items):
        for item in items:
            seen.append(item["step"])
            yield item

    got = dynamics.analyse(
        entries, root / "checkpoints", root / "config.json", repeated, heldout, cfg, 4, progress
    )
    assert seen == list(STEPS) and got.steps["step"].tolist() == list(STEPS)


@pytest.mark.parametrize("bad", ["pattern", "loss"])
def test_non_finite_patterns_or_loss_are_refused_naming_the_checkpoint(run, cfg, monkeypatch, bad):
    """A non-finite attention score with a finite loss is refused, and a non-finite loss with finite
    scores: each alone, in one line naming the checkpoint's file."""
    root, repeated, heldout = run
    real = dynamics.heads_at

    def heads_at(model, repeated, heldout, cfg):
        table, loss = real(model, repeated, heldout, cfg)
        if bad == "pattern":
            table.loc[3, "induction"] = np.nan
        return table, (math.inf if bad == "loss" else loss)

    monkeypatch.setattr(dynamics, "heads_at", heads_at)
    entries = checkpoint.read_index(root / "checkpoints")
    with pytest.raises(UserError) as e:
        dynamics.analyse(entries, root / "checkpoints", root / "config.json", repeated, heldout, cfg, 4)
    path = root / "checkpoints" / checkpoint.step_file(0)
    assert e.value.where == str(path)
    one_line(e)


def test_scores_at_is_the_composition_stages_on_the_runs_seed_and_device(run, cfg, monkeypatch):
    """The same rows as `significance.measured` for the seed given (not another draw), and the
    products run on the device given."""
    root, _, _ = run
    model_cfg, state = tl_checkpoint.read_checkpoint(
        root / "checkpoints" / checkpoint.step_file(10), root / "config.json"
    )
    hw, _ = weights.prepare(state, model_cfg)
    expected = significance.measured(hw, cfg.analysis.composition, 7, "shortformer")[0]
    pd.testing.assert_frame_equal(dynamics.scores_at(hw, cfg, 7, "shortformer"), expected)
    devices = []
    for module, name in ((composition, "composition_scores"), (invariant, "invariant_scores")):
        real = getattr(module, name)

        def spy(*args, real=real, **kwargs):
            devices.append(kwargs.get("device"))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    pd.testing.assert_frame_equal(dynamics.scores_at(hw, cfg, 7, "shortformer", device="cpu"), expected)
    assert len(devices) >= 2 and set(devices) == {"cpu"}  # both measures, every call


@pytest.mark.parametrize(
    "layers, induction, prev_token",
    [
        (2, [0.21, 0.31], [0.51, 0.61]),  # induction over layer 1, previous-token over layer 0
        (3, [0.31, 0.41], [0.51, 0.61]),  # induction over layers 1, 2; previous-token over 0, 1
        (1, [0.11, 0.21], [0.51, 0.61]),  # one layer: both over it (as train's curve.tsv)
    ],
)
def test_steps_table_known_answers(layers, induction, prev_token):
    losses = pd.DataFrame({"step": list(STEPS), "tokens": [0, 80], "eval_loss": [3.0, 2.5]})
    pair = {"src": [0, 1], "dst": [min(1, layers - 1), 0]}
    got = dynamics.steps_table(pair_rows((0, 1, min(1, layers - 1), 0)), head_scores(layers), losses, pair)
    assert list(got.columns) == list(tables.STEPS_COLUMNS)
    assert got["induction"].tolist() == pytest.approx(induction)
    assert got["prev_token"].tolist() == pytest.approx(prev_token)
    assert got["eval_loss"].tolist() == [3.0, 2.5]
    for m in tables.MEASURES:
        assert got[f"z_{m}"].tolist() == [1.0, 11.0] and got[f"q_{m}"].tolist() == pytest.approx(
            [0.5, 0.5 / 11]
        )


def test_previous_token_is_over_the_first_layer_alone_in_a_two_layer_model():
    """The later layer's previous-token heads are left out even where they score higher."""
    losses = pd.DataFrame({"step": list(STEPS), "tokens": [0, 80], "eval_loss": [3.0, 2.5]})
    scores = head_scores(2).assign(prev_token=lambda t: 0.5 + 0.1 * t["layer"] + t["step"] / 100)
    got = dynamics.steps_table(pair_rows((0, 1, 1, 0)), scores, losses, {"src": [0, 1], "dst": [1, 0]})
    assert got["prev_token"].tolist() == pytest.approx([0.5, 0.6])  # layer 0's, not layer 1's 0.6, 0.7


def test_run_hands_its_device_to_analyse(run, cfg, monkeypatch):
    root, _, _ = run
    calls = []
    monkeypatch.setattr(dynamics, "analyse", lambda *args, **kwargs: calls.append((args, kwargs)) or "done")
    assert dynamics.run(root / "checkpoints", root / "config.json", cfg, 0, device="cpu") == "done"
    ((args, kwargs),) = calls
    assert kwargs.get("device", args[-1]) == "cpu"


def test_summarize_names_the_checkpoints_and_the_pair():
    steps = pd.DataFrame({"step": [0, 100], "tokens": [0, 800], "eval_loss": [3.0, 2.0],
                          "induction": [0.1, 0.6], "prev_token": [0.2, 0.7]})  # fmt: skip
    for m in tables.MEASURES:
        steps[f"z_{m}"], steps[f"q_{m}"] = [0.0, 5.0], [1.0, 0.01]
    result = dynamics.DynamicsResult(pd.DataFrame(), pd.DataFrame(), steps, {"src": [0, 1], "dst": [1, 0]})
    got = dynamics.summarize(result, 0.05)
    assert got == {"checkpoints": 2, "pair": {"src": [0, 1], "dst": [1, 0]}, **phases.summary(steps, 0.05)}
    assert got["checkpoints"] == 2 and got["phase_step"] == 100


def test_analyse_hands_its_device_seed_and_positions_to_scores_at(run, cfg, monkeypatch):
    """The composition scores of a checkpoint are computed on the device analyse is given (as
    the composition stage's, `scores_at`), with the run's seed and the model's positional
    embedding. (Stopped at the first checkpoint's call: only the arguments are read.)"""
    root, repeated, heldout = run
    calls = []

    class Called(Exception):
        pass

    def scores_at(hw, cfg, seed, positions, device=None):
        calls.append((seed, positions, device))
        raise Called

    monkeypatch.setattr(dynamics, "scores_at", scores_at)
    entries = checkpoint.read_index(root / "checkpoints")
    with pytest.raises(Called):
        dynamics.analyse(
            entries, root / "checkpoints", root / "config.json", repeated, heldout, cfg, 4, device="cpu"
        )
    assert calls == [(4, "shortformer", "cpu")]


def test_run_draws_the_held_out_text_and_the_probe_from_the_runs_seed(run, cfg, monkeypatch):
    """run's held-out text is the synthetic source's evaluation rows of the run's seed (as the heads
    stage loads them) and its probe that seed's probe of them: seed 5's, not seed 6's."""
    from pipeline.data import datasets

    root, _, _ = run
    calls = []
    monkeypatch.setattr(dynamics, "analyse", lambda *args, **kwargs: calls.append(args) or "done")
    assert dynamics.run(root / "checkpoints", root / "config.json", cfg, 5) == "done"
    (args,) = calls
    repeated, heldout = args[3], args[4]
    shape = tl_checkpoint.read_tl_config(root / "config.json")
    h = cfg.analysis.heads
    for seed, same in ((5, True), (6, False)):
        dataset = datasets.load(cfg.data, shape, seed, h.eval_sequences, need_train=False)
        probe = datasets.repeated_probe(dataset, h.eval_sequences, LENGTH, shape.d_vocab, seed)
        assert torch.equal(heldout, dataset.eval) is same
        assert torch.equal(repeated, probe) is same
    assert tuple(heldout.shape) == (8, shape.n_ctx) and tuple(repeated.shape) == (8, 1 + 2 * LENGTH)


SMALL = ModelConfig(n_heads=2, d_head=4, d_model=16, n_ctx=20, d_vocab=16)


def test_the_dynamics_library_refuses_a_shape_before_reading_checkpoints_or_data(tmp_path, monkeypatch):
    """dynamics.run checks the shape as the heads stage does, after the index and before the
    checkpoints (an empty file here: reading it would fail otherwise) and the data."""
    monkeypatch.setattr(memory, "available_bytes", lambda: int(8e9))
    (tmp_path / checkpoint.step_file(0)).write_bytes(b"")
    index = {"checkpoints": [{"step": 0, "tokens": 0, "file": checkpoint.step_file(0)}]}
    (tmp_path / checkpoint.INDEX).write_text(json.dumps(index))
    config = tmp_path / "config.json"  # a model whose analysis needs terabytes (its n_ctx)
    config.write_text(json.dumps(tl_checkpoint.tl_config(replace(SMALL, n_ctx=10**7))))
    cfg = params.from_dict(params.compose(["setup=synthetic"], conf_dir=ROOT / "conf"), "params.yaml")
    with pytest.raises(UserError) as e:
        dynamics.run(tmp_path, config, cfg, seed=0)
    assert e.value.where == f"{config}: n_ctx" and e.value.value == 10**7
    assert memory.human(8e9) in str(e.value) and "\n" not in str(e.value)  # against the memory given


# --- dynamics: the pair followed through training -----------------------------------------


def test_the_top_pairs_source_is_in_an_earlier_layer():
    """The best induction head of layers >= 1 (1.1), and the best previous-token head of the layers
    before it: 0.1, although 1.0's previous-token score is higher."""
    from pipeline.behaviour import dynamics

    final = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "prev_token": [0.2, 0.6, 0.9, 0.0],
                          "induction": [0.9, 0.0, 0.1, 0.8]})  # fmt: skip
    assert dynamics.top_pair(final) == {"src": [0, 1], "dst": [1, 1]}
