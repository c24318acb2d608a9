"""The memory check (pipeline/memory.py): an estimate's terms held against the memory available
(the host's, or on a GPU its free memory for the device terms), refused in one line naming the key
that grew, its value and both amounts; the project's own configs fit in a few GB; /proc/meminfo
is read in kibibytes. Each module's own terms are tested beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import memory, params
from pipeline.behaviour import heads
from pipeline.errors import UserError
from pipeline.model import train

ROOT = Path(__file__).resolve().parents[1]


def cfg_of(*overrides: str):
    return params.from_dict(params.compose(list(overrides), conf_dir=ROOT / "conf"), "params.yaml")


def one_line_naming(e: pytest.ExceptionInfo, key: str, value: object, *amounts: float) -> str:
    """The refusal is one line, names `key` and `value`, and shows each amount (`memory.human`)."""
    message = str(e.value)
    assert "\n" not in message
    assert e.value.where == key and e.value.value == value
    assert message.startswith(f"{key} = {value}: ")
    for n in amounts:
        assert memory.human(n) in message
    return message


# the project's configs (conf/), as composed for a run: (overrides, what the heads stage needs)
REAL = [
    ((), 2e9),  # the default: the text setup, the text model (1.7 GB)
    (("setup=synthetic",), 2e9),  # 1.3 GB (measured: 1.4 GB)
    (("model=paper",), 3e9),  # 2.4 GB
    (("setup=synthetic", "model=paper"), 3e9),
    # the heads stage really needs ~6 GB here (5.9 GB): one source head's results [64, 256, 8, 512]
    # in float64 are 0.5 GB, and the path ablation holds several (measured: 1.8 GB at
    # eval_sequences 16, estimated 1.9 GB)
    (("model=tl_attn_only_2l",), 7e9),
    (("setup=synthetic", "model=tl_attn_only_2l"), 7e9),
]


@pytest.mark.parametrize("overrides, heads_need", REAL, ids=[" ".join(o) or "default" for o, _ in REAL])
def test_the_projects_configs_are_not_refused(overrides, heads_need):
    cfg = cfg_of(*overrides)
    memory.require_fits(train.training_estimate(cfg), available=int(3e9))  # a machine with 3 GB free
    memory.require_fits(train.loading_estimate(cfg.model, cfg, "config.json"), available=int(3e9))
    estimate = heads.memory_estimate(cfg.model, cfg.analysis.heads, cfg.data, "config.json")
    memory.require_fits(estimate, available=int(heads_need))
    assert train.training_estimate(cfg).bytes > 20e6  # not vacuous: each is at least tens of MB
    assert estimate.bytes > 100e6


def test_a_refusal_names_the_key_and_both_numbers():
    cfg = cfg_of("setup=synthetic", "model.d_vocab=1000000000")
    estimate = train.training_estimate(cfg)
    with pytest.raises(UserError) as e:
        memory.require_fits(estimate, available=int(20.1e9))
    # logits 16 x 32 x 64 x 1e9 B = 32.8 TB, embeddings 20 x 129e9 B = 2.6 TB, the rest < 0.1 TB
    assert memory.human(estimate.bytes) == "35.4 TB"
    message = one_line_naming(e, "model.d_vocab", 1000000000, estimate.bytes, 20.1e9)
    largest = max(estimate.terms, key=lambda t: t.bytes)
    assert largest.what in message  # the largest term, the logits of a training batch, is named
    assert largest.sizes[-1].key == "model.d_vocab"


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.n_ctx=1000000", "model.n_ctx"),
        ("train.batch_size=10000000000", "train.batch_size"),
        ("train.eval_batch_size=100000000000", "train.eval_batch_size"),
        ("data.n_train_sequences=1000000000000", "data.n_train_sequences"),
        ("model.d_model=1000000", "model.d_model"),
    ],
)
def test_the_key_named_is_the_one_that_grew(override, key):
    with pytest.raises(UserError) as e:
        memory.require_fits(train.training_estimate(cfg_of("setup=synthetic", override)), available=int(1e9))
    assert e.value.where == key


def test_on_a_gpu_the_data_is_held_against_the_host():
    cfg = cfg_of("setup=synthetic", "data.n_train_sequences=1000000000")  # 0.6 TB of synthetic data
    estimate = train.training_estimate(cfg)
    memory.require_fits(estimate, available=None, device_available=int(1e9))  # the model fits the GPU
    with pytest.raises(UserError) as e:
        memory.require_fits(estimate, available=int(1e9), device_available=int(1e12))
    host = sum(t.bytes for t in estimate.terms if t.host)
    one_line_naming(e, "data.n_train_sequences", 1000000000, host, 1e9)
    big = train.training_estimate(cfg_of("setup=synthetic", "model.n_ctx=100000"))
    with pytest.raises(UserError) as e:
        memory.require_fits(big, available=int(1e15), device_available=int(80e9))
    device = sum(t.bytes for t in big.terms if not t.host)
    one_line_naming(e, "model.n_ctx", 100000, device, 80e9)


def test_unknown_memory_checks_nothing():
    """The 35 TB estimate above: refused one byte short of it, accepted at exactly its size, and
    never checked against memory that is unknown (None), on the host or, on a GPU, for the host's
    terms (the GPU's free memory is still held against the rest)."""
    estimate = train.training_estimate(cfg_of("setup=synthetic", "model.d_vocab=1000000000"))
    need = estimate.bytes
    assert need > 35e12
    with pytest.raises(UserError) as e:
        memory.require_fits(estimate, available=need - 1)
    assert e.value.where == "model.d_vocab"
    assert memory.require_fits(estimate, available=need) is None
    assert memory.require_fits(estimate, available=None) is None
    assert memory.require_fits(estimate, available=None, device_available=need) is None
    with pytest.raises(UserError) as e:
        memory.require_fits(estimate, available=None, device_available=int(1e9))
    device = sum(t.bytes for t in estimate.terms if not t.host)  # the synthetic data is the host's
    one_line_naming(e, "model.d_vocab", 1000000000, device, 1e9)


def test_a_refusal_of_one_term_names_it_and_of_several_the_estimate_and_the_largest():
    one = memory.Term("the synthetic data", 3_000_000, (memory.Size("data.n_train_sequences", 10**6, 20000),))
    two = memory.Term("the logits", 1_000_000, (memory.Size("model.d_vocab", 100, 64),))
    whole = "the whole model"  # the estimate's own name, given here
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate(whole, (one,)), available=2_000_000)
    message = one_line_naming(caught, "data.n_train_sequences", 10**6, 3e6, 2e6)
    assert one.what in message and whole not in message
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate(whole, (one, two)), available=2_000_000)
    message = one_line_naming(caught, "data.n_train_sequences", 10**6, 4e6, 2e6)
    assert whole in message and one.what in message and two.what not in message


