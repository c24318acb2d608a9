"""Analysis-ready weights: folding LayerNorm, centring and folding value biases keep the
model's function (log-probabilities) exactly, for all four position/norm variants;
each step is recorded. (Equality with TransformerLens's processing: test_interop.py.)"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from models import random_model

from pipeline import checkpoint
from pipeline.circuits import weights
from pipeline.config import ModelConfig
from pipeline.model import tl_checkpoint
from pipeline.model.transformer import LayerNorm

VARIANTS = list(itertools.product(["standard", "shortformer"], [None, "LN"]))


def normalise(x: torch.Tensor) -> torch.Tensor:
    """LayerNorm with no weights (what is left of ln1 / ln_final after folding)."""
    ln = LayerNorm(x.shape[-1]).double()
    return ln(x).detach()


def forward_from_heads(
    hw: weights.HeadWeights, extra: dict, cfg: ModelConfig, tokens: torch.Tensor
) -> torch.Tensor:
    """Log-probabilities computed from prepared weights only, in float64."""
    T = tokens.shape[1]
    ln = cfg.normalization_type == "LN"
    shortformer = cfg.positional_embedding_type == "shortformer"
    resid = hw.W_E[tokens] + (0 if shortformer else hw.W_pos[:T])
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for l in range(hw.n_layers):
        x = normalise(resid) if ln else resid
        q = torch.einsum("bpm,hmd->bhpd", x, hw.W_Q[l]) + hw.b_Q[l][None, :, None]
        k = torch.einsum("bpm,hmd->bhpd", x, hw.W_K[l]) + hw.b_K[l][None, :, None]
        if shortformer and ln:  # exact positional terms stored beside the folded weights
            q, k = q + extra[f"blocks.{l}.attn.pos_Q"][:, :T], k + extra[f"blocks.{l}.attn.pos_K"][:, :T]
        elif shortformer:
            q = q + torch.einsum("pm,hmd->hpd", hw.W_pos[:T], hw.W_Q[l])
            k = k + torch.einsum("pm,hmd->hpd", hw.W_pos[:T], hw.W_K[l])
        v = torch.einsum("bpm,hmd->bhpd", x, hw.W_V[l]) + hw.b_V[l][None, :, None]
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hw.d_head)).masked_fill(mask, float("-inf"))
        z = scores.softmax(-1) @ v  # [batch, head, pos, d_head]
        resid = resid + torch.einsum("bhpd,hdm->bpm", z, hw.W_O[l]) + hw.b_O[l]
    x = normalise(resid) if ln else resid
    return (x @ hw.W_U + hw.b_U).log_softmax(-1)


@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_prepared_weights_compute_the_same_log_probabilities(pos, norm):
    model = random_model(positional_embedding_type=pos, normalization_type=norm)
    state = model.state_dict()
    hw, steps = weights.prepare(state, model.cfg)
    extra = weights.positional_terms(state, model.cfg)
    shape = (4, model.cfg.n_ctx)
    tokens = torch.randint(0, model.cfg.d_vocab, shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens).log_softmax(-1)
    assert torch.allclose(forward_from_heads(hw, extra, model.cfg, tokens), expected, atol=1e-10)
    assert hw.b_V.abs().max() == 0  # folded into b_O
    assert torch.allclose(hw.W_U.mean(-1), torch.zeros(model.cfg.d_model, dtype=torch.float64), atol=1e-12)
    assert any("value biases" in s for s in steps) and any("W_U" in s for s in steps)


def test_layernorm_steps_fold_and_centre():
    model = random_model("layernorm", positional_embedding_type="standard")
    hw, steps = weights.prepare(model.state_dict(), model.cfg)
    zero = lambda t, dim: torch.allclose(t.mean(dim), torch.zeros(()).double(), atol=1e-12)  # noqa: E731
    assert zero(hw.W_Q, 2) and zero(hw.W_K, 2) and zero(hw.W_V, 2)  # reading weights centred over d_model
    assert zero(hw.W_E, -1) and zero(hw.W_pos, -1) and zero(hw.W_O, -1) and zero(hw.b_O, -1)  # writing
    w = model.blocks[0].ln1.w.detach()
    expected = model.blocks[0].attn.W_Q.detach() * w[None, :, None]
    assert torch.allclose(hw.W_Q[0], expected - expected.mean(1, keepdim=True))
    assert any(s.startswith("folded LayerNorm") for s in steps)
    assert any("W_E, W_pos, W_O, b_O" in s for s in steps)


def test_shortformer_layernorm_keeps_positions_exact_and_says_so():
    model = random_model("layernorm", positional_embedding_type="shortformer")
    state = model.state_dict()
    hw, steps = weights.prepare(state, model.cfg)
    extra = weights.positional_terms(state, model.cfg)
    assert sorted(extra) == [f"blocks.{l}.attn.pos_{x}" for l in (0, 1) for x in ("K", "Q")]
    cfg = model.cfg
    assert extra["blocks.1.attn.pos_Q"].shape == (cfg.n_heads, cfg.n_ctx, cfg.d_head)
    assert torch.equal(hw.W_pos, state["pos_embed.W_pos"])  # never normalised: kept as trained
    assert any("shortformer + LayerNorm" in s for s in steps)


def test_without_layernorm_nothing_is_folded_or_centred():
    model = random_model(positional_embedding_type="shortformer")
    state = model.state_dict()
    hw, steps = weights.prepare(state, model.cfg)
    assert torch.equal(hw.W_Q[1], state["blocks.1.attn.W_Q"]) and torch.equal(hw.W_E, state["embed.W_E"])
    assert weights.positional_terms(state, model.cfg) == {}
    assert any(s.startswith("no LayerNorm") for s in steps)


def test_weights_stage_records_every_step(tmp_path):
    from stages import weights as stage

    model = random_model("layernorm", positional_embedding_type="shortformer")
    checkpoint.save_state(tmp_path / "model.safetensors", model.float().state_dict())
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(model.cfg)))
    params = tmp_path / "params.yaml"
    from pipeline import params as params_mod

    params.write_text(
        params_mod.dump(params_mod.compose(conf_dir=Path(__file__).resolve().parents[1] / "conf"))
    )
    for out in ("out", "again"):
        code = stage.main(
            [
                "--model",
                str(tmp_path / "model.safetensors"),
                "--config",
                str(tmp_path / "config.json"),
                "--out",
                str(tmp_path / out),
                "--params",
                str(params),
            ]
        )
        assert code == 0
    for name in ("heads.safetensors", "summary.json"):  # byte-identical when run again
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    hw, meta = weights.load(tmp_path / "out" / "heads.safetensors")
    assert json.loads(meta["steps"]) == summary["steps"] and len(summary["steps"]) >= 4
    state, _ = checkpoint.load_state(tmp_path / "out" / "heads.safetensors")
    assert "blocks.0.attn.pos_Q" in state and hw.n_heads == model.cfg.n_heads


def test_a_raw_layernorm_checkpoint_is_refused_naming_the_weights_stage(tmp_path, capsys):
    """The composition stage reads any TransformerLens-named checkpoint, but one that still has
    LayerNorm parameters would be scored unfolded (TransformerLens's unprocessed scores): it is
    refused in one line naming the weights stage, whose heads.safetensors of the same model is read."""
    from pipeline import params as params_mod
    from stages import composition
    from stages import weights as weights_stage

    model = random_model("layernorm", positional_embedding_type="standard")
    raw = tmp_path / "model.pth"
    torch.save(model.float().state_dict(), raw)  # a raw HookedTransformer-style state dict: ln1.w, ...
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(model.cfg)))
    p = tmp_path / "params.yaml"
    p.write_text(params_mod.dump(params_mod.compose(conf_dir=Path(__file__).resolve().parents[1] / "conf")))
    capsys.readouterr()
    assert composition.main(["--weights", str(raw), "--out", str(tmp_path / "c"), "--params", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "blocks.0.ln1.b" in err and "python -m stages.weights" in err, err
    assert not (tmp_path / "c").exists()
    only_final = tmp_path / "final.safetensors"  # any LayerNorm key, in any file weights.load reads
    weights.save(only_final, weights.from_state_dict(random_model().state_dict()))
    state, _ = checkpoint.load_state(only_final)
    d_model = state["blocks.0.attn.W_O"].shape[-1]
    checkpoint.save_state(only_final, {**state, "ln_final.w": torch.ones(d_model)})
    with pytest.raises(weights.UserError, match="ln_final.w: LayerNorm weights not folded"):
        weights.load(only_final)
    argv = ["--model", str(raw), "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "w")]
    assert weights_stage.main([*argv, "--params", str(p)]) == 0
    hw, _ = weights.load(tmp_path / "w" / "heads.safetensors")  # folded: read without a word
    assert hw.n_heads == model.cfg.n_heads
