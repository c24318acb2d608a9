"""The Python API (`attn_circuits.api`, here `pipeline.api`) returns the stages' own outputs.

Every form a user holds a model in (`MODELS`: a checkpoint, the weights stage's file, a state
dict, a HookedTransformer; and a folder, our model, a TransformerBridge) reads as the same
weights; each call returns what the functions it promises to run return (`behaviour.heads`,
`circuits.analysis`, `circuits.weights`) for the same weights, seed and batches, with
conf/analysis/default.yaml's settings unless given. On the tiny project reproduced by `dvc repro`
(tests/dvc_repo.py, the slow tier), and on a LayerNorm model run through the stages in-process,
its tables are byte for byte the composition and heads stages' files. A bad model, config,
setting or token batch is one `UserError` line naming the argument and its value."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from dvc_repo import reproduced
from models import random_model
from omegaconf import OmegaConf
from refusals import refused
from tl_oracle import bridge_of

from pipeline import api, checkpoint, io, params
from pipeline.behaviour import heads as heads_analysis
from pipeline.circuits import analysis, weights
from pipeline.config import AnalysisConfig, CompositionConfig, HeadsConfig, ModelConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import Transformer
from pipeline.tables import INVARIANT, PROJECTION, join_measures
from stages import composition as composition_stage
from stages import weights as weights_stage

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
TRAIN = Path("outputs/train/seed0")


@pytest.fixture(scope="module")
def repo(shared_dir) -> Path:
    """The tiny project, seeds [0], reproduced once a run (read only)."""
    return reproduced(shared_dir)[0]


def hooked_transformer(checkpoint_path: Path, config_path: Path):
    """A TransformerLens 3.9 HookedTransformer holding a checkpoint (as a user builds one from our files)."""
    tl = pytest.importorskip("transformer_lens")
    config = json.loads(config_path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = tl.HookedTransformer(
            tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"})
        )
    state, _ = checkpoint.load_state(checkpoint_path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith((".mask", ".IGNORE")) for k in missing)
    return model.eval()


# How a user holds seed 0's model, from the reproduced project's files: one entry per form. Each
# builds the object the API is handed; the TransformerLens 4.x bridge is one more entry.
MODELS: dict[str, Callable[[Path], Any]] = {
    "hooked_transformer": lambda repo: hooked_transformer(
        repo / TRAIN / "model.safetensors", repo / TRAIN / "config.json"
    ),
    "state_dict": lambda repo: api.weights_of(
        checkpoint.load_state(repo / TRAIN / "model.safetensors")[0], repo / TRAIN / "config.json"
    ),
    "checkpoint_path": lambda repo: repo / TRAIN / "model.safetensors",  # config.json beside it
    "heads_file": lambda repo: repo / "outputs/weights/seed0/heads.safetensors",  # the weights stage's
}
CASES = [
    pytest.param("hooked_transformer", marks=pytest.mark.interop),
    "state_dict",
    "checkpoint_path",
    "heads_file",
]
RUNNABLE = [c for c in CASES if c != "heads_file"]  # roles and the ablation need a model to run

COMPOSITION_FILES = {  # the composition stage's file: the Composition field it holds
    "scores.csv": "scores",
    "invariant.csv": "invariant",
    "projection.csv": "projection",
    "placebo.csv": "placebo",
    "channels.csv": "channels",
    "channels_placebo.csv": "channels_placebo",
}


def written(result: api.Composition, out: Path, seed: int = SEED) -> Path:
    """`result` written as the composition stage writes it (its writers, its file names)."""
    for name, field in COMPOSITION_FILES.items():
        io.write_csv(out / name, getattr(result, field))
    checkpoint.save_state(out / "channels.safetensors", result.shares, {"seed": seed, "rows": "channels.csv"})
    io.write_json(out / "summary.json", result.summary)
    return out


def assert_same_files(ours: Path, stage: Path, names) -> None:
    for name in names:
        assert (ours / name).read_bytes() == (stage / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_composition_equals_the_composition_stage(repo, tmp_path, case):
    cfg = params.load(repo / "params.yaml")
    result = api.composition(MODELS[case](repo), seed=SEED, config=cfg)
    assert len(result.scores) > 0 and result.scores["discovery"].dtype == bool
    names = [*COMPOSITION_FILES, "channels.safetensors", "summary.json"]
    assert_same_files(written(result, tmp_path), repo / "outputs/composition/seed0", names)


def stage_batches(repo: Path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The heads stage's probes and held-out batches for seed 0 (`heads.analyse`'s)."""
    cfg = params.load(repo / "params.yaml")
    h = cfg.analysis.heads
    shape = tl_checkpoint.read_tl_config(repo / TRAIN / "config.json")
    dataset = datasets.load(cfg.data, shape, SEED, h.eval_sequences * h.ablation_batches, need_train=False)
    return heads_analysis.evaluation_batches(dataset, h, shape.d_vocab, SEED)


