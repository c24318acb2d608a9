"""Analysis-ready weights: folding LayerNorm, centring and folding value biases keep the
model's function (log-probabilities) exactly, for all four position/norm variants;
each step is recorded, and equals TransformerLens 3.9's processing where that is valid. Stacking a
TransformerLens-named state dict (every refusal names the key, the file and the shapes), the state
dict round trip, the exact power-of-two scaling, the positions recorded in a weights file, refusing
unfolded LayerNorm, float64 checkpoints read unrounded, and `prepare`'s recorded steps and folds."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from models import random_model
from tl_oracle import SHAPE, hooked

from pipeline import checkpoint
from pipeline.circuits import weights
from pipeline.circuits.weights import HEAD_BIASES, HEAD_MATRICES, HeadWeights
from pipeline.config import ModelConfig
from pipeline.errors import UserError
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
    with pytest.raises(weights.UserError) as caught:
        weights.load(only_final)
    assert_names(caught, f"{only_final}: ln_final.w", "python -m stages.weights")
    argv = ["--model", str(raw), "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "w")]
    assert weights_stage.main([*argv, "--params", str(p)]) == 0
    hw, _ = weights.load(tmp_path / "w" / "heads.safetensors")  # folded: read without a word
    assert hw.n_heads == model.cfg.n_heads


F64 = torch.float64


FIELDS = (*HEAD_MATRICES, *HEAD_BIASES, "b_O", "W_E", "W_pos", "W_U", "b_U")


def tiny_state(**overrides) -> dict[str, torch.Tensor]:
    """The tiny model's state dict: 2 layers, 3 heads, d_model 16, d_head 4, n_ctx 16, d_vocab 20."""
    return dict(random_model(**overrides).state_dict())


def refused(state, where: str, *named: str, **kwargs) -> None:
    """`from_state_dict` refuses `state` in one line that begins with `where` (the file and the key)
    and names each of `named` (the shapes or values involved)."""
    with pytest.raises(UserError) as caught:
        weights.from_state_dict(state, **kwargs)
    assert_names(caught, where, *named)


def assert_names(caught, where: str, *named: str) -> None:
    """The refusal is one line, begins with `where: ` and names each of `named`."""
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{where}: "), message
    assert all(x in message for x in named), (message, named)


def test_state_dict_round_trip_stacks_every_layer_under_transformerlens_names() -> None:
    state = tiny_state()
    hw = weights.from_state_dict(state)
    assert (hw.n_layers, hw.n_heads, hw.d_model, hw.d_head) == (2, 3, 16, 4)
    assert hw.W_O.shape == (2, 3, 4, 16) and hw.b_Q.shape == (2, 3, 4) and hw.b_O.shape == (2, 16)
    for name in FIELDS:
        assert getattr(hw, name).dtype == F64, name
    for l in range(2):
        for name in (*HEAD_MATRICES, *HEAD_BIASES, "b_O"):
            assert torch.equal(getattr(hw, name)[l], state[f"blocks.{l}.attn.{name}"]), (l, name)
    out = hw.state_dict()
    want = {"embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U"} | {
        f"blocks.{l}.attn.{n}" for l in range(2) for n in (*HEAD_MATRICES, *HEAD_BIASES, "b_O")
    }
    assert set(out) == want
    for key in want:
        assert torch.equal(out[key], state[key]), key
    again = weights.from_state_dict(out)
    for name in FIELDS:
        assert torch.equal(getattr(again, name), getattr(hw, name)), name


def test_from_state_dict_converts_to_the_dtype_asked_for_and_to_moves_every_matrix() -> None:
    state = tiny_state()
    hw32 = weights.from_state_dict(state, dtype=torch.float32)
    assert {getattr(hw32, n).dtype for n in FIELDS} == {torch.float32}
    assert torch.equal(hw32.W_V, weights.from_state_dict(state).W_V.float())
    hw = weights.from_state_dict(state)
    for moved in (hw.to(torch.float32), hw.to(dtype=torch.float32), hw.to("cpu", torch.float32)):
        assert isinstance(moved, HeadWeights)
        for n in FIELDS:
            assert torch.equal(getattr(moved, n), getattr(hw, n).float()), n


