"""Schemas of `params.yaml`: one dataclass per config group (`conf/<group>/`).

OmegaConf (Hydra's config library) checks keys and types when `params.yaml` is
merged into these schemas (`pipeline.params.load`); each section's `validate`
then checks values and combinations, naming the key. `None` means "unset".

This module holds only dataclasses and plain checks, so every stage can import
it without importing torch or the code of other stages (DVC deps stay exact).
"""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath

from .errors import UserError, require, under
from .hub import require_hub_name
from .tables import ERRATA

POSITIONAL_EMBEDDINGS = ("standard", "shortformer", "rotary")
NORMALIZATIONS = (None, "LN")
# MLP activations (HookedTransformerConfig's `act_fn` names): gelu_new is GPT-2's (tanh approximation)
ACTIVATIONS = ("gelu_new", "gelu", "relu")
DATA_SOURCES = ("synthetic", "text", "tokens")
# data.text.corpus: the corpora a config may name. Their pinned packages and texts are
# pipeline/data/corpus.py's (which checks it names the same ones); the name alone is here, so that
# the schema refuses an unknown one without reading the corpus code.
CORPUS_NAMES = ("kjv", "torch-py")
TRAIN_SOURCES = ("train", "load")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("float32", "tf32", "bf16")  # tf32: float32 matmuls on tensor cores; bf16: autocast
LN_EPS = 1e-5  # LayerNorm epsilon: TransformerLens's default (config.json records it)


