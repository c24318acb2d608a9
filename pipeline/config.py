"""Schemas of `params.yaml`: one dataclass per config group (`conf/<group>/`).

OmegaConf (Hydra's config library) checks keys and types when `params.yaml` is
merged into these schemas (`pipeline.params.load`); each section's `validate`
then checks values and combinations, naming the key. `None` means "unset".

This module holds only dataclasses and plain checks, so every stage can import
it without importing torch or the code of other stages (DVC deps stay exact).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath

from pipeline.errors import UserError, require

POSITIONAL_EMBEDDINGS = ("standard", "shortformer")
NORMALIZATIONS = (None, "LN")
DATA_SOURCES = ("synthetic", "text", "tokens")
TRAIN_SOURCES = ("train", "load")
DEVICES = ("auto", "cpu", "cuda")


def _positive(section: object, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(value > 0, name, value, "must be > 0")


def _required(value: object, key: str, when: str) -> None:
    """A key that must be set (not null) when `when` holds."""
    if value is None:
        raise UserError(key, f"is required when {when}")


def _inside_dir(section: object, name: str) -> None:
    """A path or glob relative to data.dir that cannot leave it (DVC tracks only data.dir)."""
    value = getattr(section, name)
    if value is not None:
        require(value.strip() != "", name, value, "must not be empty")
        require(
            not PurePosixPath(value).is_absolute() and ".." not in PurePosixPath(value).parts,
            name,
            value,
            "must be relative to data.dir, without '..'",
        )


def _fraction(section: object, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        require(0.0 <= value <= 1.0, name, value, "must be in [0, 1]")


class Section:
    """A config section: `check()` validates its own values, naming keys relative to it."""

    def check(self) -> None:  # overridden where a section has rules
        pass

    def validate(self, prefix: str = "") -> None:
        """Check this section and every nested section, with keys under `prefix` (none at the root)."""
        try:
            self.check()
        except UserError as e:
            raise e.under(prefix) from None
        for f in fields(self):  # type: ignore[arg-type]
            child = getattr(self, f.name)
            if isinstance(child, Section):
                child.validate(f"{prefix}.{f.name}" if prefix else f.name)


# --- model -------------------------------------------------------------------------


@dataclass
class ModelConfig(Section):
    """An attention-only transformer; field names are HookedTransformerConfig's."""

    n_layers: int = 2
    n_heads: int = 8
    d_head: int = 8
    d_model: int = 64
    n_ctx: int = 64
    d_vocab: int = 64
    positional_embedding_type: str = "shortformer"  # "standard": added to the residual stream
    normalization_type: str | None = None  # None or "LN" (pre-LN, TransformerLens placement)
    use_bias: bool = True  # False: b_Q, b_K, b_V, b_O, b_U stay zero (still saved, for interop)
    init_range: float | None = None  # std of weight init; None: 0.8 / sqrt(d_model) as TransformerLens

    def check(self) -> None:
        _positive(self, "n_layers", "n_heads", "d_head", "d_model", "n_ctx", "d_vocab")
        # composition, induction and the ablation all need a head that reads an earlier one
        require(
            self.n_layers >= 2,
            "n_layers",
            self.n_layers,
            "must be >= 2: composition needs an earlier and a later layer",
        )
        require(
            self.positional_embedding_type in POSITIONAL_EMBEDDINGS,
            "positional_embedding_type",
            self.positional_embedding_type,
            f"must be one of {', '.join(POSITIONAL_EMBEDDINGS)}",
        )
        if self.normalization_type in ("none", "None"):
            self.normalization_type = None
        require(
            self.normalization_type in NORMALIZATIONS,
            "normalization_type",
            self.normalization_type,
            "must be null (none) or 'LN'",
        )
        require(
            self.n_heads * self.d_head <= self.d_model,
            "d_head",
            self.d_head,
            f"n_heads x d_head = {self.n_heads} x {self.d_head} = {self.n_heads * self.d_head} "
            f"exceeds d_model = {self.d_model}: heads would not be low-rank",
        )
        if self.init_range is not None:
            _positive(self, "init_range")


# --- data --------------------------------------------------------------------------