@pytest.mark.slow
@pytest.mark.parametrize("case", RUNNABLE)
def test_heads_equal_the_heads_stage_on_its_batches(repo, tmp_path, case):
    """Given the heads stage's batches, `api.heads` writes its tables byte for byte, its summary
    (less the channel check, which the API does not run) equal; `roles` and `path_ablation`
    alone equal the same tables."""
    cfg = params.load(repo / "params.yaml")
    probes, heldout = stage_batches(repo)
    model = MODELS[case](repo)
    composition = api.composition(model, seed=SEED, config=cfg)
    got = api.heads(model, heldout, seed=SEED, probe=probes, composition=composition, config=cfg)
    io.write_csv(tmp_path / "heads.csv", got.roles)
    io.write_csv(tmp_path / "ablation.csv", got.ablation)
    io.write_csv(tmp_path / "ablation_batches.csv", got.ablation_batches)
    stage = repo / "outputs/heads/seed0"
    assert_same_files(tmp_path, stage, ["heads.csv", "ablation.csv", "ablation_batches.csv"])
    theirs = json.loads((stage / "summary.json").read_text())
    theirs.pop("channel_ablation")
    assert json.loads(json.dumps(got.summary)) == theirs

    roles = api.roles(model, heldout, seed=SEED, probe=probes, composition=composition, config=cfg)
    assert roles.equals(got.roles)
    ablation = api.path_ablation(model, heldout, seed=SEED, probe=probes, config=cfg)
    assert ablation.equals(got.ablation)
    every = api.path_ablation(model, heldout, seed=SEED, probe=probes, config=cfg, every_batch=True)
    assert every.equals(got.ablation_batches)


@pytest.mark.interop
@pytest.mark.parametrize(
    "positions,block",
    [("standard", {}), ("shortformer", {}), ("standard", {"n_layers": 3, "d_mlp": 32})],
    ids=["standard", "shortformer", "gpt2-block-three-layers"],
)
def test_a_layernorm_hooked_transformer_equals_the_weights_and_composition_stages(tmp_path, positions, block):
    """LayerNorm is folded by the weights stage: a HookedTransformer with LayerNorm (GPT-2's block,
    with MLPs, too) through the API, and its checkpoint through the weights and composition stages
    (in-process, their command lines), give the same bytes, every later layer pair scored."""
    from stages import composition as composition_stage
    from stages import weights as weights_stage

    model_cfg = ModelConfig(
        **{"n_layers": 2, "n_heads": 2, "d_head": 4, "d_model": 16, "n_ctx": 12, "d_vocab": 20,
           "positional_embedding_type": positions, "normalization_type": "LN", **block}
    )  # fmt: skip
    checkpoint_path, config_path = tmp_path / "model.safetensors", tmp_path / "config.json"
    torch.manual_seed(3)
    model = tl_checkpoint.build_model(model_cfg, _perturbed(model_cfg))
    checkpoint.save_state(checkpoint_path, model.state_dict())
    config_path.write_text(json.dumps(tl_checkpoint.tl_config(model_cfg)))
    hooked = hooked_transformer(checkpoint_path, config_path)
    raw = OmegaConf.to_container(OmegaConf.load(ROOT / "params.yaml"))
    raw["analysis"]["composition"].update(baseline_samples=8, null_samples=8)
    (tmp_path / "params.yaml").write_text(params.dump(raw))
    p = ["--params", str(tmp_path / "params.yaml")]
    assert weights_stage.main([*p, "--model", str(checkpoint_path), "--config", str(config_path),
                               "--out", str(tmp_path / "weights")]) == 0  # fmt: skip
    assert composition_stage.main([*p, "--weights", str(tmp_path / "weights/heads.safetensors"),
                                   "--seed", "1", "--out", str(tmp_path / "stage")]) == 0  # fmt: skip

    result = api.composition(hooked, seed=1, baseline_samples=8, null_samples=8)
    names = [*COMPOSITION_FILES, "channels.safetensors", "summary.json"]
    assert_same_files(written(result, tmp_path / "api", seed=1), tmp_path / "stage", names)
    w = api.weights_of(hooked)
    summary = json.loads((tmp_path / "weights" / "summary.json").read_text())
    assert w.steps and list(w.steps) == summary["steps"] and w.positions == positions  # the stage's folding
    pairs = result.scores[["src_layer", "dst_layer"]].drop_duplicates()
    assert len(pairs) == model_cfg.n_layers * (model_cfg.n_layers - 1) // 2


