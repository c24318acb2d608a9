"""pipeline/model/patterns.py: attention-pattern head scores, on known patterns and against
TransformerLens's detect_head (interop)."""

from __future__ import annotations

import planted
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import one_line

from pipeline.model import patterns


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def one_hot_pattern(batch: int, T: int, key_of_query) -> torch.Tensor:
    """[batch, 1, T, T]: query i attends only to key_of_query(i)."""
    p = torch.zeros(batch, 1, T, T, dtype=torch.float64)
    for i in range(T):
        p[:, 0, i, key_of_query(i)] = 1.0
    return p


WORDS = ["<bos>"] + [f"t{i}" for i in range(1, planted.V)]  # token 0 is the BOS / first token


@pytest.fixture(scope="module")
def tl_model(tmp_path_factory):
    """The planted weights in a HookedTransformer with an offline word-level tokenizer."""
    tl = pytest.importorskip("transformer_lens")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<bos>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<bos>", eos_token="<bos>", pad_token="<bos>"
    )
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)  # TransformerLens reloads it by path to add BOS handling
    tokenizer = AutoTokenizer.from_pretrained(path)
    c = planted.CONFIG
    cfg = tl.HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_ctx=c.n_ctx, d_head=c.d_head, n_heads=c.n_heads,
        d_vocab=c.d_vocab, attn_only=True, act_fn=None, normalization_type=None,
        positional_embedding_type="shortformer", dtype=torch.float64, device="cpu",
    )  # fmt: skip
    model = tl.HookedTransformer(cfg, tokenizer=tokenizer)
    missing, unexpected = model.load_state_dict(planted.state_dict(), strict=False)
    assert not unexpected and all(k.endswith((".mask", ".IGNORE")) for k in missing)
    return model.eval()


def texts(tokens: torch.Tensor) -> list[str]:
    """Sequences without their first token: TransformerLens prepends BOS (id 0) itself."""
    return [" ".join(WORDS[t] for t in row[1:].tolist()) for row in tokens]


def test_one_hot_patterns_score_one_on_their_own_score_only():
    T = 9
    prev = one_hot_pattern(2, T, lambda i: max(i - 1, 0))
    cur = one_hot_pattern(2, T, lambda i: i)
    first = one_hot_pattern(2, T, lambda i: 0)
    assert patterns.prev_token(prev).item() == 1.0
    assert patterns.recent_mass(prev, 3).item() == 1.0
    assert patterns.current_token(prev).item() == pytest.approx(1 / T)  # query 0 only
    assert patterns.current_token(cur).item() == 1.0
    assert patterns.prev_token(cur).item() == 0.0
    assert patterns.first_token(first).item() == 1.0
    assert patterns.prev_token(first).item() == pytest.approx(1 / (T - 1))  # query 1 only


def test_uniform_causal_pattern_has_the_closed_form_scores():
    T, k = 12, 3
    uniform = causal_softmax(torch.zeros(1, 1, T, T, dtype=torch.float64))
    expect_first = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    expect_window = sum(k / (i + 1) for i in range(k, T)) / (T - k)
    assert patterns.first_token(uniform).item() == pytest.approx(expect_first, abs=1e-15)
    assert patterns.prev_token(uniform).item() == pytest.approx(expect_first, abs=1e-15)
    assert patterns.recent_mass(uniform, k).item() == pytest.approx(expect_window, abs=1e-15)


def test_induction_reads_the_token_after_the_earlier_copy():
    length = 5
    T = 2 * length + 1
    perfect = one_hot_pattern(3, T, lambda i: i - length + 1 if i > length else 0)
    assert patterns.induction(perfect, length).item() == 1.0
    off_by_one = one_hot_pattern(3, T, lambda i: i - length if i > length else 0)  # duplicate token
    assert patterns.induction(off_by_one, length).item() == 0.0


def test_induction_averages_over_every_query_of_the_second_copy_and_no_other():
    length = 5
    T = 2 * length + 1
    target = lambda i: i - length + 1  # noqa: E731
    # right at one query only, the first or the last of the second copy: 1 / length
    first = one_hot_pattern(2, T, lambda i: target(i) if i == length + 1 else 0)
    last = one_hot_pattern(2, T, lambda i: target(i) if i == 2 * length else 0)
    assert patterns.induction(first, length).item() == pytest.approx(1 / length)
    assert patterns.induction(last, length).item() == pytest.approx(1 / length)
    # the same offset in the first copy is not induction (nothing earlier to match): 0
    before = one_hot_pattern(2, T, lambda i: target(i) if length - 1 <= i <= length else 0)
    assert patterns.induction(before, length).item() == 0.0


