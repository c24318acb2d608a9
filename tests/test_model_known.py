"""Known answers of pipeline/model/ worked out by hand: a TransformerLens 4.x bridge read in-process
through the two calls it offers (`cfg.to_dict()`, `state_dict()`, a stand-in object: 4.x itself is
tests/test_interop4.py's oracle), the refusals naming where the shapes came from, the metadata a
written bridge checkpoint carries, and the copy shares the train stage reports."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from models import random_model

from pipeline import checkpoint
from pipeline.config import ModelConfig
from pipeline.data import datasets
from pipeline.errors import UserError
from pipeline.model import tl_checkpoint, train

STANDARD = ModelConfig(
    n_layers=2, n_heads=3, d_head=4, d_model=16, n_ctx=16, d_vocab=20,
    positional_embedding_type="standard", normalization_type="LN",
)  # fmt: skip
BAD_HEADS = "blocks.1.attn.q.weight: shape [8, 16] disagrees with n_heads x d_head = 3 x 4 from "


class Bridge:
    """What `bridge_state_dict` reads of a TransformerBridge: `cfg.to_dict()` and `state_dict()`."""

    def __init__(self, config: dict, state: dict):
        self.cfg = SimpleNamespace(to_dict=lambda: dict(config))
        self._state = state

    def state_dict(self) -> dict:
        return dict(self._state)


def test_a_bridge_reads_in_process_as_our_state_and_config():
    model = random_model(STANDARD, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD, model.state_dict())
    state, tl = tl_checkpoint.bridge_state_dict(Bridge(config, bridge_state))
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert tl == tl_checkpoint.tl_config(STANDARD)


def test_a_bridge_whose_shapes_disagree_with_its_config_names_the_config():
    model = random_model(STANDARD, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD, model.state_dict())
    bad = {**bridge_state, "blocks.1.attn.q.weight": torch.zeros(8, 16)}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge(config, bad))
    assert str(caught.value) == f"bridge.state_dict(): {BAD_HEADS}bridge.cfg"
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_bridge_state(bad, STANDARD, "their/config.json")
    assert str(caught.value) == f"{BAD_HEADS}their/config.json"
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_bridge_state(bad, STANDARD)  # the default source
    assert str(caught.value) == f"{BAD_HEADS}config.json"


def test_a_bridge_whose_config_is_refused_names_bridge_cfg():
    """A bridge with MLPs (attn_only false) is refused before its state dict is read, naming
    `bridge.cfg`, the object its config came from."""
    model = random_model(STANDARD, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD, model.state_dict())
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge({**config, "attn_only": False}, bridge_state))
    assert str(caught.value) == "bridge.cfg: attn_only = False: not an attention-only model (it has MLPs)"


def test_a_written_bridge_checkpoint_says_its_format(tmp_path):
    model = random_model(STANDARD, dtype=torch.float32)
    out = tl_checkpoint.write_bridge_checkpoint(tmp_path / "bridge", STANDARD, model.state_dict())
    _, metadata = checkpoint.load_state(out / "model.safetensors")
    assert metadata == {"format": "TransformerBridge"}


def test_copy_shares_over_the_run_and_its_last_quarter():
    stream = datasets.Stream(np.arange(100), 8)
    assert train._copy_shares(stream, (0, 0)) == {"copy_share": 0.0, "copy_share_last_quarter": 0.0}
    stream.tokens_drawn, stream.tokens_copied = 400, 100
    assert train._copy_shares(stream, (400, 100)) == {"copy_share": 0.25, "copy_share_last_quarter": 0.0}
    assert train._copy_shares(stream, (300, 40)) == {"copy_share": 0.25, "copy_share_last_quarter": 0.6}


def test_attn_scale_must_be_sqrt_d_head_even_for_one_dimensional_heads():
    one = replace(STANDARD, d_head=1, normalization_type=None)
    assert tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(one), "attn_scale": 1.0}) == one
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config({**tl_checkpoint.tl_config(one), "attn_scale": 3.0})
    assert str(caught.value) == "config.json: attn_scale = 3.0: must be sqrt(d_head) = 1"


def test_a_bridges_positive_attn_scale_is_what_it_divides_by():
    """TransformerLens 4.3's native attention divides by attn_scale whenever it is > 0 (0.5 too),
    and by sqrt(d_head) when it is absent: 0.5 is refused, absent is read as sqrt(d_head)."""
    bridge = {**tl_checkpoint.tl_config(STANDARD), "architecture": tl_checkpoint.NATIVE}
    assert "attn_scale" not in bridge and tl_checkpoint.from_tl_config(bridge) == STANDARD
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config({**bridge, "attn_scale": 0.5})
    assert str(caught.value) == "config.json: attn_scale = 0.5: must be sqrt(d_head) = 2"


def test_a_bridge_missing_a_weight_is_refused_naming_its_state_dict_and_the_weight():
    """from_bridge_state maps only the keys present; the check against our model finds the
    unembedding missing and names the object it came from, `bridge.state_dict()`."""
    model = random_model(STANDARD, dtype=torch.float32)
    config, bridge_state = tl_checkpoint.bridge_checkpoint(STANDARD, model.state_dict())
    del bridge_state["unembed.weight"]
    with pytest.raises(UserError) as caught:
        tl_checkpoint.bridge_state_dict(Bridge(config, bridge_state))
    assert str(caught.value) == "bridge.state_dict(): unembed.W_U: missing from the checkpoint"


def test_a_model_built_on_meta_draws_nothing_and_imports_no_compiler():
    """`read_checkpoint` builds the model under torch.device("meta") for its names and shapes: no
    draw there (the global generator is where it was), and torch's compiler is not imported (a
    meta draw imports torch._dynamo, about a second of every stage that checks a checkpoint). On
    the CPU the weights are still drawn, Normal(0, 0.8 / sqrt(d_model)), and advance the generator."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from pipeline.config import ModelConfig\n"
        "from pipeline.model.transformer import AttnOnlyTransformer\n"
        "torch.manual_seed(0)\n"
        "before = torch.get_rng_state()\n"
        "with torch.device('meta'):\n"
        "    m = AttnOnlyTransformer(ModelConfig(d_model=64, d_head=8, n_heads=2, d_vocab=50, n_ctx=10))\n"
        "assert m.blocks[0].attn.W_Q.is_meta and torch.equal(torch.get_rng_state(), before)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

    from pipeline.model.transformer import AttnOnlyTransformer

    torch.manual_seed(0)
    before = torch.get_rng_state()
    m = AttnOnlyTransformer(ModelConfig(d_model=64, d_head=8, n_heads=2, d_vocab=500, n_ctx=10))
    assert not torch.equal(torch.get_rng_state(), before)
    assert float(m.embed.W_E.detach().std()) == pytest.approx(0.1, rel=0.05)  # 0.8 / sqrt(64), 32,000 draws