def _perturbed(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A model's fresh initialisation with LayerNorm weights and biases away from 1 and 0."""
    state = Transformer(cfg).state_dict()
    return {
        k: v + 0.2 * torch.randn_like(v) if (".ln" in k or "ln_final" in k) else v for k, v in state.items()
    }


def test_defaults_are_conf_analysis_default_yaml():
    """The API's settings, when none are given, are the schema's defaults: the values of
    conf/analysis/default.yaml (every key, both ways)."""
    conf = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/analysis/default.yaml"))
    assert asdict(AnalysisConfig()) == conf
    assert api._settings(CompositionConfig, "composition", None, {}) == CompositionConfig(
        **conf["composition"]
    )


def test_settings_override_the_defaults_and_unknown_ones_are_named(tmp_path):
    state = Transformer(ModelConfig(n_heads=2, d_head=4, d_model=16, d_vocab=20)).state_dict()
    w = api.weights_of(state, {"positional_embedding_type": "shortformer"})
    result = api.composition(w, fdr=0.2, baseline_samples=4, null_samples=4)
    assert result.summary["fdr"] == 0.2
    with pytest.raises(UserError) as caught:
        api.composition(w, fd=0.2)
    refused(caught, "analysis.composition.fd")
    with pytest.raises(UserError) as caught:
        api.composition(w, fdr=2.0)
    refused(caught, "analysis.composition.fdr", 2.0)


@pytest.mark.slow  # its fixture reproduces the tiny project with real dvc
def test_bad_inputs_are_one_line_naming_what_is_wrong(repo):
    heads_file = repo / "outputs/weights/seed0/heads.safetensors"
    with pytest.raises(UserError) as caught:
        api.weights_of(3)
    refused(caught, "model", "int")
    with pytest.raises(UserError) as caught:
        api.roles(heads_file, torch.zeros(2, 8, dtype=torch.long))
    assert "roles" in refused(caught, heads_file)  # the file, and the call that needs more
    model, cfg = repo / TRAIN / "model.safetensors", params.load(repo / "params.yaml")
    d_vocab = tl_checkpoint.read_tl_config(repo / TRAIN / "config.json").d_vocab
    outside = torch.tensor([[0, 1, d_vocab]])
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, outside, config=cfg)
    assert f"d_vocab = {d_vocab}" in refused(caught, "tokens", f"0..{d_vocab}")
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, torch.zeros(2, 8), config=cfg)
    refused(caught, "tokens", "torch.float32 [2, 8]")
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, torch.zeros(2, 8, dtype=torch.long))  # the defaults: too long for n_ctx 20
    assert "n_ctx" in refused(caught, "analysis.heads.repeat_length", 24)


def numbers(message: str) -> list[int]:
    """The integers a refusal names, in order: the sizes it counts."""
    return [int(n) for n in re.findall(r"\d+", message)]


CFG = ModelConfig(
    n_layers=2, n_heads=2, d_head=4, d_model=16, n_ctx=16, d_vocab=24, positional_embedding_type="standard"
)
# small enough to run in a second: a probe of 1 + 2 * 4 tokens, 4 composition draws
SETTINGS = AnalysisConfig(
    composition=CompositionConfig(baseline_samples=4, null_samples=4),
    heads=HeadsConfig(eval_sequences=4, repeat_length=4, window_length=2, ablation_batches=2, placebo_sets=3),
)


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CFG).eval()


@pytest.fixture(scope="module")
def tokens() -> list[torch.Tensor]:
    """Two disjoint held-out batches, [4, 12] each."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CFG.d_vocab, (4, 12), generator=g) for _ in range(2)]


def probes_for(tokens: list[torch.Tensor], seed: int, h: HeadsConfig) -> list[torch.Tensor]:
    """The heads stage's rule for text, written out: probe b is spans of the held-out text, end to
    end, drawn from run `seed`'s probe stream, batch b."""
    from pipeline import streams
    from pipeline.data import datasets

    stream = torch.cat([t.reshape(-1) for t in tokens]).numpy()
    return [
        datasets.repeated_heldout_spans(
            stream, len(t), h.repeat_length, torch.Generator().manual_seed(streams.seed_of(seed, "probe", b))
        )
        for b, t in enumerate(tokens)
    ]


