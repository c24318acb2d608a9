"""What the two composition measures share (pipeline/circuits/scoring.py): the pairs scored, the
random draws, the raw-scores table and its summary, and the surrogate null, each pinned by a
known answer or an invariant."""

from __future__ import annotations

import pytest
import torch
from models import random_model

from pipeline.circuits import scoring, weights

# --- surrogates -----------------------------------------------------------------------


def _hw(shape: str = "three_layers", dtype: torch.dtype = torch.float64, **overrides) -> weights.HeadWeights:
    state = random_model(shape, seed=5, dtype=dtype, **overrides).state_dict()
    return weights.from_state_dict(state, dtype=dtype)


def _as_right(w: weights.HeadWeights, name: str, layer: int) -> torch.Tensor:
    """The right factor of a circuit: W_K transposed (QK = W_Q W_K^T), W_O as it is (OV = W_V W_O)."""
    return getattr(w, name)[layer].mT if name == "W_K" else getattr(w, name)[layer]


def test_a_surrogate_rotates_every_later_layer_as_a_whole_and_keeps_layer_0_and_the_rest():
    """Layer l >= 1 reads x R_l and writes back through R_l^T: each head's own QK and OV circuits
    become R_l C R_l^T (trace, spectrum and norm kept, the matrix moved), the output bias b_O R_l^T
    is what the layer's own queries read as before, and nothing outside the heads changes."""
    hw = _hw()
    fake = scoring.surrogate(hw, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):  # layer 0 as it was
        assert torch.equal(getattr(fake, name)[0], getattr(hw, name)[0]), name
    for name in ("b_Q", "b_K", "b_V", "W_E", "W_pos", "W_U", "b_U"):  # not touched
        assert torch.equal(getattr(fake, name), getattr(hw, name)), name
    for layer in (1, 2):
        for left, right in (("W_Q", "W_K"), ("W_V", "W_O")):  # QK, OV: [head, d_model, d_model]
            a, b = (getattr(w, left)[layer] @ _as_right(w, right, layer) for w in (hw, fake))
            # R C R^T, not R C or C: the same trace (a rotation of one side alone changes it)
            assert torch.allclose(torch.diagonal(b, dim1=-2, dim2=-1).sum(-1),
                                  torch.diagonal(a, dim1=-2, dim2=-1).sum(-1), atol=1e-12)  # fmt: skip
            assert torch.allclose(torch.linalg.eigvals(b).abs().sort().values,
                                  torch.linalg.eigvals(a).abs().sort().values, atol=1e-10)  # fmt: skip
            assert not torch.allclose(a, b)
        # each input matrix keeps its Gram matrix (R orthogonal), and W_O its row Gram matrix
        for name in ("W_Q", "W_K", "W_V"):
            a, b = getattr(hw, name)[layer], getattr(fake, name)[layer]
            assert torch.allclose(b.mT @ b, a.mT @ a, atol=1e-12) and not torch.allclose(a, b), name
        a, b = hw.W_O[layer], fake.W_O[layer]
        assert torch.allclose(b @ b.mT, a @ a.mT, atol=1e-12) and not torch.allclose(a, b)
        # b_O R^T: its norm kept, moved, and read by the layer's own queries exactly as before
        a, b = hw.b_O[layer], fake.b_O[layer]
        assert torch.linalg.norm(b) == pytest.approx(float(torch.linalg.norm(a)), rel=1e-12)
        assert not torch.allclose(a, b)
        assert torch.allclose(b @ fake.W_Q[layer], a @ hw.W_Q[layer], atol=1e-12)
    # the alignment between layers is what moves: layer 0's output read by layer 1's queries
    assert not torch.allclose(fake.W_O[0] @ fake.W_Q[1, 0], hw.W_O[0] @ hw.W_Q[1, 0], atol=1e-3)


def test_a_surrogate_is_drawn_from_its_generator_alone():
    """The same generator seed gives the same surrogate whatever torch's global seed; another seed
    gives another one."""
    hw = _hw()
    torch.manual_seed(1)
    a = scoring.surrogate(hw, torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = scoring.surrogate(hw, torch.Generator().manual_seed(7))
    c = scoring.surrogate(hw, torch.Generator().manual_seed(8))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name)[1:], getattr(c, name)[1:]), name


def test_a_surrogate_of_one_layer_is_the_model_itself():
    """Nothing comes after layer 0: no rotation is drawn, every weight is kept."""
    hw = _hw("tiny", n_layers=1)
    fake = scoring.surrogate(hw, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        assert torch.equal(getattr(fake, name), getattr(hw, name)), name


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
def test_a_surrogate_keeps_float32_weights_float32_whatever_the_default_dtype(default):
    """float32 weights give a float32 surrogate (rotated by the float64 draw rounded once), also
    when torch's default dtype is float64."""
    hw32 = _hw(dtype=torch.float32)
    hw64 = hw32.to(torch.float64)
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        fake32 = scoring.surrogate(hw32, torch.Generator().manual_seed(0))
    finally:
        torch.set_default_dtype(before)
    fake64 = scoring.surrogate(hw64, torch.Generator().manual_seed(0))
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        got = getattr(fake32, name)
        assert got.dtype == torch.float32, name
        assert torch.allclose(got.double(), getattr(fake64, name), rtol=1e-5, atol=1e-6), name
