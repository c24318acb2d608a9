"""pipeline/behaviour/ablation.py: ablating a set of heads equals TransformerLens 3.9's hooks
(`interop`); a channel cut of a block of one direction is the single-direction formula, and a
block cut is the dense projection of the mean-ablated write, whatever basis its blocks are given in."""

from __future__ import annotations

import json

import pytest
import torch
from block_models import turn
from models import F64, random_model
from tl_oracle import SHAPE, hooked, tl_config_json

from pipeline.behaviour import ablation
from pipeline.model import tl_checkpoint

VARIANTS = [(pos, norm) for pos in ("standard", "shortformer") for norm in (None, "LN")]


@pytest.mark.interop
@pytest.mark.parametrize("pos,norm", VARIANTS)
def test_ablating_a_set_of_heads_equals_transformer_lens_hooks(tmp_path, pos, norm):
    """`ablation.heads_loss_effect` against HookedTransformer with each ablated head's z replaced
    by its batch mean at every position (a head's write is linear in its z)."""
    pytest.importorskip("transformer_lens")
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


def test_a_block_of_one_direction_cuts_as_the_single_direction_formula() -> None:
    """A block of one direction ([d_model, 1] columns) is resid - ((delta . w)(w . k)) k, written out,
    and the same cut as the vectors themselves."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(4)
    w, k = (torch.nn.functional.normalize(torch.randn(model.cfg.d_model, generator=gen, dtype=F64), dim=0)
            for _ in range(2))  # fmt: skip
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=gen)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    write = cache.result[0][:, :, 2]  # [batch, pos, d_model]
    delta = write - write.mean(0, keepdim=True)
    want = cache.resid_pre[1] - ((delta @ w) * (w @ k))[..., None] * k
    as_block = ablation._channel_cut(cache, ablation.ChannelCut((0, 2), (1, 1), w[:, None], k[:, None]))
    as_vectors = ablation._channel_cut(cache, ablation.ChannelCut((0, 2), (1, 1), w, k))
    scale = cache.resid_pre[1].abs().max().item()
    torch.testing.assert_close(as_block, want, rtol=0, atol=1e-15 * scale)
    torch.testing.assert_close(as_vectors, as_block, rtol=0, atol=0)
    cuts = [
        ablation.ChannelCut((0, 2), (1, 1), w[:, None], k[:, None]),
        ablation.ChannelCut((0, 2), (1, 1), w, k),
    ]
    got = ablation.channel_ablation(model, tokens, cuts, None)
    assert got["pattern_effect"].iloc[0] == pytest.approx(got["pattern_effect"].iloc[1], rel=1e-12)
    assert got["pattern_effect"].iloc[0] > 1e-4


def test_a_block_cut_is_the_projection_of_the_mean_ablated_write() -> None:
    """Two directions each: resid - (delta W W^T) K K^T with dense projectors, and unchanged when
    either block's columns are replaced by another orthonormal basis of their span."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(6)
    D = model.cfg.d_model
    W = torch.linalg.qr(torch.randn(D, 2, generator=gen, dtype=F64))[0]  # [d_model, 2]
    K = torch.linalg.qr(torch.randn(D, 2, generator=gen, dtype=F64))[0]
    tokens = torch.randint(0, model.cfg.d_vocab, (5, 12), generator=gen)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    write = cache.result[0][:, :, 1]
    delta = write - write.mean(0, keepdim=True)
    want = cache.resid_pre[1] - delta @ (W @ W.mT) @ (K @ K.mT)
    scale = cache.resid_pre[1].abs().max().item()
    for G, H in ((torch.eye(2, dtype=F64), torch.eye(2, dtype=F64)), (turn(2, 0, 0.4), turn(2, 0, -1.3))):
        got = ablation._channel_cut(cache, ablation.ChannelCut((0, 1), (1, 0), W @ G, K @ H))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14 * scale)