def test_absent_biases_are_zero_but_absent_matrices_are_refused() -> None:
    state = tiny_state()
    for l in range(2):
        for name in (*HEAD_BIASES, "b_O"):
            del state[f"blocks.{l}.attn.{name}"]
    del state["unembed.b_U"]
    hw = weights.from_state_dict(state)
    for name, shape in (("b_Q", (2, 3, 4)), ("b_K", (2, 3, 4)), ("b_V", (2, 3, 4)), ("b_O", (2, 16))):
        b = getattr(hw, name)
        assert b.shape == shape and b.dtype == F64 and (b == 0).all(), name
    assert hw.b_U.shape == (20,) and hw.b_U.dtype == F64 and (hw.b_U == 0).all()
    assert weights.from_state_dict(state, dtype=torch.float32).b_K.dtype == torch.float32
    assert weights.from_state_dict(state, dtype=torch.float32).b_U.dtype == torch.float32
    for name in HEAD_MATRICES:  # a head matrix is never taken as zero
        partial = {k: v for k, v in state.items() if not k.endswith(f"attn.{name}")}
        refused(partial, f"weights: blocks.0.attn.{name}")
    one_layer = dict(tiny_state())
    del one_layer["blocks.1.attn.b_K"]  # present in layer 0: every layer must have it
    refused(one_layer, "weights: blocks.1.attn.b_K")


def test_every_refusal_names_the_file_the_key_and_the_shapes() -> None:
    good = tiny_state()
    refused({"embed.W_E": good["embed.W_E"]}, "weights: blocks", "blocks.0.attn.W_Q")
    gap = {k.replace("blocks.1.", "blocks.2."): v for k, v in good.items()}
    refused(gap, "weights: blocks", "[0, 2]")
    from_one = {k.replace("blocks.0.", "blocks.2."): v for k, v in good.items()}
    refused(from_one, "weights: blocks", "[1, 2]")
    refused({**good, "blocks.0.attn.W_Q": good["blocks.0.attn.W_Q"][0]}, "m.pt: blocks.0.attn.W_Q", "[16, 4]",
            "[n_heads, d_model, d_head]", source="m.pt")  # fmt: skip
    missing = {k: v for k, v in good.items() if k != "embed.W_E"}
    refused(missing, "weights: embed.W_E")
    for W_E in (good["embed.W_E"][:, :15], good["embed.W_E"][0]):
        refused({**good, "embed.W_E": W_E}, "weights: embed.W_E", str(list(W_E.shape)), "d_model = 16")
    for W_pos in (good["pos_embed.W_pos"][:, :15], good["pos_embed.W_pos"][0]):
        refused(
            {**good, "pos_embed.W_pos": W_pos},
            "weights: pos_embed.W_pos",
            str(list(W_pos.shape)),
            "d_model = 16",
        )
    wrong = {
        "blocks.1.attn.W_K": (torch.zeros(3, 16, 5), ("[3, 16, 5]", "[3, 16, 4]")),
        "blocks.1.attn.W_Q": (torch.zeros(2, 16, 4), ("[2, 16, 4]", "[3, 16, 4]")),
        "blocks.1.attn.W_V": (torch.zeros(3, 15, 4), ("[3, 15, 4]", "[3, 16, 4]")),
        "blocks.1.attn.W_O": (torch.zeros(3, 16, 4), ("[3, 16, 4]", "[3, 4, 16]")),
        "blocks.0.attn.b_Q": (torch.zeros(3, 5), ("[3, 5]", "[3, 4]")),
        "blocks.0.attn.b_K": (torch.zeros(4, 4), ("[4, 4]", "[3, 4]")),
        "blocks.1.attn.b_V": (torch.zeros(3, 3), ("[3, 3]", "[3, 4]")),
        "blocks.1.attn.b_O": (torch.zeros(15), ("[15]", "[16]")),
        "unembed.W_U": (torch.zeros(16, 19), ("[16, 19]", "[16, 20]")),
        "unembed.b_U": (torch.zeros(21), ("[21]", "[20]")),
    }
    for key, (t, shapes) in wrong.items():  # the shape found, the shape W_Q and W_E imply, and those two
        refused({**good, key: t}, f"weights: {key}", *shapes, "blocks.0.attn.W_Q", "embed.W_E")


