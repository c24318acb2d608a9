"""Every config rule's refusal, word for word: a valid section with one value made bad, validated as
params.yaml's loader validates it (`Section.validate`), gives one line naming the key, the value
and the rule (pipeline/config.py); the values beside a bad one are accepted."""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import replace

import pytest

from pipeline.config import (
    AnalysisConfig,
    CompareConfig,
    CompositionConfig,
    Config,
    CopiesConfig,
    DataConfig,
    FiguresConfig,
    HeadsConfig,
    ModelConfig,
    RoleThresholds,
    SyntheticDataConfig,
    TextDataConfig,
    TokenizerConfig,
    TokensDataConfig,
    TrainConfig,
    notes,
    require_corpus_package,
    require_hub_name,
)
from pipeline.errors import UserError

INF, NAN = math.inf, math.nan
TEXT = DataConfig(source="text", text=TextDataConfig(corpus="kjv"), tokenizer=TokenizerConfig(vocab_size=256))

REFUSED = [
    (ModelConfig(n_layers=1), "n_layers = 1: must be >= 2: composition needs an earlier and a later layer"),
    (ModelConfig(n_heads=0), "n_heads = 0: must be > 0"),
    (ModelConfig(init_range=0.0), "init_range = 0.0: must be > 0"),
    (ModelConfig(normalization_type="RMS"), "normalization_type = 'RMS': must be null (none) or 'LN'"),
    (SyntheticDataConfig(topic_fraction=1.5), "topic_fraction = 1.5: must be in [0, 1]"),
    (SyntheticDataConfig(min_segment=9), "min_segment = 9: must be <= max_segment = 8"),
    (CopiesConfig(rate=1.5), "rate = 1.5: must be in [0, 1]"),
    (CopiesConfig(rate=-0.25), "rate = -0.25: must be in [0, 1]"),
    (CopiesConfig(max_span=0), "max_span = 0: must be > 0"),
    (CopiesConfig(min_span=11), "min_span = 11: must be <= max_span = 10"),
    (CopiesConfig(anneal_start=0.9, anneal_end=0.5), "anneal_start = 0.9: must be <= anneal_end = 0.5"),
    (TextDataConfig(glob="../x/*.txt"), "glob = '../x/*.txt': must be relative to data.dir, without '..'"),
    (TextDataConfig(glob=" "), "glob = ' ': must not be empty"),
    (TextDataConfig(max_chars=0), "max_chars = 0: must be > 0"),
    (DataConfig(source="tokens"), "tokens.path: is required when data.source = 'tokens'"),
    (
        DataConfig(copies=CopiesConfig(anneal_start=0.5, anneal_end=0.5)),
        "copies.anneal_start = 0.5: applies to text and token streams only",
    ),
    (FiguresConfig(edges="p"), "edges = 'p': must be one of fdr, z, excess"),
    (FiguresConfig(edge_threshold=-0.5), "edge_threshold = -0.5: must be >= 0"),
    (AnalysisConfig(device="tpu"), "device = 'tpu': must be one of auto, cpu, cuda"),
    (CompositionConfig(null_samples=0), "null_samples = 0: must be > 0"),
    (Config(seeds=[]), "seeds = []: must list at least one seed"),
    (Config(seeds=[0, 1, 0]), "seeds = [0, 1, 0]: must not repeat a seed"),
    (
        Config(analysis=AnalysisConfig(heads=HeadsConfig(window_length=64))),
        "analysis.heads.window_length = 64: must be < model.n_ctx = 64 "
        "(a window of k earlier tokens needs k + 1 positions)",
    ),
    (
        Config(train=TrainConfig(probe_length=32)),
        "train.probe_length = 32: a repeated sequence (1 + 2 x 32 = 65 tokens) does not fit in "
        "model.n_ctx = 64",
    ),
    (
        Config(data=TEXT),
        "model.d_vocab = 64: must equal data.tokenizer.vocab_size = 256 (the text source's tokens)",
    ),
    (TrainConfig(save_every=-1), "save_every = -1: must be >= 0 (0: no periodic checkpoints)"),
    (TrainConfig(device="tpu"), "device = 'tpu': must be one of auto, cpu, cuda"),
    (TrainConfig(betas=[0.9, 1.0]), "betas = [0.9, 1.0]: must be two numbers in [0, 1)"),
    (TrainConfig(source="fit"), "source = 'fit': must be one of train, load"),
    (TrainConfig(warmup_steps=11, steps=10), "warmup_steps = 11: must be in [0, steps = 10]"),
    (
        TrainConfig(checkpoint="model.bin"),
        "checkpoint = 'model.bin': must end in .safetensors, .pt or .pth, or name a directory holding "
        "model.safetensors and config.json",
    ),
    (
        TrainConfig(steps=10, warmup_steps=0, save_steps=[10, 11]),
        "save_steps[1] = 11: must be in [0, steps = 10] (a shorter run: set train.save_steps=[] too)",
    ),
    (TrainConfig(lr=NAN), "lr = nan: must be a finite number (not inf or NaN)"),
    (TrainConfig(betas=[0.9, INF]), "betas[1] = inf: must be a finite number (not inf or NaN)"),
    (
        ModelConfig(positional_embedding_type="rotary"),
        "positional_embedding_type = 'rotary': must be one of standard, shortformer",
    ),
    (
        ModelConfig(d_head=16),
        "d_head = 16: n_heads x d_head = 8 x 16 = 128 exceeds d_model = 64: heads would not be low-rank",
    ),
    (SyntheticDataConfig(topics=0), "topics = 0: must be > 0"),
    (CopiesConfig(anneal_end=1.5), "anneal_end = 1.5: must be in [0, 1]"),
    (TextDataConfig(corpus="gutenberg"), "corpus = 'gutenberg': unknown corpus: one of kjv, torch-py"),
    (TextDataConfig(corpus="kjv", glob="*.txt"), "glob = '*.txt': must be null when text.corpus = 'kjv'"),
    (TokenizerConfig(vocab_size=255), "vocab_size = 255: must be in [256, 65535]"),
    (TokenizerConfig(vocab_size=65536), "vocab_size = 65536: must be in [256, 65535]"),
    (
        DataConfig(tokenizer=TokenizerConfig(pretrained="org/tok")),
        "tokenizer.pretrained = 'org/tok': must be hf:ORG/NAME or hf:ORG/NAME@REVISION "
        "(a snapshot in the Hugging Face cache)",
    ),
    (
        DataConfig(tokens=TokensDataConfig(path="/abs/tokens.npy")),
        "tokens.path = '/abs/tokens.npy': must be relative to data.dir, without '..'",
    ),
    (DataConfig(source="csv"), "source = 'csv': must be one of synthetic, text, tokens"),
    (DataConfig(n_train_sequences=0), "n_train_sequences = 0: must be > 0"),
    (DataConfig(eval_fraction=1.0), "eval_fraction = 1.0: must be in (0, 1)"),
    (DataConfig(eval_fraction=0.0), "eval_fraction = 0.0: must be in (0, 1)"),
    (DataConfig(source="text"), "text.glob: is required when data.source = 'text' and text.corpus is null"),
    (TrainConfig(weight_decay=-0.5), "weight_decay = -0.5: must be >= 0"),
    (TrainConfig(threads=0), "threads = 0: must be > 0"),
    (TrainConfig(source="load"), "checkpoint: is required when train.source = 'load'"),
    (
        TrainConfig(checkpoint="hf:no-slash"),
        "checkpoint = 'hf:no-slash': must be hf:ORG/NAME or hf:ORG/NAME@REVISION "
        "(a snapshot in the Hugging Face cache)",
    ),
    (CompositionConfig(baseline_samples=0), "baseline_samples = 0: must be > 0"),
    (CompositionConfig(fdr=1.0), "fdr = 1.0: must be in (0, 1)"),
    (CompositionConfig(channel_tolerance=1.0), "channel_tolerance = 1.0: must be in [0, 1)"),
    (CompositionConfig(channel_tolerance=-0.01), "channel_tolerance = -0.01: must be in [0, 1)"),
    (HeadsConfig(placebo_sets=0), "placebo_sets = 0: must be > 0"),
    (HeadsConfig(min_effect=-0.5), "min_effect = -0.5: must be >= 0"),
    (HeadsConfig(thresholds=RoleThresholds(induction=1.5)), "thresholds.induction = 1.5: must be in [0, 1]"),
    (FiguresConfig(dpi=0), "dpi = 0: must be > 0"),
    (
        FiguresConfig(errata_variant="x"),
        "errata_variant = 'x': must be one of errata_bcda, errata_dabc, errata_bcda_trueden, "
        "errata_dabc_trueden",
    ),
    (CompareConfig(ci=1.0), "ci = 1.0: must be in (0, 1)"),
    (CompareConfig(min_seeds=0), "min_seeds = 0: must be > 0"),
    (AnalysisConfig(threads=0), "threads = 0: must be > 0"),
    (Config(seeds=[0, -1]), "seeds = [0, -1]: must be >= 0"),
    (
        Config(analysis=AnalysisConfig(heads=HeadsConfig(repeat_length=32))),
        "analysis.heads.repeat_length = 32: a repeated sequence (1 + 2 x 32 = 65 tokens) does not fit in "
        "model.n_ctx = 64",
    ),
]


