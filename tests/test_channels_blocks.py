"""Channels that are defined: singular directions whose values lie within the tolerance form one
block, and the shares, the top channel, the channel null and the channel ablation are per block.
The blocking rule by hand; an exactly degenerate block whose directions are turned within it
(the circuits kept) changes no table, top channel, block size or ablation effect, though the
per-direction answers move; near-equal values keep the named top channel under every turn
within the block; blocks of one direction are the per-direction results; the block shares
against dense float64 projectors; the tolerance validated as a config key."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from models import F64, random_model

from pipeline import params
from pipeline.behaviour import ablation, channel_check
from pipeline.circuits import channels as ch
from pipeline.circuits.weights import HeadWeights, from_state_dict
from pipeline.config import CompositionConfig
from pipeline.errors import UserError
from pipeline.model.transformer import AttnOnlyTransformer
from pipeline.tables import CHANNELS_COLUMNS

TOL = CompositionConfig().channel_tolerance
PAIR = ["src_layer", "src_head", "dst_layer", "dst_head"]
NAMED = ["writer_channel", "reader_channel", "writer_block", "reader_block"]


# --- the rule ---------------------------------------------------------------------------------


def test_blocks_chain_steps_within_the_tolerance_and_keep_zeros_apart() -> None:
    """Steps by hand at tol = 1/4 (exact binary fractions): 1 -> 0.75 is 0.25 of 1 (joins, at the
    tolerance itself), 0.75 -> 0.5625 is 0.25 of 0.75 (joins: the chain spans 1 to 0.5625),
    0.5625 -> 0.25 does not; 0.25 -> 0.2 joins; then exact zeros, one block of their own."""
    s = torch.tensor([1.0, 0.75, 0.5625, 0.25, 0.2, 0.0, 0.0], dtype=F64)
    blocks = ch.spectral_blocks(s, 0.25)
    assert blocks.tolist() == [0, 0, 0, 3, 3, 5, 5]
    assert ch.block_sizes(blocks).tolist() == [3, 3, 3, 2, 2, 2, 2]
    assert ch.spectral_blocks(s, 0.0).tolist() == [0, 1, 2, 3, 4, 5, 5]  # equal values only: the zeros
    # a step a hair above the tolerance splits; values zero up to rounding join the zeros
    assert ch.spectral_blocks(torch.tensor([1.0, 0.75 - 1e-12], dtype=F64), 0.25).tolist() == [0, 1]
    rounding = torch.tensor([2.0, 1e-9, 3e-17, 1e-30], dtype=F64)  # <= ZERO_RTOL x 2: zero
    assert ch.spectral_blocks(rounding, 0.5).tolist() == [0, 1, 1, 1]
    assert ch.spectral_blocks(torch.zeros(3, dtype=F64), TOL).tolist() == [0, 0, 0]  # a zero circuit
    batch = torch.tensor([[3.0, 3.0, 1.0], [3.0, 1.0, 1.0]], dtype=F64)  # [.., d]: each row its own
    assert ch.spectral_blocks(batch, TOL).tolist() == [[0, 0, 2], [0, 1, 1]]


def test_block_sums_and_their_spread_by_hand() -> None:
    """Writer blocks {0, 1}, {2}; reader blocks {0}, {1, 2}: sums at the blocks' first directions,
    zeros elsewhere; spread back, each block pair's cells share its sum evenly."""
    table = torch.arange(1.0, 10.0, dtype=F64).view(1, 3, 3)  # [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    writer, reader = torch.tensor([[0, 0, 2]]), torch.tensor([[0, 1, 1]])
    sums = ch.block_sums(table, writer, reader)
    assert sums[0].tolist() == [[5, 16, 0], [0, 0, 0], [7, 17, 0]]
    assert ch.spread(sums, writer, reader)[0].tolist() == [[2.5, 4, 4], [2.5, 4, 4], [7, 8.5, 8.5]]
    one = torch.tensor([[0, 1, 2]])
    assert ch.block_sums(table, one, one) is table  # no block of more than one direction


# --- an exactly degenerate block, turned within it -----------------------------------------------


def turn(d: int, first: int, angle: float) -> torch.Tensor:
    """[d, d]: the identity with a plane rotation by `angle` in directions first, first + 1."""
    G = torch.eye(d, dtype=F64)
    c, s = math.cos(angle), math.sin(angle)
    G[first : first + 2, first : first + 2] = torch.tensor([[c, -s], [s, c]], dtype=F64)
    return G


