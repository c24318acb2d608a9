"""The Python API (`attn_circuits.api`, here `pipeline.api`) returns the stages' own outputs.

On the tiny project reproduced by the real `dvc repro` (tests/dvc_repo.py), seed 0's model is
handed to the API in every form a user holds it (`MODELS`: one parameter per form; a
TransformerLens 4.x bridge is one more), and every table the API returns, written by the
project's own writers, is byte for byte the composition and heads stages' files. A LayerNorm
model (which the weights stage folds) runs through the stages in-process and through the API
from a HookedTransformer: the same bytes again. The API's defaults are conf/analysis/default.yaml.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from dvc_repo import reproduced
from omegaconf import OmegaConf

from pipeline import api, checkpoint, io, params
from pipeline.behaviour import heads as heads_analysis
from pipeline.config import AnalysisConfig, CompositionConfig, ModelConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import AttnOnlyTransformer

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
@pytest.mark.parametrize("positions", ["standard", "shortformer"])
def test_a_layernorm_hooked_transformer_equals_the_weights_and_composition_stages(tmp_path, positions):
    """LayerNorm is folded by the weights stage: a HookedTransformer with LayerNorm through the
    API, and its checkpoint through the weights and composition stages (in-process, their
    command lines), give the same bytes."""
    from stages import composition as composition_stage
    from stages import weights as weights_stage

    model_cfg = ModelConfig(
        n_layers=2, n_heads=2, d_head=4, d_model=16, n_ctx=12, d_vocab=20,
        positional_embedding_type=positions, normalization_type="LN",
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
    assert any("folded LayerNorm" in step for step in w.steps) and w.positions == positions


def _perturbed(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A model's fresh initialisation with LayerNorm weights and biases away from 1 and 0."""
    state = AttnOnlyTransformer(cfg).state_dict()
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
    state = AttnOnlyTransformer(ModelConfig(n_heads=2, d_head=4, d_model=16, d_vocab=20)).state_dict()
    w = api.weights_of(state, {"positional_embedding_type": "shortformer"})
    result = api.composition(w, fdr=0.2, baseline_samples=4, null_samples=4)
    assert result.summary["fdr"] == 0.2
    with pytest.raises(UserError, match=r"^analysis\.composition\.fd: unknown setting"):
        api.composition(w, fd=0.2)
    with pytest.raises(UserError, match=r"^analysis\.composition\.fdr = 2\.0: must be in \(0, 1\)"):
        api.composition(w, fdr=2.0)


@pytest.mark.slow  # its fixture reproduces the tiny project with real dvc
def test_bad_inputs_are_one_line_naming_what_is_wrong(repo):
    heads_file = repo / "outputs/weights/seed0/heads.safetensors"
    with pytest.raises(UserError, match=r"^model = 'int': expected a TransformerLens HookedTransformer"):
        api.weights_of(3)
    with pytest.raises(UserError, match="roles needs the model's checkpoint and config.json"):
        api.roles(heads_file, torch.zeros(2, 8, dtype=torch.long))
    model, cfg = repo / TRAIN / "model.safetensors", params.load(repo / "params.yaml")
    d_vocab = tl_checkpoint.read_tl_config(repo / TRAIN / "config.json").d_vocab
    outside = torch.tensor([[0, 1, d_vocab]])
    with pytest.raises(UserError, match=rf"^tokens = '0\.\.{d_vocab}': token ids must be in \[0, d_vocab"):
        api.path_ablation(model, outside, config=cfg)
    with pytest.raises(UserError, match=r"^tokens = 'torch.float32 \[2, 8\]': expected integer token ids"):
        api.path_ablation(model, torch.zeros(2, 8), config=cfg)
    with pytest.raises(UserError, match=r"^analysis\.heads\.repeat_length = 24: .*n_ctx"):
        api.path_ablation(model, torch.zeros(2, 8, dtype=torch.long))  # the defaults: too long for n_ctx 20
