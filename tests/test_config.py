"""The config schemas (pipeline/config.py), each rule tested once where it is defined: a valid
section with one value made bad, validated as params.yaml's loader validates it
(`Section.validate`), is refused in one line naming the key and the value; the values at the
edge of a rule are accepted; the notes name the keys nothing reads."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from refusals import one_line

from pipeline import params
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
)
from pipeline.errors import UserError
from pipeline.tables import ERRATA

INF, NAN = math.inf, math.nan
UNSET = object()  # a key refused for being unset: no value is named
TEXT = DataConfig(source="text", text=TextDataConfig(corpus="kjv"), tokenizer=TokenizerConfig(vocab_size=256))

REFUSED = [  # (a section with one bad value, the key its refusal names, the value; None: a key unset)
    (ModelConfig(n_layers=1), "n_layers", 1),
    (ModelConfig(n_heads=0), "n_heads", 0),
    (ModelConfig(d_model=0), "d_model", 0),
    (TrainConfig(batch_size=-8), "batch_size", -8),
    (HeadsConfig(ablation_batches=0), "ablation_batches", 0),
    (ModelConfig(init_range=0.0), "init_range", 0.0),
    (ModelConfig(normalization_type="RMS"), "normalization_type", "RMS"),
    (ModelConfig(d_mlp=0), "d_mlp", 0),
    (ModelConfig(d_mlp=32, act_fn="solu_ln"), "act_fn", "solu_ln"),
    (ModelConfig(parallel_attn_mlp=True), "parallel_attn_mlp", True),  # no MLP to run beside attention
    (ModelConfig(positional_embedding_type="rotary", rotary_dim=3), "rotary_dim", 3),  # turns pairs
    (
        ModelConfig(positional_embedding_type="rotary", d_head=5, d_model=64),
        "d_head",
        5,
    ),  # all of an odd d_head
    (SyntheticDataConfig(topic_fraction=1.5), "topic_fraction", 1.5),
    (SyntheticDataConfig(min_segment=9), "min_segment", 9),
    (CopiesConfig(rate=1.5), "rate", 1.5),
    (CopiesConfig(rate=-0.25), "rate", -0.25),
    (CopiesConfig(max_span=0), "max_span", 0),
    (CopiesConfig(min_span=11), "min_span", 11),
    (CopiesConfig(anneal_start=0.9, anneal_end=0.5), "anneal_start", 0.9),
    (TextDataConfig(glob="../x/*.txt"), "glob", "../x/*.txt"),
    (TextDataConfig(glob=" "), "glob", " "),
    (TextDataConfig(max_chars=0), "max_chars", 0),
    (DataConfig(source="tokens"), "tokens.path", UNSET),
    (DataConfig(copies=CopiesConfig(anneal_start=0.5, anneal_end=0.5)), "copies.anneal_start", 0.5),
    (FiguresConfig(edges="p"), "edges", "p"),
    (FiguresConfig(edge_threshold=-0.5), "edge_threshold", -0.5),
    (AnalysisConfig(device="tpu"), "device", "tpu"),
    (CompositionConfig(null_samples=0), "null_samples", 0),
    (Config(seeds=[]), "seeds", []),
    (Config(seeds=[0, 1, 0]), "seeds", [0, 1, 0]),
    (
        Config(analysis=AnalysisConfig(heads=HeadsConfig(window_length=64))),
        "analysis.heads.window_length",
        64,
    ),
    (Config(train=TrainConfig(probe_length=32)), "train.probe_length", 32),
    (Config(data=TEXT), "model.d_vocab", 64),
    (TrainConfig(save_every=-1), "save_every", -1),
    (TrainConfig(device="tpu"), "device", "tpu"),
    (TrainConfig(betas=[0.9, 1.0]), "betas", [0.9, 1.0]),
    (TrainConfig(source="fit"), "source", "fit"),
    (TrainConfig(warmup_steps=11, steps=10), "warmup_steps", 11),
    (TrainConfig(checkpoint="model.bin"), "checkpoint", "model.bin"),
    (TrainConfig(steps=10, warmup_steps=0, save_steps=[10, 11]), "save_steps[1]", 11),
    (TrainConfig(lr=NAN), "lr", NAN),
    (TrainConfig(betas=[0.9, INF]), "betas[1]", INF),
    (ModelConfig(positional_embedding_type="alibi"), "positional_embedding_type", "alibi"),
    (ModelConfig(d_head=16), "d_head", 16),
    (SyntheticDataConfig(topics=0), "topics", 0),
    (CopiesConfig(anneal_end=1.5), "anneal_end", 1.5),
    (TextDataConfig(corpus="gutenberg"), "corpus", "gutenberg"),
    (TextDataConfig(corpus="kjv", glob="*.txt"), "glob", "*.txt"),
    (TokenizerConfig(vocab_size=255), "vocab_size", 255),
    (TokenizerConfig(vocab_size=65536), "vocab_size", 65536),
    (DataConfig(tokenizer=TokenizerConfig(pretrained="org/tok")), "tokenizer.pretrained", "org/tok"),
    (DataConfig(tokens=TokensDataConfig(path="/abs/tokens.npy")), "tokens.path", "/abs/tokens.npy"),
    (DataConfig(source="csv"), "source", "csv"),
    (DataConfig(n_train_sequences=0), "n_train_sequences", 0),
    (DataConfig(eval_fraction=1.0), "eval_fraction", 1.0),
    (DataConfig(eval_fraction=0.0), "eval_fraction", 0.0),
    (DataConfig(source="text"), "text.glob", UNSET),
    (TrainConfig(weight_decay=-0.5), "weight_decay", -0.5),
    (TrainConfig(threads=0), "threads", 0),
    (TrainConfig(source="load"), "checkpoint", UNSET),
    (TrainConfig(checkpoint="hf:no-slash"), "checkpoint", "hf:no-slash"),
    (CompositionConfig(baseline_samples=0), "baseline_samples", 0),
    (CompositionConfig(fdr=1.0), "fdr", 1.0),
    (CompositionConfig(channel_tolerance=1.0), "channel_tolerance", 1.0),
    (CompositionConfig(channel_tolerance=-0.01), "channel_tolerance", -0.01),
    (HeadsConfig(placebo_sets=0), "placebo_sets", 0),
    (HeadsConfig(min_effect=-0.5), "min_effect", -0.5),
    (HeadsConfig(thresholds=RoleThresholds(induction=1.5)), "thresholds.induction", 1.5),
    (FiguresConfig(dpi=0), "dpi", 0),
    (FiguresConfig(errata_variant="x"), "errata_variant", "x"),
    (CompareConfig(ci=1.0), "ci", 1.0),
    (CompareConfig(min_seeds=0), "min_seeds", 0),
    (AnalysisConfig(threads=0), "threads", 0),
    (Config(seeds=[0, -1]), "seeds", [0, -1]),
    (
        Config(analysis=AnalysisConfig(heads=HeadsConfig(repeat_length=32))),
        "analysis.heads.repeat_length",
        32,
    ),
]


REFUSED_IDS = [f"{k}={'unset' if v is UNSET else v}" for _, k, v in REFUSED]  # the same on every worker


@pytest.mark.parametrize("section,key,value", REFUSED, ids=REFUSED_IDS)
def test_a_bad_value_is_refused_in_one_line_naming_key_and_value(section, key, value):
    """Each rule once, where it is defined: its refusal names the key (relative to the section
    validated) and the bad value, in one line."""
    with pytest.raises(UserError) as caught:
        section.validate()
    refused(caught, key, value)


def refused(caught: pytest.ExceptionInfo, key: str, value: object = None) -> None:
    """One line that starts with the key and, when one is given, its value (repr: strings quoted)."""
    message = str(caught.value)
    assert "\n" not in message and caught.value.where == key
    if value is UNSET:
        assert message.startswith(f"{key}: ")
        return
    same = value == caught.value.value or (value != value and caught.value.value != caught.value.value)
    assert same, (caught.value.value, value)  # NaN: not equal to itself
    assert message.startswith(f"{key} = {value!r}: ")


def test_a_normalization_type_written_none_or_None_is_null():
    """YAML and Hydra overrides may give the string "none" or "None" for null: both are no
    LayerNorm (None); "NONE" is not one of the spellings."""
    for spelled in ("none", "None"):
        m = ModelConfig(normalization_type=spelled)
        m.validate()
        assert m.normalization_type is None
    with pytest.raises(UserError) as caught:
        ModelConfig(normalization_type="NONE").validate()
    refused(caught, "normalization_type", "NONE")


def test_errata_variant_names_the_variants():
    with pytest.raises(UserError) as caught:
        FiguresConfig(errata_variant="x").validate()
    refused(caught, "errata_variant", "x")
    assert all(name in str(caught.value) for name in ERRATA)


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
    train_note, data_note = notes(cfg)
    for note, key, value in [
        (train_note, "train.checkpoint", "model.pt"),
        (data_note, "data.tokenizer.pretrained", "hf:org/tok"),
    ]:
        assert "\n" not in note and f"{key} = {value!r}" in note  # one line, naming the key and value
    assert "train.source = 'train'" in train_note and "data.source = 'synthetic'" in data_note  # and why
    assert notes(cfg) == [train_note, data_note]
    assert notes(cfg, "train") == [train_note]
    assert notes(cfg, "data") == [data_note]
    assert notes(cfg, "model") == []


ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_steps_are_the_periodic_the_listed_and_the_last():
    t = TrainConfig(steps=25, save_every=10, save_steps=[3, 10, 17])
    assert t.checkpoint_steps() == [0, 3, 10, 17, 20, 25]
    assert TrainConfig(steps=25, save_every=0, save_steps=[]).checkpoint_steps() == [25]  # the final model
    assert TrainConfig(steps=20, save_every=10).checkpoint_steps() == [0, 10, 20]  # the last only once


def test_the_shipped_schedules_are_denser_where_induction_forms():
    shipped = ((["setup=synthetic"], (200, 900)), (["setup=code"], (300, 1400)), ([], (950, 1750)))
    for overrides, dense in shipped:
        t = params.compose(overrides, conf_dir=ROOT / "conf")["train"]
        steps = TrainConfig(steps=t["steps"], save_every=t["save_every"], save_steps=t["save_steps"])
        gaps = pd.Series(steps.checkpoint_steps()).diff().dropna()
        inside = [s for s in steps.checkpoint_steps() if dense[0] <= s <= dense[1]]
        assert gaps.max() == t["save_every"] and pd.Series(inside).diff().dropna().eq(50).all()


def test_checkpoint_suffix_is_validated():
    with pytest.raises(UserError) as caught:
        params.from_dict(
            params.compose(["train=load", "train.checkpoint=model.ckpt"], conf_dir=ROOT / "conf")
        )
    one_line(caught, "train.checkpoint", "'model.ckpt'")  # the override's key and value


def test_an_unknown_precision_is_refused_by_the_config():
    with pytest.raises(UserError) as caught:
        TrainConfig(precision="fp16").validate()
    assert (caught.value.where, caught.value.value) == ("precision", "fp16")
    one_line(caught, "float32, tf32, bf16")  # the choices


@pytest.mark.parametrize("value", [-0.01, 1.0, 2.5])
def test_the_tolerance_is_refused_outside_0_to_1_in_one_line_naming_its_key(value) -> None:
    raw = yaml.safe_load(params.dump(params.compose([])))
    raw["analysis"]["composition"]["channel_tolerance"] = value
    with pytest.raises(UserError) as caught:
        params.from_dict(raw)
    message = str(caught.value)
    assert "\n" not in message
    assert f"analysis.composition.channel_tolerance = {value}: " in message