@pytest.mark.parametrize("key", ["blocks.0.attn.W_Q", "embed.W_E", "pos_embed.W_pos", "blocks.1.attn.b_V",
                                 "unembed.W_U", "unembed.b_U", "blocks.1.attn.W_O"])  # fmt: skip
def test_a_non_finite_entry_is_refused_naming_its_key(key: str) -> None:
    good = tiny_state()
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = good[key].clone()
        t.view(-1)[3] = bad
        refused({**good, key: t}, f"w.safetensors: {key}", source="w.safetensors")
    t = good[key].clone()
    t.view(-1)[0] = 1e300  # finite in float64, inf once converted to the float32 asked for
    weights.from_state_dict({**good, key: t})
    refused({**good, key: t}, f"weights: {key}", dtype=torch.float32)


def test_power_of_two_scaling_divides_each_matrix_exactly_and_leaves_the_rest() -> None:
    hw = weights.from_state_dict(tiny_state())
    big = HeadWeights(**{n: getattr(hw, n).clone() for n in FIELDS})
    big.W_Q[0, 1] *= 2.0**200  # beyond float32's exponent range, as below
    big.W_K[1, 2] *= 2.0**-160
    big.W_V[1, 0] *= 3.0
    big.W_O[0, 0].zero_()  # a zero matrix stays zero (its exponent is 0)
    big = HeadWeights(
        **{**{n: getattr(big, n) for n in FIELDS}, "W_E": big.W_E * 2.0**70, "W_U": big.W_U * 0.01}
    )
    out = weights.power_of_two_scaled(big)
    for name, dims in [(n, (-2, -1)) for n in HEAD_MATRICES] + [("W_E", (0, 1)), ("W_U", (0, 1))]:
        before, after = getattr(big, name), getattr(out, name)
        ratio = before / after
        top = after.abs().amax(dim=dims)
        if name == "W_O":
            assert (after[0, 0] == 0).all() and not after.isnan().any()
            top = top.flatten()[1:]
            ratio = ratio.reshape(-1, *ratio.shape[-2:])[1:]
        assert ((top >= 0.5) & (top < 1)).all(), name
        _, e = torch.frexp(ratio)
        mantissa = ratio / torch.pow(2.0, e.to(F64))
        assert (mantissa == 0.5).all(), name  # an exact power of two
        flat = ratio.reshape(-1, *ratio.shape[-2:]) if ratio.ndim > 2 else ratio[None]
        assert (flat == flat[:, :1, :1]).all(), name  # one factor per layer and head (per matrix)
    q, k = ((getattr(big, n) / getattr(out, n))[..., 0, 0] for n in ("W_Q", "W_K"))  # each head its own
    assert q[0, 1] / q[0, 0] >= 2.0**190 and k[1, 2] / k[1, 1] <= 2.0**-150
    for name in ("b_Q", "b_K", "b_V", "b_O", "W_pos", "b_U"):
        assert torch.equal(getattr(out, name), getattr(big, name)), name