@pytest.mark.parametrize("section,message", REFUSED, ids=[m.split(":")[0] for _, m in REFUSED])
def test_a_bad_value_is_refused_in_one_line_naming_key_value_and_rule(section, message):
    with pytest.raises(UserError) as caught:
        section.validate()
    assert str(caught.value) == message


def test_a_normalization_type_written_none_or_None_is_null():
    """YAML and Hydra overrides may give the string "none" or "None" for null: both are no
    LayerNorm (None); "NONE" is not one of the spellings."""
    for spelled in ("none", "None"):
        m = ModelConfig(normalization_type=spelled)
        m.validate()
        assert m.normalization_type is None
    with pytest.raises(UserError) as caught:
        ModelConfig(normalization_type="NONE").validate()
    assert str(caught.value) == "normalization_type = 'NONE': must be null (none) or 'LN'"


def test_errata_variant_names_the_variants():
    with pytest.raises(UserError, match=r"^errata_variant = 'x': must be one of errata_"):
        FiguresConfig(errata_variant="x").validate()


# (a value at the edge of its rule, accepted; one step past it, refused)
EDGES = [
    (Config(), Config(seeds=[-1])),
    (Config(data=TEXT, model=ModelConfig(d_vocab=256)), Config(data=TEXT, model=ModelConfig(d_vocab=255))),
    (Config(seeds=[3]), Config(seeds=[3, 3])),
    (
        Config(analysis=AnalysisConfig(heads=HeadsConfig(window_length=63))),
        Config(analysis=AnalysisConfig(heads=HeadsConfig(window_length=64))),
    ),
    (Config(train=TrainConfig(probe_length=31)), Config(train=TrainConfig(probe_length=32))),
    (
        TrainConfig(source="load", checkpoint="ckpt/model.v2.pt"),
        TrainConfig(source="load", checkpoint="ckpt/model.v2.p"),
    ),
    (TrainConfig(checkpoint="seed{seed}.safetensors", save_every=0), TrainConfig(save_every=-1)),
    (
        TrainConfig(checkpoint="weights.pth", warmup_steps=10, steps=10),
        TrainConfig(warmup_steps=11, steps=10),
    ),
    (TrainConfig(warmup_steps=0), TrainConfig(warmup_steps=-1)),
    (CopiesConfig(min_span=10, anneal_start=0.5, anneal_end=0.5), CopiesConfig(min_span=11)),
    (SyntheticDataConfig(min_segment=8, topic_fraction=1.0), SyntheticDataConfig(topic_fraction=1.01)),
    (DataConfig(copies=CopiesConfig(anneal_start=1.0)), DataConfig(copies=CopiesConfig(anneal_start=0.99))),
    (
        TrainConfig(steps=10, warmup_steps=0, save_steps=[0, 10]),
        TrainConfig(steps=10, warmup_steps=0, save_steps=[-1]),
    ),
    (TextDataConfig(glob="*.txt", max_chars=1), TextDataConfig(glob="", max_chars=1)),
    (ModelConfig(init_range=0.02), ModelConfig(init_range=-0.02)),
    (CopiesConfig(rate=1.0), CopiesConfig(rate=1.01)),
    (CopiesConfig(rate=0.0), CopiesConfig(rate=-0.01)),
]