def test_duplicate_token_averages_over_queries_that_have_an_earlier_copy():
    tokens = torch.tensor([[0, 1, 2, 1, 1]])  # queries 3 (copy at 1) and 4 (copies at 1, 3)
    p = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    p[0, 0, :, 0] = 1.0
    p[0, 0, 3] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])  # 0.5 on the copy
    p[0, 0, 4] = torch.tensor([0.0, 0.25, 0.0, 0.25, 0.5])  # 0.5 on the copies
    assert patterns.duplicate_token(p, tokens).item() == pytest.approx(0.5)
    assert torch.isnan(patterns.duplicate_token(p, torch.arange(5)[None])).all()  # no query has one


def test_duplicate_token_with_a_single_query_that_has_an_earlier_copy_is_that_querys_mass():
    """One query of the batch (query 2: token 7 at key 0) has an earlier copy: the score is its
    mass there, 0.75 for head 0 and 0.25 for head 1, not NaN (NaN only when no query has one)."""
    tokens = torch.tensor([[7, 3, 7, 4]])
    p = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    p[0, :, :, 0] = 1.0
    p[0, 0, 2] = torch.tensor([0.75, 0.25, 0.0, 0.0])
    p[0, 1, 2] = torch.tensor([0.25, 0.5, 0.25, 0.0])
    assert patterns.duplicate_token(p, tokens).tolist() == [0.75, 0.25]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 6))
def test_scores_are_fractions_and_ignore_the_batch_order(seed, k):
    gen = torch.Generator().manual_seed(seed)
    T, length = 13, 6
    pattern = causal_softmax(torch.randn(5, 3, T, T, generator=gen, dtype=torch.float64) * 3)
    tokens = torch.randint(0, 4, (5, T), generator=gen)
    perm = torch.randperm(5, generator=gen)
    for score in (
        patterns.prev_token, patterns.current_token, patterns.first_token,
        lambda p: patterns.recent_mass(p, k), lambda p: patterns.induction(p, length),
    ):  # fmt: skip
        s = score(pattern)
        assert s.shape == (3,) and ((s >= 0) & (s <= 1 + 1e-12)).all()
        torch.testing.assert_close(score(pattern[perm]), s, rtol=0, atol=1e-14)
    dup = patterns.duplicate_token(pattern, tokens)
    torch.testing.assert_close(patterns.duplicate_token(pattern[perm], tokens[perm]), dup, rtol=0, atol=1e-14)


def test_recent_mass_refuses_a_window_longer_than_the_sequence():
    with pytest.raises(ValueError) as caught:
        patterns.recent_mass(torch.ones(1, 1, 4, 4), 4)
    one_line(caught, "k = 4", "seq_len - 1 = 3")
    with pytest.raises(ValueError) as caught:
        patterns.recent_mass(torch.ones(1, 1, 6, 6), 0)
    one_line(caught, "k = 0", "seq_len - 1 = 5")


@pytest.mark.interop
def test_tokenizer_round_trip_gives_our_token_ids(tl_model):
    tokens = planted.random_tokens(3, 15, seed=4)
    assert torch.equal(tl_model.to_tokens(texts(tokens)), tokens)


@pytest.mark.interop
def test_prev_token_agrees_with_detect_head(tl_model):
    """TL divides by all T queries, we by the T - 1 that have a previous token."""
    from transformer_lens.head_detector import detect_head

    tokens = planted.random_tokens(8, 15, seed=5)
    T = tokens.shape[1]
    _, cache = planted.model().run_with_cache(tokens)
    ours = torch.stack([patterns.prev_token(p) for p in cache.pattern])  # [layer, head]
    theirs = detect_head(tl_model, texts(tokens), "previous_token_head", error_measure="mul")
    torch.testing.assert_close(ours * (T - 1) / T, theirs, rtol=0, atol=1e-4)
    assert theirs[0, 0] > 0.9  # the planted previous-token head, so the comparison is not of zeros


@pytest.mark.interop
def test_duplicate_and_induction_agree_with_detect_head_on_repeated_distinct_spans(tl_model):
    """On [first, span, span] with distinct span tokens the marked keys coincide; TL divides
    by all 2 length + 1 queries, we by the `length` queries of the second copy."""
    from transformer_lens.head_detector import detect_head

    length = 7
    tokens = planted.repeated(8, length, seed=6)
    T = tokens.shape[1]
    _, cache = planted.model().run_with_cache(tokens)
    for name, ours_fn, planted_head in (
        ("duplicate_token_head", lambda p: patterns.duplicate_token(p, tokens), (0, 2)),
        ("induction_head", lambda p: patterns.induction(p, length), (1, 0)),
    ):
        ours = torch.stack([ours_fn(p) for p in cache.pattern])  # [layer, head]
        theirs = detect_head(tl_model, texts(tokens), name, error_measure="mul")
        torch.testing.assert_close(ours * length / T, theirs, rtol=0, atol=1e-4)
        assert (
            theirs[planted_head] > 0.4 and theirs[planted_head] == theirs.max()
        )  # not a comparison of zeros