def test_save_and_load_round_trip_with_metadata_extra_tensors_and_dtype(tmp_path) -> None:
    hw = weights.from_state_dict(tiny_state())
    extra = {"blocks.0.attn.pos_Q": torch.ones(3, 16, 4, dtype=F64)}
    path = weights.save(tmp_path / "heads.safetensors", hw, {"config": "{}", "steps": "[]"}, extra)
    assert path.is_file()
    state, meta = checkpoint.load_state(path)
    assert meta == {"config": "{}", "steps": "[]"} and torch.equal(
        state["blocks.0.attn.pos_Q"], extra[next(iter(extra))]
    )
    back, meta = weights.load(path)
    assert meta == {"config": "{}", "steps": "[]"}
    for n in FIELDS:
        assert torch.equal(getattr(back, n), getattr(hw, n)), n
    assert weights.load(path, dtype=torch.float32)[0].W_K.dtype == torch.float32
    plain = weights.save(tmp_path / "plain.safetensors", hw)
    assert set(checkpoint.load_state(plain)[0]) == set(hw.state_dict())


def test_load_names_the_file_in_a_refusal_and_refuses_every_layernorm_key(tmp_path) -> None:
    hw = weights.from_state_dict(tiny_state())
    state = hw.state_dict()
    bad = tmp_path / "bad.safetensors"
    checkpoint.save_state(bad, {**state, "blocks.1.attn.W_Q": torch.full((3, 16, 4), float("nan"))})
    with pytest.raises(UserError) as caught:
        weights.load(bad)
    assert_names(caught, f"{bad}: blocks.1.attn.W_Q")
    big = tmp_path / "big.safetensors"
    checkpoint.save_state(big, {**state, "blocks.1.attn.W_Q": torch.full((3, 16, 4), 1e300, dtype=F64)})
    weights.load(big)
    with pytest.raises(UserError) as caught:
        weights.load(big, dtype=torch.float32)  # finite in float64, not in float32
    assert_names(caught, f"{big}: blocks.1.attn.W_Q")
    for keys in (["ln_final.w"], ["ln_final.b"], ["blocks.1.ln1.w"], ["blocks.0.ln2.b", "blocks.1.ln1.w"]):
        path = tmp_path / "ln.safetensors"
        checkpoint.save_state(path, {**state, **{k: torch.ones(16) for k in keys}})
        with pytest.raises(UserError) as caught:  # the first key, and the command that folds them
            weights.load(path)
        assert_names(caught, f"{path}: {sorted(keys)[0]}", "python -m stages.weights", "heads.safetensors")
    for key in ("blocks.0.ln1.w_extra", "ln_final.wb"):  # names that only look like LayerNorm's
        near = tmp_path / "near.safetensors"
        checkpoint.save_state(near, {**state, key: torch.ones(2)})
        with pytest.raises(UserError) as caught:
            weights.load(near)
        assert_names(caught, f"{near}: {key}")
        assert "stages.weights" not in str(caught.value)  # not taken for LayerNorm


def test_load_refuses_keys_it_does_not_read_and_positional_terms_of_another_shape(tmp_path) -> None:
    """What `from_state_dict` does not read would be analysed as if absent: an MLP's weights are
    named as such, any other unknown key as unexpected; the positional terms must fit W_Q and W_pos."""
    state = weights.from_state_dict(tiny_state()).state_dict()
    path = tmp_path / "heads.safetensors"
    for extra, key, named in (
        ({"blocks.1.mlp.W_in": torch.ones(16, 64)}, "blocks.1.mlp.W_in", ()),
        ({"blocks.0.attn.W_X": torch.ones(3, 16, 4)}, "blocks.0.attn.W_X", ()),
        ({"blocks.0.attn.pos_K": torch.ones(3, 8, 4)}, "blocks.0.attn.pos_K", ("[3, 8, 4]", "[3, 16, 4]")),
    ):
        checkpoint.save_state(path, {**state, **extra})
        with pytest.raises(UserError) as caught:
            weights.load(path)
        assert_names(caught, f"{path}: {key}", *named)
    checkpoint.save_state(
        path, {**state, "blocks.1.attn.pos_Q": torch.ones(3, 16, 4), "blocks.0.attn.mask": torch.ones(1)}
    )
    assert weights.load(path)[0].n_heads == 3


