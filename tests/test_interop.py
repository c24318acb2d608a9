"""TransformerLens 3.9 as the oracle, both directions: our checkpoints load into
`HookedTransformer` with equal logits, and a random attention-only `HookedTransformer`
(state dict + config.json) loads into our pipeline with equal logits; our LayerNorm
folding equals `HookedTransformer`'s `fold_ln` / `center_writing_weights` /
`fold_value_biases` where that is valid."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from models import random_model

from pipeline import checkpoint
from pipeline.circuits import weights
from pipeline.config import ModelConfig
from pipeline.model import tl_checkpoint

tl = pytest.importorskip("transformer_lens")
pytestmark = [pytest.mark.interop, pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")]

VARIANTS = list(itertools.product(["standard", "shortformer"], [None, "LN"]))
SHAPE = {"n_layers": 2, "n_heads": 4, "d_head": 8, "d_model": 32, "n_ctx": 16, "d_vocab": 50}


def hooked(config: dict, seed: int = 0) -> tl.HookedTransformer:
    """A HookedTransformer for a config.json dict, every parameter random (LN too)."""
    cfg = tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"}, seed=seed)
    model = tl.HookedTransformer(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if name.rsplit(".", 1)[-1] in ("w", "b") else 0.05))
    return model.eval()


def tl_config_json(model: tl.HookedTransformer) -> dict:
    """What a user writes with json.dump(model.cfg.to_dict()): dtypes as strings."""
    return json.loads(json.dumps(model.cfg.to_dict(), default=str))


@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_our_checkpoint_loads_into_hooked_transformer(tmp_path, pos, norm):
    cfg = ModelConfig(positional_embedding_type=pos, normalization_type=norm, **SHAPE)
    ours = random_model(cfg, seed=1, dtype=torch.float32, bias_std=0.1)
    checkpoint.save_state(tmp_path / "model.safetensors", ours.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(cfg)))

    config = json.loads((tmp_path / "config.json").read_text())
    theirs = tl.HookedTransformer(
        tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"})
    )
    state, _ = checkpoint.load_state(tmp_path / "model.safetensors")
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith((".mask", ".IGNORE")) for k in missing)
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(theirs(tokens), ours(tokens), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_hooked_transformer_checkpoint_loads_into_ours(tmp_path, pos, norm):
    config = {
        **SHAPE,
        "positional_embedding_type": pos,
        "normalization_type": norm,
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=3)
    state = theirs.state_dict()  # includes the mask and IGNORE buffers
    assert any(k.endswith(".mask") for k in state)
    torch.save(state, tmp_path / "model.pth")  # a plain tensor dict: loads with weights_only=True
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pth", tmp_path / "config.json")
    tokens = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(ours(tokens), theirs(tokens), atol=1e-5, rtol=0)
        assert torch.allclose(ours.run_with_cache(tokens)[0], theirs(tokens), atol=1e-5, rtol=0)


def test_processed_hooked_transformer_lnpre_loads(tmp_path):
    """TransformerLens folds LayerNorm on from_pretrained, leaving normalization_type LNPre."""
    config = {
        **SHAPE,
        "positional_embedding_type": "standard",
        "normalization_type": "LN",
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=5)
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = theirs(tokens).log_softmax(-1)
    theirs.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert theirs.cfg.normalization_type == "LNPre"
    torch.save(theirs.state_dict(), tmp_path / "model.pt")
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pt", tmp_path / "config.json")
    with torch.no_grad():
        assert torch.allclose(ours(tokens).log_softmax(-1), before, atol=1e-5)


@pytest.mark.parametrize("pos,norm", [("standard", "LN"), ("standard", None), ("shortformer", None)])
def test_our_folding_equals_transformer_lens_processing(pos, norm):
    """Where TransformerLens's processing is valid, our prepared weights are its weights."""
    config = {
        **SHAPE,
        "positional_embedding_type": pos,
        "normalization_type": norm,
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=7)
    state = {k: v.clone() for k, v in theirs.state_dict().items()}
    hw, _ = weights.prepare(state, tl_checkpoint.from_tl_config(config))
    theirs.load_and_process_state_dict(
        state, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )
    processed = theirs.state_dict()
    for name, ours in hw.state_dict().items():
        assert torch.allclose(ours, processed[name].double(), atol=1e-5), name