@dataclass
class SyntheticDataConfig(Section):
    """Seeded sequences, written left to right: background "topic" segments (local
    structure) interrupted by copies of earlier spans (pipeline.data explains why)."""

    topics: int = 8  # the vocabulary is split at random into this many topics
    min_segment: int = 3  # background segments (one topic each) are this many positions long
    max_segment: int = 8
    topic_fraction: float = 0.7  # a background token is from the segment's topic with this probability
    copy_rate: float = 0.2  # probability that a copy starts at a position not already copying
    min_span: int = 4  # copied spans are this many tokens long
    max_span: int = 10
    min_distance: int = 2  # a copy's source is at least this far back (and at most the whole context)

    def check(self) -> None:
        _positive(self, "topics", "min_segment", "max_segment", "min_span", "max_span", "min_distance")
        _fraction(self, "topic_fraction", "copy_rate")
        for low, high in (("min_segment", "max_segment"), ("min_span", "max_span")):
            require(
                getattr(self, low) <= getattr(self, high),
                low,
                getattr(self, low),
                f"must be <= {high} = {getattr(self, high)}",
            )


@dataclass
class TextDataConfig(Section):
    """Local text files, byte-level tokens (d_vocab >= 256)."""

    glob: str | None = None  # relative to data.dir

    def check(self) -> None:
        _inside_dir(self, "glob")


@dataclass
class TokensDataConfig(Section):
    """A .npy file of token ids (any integer dtype), memory-mapped."""

    path: str | None = None  # relative to data.dir

    def check(self) -> None:
        _inside_dir(self, "path")


@dataclass
class DataConfig(Section):
    source: str = "synthetic"
    dir: str = "data"  # local inputs (a DVC dependency of train)
    n_train_sequences: int = 20000  # synthetic only: sequences generated per seed
    eval_fraction: float = 0.05  # held out for evaluation
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    text: TextDataConfig = field(default_factory=TextDataConfig)
    tokens: TokensDataConfig = field(default_factory=TokensDataConfig)

    def check(self) -> None:
        require(
            self.source in DATA_SOURCES,
            "source",
            self.source,
            f"must be one of {', '.join(DATA_SOURCES)}",
        )
        _positive(self, "n_train_sequences")
        require(0.0 < self.eval_fraction < 1.0, "eval_fraction", self.eval_fraction, "must be in (0, 1)")
        if self.source == "text":
            _required(self.text.glob, "text.glob", "data.source = 'text'")
        if self.source == "tokens":
            _required(self.tokens.path, "tokens.path", "data.source = 'tokens'")


# --- train -------------------------------------------------------------------------


@dataclass
class TrainConfig(Section):
    source: str = "train"  # "train" a new model, or "load" a checkpoint
    # load: path under checkpoint_dir (.safetensors, .pt, .pth) with config.json beside it;
    # "{seed}" in it maps each seed to its own file
    checkpoint: str | None = None
    checkpoint_dir: str = "checkpoints"  # a DVC dependency of train, like data.dir
    device: str = "auto"  # "auto": CUDA when present
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

    def check(self) -> None:
        require(
            self.source in TRAIN_SOURCES, "source", self.source, f"must be one of {', '.join(TRAIN_SOURCES)}"
        )
        require(self.device in DEVICES, "device", self.device, f"must be one of {', '.join(DEVICES)}")
        _positive(
            self, "steps", "batch_size", "lr", "grad_clip", "eval_every", "eval_batch_size", "probe_length"
        )
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        require(
            0 <= self.warmup_steps <= self.steps,
            "warmup_steps",
            self.warmup_steps,
            f"must be in [0, steps = {self.steps}]",
        )
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            list(self.betas),
            "must be two numbers in [0, 1)",
        )
        if self.threads is not None:
            _positive(self, "threads")
        if self.source == "load":
            _required(self.checkpoint, "checkpoint", "train.source = 'load'")
        if self.checkpoint is not None:
            suffix = self.checkpoint.rsplit(".", 1)[-1] if "." in self.checkpoint else ""
            require(
                suffix in ("safetensors", "pt", "pth"),
                "checkpoint",
                self.checkpoint,
                "must end in .safetensors, .pt or .pth",
            )


# --- analysis ----------------------------------------------------------------------


@dataclass
class CompositionConfig(Section):
    baseline_samples: int = 200  # random matrices of the same shapes per score variant
    null_samples: int = 64  # random orthogonal rotations for the spectrum-preserving null
    # reproduce the bug in the denominators too (||W_K W_Q^T|| for ||W_Q^T W_K||)
    errata_rotate_denominators: bool = True

    def check(self) -> None:
        _positive(self, "baseline_samples", "null_samples")


