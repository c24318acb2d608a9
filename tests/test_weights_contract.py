"""pipeline/circuits/weights.py's contract, in-process and on small tensors: stacking a
TransformerLens-named state dict (every refusal names the key, the file and the shapes),
the state dict round trip, the exact power-of-two scaling, the positions recorded in a weights
file, refusing unfolded LayerNorm, and `prepare`'s recorded steps and folds."""

from __future__ import annotations

import json
import re

import pytest
import torch
from models import random_model

from pipeline import checkpoint
from pipeline.circuits import weights
from pipeline.circuits.weights import HEAD_BIASES, HEAD_MATRICES, HeadWeights
from pipeline.errors import UserError

F64 = torch.float64
FIELDS = (*HEAD_MATRICES, *HEAD_BIASES, "b_O", "W_E", "W_pos", "W_U", "b_U")


def tiny_state(**overrides) -> dict[str, torch.Tensor]:
    """The tiny model's state dict: 2 layers, 3 heads, d_model 16, d_head 4, n_ctx 16, d_vocab 20."""
    return dict(random_model(**overrides).state_dict())


def refused(state, match: str, **kwargs) -> None:
    with pytest.raises(UserError, match=match):
        weights.from_state_dict(state, **kwargs)


# --- stacking and the state dict ------------------------------------------------------------


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
        refused(partial, rf"^weights: blocks\.0\.attn\.{name}: missing from the weights file$")
    one_layer = dict(tiny_state())
    del one_layer["blocks.1.attn.b_K"]  # present in layer 0: every layer must have it
    refused(one_layer, r"^weights: blocks\.1\.attn\.b_K: missing from the weights file$")


def test_every_refusal_names_the_file_the_key_and_the_shapes() -> None:
    good = tiny_state()
    refused(
        {"embed.W_E": good["embed.W_E"]},
        r"^weights: blocks: none \(expected keys like blocks\.0\.attn\.W_Q\)$",
    )
    gap = {k.replace("blocks.1.", "blocks.2."): v for k, v in good.items()}
    refused(gap, r"^weights: blocks: layers are not numbered 0\.\.n-1: \[0, 2\]$")
    from_one = {k.replace("blocks.0.", "blocks.2."): v for k, v in good.items()}
    refused(from_one, r"^weights: blocks: layers are not numbered 0\.\.n-1: \[1, 2\]$")
    refused({**good, "blocks.0.attn.W_Q": good["blocks.0.attn.W_Q"][0]},
            r"^m\.pt: blocks\.0\.attn\.W_Q: shape \[16, 4\]: expected \[n_heads, d_model, d_head\]$",
            source="m.pt")  # fmt: skip
    missing = {k: v for k, v in good.items() if k != "embed.W_E"}
    refused(missing, r"^weights: embed\.W_E: missing from the weights file$")
    for W_E in (good["embed.W_E"][:, :15], good["embed.W_E"][0]):
        shown = re.escape(str(list(W_E.shape)))
        refused(
            {**good, "embed.W_E": W_E},
            rf"^weights: embed\.W_E: shape {shown}: expected \[d_vocab, d_model = 16\]$",
        )
    for W_pos in (good["pos_embed.W_pos"][:, :15], good["pos_embed.W_pos"][0]):
        shown = re.escape(str(list(W_pos.shape)))
        refused({**good, "pos_embed.W_pos": W_pos},
                rf"^weights: pos_embed\.W_pos: shape {shown}: expected \[n_ctx, d_model = 16\]$")  # fmt: skip
    by = r"implied by blocks\.0\.attn\.W_Q and embed\.W_E$"
    wrong = {
        "blocks.1.attn.W_K": (torch.zeros(3, 16, 5), r"\[3, 16, 5\] disagrees with \[3, 16, 4\]"),
        "blocks.1.attn.W_Q": (torch.zeros(2, 16, 4), r"\[2, 16, 4\] disagrees with \[3, 16, 4\]"),
        "blocks.1.attn.W_V": (torch.zeros(3, 15, 4), r"\[3, 15, 4\] disagrees with \[3, 16, 4\]"),
        "blocks.1.attn.W_O": (torch.zeros(3, 16, 4), r"\[3, 16, 4\] disagrees with \[3, 4, 16\]"),
        "blocks.0.attn.b_Q": (torch.zeros(3, 5), r"\[3, 5\] disagrees with \[3, 4\]"),
        "blocks.0.attn.b_K": (torch.zeros(4, 4), r"\[4, 4\] disagrees with \[3, 4\]"),
        "blocks.1.attn.b_V": (torch.zeros(3, 3), r"\[3, 3\] disagrees with \[3, 4\]"),
        "blocks.1.attn.b_O": (torch.zeros(15), r"\[15\] disagrees with \[16\]"),
        "unembed.W_U": (torch.zeros(16, 19), r"\[16, 19\] disagrees with \[16, 20\]"),
        "unembed.b_U": (torch.zeros(21), r"\[21\] disagrees with \[20\]"),
    }
    for key, (t, shapes) in wrong.items():
        refused({**good, key: t}, rf"^weights: {re.escape(key)}: shape {shapes} {by}")


@pytest.mark.parametrize("key", ["blocks.0.attn.W_Q", "embed.W_E", "pos_embed.W_pos", "blocks.1.attn.b_V",
                                 "unembed.W_U", "unembed.b_U", "blocks.1.attn.W_O"])  # fmt: skip