def block_model(
    s: tuple[float, ...], writer_turn: torch.Tensor, reader_turn: torch.Tensor
) -> AttnOnlyTransformer:
    """The tiny random model with the K edge 0.0 -> 1.0 rebuilt around known blocks. With p, q
    orthonormal [d_model, d_head] and u_0 .. u_3 orthonormal in d_model:

        OV^0.0  = p G diag(s) G^T U^T      W_V = p G diag(s), W_O = G^T U^T   (G: writer_turn)
        QK^1.0T = W_K W_Q^T                W_K = K diag(4, 3, 3, 1) H, W_Q = 2 q H (H: reader_turn)

    K = [(u_0 + u_1)/sqrt 2, u_2, u_3, (u_0 - u_1)/sqrt 2]: the keys' strongest direction reads
    the writer's first two output directions half and half. Head 0.0's b_V and 1.0's b_Q, b_K
    turn with G and H. s_0 = s_1 (exactly or within the
    tolerance): writer block {0, 1}; t = 4, 3, 3, 1: reader block {1, 2}. H keeps QK^1.0 whatever
    it is (a change of head basis); G keeps OV^0.0 when s_0 = s_1 and turns its directions within
    the block otherwise. Top channel: writer block {0, 1} x reader direction 0."""
    model = random_model("tiny")
    gen = torch.Generator().manual_seed(100)
    D, d = model.cfg.d_model, model.cfg.d_head
    u = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=F64))[0]  # [d_model, d_model]
    p = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]  # [d_model, d_head]
    q = torch.linalg.qr(torch.randn(D, d, generator=gen, dtype=F64))[0]
    root = 2**-0.5
    K = torch.stack([root * (u[:, 0] + u[:, 1]), u[:, 2], u[:, 3], root * (u[:, 0] - u[:, 1])], 1)
    with torch.no_grad():
        writer, reader = model.blocks[0].attn, model.blocks[1].attn
        writer.W_V[0] = p @ writer_turn @ torch.diag(torch.tensor(s, dtype=F64))
        writer.W_O[0] = writer_turn.mT @ u[:, :d].mT
        reader.W_K[0] = K @ torch.diag(torch.tensor([4.0, 3.0, 3.0, 1.0], dtype=F64)) @ reader_turn
        reader.W_Q[0] = 2 * q @ reader_turn
        # the biases in head space turn with their heads' bases: b_V W_O and q . k stay the model's
        writer.b_V[0] = writer.b_V[0] @ writer_turn
        reader.b_Q[0], reader.b_K[0] = reader.b_Q[0] @ reader_turn, reader.b_K[0] @ reader_turn
    return model


def heads_of(model: AttnOnlyTransformer) -> HeadWeights:
    return from_state_dict(model.state_dict())  # no LayerNorm: the model's own weights


def rows_and_tables(hw: HeadWeights) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    rotations = ch.channel_blocks(64, hw.d_model, hw.d_head, torch.Generator().manual_seed(0))
    return ch.channel_rows(hw, rotations, TOL)


def the_pair(rows: pd.DataFrame) -> pd.Series:
    k = rows[rows["kind"] == "K"].set_index(PAIR)
    return k.loc[(0, 0, 1, 0)]


EXACT = (2.0, 2.0, 1.0, 0.5)


def test_an_exactly_degenerate_block_turned_within_it_changes_no_channel_table() -> None:
    """The same circuits from factors whose SVD turns within both blocks: every row of every kind
    (top channel, block sizes, top share, effective channels, the null and z) and every table the
    same to float64 precision, while the per-direction shares of the pair move (the SVD's
    directions in a degenerate block are arbitrary)."""
    d = 4
    base = heads_of(block_model(EXACT, torch.eye(d, dtype=F64), torch.eye(d, dtype=F64)))
    turned = heads_of(block_model(EXACT, turn(d, 0, 0.7), turn(d, 1, 1.1)))
    torch.testing.assert_close(  # the circuits are the same ...
        turned.W_V[0, 0] @ turned.W_O[0, 0], base.W_V[0, 0] @ base.W_O[0, 0], rtol=0, atol=1e-14
    )
    per_direction = [
        ch.pair_shares(ch.writer_circuit(hw), ch.reader_circuit(hw, "K"), ([0], [0], [1], [0]))[0]
        for hw in (base, turned)
    ]
    assert (per_direction[0] - per_direction[1]).abs().max() > 1e-2 * per_direction[
        0
    ].sum()  # ... not their SVDs
    (rows, tables), (rows_turned, tables_turned) = rows_and_tables(base), rows_and_tables(turned)
    pd.testing.assert_frame_equal(rows[["kind", *PAIR, *NAMED]], rows_turned[["kind", *PAIR, *NAMED]])
    numbers = ["top_share", "effective_channels", "null_mean", "null_std", "z"]
    pd.testing.assert_frame_equal(rows[numbers], rows_turned[numbers], rtol=1e-10, atol=1e-12)
    for kind in tables:
        torch.testing.assert_close(tables_turned[kind], tables[kind], rtol=0, atol=1e-12, equal_nan=True)
    top = the_pair(rows)
    assert tuple(top[NAMED]) == (0, 0, 2, 1)  # writer block {0, 1} x reader direction 0
    # shares s^2 t^2 |W_A^T k|^2: block {0, 1} x k_0 4 x 16, x k_3 4 x 1; u_2 x k_1 9; u_3 x k_2 0.25 x 9
    assert top["top_share"] == pytest.approx(64 / (64 + 4 + 9 + 2.25), rel=1e-12)
    # 0.0 -> 1.0 is K's first later pair: its table spreads the top share over the block's cells
    assert tables["K"][0, :2, 0].tolist() == pytest.approx([top["top_share"] / 2] * 2, rel=1e-12)
    assert tables["K"][0].sum().item() == pytest.approx(1, rel=1e-12)