@dataclass
class RoleThresholds(Section):
    """A head takes a role when its score (in [0, 1]) reaches the role's threshold.

    Its primary role: previous_token or induction if it takes one, else the role it takes
    with the highest score (pipeline/heads.py `classify`); heads.csv flags every role it
    takes (`is_<role>`).
    """

    previous_token: float = 0.5  # prev_token: attention i -> i-1
    recent_window: float = 0.5  # recent_window: mass on i-k..i-1 (k = heads.recent_window)
    induction: float = 0.3  # induction: prefix matching on repeated random tokens
    duplicate_token: float = 0.3  # duplicate_token: mass on earlier copies of the current token
    current_token: float = 0.5  # current_token: attention i -> i
    first_token: float = 0.5  # first_token: attention i -> 0

    def check(self) -> None:
        _fraction(self, *(f.name for f in fields(self)))


@dataclass
class HeadsConfig(Section):
    eval_sequences: int = 64  # per evaluation batch: repeated random tokens, and held-out data
    repeat_length: int = 24  # each is a random span of this many tokens, then the same again
    recent_window: int = 4  # k: a recent-window head attends to i-k..i-1
    thresholds: RoleThresholds = field(default_factory=RoleThresholds)

    def check(self) -> None:
        _positive(self, "eval_sequences", "repeat_length", "recent_window")


@dataclass
class FiguresConfig(Section):
    edge_threshold: float = 0.05  # errata diagram: draw pairs whose score - baseline exceeds this
    errata_variant: str = "errata_bcda"  # the "original" panel: errata_bcda or errata_dabc
    dpi: int = 120

    def check(self) -> None:
        _fraction(self, "edge_threshold")
        _positive(self, "dpi")
        require(
            self.errata_variant in ("errata_bcda", "errata_dabc"),
            "errata_variant",
            self.errata_variant,
            "must be errata_bcda or errata_dabc",
        )


@dataclass
class CompareConfig(Section):
    """Across seeds: means with percentile-bootstrap confidence intervals (pipeline/compare.py)."""

    ci: float = 0.95  # confidence level of every interval
    bootstrap_samples: int = 10000  # resamples of the seeds
    bootstrap_seed: int = 0  # the resampling is seeded: same inputs, same intervals
    z_threshold: float = 3.0  # claim (b): a composition "shows" when its z against the null exceeds this
    dpi: int = 120  # the compare figures (own key: figures params rerun only the figures stages)

    def check(self) -> None:
        require(0.0 < self.ci < 1.0, "ci", self.ci, "must be in (0, 1)")
        _positive(self, "bootstrap_samples", "dpi")
        require(self.bootstrap_seed >= 0, "bootstrap_seed", self.bootstrap_seed, "must be >= 0")


@dataclass
class ReportConfig(Section):
    """The self-contained HTML report (pipeline/report.py)."""

    title: str = "attn-circuits: attention-head composition, original and corrected"


@dataclass
class AnalysisConfig(Section):
    composition: CompositionConfig = field(default_factory=CompositionConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    figures: FiguresConfig = field(default_factory=FiguresConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    report: ReportConfig = field(default_factory=ReportConfig)


# --- root --------------------------------------------------------------------------


@dataclass
class Config(Section):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])

    def check(self) -> None:
        require(len(self.seeds) > 0, "seeds", list(self.seeds), "must list at least one seed")
        require(len(set(self.seeds)) == len(self.seeds), "seeds", list(self.seeds), "must not repeat a seed")
        require(all(s >= 0 for s in self.seeds), "seeds", list(self.seeds), "must be >= 0")
        if self.train.source == "load":
            return  # `model` is unused: the train and heads stages check these against the loaded model
        for key, length in (
            ("analysis.heads.repeat_length", self.analysis.heads.repeat_length),
            ("train.probe_length", self.train.probe_length),
        ):
            need = 2 * length + 1
            require(
                need <= self.model.n_ctx,
                key,
                length,
                f"a repeated sequence (1 + 2 x {length} = {need} tokens) does not fit in model.n_ctx = {self.model.n_ctx}",
            )
        k = self.analysis.heads.recent_window
        require(
            k < self.model.n_ctx,
            "analysis.heads.recent_window",
            k,
            f"must be < model.n_ctx = {self.model.n_ctx} (a window of k earlier tokens needs k + 1 positions)",
        )