def _positive(section: object, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(value > 0, name, "must be > 0", value)


def _required(value: object, key: str, when: str) -> None:
    """A key that must be set (not null) when `when` holds."""
    if value is None:
        raise UserError(key, f"is required when {when}")


def _inside_dir(section: object, name: str) -> None:
    """A path or glob relative to data.dir that cannot leave it (DVC tracks only data.dir)."""
    value = getattr(section, name)
    if value is not None:
        require(value.strip() != "", name, "must not be empty", value)
        require(
            not PurePosixPath(value).is_absolute() and ".." not in PurePosixPath(value).parts,
            name,
            "must be relative to data.dir, without '..'",
            value,
        )


def _ordered(section: object, low: str, high: str) -> None:
    value, bound = getattr(section, low), getattr(section, high)
    require(value <= bound, low, f"must be <= {high} = {bound}", value)


def _fraction(section: object, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(0.0 <= value <= 1.0, name, "must be in [0, 1]", value)


def _fits_context(key: str, length: int, n_ctx: int, whose: str) -> None:
    """The one rule for every repeated probe `[first, span, span]`: it fits in the context."""
    need = 1 + 2 * length
    problem = f"a repeated sequence (1 + 2 x {length} = {need} tokens) does not fit in {whose} = {n_ctx}"
    require(need <= n_ctx, key, problem, length)


@functools.cache
def _float_fields(section: type) -> tuple[tuple[str, bool], ...]:
    """(name, is_list) of every field of a section annotated float, float | None or list[float]."""
    hints = typing.get_type_hints(section)
    found = []
    for f in fields(section):
        hint = hints[f.name]
        if float in (hint, *typing.get_args(hint)) and typing.get_origin(hint) is not list:
            found.append((f.name, False))
        elif typing.get_origin(hint) is list and typing.get_args(hint) == (float,):
            found.append((f.name, True))
    return tuple(found)


def _finite(section: object) -> None:
    """The one rule for float settings: each is a finite number. No setting of ours means
    anything at inf or NaN (a rate, a fraction, a learning rate, a decay, a threshold), and a
    comparison lets them through or blames another key: `weight_decay: .inf` passes `>= 0` and
    the training loss then becomes NaN, which the train stage blames on train.lr."""
    for name, is_list in _float_fields(type(section)):
        value = getattr(section, name)
        for where, x in [(f"{name}[{i}]", x) for i, x in enumerate(value)] if is_list else [(name, value)]:
            if isinstance(x, float):  # None: unset
                require(math.isfinite(x), where, "must be a finite number (not inf or NaN)", x)


class Section:
    """A config section: `check()` validates its own values, naming keys relative to it; before
    it, every float setting is refused at inf or NaN (`_finite`)."""

    def check(self) -> None:  # overridden where a section has rules
        pass

    def validate(self, prefix: str = "") -> None:
        """Check every nested section, then this one's float settings and own rules (which may
        read them), with keys under `prefix` (none at the root)."""
        for f in fields(self):  # type: ignore[arg-type]
            child = getattr(self, f.name)
            if isinstance(child, Section):
                child.validate(f"{prefix}.{f.name}" if prefix else f.name)
        with under(prefix):
            _finite(self)
            self.check()


# --- model -------------------------------------------------------------------------


@dataclass
class ModelConfig(Section):
    """A transformer of `n_layers` blocks: attention, then (with `d_mlp`) an MLP, each reading the
    residual stream through a pre-LayerNorm when `normalization_type` is "LN"; field names are
    HookedTransformerConfig's."""

    n_layers: int = 2
    n_heads: int = 8
    d_head: int = 8
    d_model: int = 64
    n_ctx: int = 64
    d_vocab: int = 64
    # "shortformer": added to queries and keys only; "standard": to the residual stream; "rotary":
    # queries and keys turned by position (rotary_*)
    positional_embedding_type: str = "shortformer"
    normalization_type: str | None = None  # None or "LN" (pre-LN, TransformerLens placement)
    use_bias: bool = True  # False: b_Q, b_K, b_V, b_O, b_U stay zero (still saved, for interop)
    init_range: float | None = None  # std of weight init; None: 0.8 / sqrt(d_model) as TransformerLens
    d_mlp: int | None = None  # None: attention-only; else each block's MLP has this many neurons
    act_fn: str = "gelu_new"  # the MLP's activation (ACTIVATIONS)
    parallel_attn_mlp: bool = False  # the MLP reads the block's input, beside attention (GPT-J, Pythia)
    rotary_dim: int | None = None  # rotary: the leading query and key dimensions rotated (None: d_head)
    rotary_base: int = 10000  # rotary: the wavelengths' base
    # rotary: turn adjacent pairs (0, 1), (2, 3), .. (GPT-J); else the halves (GPT-NeoX, Pythia)
    rotary_adjacent_pairs: bool = False

    @property
    def attn_only(self) -> bool:
        return self.d_mlp is None

    @property
    def rotated_dims(self) -> int:
        """Rotary positions: how many leading dimensions of each query and key turn."""
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    def check(self) -> None:
        _positive(self, "n_layers", "n_heads", "d_head", "d_model", "n_ctx", "d_vocab")
        if self.d_mlp is not None:
            _positive(self, "d_mlp")
        require(self.act_fn in ACTIVATIONS, "act_fn", f"must be one of {', '.join(ACTIVATIONS)}", self.act_fn)
        if self.positional_embedding_type == "rotary":
            require(
                0 < self.rotated_dims <= self.d_head and self.rotated_dims % 2 == 0,
                "rotary_dim" if self.rotary_dim is not None else "d_head",
                f"rotary positions turn pairs of dimensions: must be even, from 2 to d_head = {self.d_head}",
                self.rotated_dims,
            )
        _positive(self, "rotary_base")
        require(
            not (self.parallel_attn_mlp and self.attn_only),
            "parallel_attn_mlp",
            "needs an MLP (d_mlp) to run beside attention",
            self.parallel_attn_mlp,
        )
        # composition, induction and the ablation all need a head that reads an earlier one
        require(
            self.n_layers >= 2,
            "n_layers",
            "must be >= 2: composition needs an earlier and a later layer",
            self.n_layers,
        )
        require(
            self.positional_embedding_type in POSITIONAL_EMBEDDINGS,
            "positional_embedding_type",
            f"must be one of {', '.join(POSITIONAL_EMBEDDINGS)}",
            self.positional_embedding_type,
        )
        if self.normalization_type in ("none", "None"):
            self.normalization_type = None
        require(
            self.normalization_type in NORMALIZATIONS,
            "normalization_type",
            "must be null (none) or 'LN'",
            self.normalization_type,
        )
        require(
            self.n_heads * self.d_head <= self.d_model,
            "d_head",
            f"n_heads x d_head = {self.n_heads} x {self.d_head} = {self.n_heads * self.d_head} "
            f"exceeds d_model = {self.d_model}: heads would not be low-rank",
            self.d_head,
        )
        if self.init_range is not None:
            _positive(self, "init_range")


# --- data --------------------------------------------------------------------------


@dataclass
class SyntheticDataConfig(Section):
    """Seeded sequences, written left to right: background "topic" segments (local
    structure) interrupted by copies of earlier spans (data.copies; pipeline/data/datasets.py)."""

    topics: int = 8  # the vocabulary is split at random into this many topics
    min_segment: int = 3  # background segments (one topic each) are this many positions long
    max_segment: int = 8
    topic_fraction: float = 0.7  # a background token is from the segment's topic with this probability

    def check(self) -> None:
        _positive(self, "topics", "min_segment", "max_segment")
        _fraction(self, "topic_fraction")
        _ordered(self, "min_segment", "max_segment")


@dataclass
class CopiesConfig(Section):
    """Copies of earlier spans written into training sequences (pipeline/data/datasets.py): the
    synthetic data's induction signal; for text and token files, off at rate 0."""

    rate: float = 0.2  # probability that a copy starts at a position not already copying
    min_span: int = 4  # copied spans are this many tokens long
    max_span: int = 10
    min_distance: int = 2  # a copy's source is at least this far back (and at most the whole context)
    # Text and token streams only: the rate falls linearly from `rate` at this fraction of
    # train.steps to 0 at `anneal_end`, and stays 0 after it (1.0 and 1.0: copies throughout), so
    # the last part of training sees the text as it is (pipeline/data/datasets.py `copy_rate`).
    anneal_start: float = 1.0
    anneal_end: float = 1.0

    def check(self) -> None:
        _fraction(self, "rate")
        _positive(self, "min_span", "max_span", "min_distance")
        _ordered(self, "min_span", "max_span")
        _fraction(self, "anneal_start", "anneal_end")
        _ordered(self, "anneal_start", "anneal_end")


@dataclass
class TextDataConfig(Section):
    """Text, tokenized by the tokenizer stage: a corpus a pinned package ships (by name), or
    local UTF-8 files under data.dir (pipeline/data/corpus.py). Exactly one of the two."""

    corpus: str | None = None  # in CORPUS_NAMES: torch-py (torch's sources) or kjv (the King James Bible)
    glob: str | None = None  # relative to data.dir
    max_chars: int | None = None  # only the first this many characters (a slice, for fast tests)

    def check(self) -> None:
        _inside_dir(self, "glob")
        if self.max_chars is not None:
            _positive(self, "max_chars")
        if self.corpus is not None:
            known = ", ".join(sorted(CORPUS_NAMES))
            require(self.corpus in CORPUS_NAMES, "corpus", f"unknown corpus: one of {known}", self.corpus)
            require(self.glob is None, "glob", f"must be null when text.corpus = {self.corpus!r}", self.glob)


@dataclass
class TokenizerConfig(Section):
    """Byte-level BPE (Hugging Face tokenizers), trained on the training part of the text; or a
    model's own tokenizer.json from the local Hugging Face cache (`pretrained`, pipeline/hub.py)."""

    vocab_size: int = 2048  # at most this many tokens; 256: bytes alone, no merges
    pretrained: str | None = None  # hf:ORG/NAME[@REVISION]: its tokenizer.json (vocab_size unused)

    def check(self) -> None:
        require(256 <= self.vocab_size <= 65535, "vocab_size", "must be in [256, 65535]", self.vocab_size)
        if self.pretrained is not None:
            require_hub_name(self.pretrained, "pretrained")


@dataclass
class TokensDataConfig(Section):
    """A .npy file of token ids (any integer dtype), memory-mapped."""

    path: str | None = None  # relative to data.dir

    def check(self) -> None:
        _inside_dir(self, "path")


@dataclass
class DataConfig(Section):
    source: str = "synthetic"
    dir: str = "data"  # local inputs (a DVC dependency of the tokenizer and train stages)
    n_train_sequences: int = 20000  # synthetic only: sequences generated per seed
    eval_fraction: float = 0.05  # held out for evaluation
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    copies: CopiesConfig = field(default_factory=CopiesConfig)
    text: TextDataConfig = field(default_factory=TextDataConfig)
    tokens: TokensDataConfig = field(default_factory=TokensDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def check(self) -> None:
        require(
            self.source in DATA_SOURCES,
            "source",
            f"must be one of {', '.join(DATA_SOURCES)}",
            self.source,
        )
        _positive(self, "n_train_sequences")
        require(0.0 < self.eval_fraction < 1.0, "eval_fraction", "must be in (0, 1)", self.eval_fraction)
        if self.source == "text" and self.text.corpus is None:
            _required(self.text.glob, "text.glob", "data.source = 'text' and text.corpus is null")
        if self.source == "tokens":
            _required(self.tokens.path, "tokens.path", "data.source = 'tokens'")
        if self.source == "synthetic":  # its sequences are written once, before training
            start = self.copies.anneal_start
            require(start == 1.0, "copies.anneal_start", "applies to text and token streams only", start)


# --- train -------------------------------------------------------------------------


@dataclass
class TrainConfig(Section):
    source: str = "train"  # "train" a new model, or "load" a checkpoint
    # load: path under checkpoint_dir (.safetensors, .pt, .pth) with config.json beside it, or a
    # directory holding model.safetensors and config.json (TransformerLens 4.x's form);
    # "{seed}" in it maps each seed to its own file; or hf:ORG/NAME[@REVISION], a snapshot in the
    # local Hugging Face cache (pipeline/hub.py), the same model for every seed
    checkpoint: str | None = None
    checkpoint_dir: str = "checkpoints"  # a DVC dependency of train, like data.dir
    device: str = "auto"  # "auto": CUDA when present
    precision: str = "float32"  # PRECISIONS; tf32 and bf16 on CUDA only (pipeline/model/train.py)
    threads: int | None = None  # torch CPU threads; None: torch's default
    steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    warmup_steps: int = 100
    grad_clip: float = 1.0
    eval_every: int = 50  # steps between rows of curve.tsv
    eval_batch_size: int = 64
    probe_length: int = 24  # curve.tsv's induction score: spans of this many tokens, repeated
    # checkpoints through training (the dynamics stage): every `save_every` steps (0: none) and
    # at each of `save_steps` (denser around the phase change); the last step always
    save_every: int = 0
    save_steps: list[int] = field(default_factory=list)

    def require_probe_fits(self, n_ctx: int, whose: str) -> None:
        """curve.tsv's repeated probe fits in a context of `n_ctx`: params.yaml's model.n_ctx, or
        a loaded model's (`whose` names which)."""
        _fits_context("train.probe_length", self.probe_length, n_ctx, whose)

    def checkpoint_steps(self) -> list[int]:
        """The steps whose weights train saves: multiples of save_every, save_steps and the last."""
        periodic = range(0, self.steps + 1, self.save_every) if self.save_every else ()
        return sorted({*periodic, *self.save_steps, self.steps})

    def check(self) -> None:
        require(
            self.source in TRAIN_SOURCES, "source", f"must be one of {', '.join(TRAIN_SOURCES)}", self.source
        )
        require(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}", self.device)
        problem = f"must be one of {', '.join(PRECISIONS)}"
        require(self.precision in PRECISIONS, "precision", problem, self.precision)
        _positive(
            self, "steps", "batch_size", "lr", "grad_clip", "eval_every", "eval_batch_size", "probe_length"
        )
        require(self.weight_decay >= 0, "weight_decay", "must be >= 0", self.weight_decay)
        require(
            0 <= self.warmup_steps <= self.steps,
            "warmup_steps",
            f"must be in [0, steps = {self.steps}]",
            self.warmup_steps,
        )
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            "must be two numbers in [0, 1)",
            list(self.betas),
        )
        if self.threads is not None:
            _positive(self, "threads")
        require(
            self.save_every >= 0, "save_every", "must be >= 0 (0: no periodic checkpoints)", self.save_every
        )
        for i, step in enumerate(self.save_steps):
            problem = f"must be in [0, steps = {self.steps}] (a shorter run: set train.save_steps=[] too)"
            require(0 <= step <= self.steps, f"save_steps[{i}]", problem, step)
        if self.source == "load":
            _required(self.checkpoint, "checkpoint", "train.source = 'load'")
        if self.checkpoint is not None and self.checkpoint.startswith("hf:"):
            require_hub_name(self.checkpoint, "checkpoint")
        elif self.checkpoint is not None:
            name = PurePosixPath(self.checkpoint).name
            suffix = name.rsplit(".", 1)[-1] if "." in name else ""
            require(  # a name without a suffix is a directory: TransformerLens 4.x's form (origin.py)
                suffix in ("safetensors", "pt", "pth", ""),
                "checkpoint",
                "must end in .safetensors, .pt or .pth, or name a directory holding model.safetensors "
                "and config.json",
                self.checkpoint,
            )


# --- analysis ----------------------------------------------------------------------


@dataclass
class CompositionConfig(Section):
    baseline_samples: int = 200  # random matrices of the same shapes per score variant
    null_samples: int = 64  # random orthogonal rotations for the spectrum-preserving null
    # a pair composes (a discovery) at this false-discovery rate, Benjamini-Hochberg per kind and
    # measure, against the model's own empirical null (pipeline/circuits/significance.py)
    fdr: float = 0.05
    # a channel is a block of consecutive singular directions of a circuit whose values step down
    # by at most this fraction each (pipeline/circuits/channels.py; docs/maths.md, "Channels"):
    # within it the SVD's directions are arbitrary, so shares, the top channel and its ablation
    # are per block
    channel_tolerance: float = 0.01

    def check(self) -> None:
        _positive(self, "baseline_samples", "null_samples")
        require(0.0 < self.fdr < 1.0, "fdr", "must be in (0, 1)", self.fdr)
        require(
            0.0 <= self.channel_tolerance < 1.0,
            "channel_tolerance",
            "must be in [0, 1)",
            self.channel_tolerance,
        )


@dataclass
class CalibrationConfig(Section):
    """The calibrate stage: the composition test's false discoveries on nulls and its power on
    planted pairs (pipeline/circuits/calibration.py)."""

    surrogates: int = 4  # this model's later layers in random bases of the residual stream
    untrained: int = 4  # fresh initialisations of the model's shape
    # planted K composition, tried in this order until every measure finds it
    strengths: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0])
    claim_e_surrogates: int = 20  # claim (e)'s statistic on this many surrogates

    def check(self) -> None:
        _positive(self, "surrogates", "untrained", "claim_e_surrogates")
        require(len(self.strengths) > 0, "strengths", "must not be empty", self.strengths)
        for i, s in enumerate(self.strengths):
            require(0 < s <= 10, f"strengths[{i}]", "must be in (0, 10]", s)