@pytest.fixture(scope="module")
def text() -> torch.Tensor:
    return torch.randint(0, 20, (32, 16), generator=torch.Generator().manual_seed(3))


def channels_csv(hw: HeadWeights) -> pd.DataFrame:
    """channels.csv's rows of the weights with 0.0 -> 1.0 (K) the one discovered pair."""
    rows, _ = rows_and_tables(hw)
    rows["pair_discovery"] = (rows["kind"] == "K") & (rows[PAIR] == [0, 0, 1, 0]).all(axis=1)
    for column in CHANNELS_COLUMNS:
        rows[column] = rows[column] if column in rows else np.nan
    return rows[list(CHANNELS_COLUMNS)]


def test_the_channel_ablation_of_a_degenerate_block_is_the_same_whatever_its_directions(text) -> None:
    """The heads stage's cut of the named top channel (`channel_check.cuts`: the whole block pair),
    from the weights and from the weights turned within the blocks: the same effects to float64
    precision; cutting one direction of the block instead moves with the turn."""
    d = 4
    models = [
        block_model(EXACT, torch.eye(d, dtype=F64), torch.eye(d, dtype=F64)),
        block_model(EXACT, turn(d, 0, 0.7), turn(d, 1, 1.1)),
    ]
    effects, single = [], []
    for model in models:
        hw = heads_of(model)
        pairs = channel_check.discovered(channels_csv(hw))
        assert pairs[NAMED].values.tolist() == [[0, 0, 2, 1]]
        (cut,) = channel_check.cuts(hw, pairs)
        assert tuple(cut.w.shape) == (hw.d_model, 2) and tuple(cut.k.shape) == (hw.d_model, 1)
        effects.append(ablation.channel_ablation(model, text, [cut], None).iloc[0])
        one = ablation.ChannelCut(cut.src, cut.dst, cut.w[:, 0], cut.k[:, 0])  # direction 0 of the block
        single.append(ablation.channel_ablation(model, text, [one], None).iloc[0])
    assert effects[0]["pattern_effect"] > 1e-3
    for column in ("loss_effect", "pattern_effect"):
        assert effects[1][column] == pytest.approx(effects[0][column], rel=1e-10, abs=1e-14)
    assert (
        abs(single[1]["pattern_effect"] - single[0]["pattern_effect"]) > 1e-3 * effects[0]["pattern_effect"]
    )


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


# --- near-equal values -----------------------------------------------------------------------