def test_heads_are_the_heads_stage_functions_on_the_same_batches(model, tokens):
    """api.heads = behaviour.heads.analyse_batches then summarize, on the model's checked
    checkpoint in float64, the probes drawn from the seed's stream, the composition given."""
    seed, h = 3, SETTINGS.heads
    w = api.weights_of(model)
    found = analysis.composition(w.heads, SETTINGS.composition, seed, w.positions, "cpu")
    result = api.heads(model, tokens, seed=seed, composition=found, config=SETTINGS)

    built = tl_checkpoint.build_model(CFG, model.state_dict(), dtype=torch.float64).eval()
    probes = probes_for(tokens, seed, h)
    sources = ("Transformer", "Transformer")
    expected = heads_analysis.analyse_batches(
        built, w.heads, probes, tokens, h, found.scores, sources, seed, "cpu"
    )
    pd.testing.assert_frame_equal(result.roles, expected.table)
    pd.testing.assert_frame_equal(result.ablation, expected.ablation)
    pd.testing.assert_frame_equal(result.ablation_batches, expected.batches)
    assert result.patterns.keys() == expected.example.keys()
    for name, t in expected.example.items():
        assert torch.equal(result.patterns[name], t), name
    measured = join_measures(found.scores, {INVARIANT: found.invariant, PROJECTION: found.projection})
    summary = heads_analysis.summarize(expected, measured, h.min_effect)
    assert json.dumps(result.summary, sort_keys=True) == json.dumps(summary, sort_keys=True)
    assert result.summary["n_heads"] == CFG.n_layers * CFG.n_heads


def test_heads_without_a_composition_compute_it_with_the_seed_on_the_models_device(
    model, tokens, monkeypatch
):
    """No composition given: it is `circuits.analysis.composition` of the model's weights with the
    same seed and the given config's composition settings, run on the model's device (the CPU)."""
    calls = []
    real = analysis.composition

    def spy(hw, cfg, seed, positions, device=None):
        calls.append((cfg, seed, positions, device))
        return real(hw, cfg, seed, positions, device)

    monkeypatch.setattr(analysis, "composition", spy)
    computed = api.heads(model, tokens, seed=2, config=SETTINGS)
    assert calls == [(SETTINGS.composition, 2, "standard", "cpu")]
    monkeypatch.undo()
    given = api.heads(model, tokens, seed=2, config=SETTINGS, composition=api.composition(model, 2, SETTINGS))
    pd.testing.assert_frame_equal(computed.roles, given.roles)
    assert json.dumps(computed.summary, sort_keys=True) == json.dumps(given.summary, sort_keys=True)


def test_roles_and_path_ablation_are_the_heads_tables(model, tokens):
    """roles = heads(...).roles (the first batch's scores), path_ablation = heads(...).ablation
    (every_batch: .ablation_batches), for the same seed, settings and batches; the seed defaults to 0."""
    whole = api.heads(model, tokens, seed=0, config=SETTINGS)
    pd.testing.assert_frame_equal(api.roles(model, tokens, config=SETTINGS), whole.roles)
    pd.testing.assert_frame_equal(api.path_ablation(model, tokens, config=SETTINGS), whole.ablation)
    every = api.path_ablation(model, tokens, config=SETTINGS, every_batch=True)
    pd.testing.assert_frame_equal(every, whole.ablation_batches)
    # another seed draws other probes: the default is seed 0, not any seed
    assert not api.roles(model, tokens, seed=1, config=SETTINGS).equals(whole.roles)


def test_settings_given_as_keywords_reach_the_heads(model, tokens):
    """Keyword settings override the config's HeadsConfig: a longer probe span is a wider probe."""
    with pytest.raises(UserError) as caught:
        api.roles(
            model, tokens, probe=probes_for(tokens, 0, SETTINGS.heads), config=SETTINGS, repeat_length=5
        )
    assert numbers(refused(caught, "probe[0]")) == [0, 9, 11]  # 9 positions where 1 + 2 x 5 = 11 fit
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, tokens, config=SETTINGS, repeat_lenght=5)
    refused(caught, "analysis.heads.repeat_lenght")


def test_given_probes_are_checked_against_the_tokens(model, tokens):
    probes = probes_for(tokens, 0, SETTINGS.heads)
    wide = [torch.cat([p, p[:, :1]], dim=1) for p in probes]  # 10 positions, not 1 + 2 * 4
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, tokens, probe=[probes[0], wide[1]], config=SETTINGS)
    assert numbers(refused(caught, "probe[1]")) == [1, 10, 9]  # 10 positions where 9 fit
    with pytest.raises(UserError) as caught:
        api.path_ablation(model, tokens, probe=probes[0], config=SETTINGS)
    assert numbers(refused(caught, "probe")) == [1, 2]  # 1 batch of probes for 2 of tokens
    # the probes drawn by default are these: passing them gives the same table
    pd.testing.assert_frame_equal(
        api.path_ablation(model, tokens, probe=probes, config=SETTINGS),
        api.path_ablation(model, tokens, config=SETTINGS),
    )