@pytest.mark.parametrize("edge,past", EDGES)
def test_the_values_at_the_edges_of_the_rules_are_accepted(edge, past):
    edge.validate()
    with pytest.raises(UserError):
        past.validate()


def test_checkpoint_steps_are_the_multiples_the_listed_steps_and_the_last():
    t = TrainConfig(steps=10, save_every=4, save_steps=[5, 8])
    assert t.checkpoint_steps() == [0, 4, 5, 8, 10]
    assert replace(t, save_every=0).checkpoint_steps() == [5, 8, 10]


def test_notes_name_the_unused_keys_of_the_section_asked():
    cfg = replace(
        Config(),
        train=TrainConfig(checkpoint="model.pt"),
        data=replace(DataConfig(), tokenizer=TokenizerConfig(pretrained="hf:org/tok")),
    )
    train_note = (
        "note: train.checkpoint = 'model.pt' is unused: train.source = 'train' trains a model from "
        "scratch (train=load, or train.source=load, loads the checkpoint)"
    )
    data_note = (
        "note: data.tokenizer.pretrained = 'hf:org/tok' is unused: data.source = 'synthetic' is not "
        "tokenized (data.source=text reads text through it)"
    )
    assert notes(cfg) == [train_note, data_note]
    assert notes(cfg, "train") == [train_note]
    assert notes(cfg, "data") == [data_note]
    assert notes(cfg, "model") == []