def test_near_equal_values_keep_the_named_top_channel_under_every_turn_within_the_block() -> None:
    """s_1 = s_0 (1 - tol / 2): one block. The writer's directions turned within it by angles over
    a half turn (the circuit moves by ~ tol): the named top channel (first directions and block
    sizes) never changes and its share stays within the block's bound, while the per-direction
    top cell moves between the block's two directions."""
    d = 4
    s = (2.0, 2.0 * (1 - TOL / 2), 1.0, 0.5)
    named, shares, per_direction_tops = set(), [], set()
    for angle in np.linspace(0.0, math.pi, 13):
        hw = heads_of(block_model(s, turn(d, 0, float(angle)), torch.eye(d, dtype=F64)))
        top = the_pair(rows_and_tables(hw)[0])
        named.add(tuple(int(x) for x in top[NAMED]))
        shares.append(top["top_share"])
        c = ch.channels(hw, "K")
        cells = c.normalised()[0, 0, 1, 0]
        per_direction_tops.add(int(cells.argmax()) // d)
    assert named == {(0, 0, 2, 1)}
    bound = (1 - TOL) ** -2  # (s_max / s_min)^2 within a block of two, a reader block of one
    assert max(shares) / min(shares) <= bound
    assert per_direction_tops == {0, 1}  # per direction, the top channel is whichever the turn favours


# --- against dense float64 ------------------------------------------------------------------------


def dense_projector(U: torch.Tensor) -> torch.Tensor:
    return U @ U.mT


@pytest.mark.parametrize("degenerate", [True, False], ids=["blocks", "distinct"])
def test_block_shares_are_the_dense_projected_numerators_and_sum_to_the_squared_numerator(degenerate) -> None:
    """share(A, B) = ||P_A OV^a N^b Q_B||^2, P_A the projector onto writer block A's reading
    directions and Q_B onto reader block B's output directions, both from a dense float64 SVD of
    the d_model x d_model circuits (a block's projector does not depend on the basis chosen in it);
    the block shares of a pair sum to ||OV^a N^b||^2, for every later pair of every kind."""
    d = 4
    model = (
        block_model(EXACT, turn(d, 0, 0.3), turn(d, 1, 0.9)) if degenerate else random_model("tiny", seed=2)
    )
    hw = heads_of(model)
    dense = {"Q": hw.W_Q @ hw.W_K.mT, "K": hw.W_K @ hw.W_Q.mT, "V": hw.W_V @ hw.W_O}  # [L, H, D, D]
    OV = hw.W_V @ hw.W_O
    found_block = False
    for kind in ("Q", "K", "V"):
        c = ch.channels(hw, kind)
        for i, h, j, g in zip(*ch.later_pairs(hw.n_layers, hw.n_heads), strict=True):
            writer_blocks = ch.spectral_blocks(c.s[i, h], TOL)
            reader_blocks = ch.spectral_blocks(c.t[j, g], TOL)
            sums = ch.block_sums(c.shares[i, h, j, g][None], writer_blocks[None], reader_blocks[None])[0]
            R, s_dense, _ = torch.linalg.svd(OV[i, h])  # reads: left singular vectors
            _, t_dense, Mh = torch.linalg.svd(dense[kind][j, g])  # outputs: right singular vectors
            product = OV[i, h] @ dense[kind][j, g]
            total = torch.linalg.matrix_norm(product).square()
            assert sums.sum().item() == pytest.approx(total.item(), rel=1e-10)
            for a in writer_blocks.unique().tolist():
                for b in reader_blocks.unique().tolist():
                    A = (writer_blocks == a).nonzero()[:, 0]
                    B = (reader_blocks == b).nonzero()[:, 0]
                    found_block |= len(A) > 1 or len(B) > 1
                    P, Q = dense_projector(R[:, A]), dense_projector(Mh.mT[:, B])
                    want = torch.linalg.matrix_norm(P @ product @ Q).square()
                    assert sums[a, b].item() == pytest.approx(want.item(), rel=1e-9, abs=1e-12 * total.item())
    assert found_block == degenerate


# --- the tolerance, a config key --------------------------------------------------------------


@pytest.mark.parametrize("value", [-0.01, 1.0, 2.5])
def test_the_tolerance_is_refused_outside_0_to_1_in_one_line_naming_its_key(value) -> None:
    raw = yaml.safe_load(params.dump(params.compose([])))
    raw["analysis"]["composition"]["channel_tolerance"] = value
    with pytest.raises(UserError) as caught:
        params.from_dict(raw)
    message = str(caught.value)
    assert "\n" not in message
    assert f"analysis.composition.channel_tolerance = {value}: " in message


def test_the_tolerance_sets_the_blocks_of_the_composition_stages_tables() -> None:
    """measured_channels blocks at cfg.channel_tolerance: tolerance 0 splits the near-equal writer
    block of two into two directions, the default joins them."""
    d = 4
    hw = heads_of(
        block_model((2.0, 2.0 * (1 - TOL / 2), 1.0, 0.5), torch.eye(d, dtype=F64), torch.eye(d, dtype=F64))
    )
    scores = pd.DataFrame([{"kind": "K", "variant": "true", **dict(zip(PAIR, (0, 0, 1, 0), strict=True)),
                            "discovery": True}])  # fmt: skip
    sizes = {}
    for tol in (0.0, TOL):
        cfg = CompositionConfig(baseline_samples=4, null_samples=8, channel_tolerance=tol)
        later, _, _ = ch.measured_channels(hw, scores, cfg, seed=0)
        sizes[tol] = int(the_pair(later)["writer_block"])
    assert sizes == {0.0: 1, TOL: 2}