def test_the_culprit_is_the_largest_terms_size_furthest_above_its_default():
    """Among the largest term's sizes, the one with the largest value / default; a smaller term's
    sizes are never named, however far above their defaults."""
    layers = memory.Size("model.n_layers", 2, 2)  # 1x its default
    heads_ = memory.Size("model.n_heads", 2, 8)  # below
    huge = memory.Size("data.n_train_sequences", 10**9, 20000)
    big = memory.Term("the weights", 1000, (heads_, layers))
    small = memory.Term("the data", 10, (huge,))
    assert memory.culprit([big, small]) == layers
    with pytest.raises(UserError) as caught:
        memory.require_fits(memory.Estimate("the model", (big, small)), available=500)
    one_line_naming(caught, "model.n_layers", 2, 1010, 500)


def test_on_a_gpu_a_refusal_names_the_part_held_against_each_memory():
    """With the GPU's free memory given, the device terms are held against it, the host terms
    (the synthetic data) against the host's memory: each refusal names its own part's key and sum."""
    logits = memory.Term("the logits", 3_000_000, (memory.Size("model.d_vocab", 100, 64),))
    weights = memory.Term("the weights", 1_000_000, (memory.Size("model.d_model", 128, 64),))
    data = memory.Term(
        "the synthetic data", 500, (memory.Size("data.n_train_sequences", 10, 20000),), host=True
    )
    estimate = memory.Estimate("the model and its buffers", (logits, weights, data))
    memory.require_fits(estimate, available=1000, device_available=4_000_000)  # each part fits its memory
    with pytest.raises(UserError) as caught:
        memory.require_fits(estimate, available=10**12, device_available=2_000_000)
    one_line_naming(caught, "model.d_vocab", 100, 4e6, 2e6)
    with pytest.raises(UserError) as caught:
        memory.require_fits(estimate, available=400, device_available=10**12)
    one_line_naming(caught, "data.n_train_sequences", 10, 500, 400)


def test_available_bytes_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683568 kB\nMemFree:  100 kB\nMemAvailable:   1000 kB\n")
    assert memory.available_bytes(meminfo) == 1024000
    meminfo.write_text("MemTotal:       24683568 kB\n")  # a kernel without MemAvailable
    assert memory.available_bytes(meminfo) is None
    assert memory.available_bytes(tmp_path / "nowhere") is None  # not Linux
    assert memory.available_bytes() is None or memory.available_bytes() > 0


def test_available_memory_is_kibibytes_times_1024_and_a_unitless_value_is_bytes(tmp_path):
    """MemAvailable in kB counts 1024-byte units; a value with no unit (or another one) is taken
    as bytes, unscaled: 1000 kB is 1 024 000 bytes, a bare 1000 is 1000."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  5000 kB\nMemAvailable:   1000\n")
    assert memory.available_bytes(meminfo) == 1000
    meminfo.write_text("MemAvailable:   1000 B\n")
    assert memory.available_bytes(meminfo) == 1000
    meminfo.write_text("MemAvailable:   3 kB\n")
    assert memory.available_bytes(meminfo) == 3072


@pytest.mark.parametrize(
    "n, shown",
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1500, "1.5 kB"),
        (20.1e9, "20.1 GB"),
        (1.2e13, "12.0 TB"),
        (3.0e18, "3.0 EB"),
        (1.5e21, "1.5 ZB"),
        (-2e6, "-2.0 MB"),
    ],
)
def test_bytes_are_shown_in_decimal_units_with_one_decimal(n, shown):
    assert memory.human(n) == shown
