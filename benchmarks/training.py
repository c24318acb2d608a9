"""Training speed, measured side by side in one run on the default config (not a test).

1. Throughput: tokens per second of one training step (forward, backward, AdamW step,
   gradient clipping) of our model and of TransformerLens 3.9's HookedTransformer with
   the same shapes and the same batches, alternating in rounds; the median of each.
   Target: ours >= 1.5x TransformerLens. `--also REV` adds our model at a git revision
   (pipeline/model/transformer.py at REV), measured in the same rounds.
2. Induction: the real training (`pipeline.model.train.train`) of each seed; the step and the
   wall seconds at which the best layer-1 head's induction score first reaches 0.5
   (curve.tsv's probe, as the heads stage measures it), and the final scores.
   Target: within 60 s of wall time per seed on 2 cores.
3. CUDA (where a GPU is present, or --cuda): tokens per second of our training step on the GPU
   under each train.precision (float32, tf32, bf16 autocast), at the config's shape and batch
   (`--override setup=paper` for the paper's), and the model FLOP utilisation: 6 x the matmul
   parameters + 12 x layers x n_ctx x (heads x d_head) per token (forward and backward; the
   embedding is a lookup), over the GPU's dense peak for that precision (`--peak-tflops`, or
   the H100/H200 datasheet's 67 / 495 / 989 TFLOP/s). Target: >= 2M tokens/s at the paper's shape.

    python benchmarks/training.py                      # seeds of params.yaml
    python benchmarks/training.py --seeds 0 1 2 3 4 --threads 1
    python benchmarks/training.py --override setup=kjv --also main~10 --skip-induction
    python benchmarks/training.py --override setup=paper --skip-induction --rounds 3   # on a GPU: CUDA rows
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import io, params  # noqa: E402
from pipeline.data import tokenizer  # noqa: E402
from pipeline.model import train  # noqa: E402
from pipeline.model.tl_checkpoint import tl_config  # noqa: E402
from pipeline.model.transformer import Transformer, next_token_loss  # noqa: E402

TARGET_RATIO = 1.5
TARGET_SECONDS = 60.0
TARGET_CUDA_TOKENS = 2e6
# dense TFLOP/s of an H100 / H200 SXM by train.precision (datasheet; bf16 and tf32 without sparsity)
PEAK_TFLOPS = {"float32": 67.0, "tf32": 494.5, "bf16": 989.5}


def hooked_transformer(cfg):
    """TransformerLens's model with our model's shape (None when it is not installed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        return None
    config = {k: v for k, v in tl_config(cfg).items() if k != "eps"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HookedTransformer(HookedTransformerConfig(**config, seed=0))


def step_seconds(model, batches: list[torch.Tensor], lr: float, precision: str = "float32") -> float:
    """Seconds per training step over `batches` (after two warm-up steps), as `train.train` steps:
    bf16 autocast when `precision` says so (the caller sets tf32), the GPU synchronised on CUDA."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    device = batches[0].device

    def step(batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = next_token_loss(model(batch), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for batch in batches[:2]:
        step(batch)
    sync()
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    sync()
    return (time.perf_counter() - start) / len(batches)


def model_at(revision: str):
    """The transformer module as it was at a git revision, as a module (never imported as
    pipeline.model.transformer). It lived in pipeline/model.py before the subpackages."""
    for path in ("pipeline/model/transformer.py", "pipeline/model.py"):
        show = ["git", "show", f"{revision}:{path}"]
        shown = subprocess.run(show, cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"--also {revision}: no transformer module at that revision")
    module = types.ModuleType(f"model_at_{revision}")
    exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def throughput(cfg, rounds: int, steps: int, also: list[str] = ()) -> list[tuple[str, float]]:
    t, m = cfg.train, cfg.model
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, m.d_vocab, (t.batch_size, m.n_ctx), generator=gen) for _ in range(steps)]
    torch.manual_seed(0)
    models = {"ours": Transformer(m)}
    for revision in also:
        torch.manual_seed(0)
        models[f"ours at {revision}"] = model_at(revision).Transformer(m)
    theirs = hooked_transformer(m)
    if theirs is not None:
        models["TransformerLens 3.9"] = theirs
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):  # alternate, so that load on the machine hits both alike
        for name, model in models.items():
            times[name].append(step_seconds(model, batches, t.lr))
    tokens = t.batch_size * m.n_ctx
    return [(name, tokens / statistics.median(ts)) for name, ts in times.items()]


def flops_per_token(m) -> float:
    """Training FLOPs per token: 6 x the matmul parameters (W_Q, W_K, W_V, W_O per layer, W_U)
    plus the attention scores and mixing, 12 x layers x n_ctx x heads x d_head (forward and
    backward; Kaplan et al. 2020's count, the causal mask's halving not taken)."""
    attn = m.n_heads * m.d_head
    params = m.n_layers * 4 * m.d_model * attn + m.d_model * m.d_vocab
    return 6 * params + 12 * m.n_layers * m.n_ctx * attn


def cuda_throughput(cfg, rounds: int, steps: int) -> list[tuple[str, float]]:
    """Tokens/s of our training step on CUDA under each train.precision (as train._setup sets it),
    the median of `rounds`, the precisions alternating."""
    from pipeline.config import PRECISIONS

    t, m = cfg.train, cfg.model
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, m.d_vocab, (t.batch_size, m.n_ctx), generator=gen).to(device) for _ in range(steps)
    ]
    torch.manual_seed(0)
    model = Transformer(m).to(device)

    def seconds(precision: str) -> float:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        return step_seconds(model, batches, t.lr, precision)

    times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for _ in range(rounds):
        for precision in PRECISIONS:
            times[precision].append(seconds(precision))
    tokens = t.batch_size * m.n_ctx
    return [(precision, tokens / statistics.median(ts)) for precision, ts in times.items()]


def tokenized(cfg, directory: Path) -> Path | None:
    """The tokenizer stage's output for a text config, written into `directory` (else None)."""
    result, manifest = tokenizer.from_config(cfg.data, cfg.model.n_ctx)
    if result is None:
        return None
    io.write_npy(directory / "tokens.npy", result.tokens)
    io.write_json(directory / "manifest.json", manifest)
    return directory


def induction(cfg, seeds: list[int]) -> list[dict]:
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="attn-circuits-bench-"))
    text = tokenized(cfg, scratch)
    for seed in seeds:
        cpu = time.process_time()
        result = train.train(cfg, seed, text, progress=False)
        curve = result.curve
        reached = [i for i, v in enumerate(curve["induction"]) if v >= train.INDUCTION_THRESHOLD]
        first = reached[0] if reached else None
        rows.append(
            {
                "seed": seed,
                "step": int(curve["step"].iloc[first]) if first is not None else None,
                "wall_s": result.eval_seconds[first] if first is not None else None,
                "total_s": result.seconds,
                "cpu_s": time.process_time() - cpu,
                "induction": float(curve["induction"].iloc[-1]),
                "prev_token": float(curve["prev_token"].iloc[-1]),
            }
        )
        print(f"  seed {seed}: done in {result.seconds:.0f} s", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument(
        "--override", nargs="*", default=None, help="compose conf/ with these overrides instead of --params"
    )
    parser.add_argument(
        "--also", nargs="*", default=[], help="git revisions of pipeline/model/transformer.py to measure too"
    )
    parser.add_argument("--seeds", type=int, nargs="*", help="default: the seeds of params.yaml")
    parser.add_argument(
        "--threads", type=int, help="torch CPU threads (default: train.threads, else torch's)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="throughput: alternating rounds per model")
    parser.add_argument("--steps", type=int, default=20, help="throughput: timed steps per round")
    parser.add_argument("--skip-induction", action="store_true")
    parser.add_argument("--cuda", action="store_true", help="the CUDA rows (default: when a GPU is present)")
    parser.add_argument("--skip-cpu", action="store_true", help="only the CUDA rows")
    parser.add_argument(
        "--peak-tflops", type=float, nargs=3, metavar=("FP32", "TF32", "BF16"), help="the GPU's dense peaks"
    )
    args = parser.parse_args()

    if args.override is not None:
        cfg = params.from_dict(params.compose(args.override, conf_dir=ROOT / "conf"), source="override")
    else:
        cfg = params.load(args.params)
    if args.threads is not None:
        cfg.train.threads = args.threads
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    torch.use_deterministic_algorithms(True)  # as training runs, for both models
    m, t = cfg.model, cfg.train
    print(
        f"model: {m.n_layers} layers x {m.n_heads} heads x {m.d_head}, "
        f"d_model {m.d_model}, n_ctx {m.n_ctx}, d_vocab {m.d_vocab}, "
        f"{m.positional_embedding_type}, norm {m.normalization_type}; batch {t.batch_size}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )

    torch.utils.deterministic.fill_uninitialized_memory = False  # as pipeline.model.train runs
    if not args.skip_cpu:
        speeds = throughput(cfg, args.rounds, args.steps, args.also)
        ours = speeds[0][1]
        print("\n| model | tokens/s | ours / model |\n|---|---:|---:|")
        for name, speed in speeds:
            print(f"| {name} | {speed:,.0f} | {ours / speed:.2f}x |")
        tl = [speed for name, speed in speeds if name.startswith("TransformerLens")]
        if tl:
            ratio = ours / tl[0]
            print(
                f"\nthroughput vs TransformerLens: {ratio:.2f}x (target >= {TARGET_RATIO}x): "
                f"{'met' if ratio >= TARGET_RATIO else 'NOT met'}"
            )
    if args.cuda or torch.cuda.is_available():
        import os

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as train._setup, before CUDA starts
        torch.use_deterministic_algorithms(True, warn_only=True)
        peaks = dict(zip(PEAK_TFLOPS, args.peak_tflops, strict=True)) if args.peak_tflops else PEAK_TFLOPS
        flops = flops_per_token(m)
        name = torch.cuda.get_device_name()
        print(
            f"\nCUDA ({name}), batch {t.batch_size} x n_ctx {m.n_ctx}, {flops / 1e6:.0f} MFLOP per token\n"
            "| train.precision | tokens/s | TFLOP/s | MFU (of the dense peak) |\n|---|---:|---:|---:|"
        )
        speeds = cuda_throughput(cfg, args.rounds, args.steps)
        for precision, speed in speeds:
            tflops = speed * flops / 1e12
            print(f"| {precision} | {speed:,.0f} | {tflops:.1f} | {tflops / peaks[precision]:.1%} |")
        best = max(speed for _, speed in speeds)
        print(
            f"\nbest CUDA throughput {best:,.0f} tokens/s (target >= {TARGET_CUDA_TOKENS:,.0f}): "
            f"{'met' if best >= TARGET_CUDA_TOKENS else 'NOT met'}"
        )

    if not args.skip_induction:
        seeds = args.seeds if args.seeds is not None else list(cfg.seeds)
        rows = induction(cfg, seeds)
        print(
            f"\n| seed | step at induction >= 0.5 | wall s at 0.5 | wall s (all {t.steps} steps) | CPU s | "
            f"final induction | final prev-token | wall s at 0.5 / {TARGET_SECONDS:.0f} s |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        for r in rows:
            at = f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "never"
            ratio = f"{r['wall_s'] / TARGET_SECONDS:.2f}" if r["wall_s"] is not None else "-"
            print(
                f"| {r['seed']} | {r['step'] if r['step'] is not None else 'never'} | {at} | "
                f"{r['total_s']:.1f} | "
                f"{r['cpu_s']:.1f} | {r['induction']:.2f} | {r['prev_token']:.2f} | {ratio} |"
            )
        ok = all(r["wall_s"] is not None and r["wall_s"] <= TARGET_SECONDS for r in rows)
        print(f"\ninduction within {TARGET_SECONDS:.0f} s in every seed: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