def test_token_batches_are_int64_ids_checked_against_the_model():
    ids = np.array([[0, 5, 23], [1, 2, 3]], dtype=np.int32)
    (out,) = api._token_batches(ids, "tokens", CFG)
    assert out.dtype == torch.int64 and out.tolist() == ids.tolist()
    one = api._token_batches([torch.tensor([1, 2]), torch.tensor([[3, 4]], dtype=torch.int16)], "tokens", CFG)
    assert [t.dtype for t in one] == [torch.int64, torch.int64]
    assert [t.tolist() for t in one] == [[[1, 2]], [[3, 4]]]
    with pytest.raises(UserError) as caught:
        api._token_batches(torch.ones(1, 3, dtype=torch.bool), "tokens", CFG)
    refused(caught, "tokens", "torch.bool [1, 3]")
    with pytest.raises(UserError) as caught:
        api._token_batches(torch.tensor([[0, 24]]), "tokens", CFG)
    assert "d_vocab = 24" in refused(caught, "tokens", "0..24")
    with pytest.raises(UserError) as caught:
        api._token_batches(torch.zeros(1, 17, dtype=torch.long), "tokens", CFG)
    assert numbers(refused(caught, "tokens")) == [17, 2, 16] and "n_ctx = 16" in str(caught.value)


def test_a_heads_file_is_read_as_the_composition_stage_reads_it(model, tmp_path):
    """heads.safetensors: analysis-ready weights, its positions from its config metadata, named by
    its path; no checkpoint, so roles refuse it, naming it and the call."""
    w = api.weights_of(model)
    path = tmp_path / "heads.safetensors"
    weights.save(path, w.heads, {"config": json.dumps({"positional_embedding_type": "shortformer"})})
    read = api.weights_of(path)
    assert (read.positions, read.config, read.state, read.source) == ("shortformer", None, None, str(path))
    assert read.device == torch.device("cpu")
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert torch.equal(getattr(read.heads, name), getattr(w.heads, name)), name
    assert api.weights_of(tmp_path).source == str(path)  # a folder holding it
    with pytest.raises(UserError) as caught:
        api.roles(path, torch.zeros(2, 12, dtype=torch.long))
    assert "roles" in refused(caught, path)  # the file, and the call that needs more
    weights.save(path, w.heads, {"config": json.dumps({"positional_embedding_type": "alibi"})})
    with pytest.raises(UserError) as caught:
        api.weights_of(path)
    refused(caught, f"{path}: config.positional_embedding_type", "alibi")


def test_a_checkpoint_with_config_json_beside_it_is_the_checkpoint(model, tmp_path):
    checkpoint.save_state(tmp_path / "model.safetensors", model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(CFG)))
    read = api.weights_of(tmp_path / "model.safetensors")
    direct = api.weights_of(model.state_dict(), CFG)
    assert (read.config, read.source, read.steps) == (CFG, str(tmp_path / "model.safetensors"), direct.steps)
    assert read.state.keys() == direct.state.keys()
    for name, t in direct.state.items():
        assert torch.equal(read.state[name], t), name
    assert torch.equal(read.heads.W_Q, direct.heads.W_Q)
    # a folder holding model.safetensors (and no heads.safetensors) is that checkpoint
    assert api.weights_of(tmp_path).source == str(tmp_path / "model.safetensors")


def test_a_state_dict_keeps_its_checked_checkpoint_and_a_given_configs_sizes(model):
    state = model.state_dict()
    w = api.weights_of(state, CFG)
    assert w.config == CFG and w.source == "state dict" and w.device == torch.device("cpu")
    assert w.state.keys() == {k for k in state if not k.endswith((".mask", ".IGNORE"))}
    # a full config is taken as given, not overruled by the shapes: a d_vocab the weights lack is refused
    fields = {**tl_checkpoint.tl_config(CFG), "d_vocab": 25, "d_vocab_out": 25}
    with pytest.raises(UserError) as caught:
        api.weights_of(state, fields)
    message = refused(caught, "state dict: embed.W_E")
    assert "[24, 16]" in message and "[25, 16]" in message  # the shape it has, the one config asks
    assert api.weights_of(state, tl_checkpoint.tl_config(CFG)).config == CFG
    # no config: the sizes from the shapes, no LayerNorm (no ln keys), TransformerLens's standard positions
    assert api.weights_of(state).config == CFG
    shortformer = api.weights_of(state, {"positional_embedding_type": "shortformer"})
    assert (shortformer.positions, shortformer.config.n_ctx) == ("shortformer", CFG.n_ctx)


def test_a_bridge_state_dict_is_read_with_its_config(model):
    """Without its config it is refused, naming model_config and the size it lacks (n_heads)."""
    _, bridge = tl_checkpoint.bridge_checkpoint(CFG, model.state_dict())
    with pytest.raises(UserError) as caught:
        api.weights_of(bridge)
    message = refused(caught, "state dict")
    assert "model_config" in message and "n_heads" in message
    read, direct = api.weights_of(bridge, CFG), api.weights_of(model.state_dict(), CFG)
    assert read.config == CFG
    for name, t in direct.state.items():
        assert torch.equal(read.state[name], t), name