def test_a_non_finite_entry_is_refused_naming_its_key(key: str) -> None:
    good = tiny_state()
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = good[key].clone()
        t.view(-1)[3] = bad
        refused(
            {**good, key: t},
            rf"^w\.safetensors: {re.escape(key)}: contains NaN or inf$",
            source="w.safetensors",
        )
    t = good[key].clone()
    t.view(-1)[0] = 1e300  # finite in float64, inf once converted to the float32 asked for
    weights.from_state_dict({**good, key: t})
    refused({**good, key: t}, rf"^weights: {re.escape(key)}: contains NaN or inf$", dtype=torch.float32)


# --- exact scaling --------------------------------------------------------------------------


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


# --- files ----------------------------------------------------------------------------------


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
    with pytest.raises(
        UserError, match=rf"^{re.escape(str(bad))}: blocks\.1\.attn\.W_Q: contains NaN or inf$"
    ):
        weights.load(bad)
    big = tmp_path / "big.safetensors"
    checkpoint.save_state(big, {**state, "blocks.1.attn.W_Q": torch.full((3, 16, 4), 1e300, dtype=F64)})
    weights.load(big)
    with pytest.raises(UserError, match="contains NaN or inf"):
        weights.load(big, dtype=torch.float32)
    for keys in (["ln_final.w"], ["ln_final.b"], ["blocks.1.ln1.w"], ["blocks.0.ln2.b", "blocks.1.ln1.w"]):
        path = tmp_path / "ln.safetensors"
        checkpoint.save_state(path, {**state, **{k: torch.ones(16) for k in keys}})
        first = re.escape(sorted(keys)[0])
        fold = (
            r"LayerNorm weights not folded in: python -m stages\.weights --model CHECKPOINT --config "
            r"CONFIG\.json --out DIR folds them, then analyse DIR/heads\.safetensors$"
        )
        with pytest.raises(UserError, match=rf"^{re.escape(str(path))}: {first}: {fold}"):
            weights.load(path)
    for key in ("blocks.0.ln1.w_extra", "ln_final.wb"):  # names that only look like LayerNorm's
        near = tmp_path / "near.safetensors"
        checkpoint.save_state(near, {**state, key: torch.ones(2)})
        with pytest.raises(UserError, match=rf"^{re.escape(str(near))}: {re.escape(key)}: unexpected key"):
            weights.load(near)


def test_load_refuses_keys_it_does_not_read_and_positional_terms_of_another_shape(tmp_path) -> None:
    """What `from_state_dict` does not read would be analysed as if absent: an MLP's weights are
    named as such, any other unknown key as unexpected; the positional terms must fit W_Q and W_pos."""
    state = weights.from_state_dict(tiny_state()).state_dict()
    path = tmp_path / "heads.safetensors"
    for extra, message in (
        ({"blocks.1.mlp.W_in": torch.ones(16, 64)}, "blocks.1.mlp.W_in: not an attention-only model"),
        ({"blocks.0.attn.W_X": torch.ones(3, 16, 4)}, "blocks.0.attn.W_X: unexpected key"),
        (
            {"blocks.0.attn.pos_K": torch.ones(3, 8, 4)},
            "blocks.0.attn.pos_K: shape [3, 8, 4] disagrees with [3, 16, 4]",
        ),
    ):
        checkpoint.save_state(path, {**state, **extra})
        with pytest.raises(UserError) as caught:
            weights.load(path)
        assert str(caught.value).startswith(f"{path}: {message}")
    checkpoint.save_state(
        path, {**state, "blocks.1.attn.pos_Q": torch.ones(3, 16, 4), "blocks.0.attn.mask": torch.ones(1)}
    )
    assert weights.load(path)[0].n_heads == 3


def test_positions_recorded_in_the_metadata() -> None:
    config = lambda c: {"config": json.dumps(c)}  # noqa: E731
    assert weights.positions_of({"steps": "[]"}) == "standard"
    assert weights.positions_of(config({"n_layers": 2})) == "standard"  # the field absent: the default
    assert weights.positions_of(config({"positional_embedding_type": "shortformer"}), "h.st") == "shortformer"
    with pytest.raises(UserError, match=r"^h\.st: its config metadata is not JSON$"):
        weights.positions_of({"config": "{"}, "h.st")
    with pytest.raises(UserError, match=r"^weights: its config metadata is not JSON$"):
        weights.positions_of({"config": "not json"})
    expected = r": expected one of \('shortformer', 'standard'\)$"
    with pytest.raises(UserError, match=r"^h\.st: config\.positional_embedding_type = 'rotary'" + expected):
        weights.positions_of(config({"positional_embedding_type": "rotary"}), "h.st")
    with pytest.raises(UserError, match=r"^weights: config\.positional_embedding_type = None" + expected):
        weights.positions_of(config(["standard"]))  # not an object: no type at all


# --- prepare ------------------------------------------------------------------------------


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
    with pytest.raises(UserError, match=r"^checkpoint: blocks\.1\.attn\.W_K: contains NaN or inf$"):
        weights.prepare(bad, model.cfg)
    with pytest.raises(UserError, match=r"^model\.pth: blocks\.1\.attn\.W_K: contains NaN or inf$"):
        weights.prepare(bad, model.cfg, source="model.pth")


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
