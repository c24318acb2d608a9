"""Benchmark: all-pairs Q-, K- and V-composition scores, ours vs TransformerLens 3.9 vs dense float64.

    python benchmarks/composition.py            # both models (about 10-15 minutes on 2 cores)
    python benchmarks/composition.py --quick    # the small model only (seconds)
    python benchmarks/composition.py --quick --huge   # the small model and (c), 1,200 heads (minutes)
    python benchmarks/composition.py --skip-tl --full-threads 2   # full on 1 and on 2 threads, side by side
    python benchmarks/composition.py --quick --skip-tl --cuda   # and on CUDA (the default where a GPU is)

Models, random Gaussian weights, seeded:
  (a) the default model shape (pipeline.config.ModelConfig: 2 layers x 8 heads, d_model 64, d_head 8)
  (b) 12 layers x 12 heads, d_model 768, d_head 64 (GPT-2-small-sized heads)
  (c) 48 layers x 25 heads, d_model 1600, d_head 64 (GPT-2-XL-sized: 1,200 heads), with --huge

Methods, on the same weights in the same run:
  ours      `pipeline.circuits.composition.true_scores` for Q, K, V (float64), exact: each pair's
            squared norm is a dot product of packed Gram matrices (`strands.gram_vectors`) on
            (b), of d_head x d_head blocks of one GEMM on (a), whichever costs fewer
            multiply-adds. Only the true scores, as that is what TransformerLens computes.
  TL 3.9    `HookedTransformer.all_composition_scores(kind)` for Q, K, V (float32, its default).
            On (b) it materialises [12, 12, 12, 12, 64, 768] float32 operands (~4 GB each), so
            each kind runs in its own subprocess (wall times summed, peak = the largest) and it
            is skipped, with a message, unless the machine has 12 GB available. On (c) its
            operands would be [48, 25, 48, 25, 64, 1600] float32, ~590 GB per kind: skipped.
  dense     float64 products OV^a @ QK^b (d_model x d_model) and their Frobenius norms. On (b)
            that is 9504 pairs x 3 kinds of 768^3 products, so it runs on a seeded subset of
            pairs and its full time is extrapolated (marked ~). Max |diff| of every method is
            measured against dense on the pairs dense computed.
  channels  the channel tables the composition stage adds (`channel_null.channel_rows` of the later
            and the placebo pairs, every kind, `null_samples` 64 rotation draws), as a share of
            full's time (target: at most a third more).
  full      `composition_scores` at the default CompositionConfig: all kinds and variants,
            the random-matrix baselines and the rotated-writer null (z). Reported on its own line.
            On (c) it runs on the first `full_layers` layers (all their pairs, the same per-pair
            work) and its time is extrapolated by the number of pairs (marked ~); its peak
            memory is that run's. With --full-threads N it runs again on N threads, in the
            same run, and the speed-up over one thread is printed (`analysis.threads`). Where
            a GPU is present (or with --cuda) it runs once more on CUDA (`analysis.device`), with
            the largest difference of its scores and z from the CPU run's.

Wall seconds: the best of a few repeats (one repeat for the slow ones), computation only
(loading weights is not timed), one torch thread in every child by default (`--threads`):
the machine is shared, and one thread keeps the methods comparable run to run.

Peak memory: every method runs in a fresh subprocess that imports the same libraries
(torch, transformer_lens, pipeline), loads the weights in the form the method uses, runs,
and reports `resource.getrusage(RUSAGE_SELF).ru_maxrss`; we subtract the peak RSS of an
idle subprocess that only imported those libraries. So "peak MB" is what the method needs
on top of the libraries, including its own copy of the weights (and converting them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KINDS = ("Q", "K", "V")
DENSE_PAIRS = 96


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    dense_pairs: int = DENSE_PAIRS  # per kind, when the model has more pairs than this
    full_layers: int | None = None  # the full analysis on these first layers only, extrapolated

    @property
    def n_pairs(self) -> int:
        return self.n_heads**2 * self.n_layers * (self.n_layers - 1) // 2


def default_shape() -> Shape:
    from pipeline.config import ModelConfig

    m = ModelConfig()
    return Shape("(a) default", m.n_layers, m.n_heads, m.d_model, m.d_head)


LARGE = Shape("(b) 12x12", 12, 12, 768, 64)
# the full analysis on 3 layers: 1,875 pairs per kind of 705,000
HUGE = Shape("(c) 48x25", 48, 25, 1600, 64, dense_pairs=24, full_layers=3)


# --- child processes: one method each ----------------------------------------------


def _import_libraries() -> None:
    """The same imports in every child, so the idle child's RSS is a fair baseline."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import transformer_lens  # noqa: F401

    import pipeline.circuits.composition  # noqa: F401
    import pipeline.circuits.weights  # noqa: F401


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _pairs(shape: Shape, limit: int | None):
    """All (i, h, j, g) with j > i, or a seeded subset of `limit` of them."""
    import numpy as np

    axes = (np.arange(n) for n in (shape.n_layers, shape.n_heads) * 2)
    i, h, j, g = (x.ravel() for x in np.meshgrid(*axes, indexing="ij"))
    keep = j > i
    pairs = np.stack([i[keep], h[keep], j[keep], g[keep]], 1)
    if limit is not None and len(pairs) > limit:
        pairs = pairs[np.sort(np.random.default_rng(0).choice(len(pairs), limit, replace=False))]
    return pairs


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def child(
    method: str, shape: Shape, weights: str, out: str, kinds: str, repeats: int, layers: int | None
) -> dict:
    _import_libraries()
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from pipeline.circuits import composition
    from pipeline.circuits.weights import from_state_dict
    from pipeline.config import CompositionConfig

    if method == "idle":
        return {"peak_mb": _peak_mb()}
    state = load_file(weights)
    if layers is not None:  # the model's first `layers` layers
        state = {
            k: v for k, v in state.items() if not k.startswith("blocks.") or int(k.split(".")[1]) < layers
        }
        shape = dataclasses.replace(shape, n_layers=layers)
    L, H = shape.n_layers, shape.n_heads
    scores = np.full((3, L, H, L, H), np.nan)
    result: dict = {}

    if method == "ours":
        hw = from_state_dict(state)  # float64

        del state

        def run() -> None:
            for k, s in composition.true_scores(hw, kinds).items():
                scores[KINDS.index(k)] = s.numpy()

        result["wall_s"] = _best_of(run, repeats)

    elif method in ("full", "full_cuda"):
        from pipeline.cli import keep_freed_memory

        keep_freed_memory()  # as the composition stage runs
        hw = from_state_dict(state)
        device = "cuda" if method == "full_cuda" else None  # analysis.device
        frames = []

        def run() -> None:
            frames[:] = [composition.composition_scores(hw, CompositionConfig(), seed=0, device=device)]
            if device:
                torch.cuda.synchronize()

        result["wall_s"] = _best_of(run, repeats)
        scores = frames[0][["score", "z"]].to_numpy()  # compared across devices by the parent
        if device:
            result["gpu"] = torch.cuda.get_device_name()
            result["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20

    elif method == "channels":
        from pipeline.circuits import channel_null

        hw = from_state_dict(state)

        def run() -> None:  # the composition stage's channel tables: later and placebo pairs, 3 kinds
            gen = torch.Generator().manual_seed(0)
            cfg = CompositionConfig()
            rotations = channel_null.channel_blocks(cfg.null_samples, hw.d_model, hw.d_head, gen)
            channel_null.channel_rows(hw, rotations, cfg.channel_tolerance)
            channel_null.channel_rows(hw, rotations, cfg.channel_tolerance, placebo=True)

        result["wall_s"] = _best_of(run, repeats)

    elif method == "tl":
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        cfg = HookedTransformerConfig(
            n_layers=L, n_heads=H, d_model=shape.d_model, d_head=shape.d_head, n_ctx=4, d_vocab=8,
            attn_only=True, normalization_type=None, positional_embedding_type="standard", seed=0,
        )  # fmt: skip
        model = HookedTransformer(cfg)
        own = model.state_dict()
        with torch.no_grad():
            for name, t in state.items():
                own[name].copy_(t)
        del state

        def run() -> None:
            for k in kinds:
                with torch.no_grad():
                    s = model.all_composition_scores(k).double().numpy()
                later = np.arange(L)[:, None, None, None] < np.arange(L)[None, None, :, None]
                scores[KINDS.index(k)] = np.where(later, s, np.nan)  # TL writes 0 where we write NaN

        result["wall_s"] = _best_of(run, repeats)

    elif method == "dense":
        hw = from_state_dict(state)
        pairs = _pairs(shape, shape.dense_pairs)
        n = torch.linalg.matrix_norm

        def run() -> None:
            for k in kinds:
                for chunk in np.array_split(pairs, max(1, len(pairs) // 16)):  # 16 pairs at a time
                    i, h, j, g = (torch.as_tensor(c) for c in chunk.T)
                    OV = hw.W_V[i, h] @ hw.W_O[i, h]  # [chunk, d_model, d_model]
                    right = {
                        "Q": hw.W_Q[j, g] @ hw.W_K[j, g].mT,  # QK^b
                        "K": hw.W_K[j, g] @ hw.W_Q[j, g].mT,  # QK^bT
                        "V": hw.W_V[j, g] @ hw.W_O[j, g],  # OV^b
                    }[k]
                    score = n(OV @ right) / (n(OV) * n(right))
                    scores[KINDS.index(k), chunk[:, 0], chunk[:, 1], chunk[:, 2], chunk[:, 3]] = score.numpy()

        result["wall_s"] = _best_of(run, repeats)
        result["pairs_per_kind"] = len(pairs)
    else:
        raise SystemExit(f"unknown method {method!r}")

    np.save(out, scores)
    result["peak_mb"] = _peak_mb()
    return result


# --- parent: run the children, print the table ----------------------------------------


def _write_weights(shape: Shape, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    L, H, D, d = shape.n_layers, shape.n_heads, shape.d_model, shape.d_head
    r = lambda *s: (torch.randn(*s, generator=g) / D**0.5).float()  # noqa: E731
    z = lambda *s: torch.zeros(*s)  # noqa: E731
    state = {"embed.W_E": r(8, D), "pos_embed.W_pos": r(4, D), "unembed.W_U": r(D, 8), "unembed.b_U": z(8)}
    for layer in range(L):
        p = f"blocks.{layer}.attn."
        state |= {p + "W_Q": r(H, D, d), p + "W_K": r(H, D, d), p + "W_V": r(H, D, d), p + "W_O": r(H, d, D)}
        state |= {p + "b_Q": z(H, d), p + "b_K": z(H, d), p + "b_V": z(H, d), p + "b_O": z(D)}
    save_file(state, str(path))


def _spawn(
    method: str,
    shape: Shape,
    weights: Path,
    out: Path,
    kinds: str = "QKV",
    repeats: int = 1,
    threads: int = 1,
    layers: int | None = None,
) -> dict:
    cmd = [sys.executable, __file__, "--child", method, "--shape", json.dumps(shape.__dict__),
           "--weights", str(weights), "--out", str(out),
           "--kinds", kinds, "--repeats", str(repeats)]  # fmt: skip
    if threads:
        cmd += ["--threads", str(threads)]
    if layers is not None:
        cmd += ["--layers", str(layers)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method} on {shape.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def bench(
    shape: Shape, tmp: Path, threads: int, skip_tl: bool, full_threads: int | None = None, cuda: bool = False
) -> list[str]:
    import numpy as np

    weights = tmp / f"{shape.n_layers}x{shape.n_heads}.safetensors"
    _write_weights(shape, weights)
    idle = _spawn("idle", shape, weights, tmp / "idle.npy", threads=threads)["peak_mb"]
    small = shape.n_pairs <= 2000
    runs: dict[str, dict] = {}
    runs["ours"] = _spawn(
        "ours",
        shape,
        weights,
        tmp / "ours.npy",
        repeats=5 if small else 3 if shape.full_layers is None else 1,
        threads=threads,
    )
    runs["ours"]["scores"] = np.load(tmp / "ours.npy")

    notes = []
    if skip_tl:
        notes.append("TransformerLens skipped (--skip-tl)")
    elif (tl_gb := shape.n_pairs * 2 * shape.d_head * shape.d_model * 4 / 1e9) > _available_gb():
        notes.append(f"TransformerLens skipped: its all-pairs operands alone are ~{tl_gb:,.0f} GB per kind")
    elif small:
        runs["tl"] = _spawn("tl", shape, weights, tmp / "tl.npy", repeats=5, threads=threads)
        runs["tl"]["scores"] = np.load(tmp / "tl.npy")
    elif _available_gb() < 12:
        notes.append(
            f"TransformerLens skipped: {_available_gb():.1f} GB available, it needs ~10 GB per kind here"
        )
    else:
        per_kind = [_spawn("tl", shape, weights, tmp / f"tl{k}.npy", kinds=k, threads=threads) for k in KINDS]
        runs["tl"] = {
            "wall_s": sum(r["wall_s"] for r in per_kind),
            "peak_mb": max(r["peak_mb"] for r in per_kind),
        }
        runs["tl"]["scores"] = np.nansum([np.load(tmp / f"tl{k}.npy") for k in KINDS], axis=0)
        runs["tl"]["scores"][np.isnan(runs["ours"]["scores"])] = np.nan
        notes.append("TransformerLens: one subprocess per kind (wall summed, peak = largest)")

    runs["dense"] = _spawn(
        "dense", shape, weights, tmp / "dense.npy", repeats=3 if small else 1, threads=threads
    )
    dense = np.load(tmp / "dense.npy")
    done = runs["dense"]["pairs_per_kind"]
    scale = shape.n_pairs / done  # dense time grows linearly with the pairs
    if scale > 1:
        notes.append(
            f"dense: {done} of {shape.n_pairs} pairs per kind, seeded; time extrapolated x{scale:.0f} (~)"
        )
    full_layers = shape.full_layers
    # with --full-threads, the same analysis again on more threads, in the same run (analysis.threads)
    for key, n in (("full", threads), ("full_threads", full_threads)):
        if n:
            runs[key] = _spawn(
                "full",
                shape,
                weights,
                tmp / f"{key}.npy",
                repeats=3 if small else 1,
                threads=n,
                layers=full_layers,
            )
    # the channel tables the composition stage adds (pipeline/circuits/channel_null.py), same layers
    runs["channels"] = _spawn(
        "channels", shape, weights, tmp / "channels.npy", repeats=3 if small else 1, threads=threads,
        layers=full_layers,
    )  # fmt: skip
    if cuda:  # the same analysis on the GPU (analysis.device=cuda), in the same run
        runs["full_cuda"] = _spawn(
            "full_cuda", shape, weights, tmp / "full_cuda.npy", repeats=3, threads=threads, layers=full_layers
        )
    full_scale = 1.0
    if full_layers is not None:
        done_pairs = dataclasses.replace(shape, n_layers=full_layers).n_pairs
        full_scale = shape.n_pairs / done_pairs
        notes.append(
            f"full: the first {full_layers} layers ({done_pairs} pairs per kind), time extrapolated "
            f"x{full_scale:.0f} (~); peak memory of that run"
        )

    title = (
        f"{shape.name}: {shape.n_layers} layers x {shape.n_heads} heads, d_model {shape.d_model}, "
        f"d_head {shape.d_head}; {shape.n_pairs} pairs x 3 kinds"
    )
    lines = [
        title,
        f"  {'method':<36}{'wall s':>10}{'peak MB':>10}{'max |diff| to dense':>22}{'time / ours':>13}",
    ]
    ours_s = runs["ours"]["wall_s"]
    labels = {
        "ours": "ours (true Q, K, V; float64)",
        "tl": "TransformerLens 3.9 (float32)",
        "dense": "dense float64 products",
    }
    for key in ("ours", "tl", "dense"):
        if key not in runs:
            continue
        r = runs[key]
        wall, mark = (r["wall_s"] * scale, "~") if key == "dense" and scale > 1 else (r["wall_s"], "")
        diff = "" if key == "dense" else f"{np.nanmax(np.abs(r['scores'] - dense)):.1e}"
        ratio = mark + f"{wall / ours_s:.1f}"
        lines.append(
            f"  {labels[key]:<36}{mark + f'{wall:.3f}':>10}{r['peak_mb'] - idle:>10.0f}{diff:>22}{ratio:>13}"
        )
    full = runs["full"]
    mark = "~" if full_scale > 1 else ""
    lines.append(
        f"  ours, full composition_scores (3 kinds x 5 variants, baseline 200, null 64): "
        f"{mark}{full['wall_s'] * full_scale:.2f} s, peak {full['peak_mb'] - idle:.0f} MB"
    )
    split = runs["channels"]
    lines.append(
        f"  ours, the channel tables (channel_null.py: later and placebo pairs, 3 kinds, null 64): "
        f"{mark}{split['wall_s'] * full_scale:.2f} s, peak {split['peak_mb'] - idle:.0f} MB, "
        f"{split['wall_s'] / full['wall_s']:.2f} x the full composition_scores"
    )
    if full_threads:
        more = runs["full_threads"]
        speedup = full["wall_s"] / more["wall_s"]
        lines.append(
            f"  the same on {full_threads} threads (analysis.threads): "
            f"{mark}{more['wall_s'] * full_scale:.2f} s, peak {more['peak_mb'] - idle:.0f} MB, "
            f"{speedup:.2f}x the speed on {threads}"
        )
    if cuda:
        gpu = runs["full_cuda"]
        diff = np.abs(np.load(tmp / "full_cuda.npy") - np.load(tmp / "full.npy"))
        lines.append(
            f"  the same on CUDA ({gpu['gpu']}, analysis.device=cuda, float64): "
            f"{mark}{gpu['wall_s'] * full_scale:.2f} s, GPU peak {gpu['gpu_peak_mb']:.0f} MB, "
            f"{full['wall_s'] / gpu['wall_s']:.1f}x the speed on {threads} CPU thread(s); max |diff| to "
            f"the CPU's: score {np.nanmax(diff[:, 0]):.1e}, z {np.nanmax(diff[:, 1]):.1e}"
        )
    lines += [f"  note: {n}" for n in notes]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the default-shape model only")
    ap.add_argument("--skip-tl", action="store_true", help="leave out TransformerLens")
    ap.add_argument("--huge", action="store_true", help="add (c), 1,200 heads (about 10 minutes more)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in every child (default 1)")
    ap.add_argument(
        "--full-threads",
        type=int,
        help="also run the full analysis on this many threads, beside the one-thread run (analysis.threads)",
    )
    ap.add_argument(
        "--cuda",
        action="store_true",
        help="also run the full analysis on CUDA (analysis.device=cuda); the default when a GPU is present",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--kinds", default="QKV", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        shape = Shape(**json.loads(args.shape))
        print(
            json.dumps(
                child(args.child, shape, args.weights, args.out, args.kinds, args.repeats, args.layers)
            )
        )
        return

    import torch

    print(f"torch {torch.__version__}, {args.threads} thread(s) per method, {os.cpu_count()} CPUs; "
          "peak MB = peak RSS minus an idle child's (see the module docstring)", flush=True)  # fmt: skip
    cuda = args.cuda or torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        shapes = [default_shape()] + ([] if args.quick else [LARGE]) + ([HUGE] if args.huge else [])
        for shape in shapes:
            print(
                "\n".join(bench(shape, Path(tmp), args.threads, args.skip_tl, args.full_threads, cuda))
                + "\n",
                flush=True,
            )


if __name__ == "__main__":
    main()