def test_positions_recorded_in_the_metadata() -> None:
    config = lambda c: {"config": json.dumps(c)}  # noqa: E731
    assert weights.positions_of({"steps": "[]"}) == "standard"
    assert weights.positions_of(config({"n_layers": 2})) == "standard"  # the field absent: the default
    assert weights.positions_of(config({"positional_embedding_type": "shortformer"}), "h.st") == "shortformer"
    assert weights.positions_of(config({"positional_embedding_type": "standard"})) == "standard"
    assert weights.positions_of({}) == "standard"  # TransformerLens's default
    for meta, where in (({"config": "{"}, "h.st"), ({"config": "not json"}, "weights")):  # not JSON
        with pytest.raises(UserError) as caught:
            weights.positions_of(meta, *([where] if where != "weights" else []))
        assert_names(caught, where, "config")
    assert weights.positions_of(config({"positional_embedding_type": "rotary"})) == "rotary"
    for value, where, shown in (("alibi", "h.st", "'alibi'"), (None, "weights", "None")):
        meta = config({"positional_embedding_type": value} if value else ["standard"])  # a list: no type
        with pytest.raises(UserError) as caught:
            weights.positions_of(meta, *([where] if where != "weights" else []))
        assert_names(
            caught, f"{where}: config.positional_embedding_type = {shown}", "shortformer", "standard"
        )


@pytest.mark.parametrize("pos", ["standard", "shortformer"])
@pytest.mark.parametrize("norm", [None, "LN"])
def test_prepare_records_each_step_it_applies(pos, norm) -> None:
    model = random_model(positional_embedding_type=pos, normalization_type=norm)
    _, steps = weights.prepare(model.state_dict(), model.cfg)
    first, *middle, centred_U, folded_V = steps
    assert first == "stacked heads per layer in float64"
    assert centred_U == "centred W_U and b_U over the vocabulary (softmax is unchanged)"
    assert folded_V == "folded value biases into b_O (b_O += sum_h b_V^h W_O^h; b_V = 0)"
    if norm is None:
        assert middle == [
            "no LayerNorm: nothing to fold; writing weights not centred (nothing removes the mean)"
        ]
        return
    assert middle[0] == (
        "folded LayerNorm: ln1.w into W_Q, W_K, W_V and ln1.b into b_Q, b_K, b_V per layer; "
        "ln_final.w into W_U and ln_final.b into b_U; reading weights centred over d_model"
    )
    written = "W_E, W_O, b_O" if pos == "shortformer" else "W_E, W_pos, W_O, b_O"
    assert middle[1] == f"centred writing weights over d_model ({written})"
    if pos == "standard":
        assert len(middle) == 2
    else:
        assert middle[2] == (
            "shortformer + LayerNorm: positions enter after ln1, unscaled by ln1.w, so W_pos W_Q (folded) is "
            "not the model's positional term; exact terms W_pos W_Q^h, W_pos W_K^h stored as "
            "blocks.{l}.attn.pos_Q, pos_K; W_pos kept as trained (never normalised, not centred)"
        )