@dataclass
class RoleThresholds(Section):
    """A head takes a role when its score (in [0, 1]) reaches the role's threshold.

    Its primary role: previous_token or induction if it takes one, else the role it takes
    with the highest score (pipeline/behaviour/heads.py `classify`); heads.csv flags every role it
    takes (`is_<role>`).
    """

    previous_token: float = 0.5  # score prev_token: attention i -> i-1
    recent_window: float = 0.5  # score recent_mass: attention on i-k..i-1 (k = heads.window_length)
    induction: float = 0.3  # score induction: prefix matching on the repeated probe
    duplicate_token: float = 0.3  # score duplicate_token: mass on earlier copies of the current token
    current_token: float = 0.5  # score current_token: attention i -> i
    first_token: float = 0.5  # score first_token: attention i -> 0

    def check(self) -> None:
        _fraction(self, *(f.name for f in fields(self)))


@dataclass
class HeadsConfig(Section):
    # per evaluation batch: the repeated probe, and held-out data (pipeline/data/datasets.py `repeated_probe`)
    eval_sequences: int = 64
    repeat_length: int = 24  # the probe: a span of this many tokens, then the same span again
    window_length: int = 4  # k: a recent-window head attends to i-k..i-1
    # top-source agreement counts a later head when its strongest ablation effect reaches this
    # (nats of loss, or induction score)
    min_effect: float = 0.01
    # the path ablation runs on this many disjoint held-out batches (and probes of their own):
    # an edge is causal when its effect exceeds their spread (pipeline/behaviour/agreement.py)
    ablation_batches: int = 3
    # a role's ablation is ranked among every other set of as many heads of the same layers (an
    # exact permutation test) when there are at most this many, else among this many drawn
    # uniformly (heads.role_ablation)
    placebo_sets: int = 1000
    thresholds: RoleThresholds = field(default_factory=RoleThresholds)

    def require_fits(self, n_ctx: int, whose: str) -> None:
        """The repeated probe and the recent window fit in a context of `n_ctx`: params.yaml's
        model.n_ctx, or a loaded model's (`whose` names which)."""
        _fits_context("analysis.heads.repeat_length", self.repeat_length, n_ctx, whose)
        k = self.window_length
        problem = f"must be < {whose} = {n_ctx} (a window of k earlier tokens needs k + 1 positions)"
        require(k < n_ctx, "analysis.heads.window_length", problem, k)

    def check(self) -> None:
        _positive(
            self, "eval_sequences", "repeat_length", "window_length", "ablation_batches", "placebo_sets"
        )
        require(self.min_effect >= 0, "min_effect", "must be >= 0", self.min_effect)