def test_device_of_is_the_first_tensors_else_the_cpu():
    assert api._device_of([]) == torch.device("cpu")
    assert api._device_of(iter([torch.zeros(1, device="meta")])) == torch.device("meta")
    assert api._device_of(["not a tensor"]) == torch.device("cpu")


def test_transformer_lens_classes_are_told_by_their_top_level_package():
    def made(name: str, module: str) -> object:
        return type(name, (), {"__module__": module})()

    assert api._is_instance_of(
        made("HookedTransformer", "transformer_lens.HookedTransformer"), "HookedTransformer"
    )
    sub = type("Mine", (type(made("HookedTransformer", "transformer_lens.x")),), {"__module__": "mine"})()
    assert api._is_instance_of(sub, "HookedTransformer")  # a subclass
    assert not api._is_instance_of(made("HookedTransformer", "my_transformer_lens.x"), "HookedTransformer")
    assert not api._is_instance_of(made("HookedTransformer", "transformer_lensx.y"), "HookedTransformer")
    assert not api._is_instance_of(made("TransformerBridge", "transformer_lens.x"), "HookedTransformer")


def test_composition_runs_on_the_device_asked_not_the_models(model, monkeypatch):
    """`device` is where the analysis runs: asked for "cpu:0", `circuits.analysis.composition` is
    called with "cpu:0", not the model's "cpu", and its result is the call's."""
    calls = []
    real = analysis.composition

    def spy(hw, cfg, seed, positions, device=None):
        calls.append((cfg, seed, positions, device))
        calls.append(real(hw, cfg, seed, positions, device))
        return calls[-1]

    monkeypatch.setattr(analysis, "composition", spy)
    found = api.composition(model, 5, SETTINGS, device="cpu:0")
    assert calls[0] == (SETTINGS.composition, 5, "standard", "cpu:0") and len(calls) == 2
    assert found is calls[1]


def test_heads_read_the_composition_given_not_one_computed_again(model, tokens):
    """qk_positivity pairs each later head with the earlier head of its largest true K score in the
    composition given: scores that make head (0, a) the best source of both layer-1 heads give both
    the QK positivity with (0, a), whatever the model's own scores say. Own scores can agree with at
    most one of a = 0 and a = 1, as each differs from the other in both heads."""
    w = api.weights_of(model)
    own = api.composition(model, 0, SETTINGS)
    expected = {
        a: heads_analysis.qk_positivity(w.heads, {(1, 0): (0, a), (1, 1): (0, a)}).reshape(-1).numpy()
        for a in range(CFG.n_heads)
    }
    assert np.isnan(expected[0][:2]).all() and not np.isnan(expected[0][2:]).any()  # layer 0 reads nothing
    assert (expected[0][2:] != expected[1][2:]).all()  # the source matters to both heads
    for a in range(CFG.n_heads):
        scores = own.scores.copy()
        k_true = (scores["kind"] == "K") & (scores["variant"] == "true")
        scores.loc[k_true, "score"] = np.where(scores.loc[k_true, "src_head"] == a, 1.0, 0.5)
        given = dataclasses.replace(own, scores=scores)
        roles = api.heads(model, tokens, composition=given, config=SETTINGS).roles
        np.testing.assert_array_equal(roles["qk_positivity"].to_numpy(), expected[a])


def test_roles_refuse_weights_that_overflow_the_forward_pass_naming_the_model(model, tokens):
    """Weights scaled by 1e100 are finite, but the attention scores overflow float64: roles refuse
    them in one line naming where the model came from (a state dict)."""
    state = {k: v.double() * 1e100 if ".W_" in k else v for k, v in model.state_dict().items()}
    columns = ["dst_layer", "dst_head", "src_layer", "src_head", "kind", "variant", "score"]
    rest = [None] * (len(dataclasses.fields(api.Composition)) - 1)
    no_scores = api.Composition(pd.DataFrame(columns=columns), *rest)  # roles read only its scores
    with pytest.raises(UserError) as caught:
        api.roles(state, tokens, composition=no_scores, config=SETTINGS)
    refused(caught, "state dict")


def test_weights_without_their_checkpoint_or_their_config_are_refused_by_roles_naming_them(model, tokens):
    """A `Weights` holding a config but no checkpoint (or a checkpoint but no config) cannot be
    built into a model to run: roles refuses either in one line naming the weights' source."""
    w = api.weights_of(model)
    for missing in ({"state": None}, {"config": None}):
        with pytest.raises(UserError) as caught:
            api.roles(dataclasses.replace(w, **missing), tokens, config=SETTINGS)
        assert refused(caught, "Transformer").split(": ", 1)[1].startswith("roles "), missing


def test_an_unknown_setting_is_refused_listing_every_known_one():
    with pytest.raises(UserError) as caught:
        api._settings(CompositionConfig, "composition", None, {"fd": 0.1})
    message = refused(caught, "analysis.composition.fd")
    assert all(f.name in message for f in dataclasses.fields(CompositionConfig)), message