def test_prepare_folds_value_biases_and_centres_the_unembedding_by_hand() -> None:
    model = random_model(positional_embedding_type="standard")  # no LayerNorm: only these two steps
    state = model.state_dict()
    hw, _ = weights.prepare(state, model.cfg)
    for l in range(2):
        want = state[f"blocks.{l}.attn.b_O"] + sum(
            state[f"blocks.{l}.attn.b_V"][h] @ state[f"blocks.{l}.attn.W_O"][h] for h in range(3)
        )
        torch.testing.assert_close(hw.b_O[l], want, rtol=0, atol=1e-14)
    assert (hw.b_V == 0).all() and hw.b_V.shape == (2, 3, 4)
    W_U, b_U = state["unembed.W_U"], state["unembed.b_U"]
    torch.testing.assert_close(hw.W_U, W_U - W_U.mean(-1, keepdim=True), rtol=0, atol=1e-15)
    torch.testing.assert_close(hw.b_U, b_U - b_U.mean(), rtol=0, atol=1e-15)
    for name in ("W_E", "W_pos"):  # written into the residual: not centred without LayerNorm
        assert torch.equal(getattr(hw, name), state[{"W_E": "embed.W_E", "W_pos": "pos_embed.W_pos"}[name]])
    assert torch.equal(hw.W_O, torch.stack([state[f"blocks.{l}.attn.W_O"] for l in range(2)]))


@pytest.mark.parametrize("pos", ["standard", "shortformer"])
def test_prepare_with_layernorm_folds_and_centres_exactly_as_the_maths_says(pos) -> None:
    model = random_model("layernorm", positional_embedding_type=pos)
    s = {k: v.detach() for k, v in model.state_dict().items()}
    hw, _ = weights.prepare(s, model.cfg)
    centre = lambda t, dim: t - t.mean(dim, keepdim=True)  # noqa: E731
    for l in range(2):
        w, b = s[f"blocks.{l}.ln1.w"], s[f"blocks.{l}.ln1.b"]
        for X in "QK":
            W = s[f"blocks.{l}.attn.W_{X}"]
            torch.testing.assert_close(
                getattr(hw, f"W_{X}")[l], centre(W * w[:, None], 1), rtol=0, atol=1e-14
            )
            want = s[f"blocks.{l}.attn.b_{X}"] + torch.einsum("m,hmd->hd", b, W)
            torch.testing.assert_close(getattr(hw, f"b_{X}")[l], want, rtol=0, atol=1e-14)
        W_V = s[f"blocks.{l}.attn.W_V"]
        torch.testing.assert_close(hw.W_V[l], centre(W_V * w[:, None], 1), rtol=0, atol=1e-14)
        W_O = s[f"blocks.{l}.attn.W_O"]
        torch.testing.assert_close(hw.W_O[l], centre(W_O, -1), rtol=0, atol=1e-14)
        b_V = s[f"blocks.{l}.attn.b_V"] + torch.einsum("m,hmd->hd", b, W_V)
        want = centre(s[f"blocks.{l}.attn.b_O"], -1) + torch.einsum("hd,hdm->m", b_V, centre(W_O, -1))
        torch.testing.assert_close(hw.b_O[l], want, rtol=0, atol=1e-14)
    w, b = s["ln_final.w"], s["ln_final.b"]
    torch.testing.assert_close(
        hw.W_U, centre(centre(s["unembed.W_U"] * w[:, None], 0), -1), rtol=0, atol=1e-14
    )
    torch.testing.assert_close(
        hw.b_U, centre(s["unembed.b_U"] + b @ s["unembed.W_U"], -1), rtol=0, atol=1e-14
    )
    torch.testing.assert_close(hw.W_E, centre(s["embed.W_E"], -1), rtol=0, atol=1e-15)
    W_pos = s["pos_embed.W_pos"]
    if pos == "standard":
        torch.testing.assert_close(hw.W_pos, centre(W_pos, -1), rtol=0, atol=1e-15)
    else:
        assert torch.equal(hw.W_pos, W_pos)