EDGE_CRITERIA = ("fdr", "z", "excess")


@dataclass
class FiguresConfig(Section):
    # errata diagram: which pairs get an edge, by a criterion that means the same in both panels
    # ("fdr": the discoveries at analysis.composition.fdr; "z": the raw, uncalibrated z against
    # the spectrum-preserving null > edge_z), or by the paper's absolute threshold on
    # score - baseline ("excess" > edge_threshold: the variants' scales differ up to ~30x)
    edges: str = "fdr"
    edge_z: float = 3.0
    edge_threshold: float = 0.05
    errata_variant: str = "errata_bcda_trueden"  # the "original" panel (docs/maths.md, "The denominators")
    dpi: int = 120

    def check(self) -> None:
        require(
            self.edges in EDGE_CRITERIA, "edges", f"must be one of {', '.join(EDGE_CRITERIA)}", self.edges
        )
        _positive(self, "edge_z", "dpi")
        require(self.edge_threshold >= 0, "edge_threshold", "must be >= 0", self.edge_threshold)
        require(
            self.errata_variant in ERRATA,
            "errata_variant",
            f"must be one of {', '.join(ERRATA)}",
            self.errata_variant,
        )


@dataclass
class CompareConfig(Section):
    """Across seeds: means with t intervals, sign counts and verdicts (pipeline/compare/stats.py)."""

    ci: float = 0.95  # confidence level of every interval
    min_seeds: int = 3  # a verdict (holds or fails) needs at least this many seeds, every one agreeing
    dpi: int = 120  # the compare figures (own key: figures params rerun only the figures stages)

    def check(self) -> None:
        require(0.0 < self.ci < 1.0, "ci", "must be in (0, 1)", self.ci)
        _positive(self, "min_seeds", "dpi")