def test_a_wrong_corpus_package_version_names_the_installed_one():
    installed = importlib.metadata.version("torch")
    with pytest.raises(UserError) as caught:
        require_corpus_package("torch-py", pin=("torch", "0.0.1"))
    assert str(caught.value) == (
        f"data.text.corpus = 'torch-py': needs torch==0.0.1, but {installed} is installed: "
        "run make install or another corpus (setup=kjv)"
    )


def test_a_missing_corpus_package_is_refused_naming_the_pin():
    with pytest.raises(UserError) as caught:
        require_corpus_package("kjv", pin=("attn-circuits-no-such-package", "1.0"))
    assert str(caught.value) == (
        "data.text.corpus = 'kjv': needs the package attn-circuits-no-such-package==1.0: run make install"
    )


def test_a_wrong_version_of_a_package_other_than_torch_offers_no_other_corpus():
    installed = importlib.metadata.version("pytest")
    with pytest.raises(UserError) as caught:
        require_corpus_package("kjv", pin=("pytest", "0.0.1"))
    assert str(caught.value) == (
        f"data.text.corpus = 'kjv': needs pytest==0.0.1, but {installed} is installed: run make install"
    )


def test_a_malformed_hub_name_is_refused_with_its_value():
    with pytest.raises(UserError) as caught:
        require_hub_name("hf:no-slash", "train.checkpoint")
    assert str(caught.value) == (
        "train.checkpoint = 'hf:no-slash': must be hf:ORG/NAME or hf:ORG/NAME@REVISION "
        "(a snapshot in the Hugging Face cache)"
    )


@pytest.mark.parametrize("revision", ["main/..", "refs//pr", "v1/.hidden"])
def test_a_revision_with_an_empty_or_dotted_part_is_refused(revision):
    with pytest.raises(UserError) as caught:
        require_hub_name(f"hf:org/name@{revision}", "train.checkpoint")
    assert str(caught.value) == (
        f"train.checkpoint = 'hf:org/name@{revision}': revision {revision!r} is not a branch, tag or "
        "commit (a part is empty or starts with '.')"
    )
    assert require_hub_name("hf:org/name@refs/pr/1", "train.checkpoint")["revision"] == "refs/pr/1"
