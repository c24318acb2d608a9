"""Known answers at the edges of model/ and the role ablation's placebo test that the sample of
mutmut's mutants found unchecked: the refusals' exact words and the file they name, NeelNanda's
config.json without `normalization`, the CUDA-only branches (a CUDA device stood in on the CPU: the
choice is what is checked, not CUDA's numbers), and a role ranked below a placebo set."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from pipeline import checkpoint
from pipeline.behaviour import heads
from pipeline.config import Config, DataConfig, HeadsConfig, ModelConfig, TrainConfig
from pipeline.errors import UserError
from pipeline.model import origin, tl_checkpoint, train, transformer
from pipeline.model.transformer import AttnOnlyTransformer

CFG = ModelConfig(
    n_layers=2, n_heads=2, d_head=4, d_model=16, n_ctx=16, d_vocab=24, positional_embedding_type="standard"
)


def test_a_load_without_a_checkpoint_is_refused_naming_train_checkpoint():
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(replace(TrainConfig(), checkpoint=None), 0)
    assert str(caught.value) == "train.checkpoint: required when train.source = 'load'"


def test_a_checkpoint_that_is_not_there_is_refused_naming_train_checkpoint_and_the_path_it_looked_at(
    tmp_path,
):
    t = replace(
        TrainConfig(), source="load", checkpoint_dir=str(tmp_path), checkpoint="s{seed}/m.safetensors"
    )
    with pytest.raises(UserError) as caught:
        origin.checkpoint_path(t, 3)
    assert str(caught.value) == (
        f"train.checkpoint = 's{{seed}}/m.safetensors': {tmp_path / 's3' / 'm.safetensors'} not found "
        f"(relative to train.checkpoint_dir = {str(tmp_path)!r})"
    )


def test_a_state_dict_is_a_bridges_only_with_embed_weight_and_without_embed_w_e():
    one = torch.zeros(1)
    assert tl_checkpoint.is_bridge_state({"embed.weight": one}) is True
    assert tl_checkpoint.is_bridge_state({"embed.W_E": one}) is False
    assert tl_checkpoint.is_bridge_state({"embed.weight": one, "embed.W_E": one}) is False
    assert tl_checkpoint.is_bridge_state({}) is False
    assert tl_checkpoint.is_bridge_state({"pos_embed.W_pos": one}) is False


def test_the_manual_attention_kernel_makes_its_causal_mask_on_the_inputs_device():
    """On the meta device (standing in for a GPU: shapes, no data), the hand-written kernel runs
    and answers on that device; a mask made on the CPU could not be added to its scores."""
    q, k, v = (torch.empty(2, 3, 5, 4, device="meta") for _ in range(3))
    z = transformer.causal_attention(q, k, v, kernel="manual")
    assert z.device == torch.device("meta") and tuple(z.shape) == (2 * 5, 3 * 4)


def test_a_config_json_that_is_not_an_object_is_refused_naming_it():
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config([1, 2])
    assert str(caught.value) == "config.json: must be a JSON object of HookedTransformerConfig fields"


def test_a_config_json_without_a_size_is_refused_naming_the_first_missing_field():
    raw = {k: v for k, v in tl_checkpoint.tl_config(CFG).items() if k not in ("d_model", "n_ctx")}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.from_tl_config(raw, "their/config.json")
    assert str(caught.value) == "their/config.json: d_model: missing from config.json"
    assert (caught.value.where, caught.value.problem) == (
        "their/config.json: d_model",
        "missing from config.json",
    )


def test_neel_nandas_config_without_normalization_keeps_its_normalization_type():
    raw = {"n_layers": 2, "shortformer_pos": True, "normalization_type": "LN"}
    out = tl_checkpoint.neel_translated(raw)
    assert out["normalization_type"] == "LN" and out["positional_embedding_type"] == "shortformer"
    assert tl_checkpoint.neel_translated({"normalization": None})["normalization_type"] is None


def test_a_bad_field_of_a_checkpoint_without_config_json_names_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "model.safetensors"
    checkpoint.save_state(path, AttnOnlyTransformer(CFG).state_dict())
    fields = {"positional_embedding_type": "rotary", "normalization_type": None, "attn_only": True}
    with pytest.raises(UserError) as caught:
        tl_checkpoint.read_checkpoint(path, fields)
    assert str(caught.value) == (  # the file, then the config read off its shapes, then the field
        f"{path}: the shapes in {path}: positional_embedding_type = 'rotary': "
        "must be one of standard, shortformer"
    )


@pytest.fixture
def cuda_setup(monkeypatch):
    """train._setup as on a CUDA device (torch.device("cuda") exists on a CPU build), its global
    switches put back afterwards."""
    monkeypatch.setattr(train, "resolve_device", lambda name, key: torch.device("cuda"))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_num_threads(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
    torch.use_deterministic_algorithms(before[2], warn_only=before[3])
    torch.set_num_threads(before[4])


def test_on_cuda_setup_makes_cublas_deterministic_and_sets_tf32_as_asked(cuda_setup):
    device = train._setup(replace(TrainConfig(), device="cuda", precision="tf32"))
    assert device.type == "cuda"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # the fused backward has no such kernel


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: which kernel causal_attention picks, seen on a CPU."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_causal_attention_takes_the_fused_kernel_on_cuda_and_the_manual_one_on_the_cpu(monkeypatch):
    calls = []
    fused = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return fused(*(torch.Tensor(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)

    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", spy)
    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)
    on_cpu = transformer.causal_attention(q, k, v)
    assert calls == []
    on_cuda = transformer.causal_attention(q.as_subclass(_OnCuda), k, v)
    assert calls == [{"is_causal": True}]
    torch.testing.assert_close(torch.Tensor(on_cuda), on_cpu)


def test_a_block_called_without_cache_keeps_no_head_results_and_adds_what_the_cached_path_adds():
    """Block.forward's default is training's path (cache=False): the fused attention, no per-head
    result or pattern kept; its output is the cached path's resid + sum_h result^h + b_O."""
    torch.manual_seed(0)
    block = AttnOnlyTransformer(CFG).blocks[0].double()
    resid = torch.randn(2, 5, CFG.d_model, dtype=torch.float64)
    plain = block(resid)
    assert plain.result is None and plain.pattern is None
    cached = block(resid, cache=True)
    assert cached.result.shape == (2, 5, CFG.n_heads, CFG.d_model)
    assert cached.pattern.shape == (2, CFG.n_heads, 5, 5)
    by_heads = resid + cached.result.sum(dim=2) + block.attn.b_O
    torch.testing.assert_close(plain.resid, by_heads, rtol=0, atol=1e-12)
    torch.testing.assert_close(cached.resid, by_heads, rtol=0, atol=1e-12)