@pytest.mark.slow
def test_transformer_lens_checkpoint_runs_the_whole_pipeline_to_figures(tmp_path):
    """A random HookedTransformer in TransformerLens's attn-only-2l layout (LayerNorm,
    standard positions, a vocabulary of its own), shrunk, saved as TransformerLens saves
    it (torch.save of its state dict, config.json from its cfg): the real `dvc repro`
    with train.source=load produces every figure and the report."""
    from dvc_repo import dvc, git, make_repo, set_config

    repo = make_repo(tmp_path / "repo", commit=False)
    config = {
        "n_layers": 2,
        "n_heads": 4,
        "d_head": 8,
        "d_model": 32,
        "n_ctx": 32,
        "d_vocab": 300,
        "positional_embedding_type": "standard",
        "normalization_type": "LN",
        "attn_only": True,
        "act_fn": None,
    }
    theirs = hooked(config, seed=11)
    (repo / "checkpoints" / "attn-only-2l").mkdir(parents=True)
    torch.save(theirs.state_dict(), repo / "checkpoints" / "attn-only-2l" / "model.pth")
    (repo / "checkpoints" / "attn-only-2l" / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    # after the checkpoint exists: the config step refuses a local checkpoint that does not
    set_config(repo, ["train.source=load", "train.checkpoint=attn-only-2l/model.pth"])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "TransformerLens checkpoint")
    dvc(repo, "repro")

    out = repo / "outputs"
    loaded = tl_checkpoint.load_model(out / "train/seed0/model.safetensors", out / "train/seed0/config.json")
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        assert torch.allclose(loaded(tokens), theirs(tokens), atol=1e-5)
    manifest = json.loads((out / "train/seed0/manifest.json").read_text())
    assert manifest["checkpoint"]["path"].endswith("attn-only-2l/model.pth")
    steps = json.loads((out / "weights/seed0/summary.json").read_text())["steps"]
    assert any(s.startswith("folded LayerNorm") for s in steps)
    for name in ("errata_diagram.png", "composition_K.png"):
        assert (out / "figures/seed0" / name).stat().st_size > 0
    assert (out / "report/index.html").is_file()


@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_ablating_a_set_of_heads_equals_transformer_lens_hooks(tmp_path, pos, norm):
    """`ablation.heads_loss_effect` against HookedTransformer with each ablated head's z replaced
    by its batch mean at every position (a head's write is linear in its z)."""
    from pipeline.behaviour import ablation

    config = {**SHAPE, "positional_embedding_type": pos, "normalization_type": norm, "attn_only": True}
    theirs = hooked({**config, "act_fn": None}, seed=5)
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    (tmp_path / "config.json").write_text(json.dumps(tl_config_json(theirs)))
    ours = tl_checkpoint.load_model(tmp_path / "model.pth", tmp_path / "config.json", dtype=torch.float64)
    tokens = torch.randint(0, 50, (6, 16), generator=torch.Generator().manual_seed(6))
    heads = [(0, 0), (0, 1), (0, 3), (1, 2)]

    def mean_z(z, hook):  # [batch, pos, head, d_head]
        layer = int(hook.name.split(".")[1])
        for l, h in heads:
            if l == layer:
                z[:, :, h] = z[:, :, h].mean(0, keepdim=True)
        return z

    with torch.no_grad():
        clean = theirs(tokens, return_type="loss")
        hooks = [(f"blocks.{l}.attn.hook_z", mean_z) for l in (0, 1)]
        ablated = theirs.run_with_hooks(tokens, return_type="loss", fwd_hooks=hooks)
    expected = float(ablated - clean)
    assert abs(expected) > 1e-3  # the check can fail: these heads matter to this random model
    assert ablation.heads_loss_effect(ours, tokens, heads) == pytest.approx(expected, abs=1e-5)