def test_settings_are_typed_and_checked_as_params_yaml_is_naming_the_key():
    """Keyword settings are merged into the section's schema as params.yaml is (OmegaConf's types,
    then the section's checks); a numpy scalar counts as the number it holds."""
    for settings, asked in (
        ({"fdr": "high"}, "float"),  # the type the schema asks for
        ({"null_samples": 4.5}, "int"),
        ({"null_samples": 0}, None),
    ):
        with pytest.raises(UserError) as caught:
            api._settings(CompositionConfig, "composition", None, settings)
        [(key, value)] = settings.items()
        message = refused(caught, f"analysis.composition.{key}", value)
        assert asked is None or message.endswith(f" {asked}")
    got = api._settings(
        CompositionConfig, "composition", None, {"fdr": np.float64(0.1), "null_samples": np.int64(8)}
    )
    assert got == CompositionConfig(fdr=0.1, null_samples=8)
    nested = api._settings(HeadsConfig, "heads", None, {"thresholds": {"induction": 0.4}})
    assert nested.thresholds.induction == 0.4
    with pytest.raises(UserError) as caught:
        api._settings(HeadsConfig, "heads", None, {"thresholds": {"induction": 1.5}})
    refused(caught, "analysis.heads.thresholds.induction", 1.5)


def test_a_seed_and_a_device_are_checked_as_the_stages_check_them(model):
    assert api._seed("0") == 0
    for seed in (-1, 0.5):  # below 0; not an integer
        with pytest.raises(UserError) as caught:
            api.composition(model, seed=seed)
        refused(caught, "seed", seed)
    assert "int" in str(caught.value)  # the type it asks for
    lacking = "cuda:99" if torch.cuda.is_available() else "cuda"
    for name in (lacking, "gpu", "meta"):  # a device the machine lacks; no device; one holding no values
        with pytest.raises(UserError) as caught:
            api.weights_of(model, device=name)
        refused(caught, "device", name)


def test_a_mapping_that_is_not_names_to_tensors_is_refused_in_one_line():
    for bad in ({"embed.W_E": 1.0}, {0: torch.zeros(1)}):
        with pytest.raises(UserError) as caught:
            api.weights_of(bad)
        refused(caught, "state dict")


class TransformerBridge:
    """What `weights_of` reads of a TransformerLens 4.x TransformerBridge: its class's name and
    top-level package, `cfg.to_dict()`, `state_dict()` and `parameters()`."""

    __module__ = "transformer_lens.model_bridge.bridge"

    def __init__(self, config: dict, state: dict):
        self.cfg = type("Cfg", (), {"to_dict": lambda _: dict(config)})()
        self._state = state

    def state_dict(self) -> dict:
        return dict(self._state)

    def parameters(self):
        return iter(self._state.values())


def test_a_transformer_bridge_is_read_as_its_checkpoint_and_carries_its_own_config(model):
    """A bridge holding our model's weights (`tl_checkpoint.bridge_checkpoint`) reads as the same
    checkpoint given as a state dict with its config, named TransformerBridge; a model_config
    beside it is refused, as the bridge carries its own."""
    bridge = TransformerBridge(*tl_checkpoint.bridge_checkpoint(CFG, model.state_dict()))
    read, direct = api.weights_of(bridge), api.weights_of(model.state_dict(), CFG)
    assert (read.config, read.source, read.device) == (CFG, "TransformerBridge", torch.device("cpu"))
    assert read.state.keys() == direct.state.keys()
    for name, t in direct.state.items():
        assert torch.equal(read.state[name], t), name
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert torch.equal(getattr(read.heads, name), getattr(direct.heads, name)), name
    with pytest.raises(UserError) as caught:
        api.weights_of(bridge, CFG)
    assert "TransformerBridge" in refused(caught, "model_config")


def test_a_model_that_carries_its_config_refuses_another_beside_it(model):
    """Our model and a HookedTransformer carry their config, as a bridge does: a model_config
    beside one is refused, naming the model's class."""
    with pytest.raises(UserError) as caught:
        api.weights_of(model, CFG)
    assert "Transformer" in refused(caught, "model_config")


# --- each refusal: the argument and value it names ---------------------------------------------


def test_a_model_of_no_known_kind_is_refused_listing_every_kind():
    with pytest.raises(UserError) as caught:
        api.weights_of(3)
    message = refused(caught, "model", "int")
    assert all(kind in message for kind in ("HookedTransformer", "TransformerBridge", "Transformer"))


def test_weights_refuse_a_model_config_beside_them():
    w = api.Weights(None, "standard", None, None, torch.device("cpu"), "x")  # refused before it is read
    with pytest.raises(UserError) as caught:
        api.weights_of(w, CFG)
    assert "Weights" in refused(caught, "model_config")


