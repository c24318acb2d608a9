"""TransformerLens models as oracles on our weights' shape: a random HookedTransformer (3.9, the
`interop` extra) and its config.json, our random model and TransformerLens 4.x bridges of it or of
their own (the `interop4` extra, the `bridge_class` fixture). TransformerLens is imported only by
the functions that use it, so every test file can import this module in either venv."""

from __future__ import annotations

import json

import torch
from models import random_model

from pipeline.config import ModelConfig
from pipeline.model import tl_checkpoint

# the shape of every model here, 3.9's and 4.x's alike
SHAPE = {"n_layers": 2, "n_heads": 4, "d_head": 8, "d_model": 32, "n_ctx": 16, "d_vocab": 50}


TOKENS = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))


def hooked(config: dict, seed: int = 0):
    """A TransformerLens 3.9 HookedTransformer for a config.json dict, every parameter random (LN too)."""
    import transformer_lens as tl  # the interop extra: imported by the tests that need it

    cfg = tl.HookedTransformerConfig(**{k: v for k, v in config.items() if k != "eps"}, seed=seed)
    model = tl.HookedTransformer(cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if name.rsplit(".", 1)[-1] in ("w", "b") else 0.05))
    return model.eval()


def tl_config_json(model) -> dict:
    """What a user writes with json.dump(model.cfg.to_dict()): dtypes as strings."""
    return json.loads(json.dumps(model.cfg.to_dict(), default=str))


def ours(norm: str | None, seed: int = 1):
    """Our random model of SHAPE with standard positions (float32, biases std 0.1): 4.x has no
    shortformer form."""
    cfg = ModelConfig(positional_embedding_type="standard", normalization_type=norm, **SHAPE)
    return random_model(cfg, seed=seed, dtype=torch.float32, bias_std=0.1)


def bridge_of(bridge_class, model):
    """A bridge loaded from our checkpoint written in 4.x's form, as a 4.x user loads it."""
    config, state = tl_checkpoint.bridge_checkpoint(model.cfg, model.state_dict())
    bridge = bridge_class.boot_native(json.loads(json.dumps(config)))
    bridge.load_state_dict(state, strict=True)
    return bridge.eval()


def random_bridge(bridge_class, norm: str | None, seed: int = 3, **fields):
    """TransformerLens 4.x's own random attention-only bridge, every parameter perturbed (LN too)."""
    config = {**SHAPE, "attn_only": True, "positional_embedding_type": "standard", "normalization_type": norm}
    bridge = bridge_class.boot_native({**config, **fields, "seed": seed, "device": "cpu"})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in bridge.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if "ln" in name else 0.05))
    return bridge.eval()