@dataclass
class ReportConfig(Section):
    """The self-contained HTML report (pipeline/present/report.py)."""

    title: str = "attn-circuits: attention-head composition, original and corrected"


@dataclass
class AnalysisConfig(Section):
    composition: CompositionConfig = field(default_factory=CompositionConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    figures: FiguresConfig = field(default_factory=FiguresConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    # torch CPU threads of the composition, heads and dynamics stages (pipeline.cli.use_threads);
    # None: torch's default, one per physical core. Another count changes float rounding only.
    threads: int | None = None
    # where the composition stage's null products and the heads stage's path and role ablations
    # run (DEVICES; "auto": CUDA when present). Draws, frames and baselines stay on the CPU; on
    # CUDA the results equal the CPU's to float64 rounding (docs/experiments.md), not bit for bit.
    device: str = "cpu"

    def check(self) -> None:
        if self.threads is not None:
            _positive(self, "threads")
        require(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}", self.device)


# --- root --------------------------------------------------------------------------


@dataclass
class Config(Section):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # the conf/setup/ option that composed it: a label for `dvc exp show` (no stage reads it)
    setup: str = "kjv-anneal"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])

    def check(self) -> None:
        require(len(self.seeds) > 0, "seeds", "must list at least one seed", list(self.seeds))
        require(len(set(self.seeds)) == len(self.seeds), "seeds", "must not repeat a seed", list(self.seeds))
        require(all(s >= 0 for s in self.seeds), "seeds", "must be >= 0", list(self.seeds))
        if self.train.source == "load":
            return  # `model` is unused: the train and heads stages check these against the loaded model
        self.analysis.heads.require_fits(self.model.n_ctx, "model.n_ctx")
        self.train.require_probe_fits(self.model.n_ctx, "model.n_ctx")
        if self.data.source == "text" and self.data.tokenizer.pretrained is None:  # else: at least its
            # tokenizer's size, which only the tokenizer stage knows (pipeline/data/datasets.py load_text)
            vocab = self.data.tokenizer.vocab_size
            problem = f"must equal data.tokenizer.vocab_size = {vocab} (the text source's tokens)"
            require(self.model.d_vocab == vocab, "model.d_vocab", problem, self.model.d_vocab)


def notes(cfg: Config, section: str = "") -> list[str]:
    """One-line notes (for stderr) on names a config gives that nothing reads: a checkpoint while
    train.source = train (a model is trained from scratch), a pretrained tokenizer while
    data.source is not text. Notes, not refusals: keeping a name while switching the source off
    and on is how `train=load` is toggled, and editing an unused checkpoint reruns only the origin
    stages (docs/bad-inputs.md). `section`: only the notes on keys under it ("train", "data")."""
    found = []  # only the asked section's keys are read: a stage's DVC params name what it reads
    if section in ("", "train") and cfg.train.source != "load" and cfg.train.checkpoint is not None:
        t = cfg.train
        found.append(
            f"note: train.checkpoint = {t.checkpoint!r} is unused: train.source = {t.source!r} trains "
            "a model from scratch (train=load, or train.source=load, loads the checkpoint)"
        )
    if section in ("", "data") and cfg.data.source != "text" and cfg.data.tokenizer.pretrained is not None:
        d = cfg.data
        found.append(
            f"note: data.tokenizer.pretrained = {d.tokenizer.pretrained!r} is unused: data.source = "
            f"{d.source!r} is not tokenized (data.source=text reads text through it)"
        )
    return found