def test_prepare_skips_transformerlens_buffers_and_names_its_source() -> None:
    model = random_model(positional_embedding_type="standard")
    state = dict(model.state_dict())
    buffers = {
        "blocks.7.attn.mask": torch.ones(2, 2, dtype=torch.bool),
        "blocks.9.attn.IGNORE": torch.tensor(-1e5),
    }
    hw, _ = weights.prepare({**state, **buffers}, model.cfg)
    assert hw.n_layers == 2  # the buffers' layer numbers would not be 0..n-1
    torch.testing.assert_close(hw.W_Q, weights.prepare(state, model.cfg)[0].W_Q, rtol=0, atol=0)
    bad = {**state, "blocks.1.attn.W_K": torch.full((3, 16, 4), float("nan"))}
    for source in ("checkpoint", "model.pth"):  # the default source's name, and the one given
        with pytest.raises(UserError) as caught:
            weights.prepare(bad, model.cfg, *([] if source == "checkpoint" else [source]))
        assert_names(caught, f"{source}: blocks.1.attn.W_K")


@pytest.mark.parametrize("pos,norm", [("standard", None), ("standard", "LN"), ("shortformer", None)])
def test_positional_terms_only_for_shortformer_with_layernorm(pos, norm) -> None:
    model = random_model(positional_embedding_type=pos, normalization_type=norm)
    assert weights.positional_terms(model.state_dict(), model.cfg) == {}


def test_positional_terms_are_the_unfolded_positions_through_each_head() -> None:
    model = random_model("three_layers", positional_embedding_type="shortformer", normalization_type="LN")
    s = model.state_dict()
    terms = weights.positional_terms(s, model.cfg)
    assert sorted(terms) == sorted(f"blocks.{l}.attn.pos_{X}" for l in range(3) for X in "QK")
    for l in range(3):
        for X in "QK":
            W = s[f"blocks.{l}.attn.W_{X}"]
            want = torch.stack([s["pos_embed.W_pos"] @ W[h] for h in range(3)])
            torch.testing.assert_close(terms[f"blocks.{l}.attn.pos_{X}"], want, rtol=0, atol=1e-14)
            assert terms[f"blocks.{l}.attn.pos_{X}"].dtype == F64


def test_a_float32_checkpoint_is_prepared_in_float64() -> None:
    """The steps run in float64 whatever the checkpoint's dtype: a float32 state gives exactly what the
    same values given in float64 give."""
    model = random_model("layernorm", positional_embedding_type="shortformer", dtype=torch.float32)
    single = model.state_dict()
    double = {k: v.double() for k, v in single.items()}
    a, b = weights.prepare(single, model.cfg)[0], weights.prepare(double, model.cfg)[0]
    for name in FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    terms, want = weights.positional_terms(single, model.cfg), weights.positional_terms(double, model.cfg)
    assert set(terms) == set(want)
    for key, t in terms.items():
        assert t.dtype == F64 and torch.equal(t, want[key]), key


def test_the_analysis_reads_float64_checkpoints_unrounded(tmp_path):
    """The heads stage loads the model in float64 (not through float32), and heads.safetensors
    is read in float64: a value float32 cannot hold arrives exactly."""
    model = random_model()  # float64
    cfg, state = model.cfg, {k: v.clone() for k, v in model.state_dict().items()}
    state["blocks.1.attn.W_Q"][0, 0, 0] = 1 + 2**-40  # rounds to 1.0 in float32
    checkpoint.save_state(tmp_path / "model.safetensors", state)
    (tmp_path / "config.json").write_text(json.dumps(tl_checkpoint.tl_config(cfg)))
    model = tl_checkpoint.load_model(
        tmp_path / "model.safetensors", tmp_path / "config.json", dtype=torch.float64
    )
    assert model.blocks[1].attn.W_Q[0, 0, 0].item() == 1 + 2**-40
    hw, _ = weights.load(tmp_path / "model.safetensors")
    assert hw.W_Q.dtype == torch.float64 and hw.W_Q[1, 0, 0, 0].item() == 1 + 2**-40


@pytest.mark.interop
@pytest.mark.parametrize("pos,norm", [("standard", "LN"), ("standard", None), ("shortformer", None)])
def test_our_folding_equals_transformer_lens_processing(pos, norm):
    """Where TransformerLens's processing is valid, our prepared weights are its weights."""
    pytest.importorskip("transformer_lens")
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