def test_a_role_serves_held_out_text_only_where_few_enough_placebo_sets_reach_it():
    """39 placebo sets, the role's effect 0.3: p = (1 + sets at or above it) / 40, p_lower the same
    from below; it serves at p <= heads.SERVES_LEVEL (0.05: at most one set reaching it)."""
    sets = [[(0, i)] for i in range(39)]
    cfg = HeadsConfig(placebo_sets=39, min_effect=0.01)
    role = {"heldout_loss_effect": [0.3]}
    for above, p, serves in ((0, 1 / 40, True), (1, 2 / 40, True), (2, 3 / 40, False)):
        effects = [0.5] * above + [0.1] * (39 - above)
        out = heads._placebo(sets, [effects], role, cfg, exact=True)
        assert (out["placebo_p"], out["serves_heldout"], out["placebo_exact"]) == (p, serves, True)
        assert out["placebo_p_lower"] == (1 + 39 - above) / 40
    below_min = heads._placebo(sets, [[0.0] * 39], {"heldout_loss_effect": [0.005]}, cfg, exact=False)
    assert below_min["placebo_p"] == 1 / 40 and below_min["serves_heldout"] is False  # under min_effect


def test_a_snapshot_file_missing_from_the_hugging_face_cache_is_refused_with_the_download_command(
    tmp_path, monkeypatch
):
    """origin.json names a snapshot this machine's cache does not hold: one line naming the file
    where the cache would keep it and the `hf download` that fetches that commit."""
    monkeypatch.setattr(origin.hub, "cache_dir", lambda: tmp_path)
    snap = {"repo": "org/tiny", "revision": "main", "commit": "abc123"}
    chosen = {
        "source": "load",
        "hub": snap,
        "checkpoint": {"path": "model.safetensors", "sha256": "0" * 64},
        "config": {"path": "config.json", "sha256": "0" * 64},
    }
    with pytest.raises(UserError) as caught:
        origin.checked(chosen)
    where = tmp_path / "models--org--tiny" / "snapshots" / "abc123" / "model.safetensors"
    assert str(caught.value) == (
        f"{where}: not in the Hugging Face cache: run `hf download org/tiny --revision abc123`"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_tensor_with_nan_or_inf_is_refused_naming_the_file_and_the_tensor(bad):
    torch.manual_seed(0)
    state = dict(AttnOnlyTransformer(CFG).state_dict())
    with torch.device("meta"):
        expected = AttnOnlyTransformer(CFG).state_dict()
    clean = tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert clean.keys() == expected.keys()
    state["blocks.1.attn.W_V"] = state["blocks.1.attn.W_V"].clone()
    state["blocks.1.attn.W_V"][1, 3, 2] = bad
    with pytest.raises(UserError) as caught:
        tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert str(caught.value) == "m.safetensors: blocks.1.attn.W_V: contains NaN or inf"


def test_a_transformerlens_state_with_mlp_weights_is_refused_naming_its_first_mlp_key_in_order():
    """Our model has no MLPs: a TransformerLens-layout checkpoint that has them is refused by
    the alphabetically first MLP key, inside the file's name."""
    torch.manual_seed(0)
    state = dict(AttnOnlyTransformer(CFG).state_dict())
    state["blocks.1.mlp.W_in"] = torch.zeros(16, 64)
    state["blocks.0.mlp.b_out"] = torch.zeros(16)
    with torch.device("meta"):
        expected = AttnOnlyTransformer(CFG).state_dict()
    with pytest.raises(UserError) as caught:
        tl_checkpoint.check_state(state, expected, "m.safetensors", "config.json")
    assert (
        str(caught.value)
        == "m.safetensors: blocks.0.mlp.b_out: not an attention-only model (it has MLP weights)"
    )


def test_attn_scale_is_not_judged_against_a_d_head_that_is_not_a_positive_integer():
    """sqrt(d_head) means nothing for d_head = 0, -4, 4.0 or null: the attention scale passes, and
    d_head itself is refused by name (not `attn_scale: must be sqrt(d_head) = 0`, nor math's
    domain error on sqrt(-4))."""
    for d_head in (0, -4, 4.0, None):
        assert tl_checkpoint._is_sqrt_d_head(3.0, {"d_head": d_head}) is True
    assert tl_checkpoint._is_sqrt_d_head(2.0, {"d_head": 4}) is True
    assert tl_checkpoint._is_sqrt_d_head(3.0, {"d_head": 4}) is False
    raw = tl_checkpoint.tl_config(CFG)
    for d_head, problem in ((0, "must be > 0"), (-4, "must be > 0"), (4.0, "must be an integer")):
        with pytest.raises(UserError) as caught:
            tl_checkpoint.from_tl_config({**raw, "d_head": d_head, "attn_scale": 3.0})
        assert str(caught.value) == f"config.json: d_head = {d_head!r}: {problem}"


def test_a_checkpoint_without_config_json_missing_a_sized_weight_is_refused_naming_it():
    """Without config.json the sizes come from W_Q, W_pos and W_E: the first one missing is named."""
    torch.manual_seed(0)
    state = AttnOnlyTransformer(CFG).state_dict()
    sizes = {"n_layers": 2, "n_heads": 2, "d_head": 4, "d_model": 16, "n_ctx": 16, "d_vocab": 24}
    assert tl_checkpoint.inferred_config(state, {"attn_only": True}) == {"attn_only": True, **sizes}
    for missing in ("blocks.0.attn.W_Q", "pos_embed.W_pos", "embed.W_E"):
        partial = {k: v for k, v in state.items() if k != missing}
        with pytest.raises(UserError) as caught:
            tl_checkpoint.inferred_config(partial, {})
        assert str(caught.value) == f"{missing}: missing from the checkpoint"


def test_a_checkpoint_too_short_for_the_probe_is_refused_naming_train_probe_length_and_the_source():
    """A loaded model's n_ctx bounds the probe [first, span, span]: a span of 7 needs 15 positions,
    one more than n_ctx 14 (CFG's 16 is enough)."""
    cpu = torch.device("cpu")
    train._fits(CFG, Config(model=CFG, train=TrainConfig(probe_length=7)), "their/config.json", cpu)
    with pytest.raises(UserError) as caught:
        train._fits(
            replace(CFG, n_ctx=14), Config(train=TrainConfig(probe_length=7)), "their/config.json", cpu
        )
    assert str(caught.value) == (
        "train.probe_length = 7: a repeated sequence (1 + 2 x 7 = 15 tokens) does not fit in "
        "n_ctx of their/config.json = 14"
    )


def test_training_evaluates_on_the_run_device_the_model_the_held_out_sequences_and_the_probe(monkeypatch):
    """Everything the first evaluation reads is on the run's device (the meta device stands in for
    a GPU: shapes, no data; the spy stops the run there), the probe included, not left on the CPU
    where the data was drawn."""

    class Stop(Exception):
        pass

    seen = {}

    def spy(model, eval_tokens, probe, probe_length):
        devices = {next(model.parameters()).device, eval_tokens.device, probe.device}
        seen.update(
            devices=devices, shapes=(tuple(eval_tokens.shape), tuple(probe.shape)), length=probe_length
        )
        raise Stop

    monkeypatch.setattr(train, "_setup", lambda t: torch.device("meta"))
    monkeypatch.setattr(train, "evaluate", spy)
    t = TrainConfig(steps=1, batch_size=2, eval_batch_size=2, probe_length=3, save_steps=[], warmup_steps=0)
    cfg = Config(model=CFG, data=DataConfig(n_train_sequences=40), train=t)
    with pytest.raises(Stop):
        train.train(cfg, 0, progress=None)
    assert seen == {"devices": {torch.device("meta")}, "shapes": ((2, 16), (2, 7)), "length": 3}