def test_a_model_config_of_no_known_kind_is_refused_naming_its_type(model):
    with pytest.raises(UserError) as caught:
        api.weights_of(model.state_dict(), 3)
    message = refused(caught, "model_config", "int")
    assert "HookedTransformerConfig" in message and "ModelConfig" in message  # the kinds it takes


def test_a_folder_without_weights_is_refused_naming_it(tmp_path):
    with pytest.raises(UserError) as caught:
        api.weights_of(tmp_path)
    message = refused(caught, tmp_path)
    assert "heads.safetensors" in message and "model.safetensors" in message  # what it looked for


def test_a_config_of_another_section_is_refused_naming_its_type():
    with pytest.raises(UserError) as caught:
        api._settings(CompositionConfig, "composition", HeadsConfig(), {})
    message = refused(caught, "config", "HeadsConfig")
    assert all(kind in message for kind in ("CompositionConfig", "AnalysisConfig", "Config"))


def test_no_token_batches_are_refused():
    with pytest.raises(UserError) as caught:
        api._token_batches([], "tokens", CFG)
    refused(caught, "tokens")


def test_weights_without_their_checkpoint_are_refused_by_heads_and_path_ablation_naming_the_call(
    model, tokens
):
    """As roles': `heads` and `path_ablation` each refuse weights that cannot be built into a
    model in one line naming the weights' source and the call itself."""
    w = dataclasses.replace(api.weights_of(model), state=None)
    for call, name in ((api.heads, "heads"), (api.path_ablation, "path_ablation")):
        with pytest.raises(UserError) as caught:
            call(w, tokens, config=SETTINGS)
        assert refused(caught, "Transformer").split(": ", 1)[1].startswith(f"{name} ")  # the call


def test_a_bridge_state_dict_whose_heads_disagree_with_its_config_names_the_model_config(model):
    """A bridge's q weight is [n_heads * d_head, d_model]: read with a config of d_head 2 (not
    4), its 2 x 4 = 8 rows do not split into 2 x 2, refused naming the key and the model_config."""
    _, bridge = tl_checkpoint.bridge_checkpoint(CFG, model.state_dict())
    with pytest.raises(UserError) as caught:
        api.weights_of(bridge, dataclasses.replace(CFG, d_head=2))
    message = refused(caught, "blocks.0.attn.q.weight")
    assert "[8, 16]" in message and "model_config" in message  # its shape, and the config at fault


def test_heads_run_the_forward_passes_on_the_weights_device(model, tokens, monkeypatch):
    """api.heads hands behaviour.heads.analyse_batches the weights' device ("cpu" here), which
    moves the probes and held-out batches (built on the CPU) there beside the model."""
    calls = []
    real = heads_analysis.analyse_batches

    def spy(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(heads_analysis, "analyse_batches", spy)
    api.heads(model, tokens, seed=0, config=SETTINGS, composition=api.composition(model, 0, SETTINGS))
    assert calls == ["cpu"]


PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@pytest.mark.interop4
def test_the_api_on_a_bridge_equals_the_composition_stages_files(tmp_path, bridge_class):
    """The same weights through the weights and composition stages (their entry points, on
    params.yaml's analysis settings) and through `api.composition` on a bridge holding them:
    every table and the summary written by the same writer, byte for byte."""
    from pipeline import api  # the notebook API's module, imported where it is tested

    model = random_model(replace(random_model("tiny").cfg, positional_embedding_type="standard"), seed=7)
    model = model.float()
    train = tmp_path / "train"
    checkpoint.save_state(io.ensure_dir(train) / "model.safetensors", model.state_dict())
    io.write_json(train / "config.json", tl_checkpoint.tl_config(model.cfg))
    argv = ["--params", str(PARAMS), "--model", str(train / "model.safetensors")]
    argv += ["--config", str(train / "config.json")]
    assert weights_stage.main([*argv, "--out", str(tmp_path / "weights")]) == 0
    heads = str(tmp_path / "weights" / "heads.safetensors")
    stage = tmp_path / "composition"
    assert (
        composition_stage.main(
            ["--params", str(PARAMS), "--weights", heads, "--seed", "3", "--out", str(stage)]
        )
        == 0
    )

    result = api.composition(bridge_of(bridge_class, model), seed=3, config=params.load(PARAMS))
    mine = tmp_path / "api"
    for name in ("scores", "invariant", "projection", "placebo", "channels", "channels_placebo"):
        io.write_csv(mine / f"{name}.csv", getattr(result, name))
        assert (mine / f"{name}.csv").read_bytes() == (stage / f"{name}.csv").read_bytes(), name
    io.write_json(mine / "summary.json", result.summary)
    assert (mine / "summary.json").read_bytes() == (stage / "summary.json").read_bytes()
