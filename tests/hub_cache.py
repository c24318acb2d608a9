"""A Hugging Face cache in a temporary directory, in the library's own layout, with tiny
attention-only models in the two public repositories' formats, for tests that must not
touch the network.

    models--ORG--NAME/
        blobs/<sha256>                    the files' bytes
        refs/main                         the commit `main` resolves to (refs/refs/pr/1: `refs/pr/1`'s)
        snapshots/<commit>/<file>         symlinks to ../../blobs/<sha256>

- NeelNanda's format (TransformerLens's attn-only-2l): config.json in his spelling
  (`normalization`, `shortformer_pos`, plus training fields TransformerLens ignores) and
  `model_final.pth`, a torch.save'd state dict with TransformerLens's buffers;
- ARENA's `attn_only_2L_half` format: the .pth alone, no config.json (shortformer, no LayerNorm).
"""

from __future__ import annotations

import hashlib
import io as _io
import os
from pathlib import Path

import torch
from models import random_model

from pipeline.config import ModelConfig

TINY_REPO = "org/tiny-attn-only"
ARENA_REPO = "callummcdougall/attn_only_2L_half"


def add_snapshot(
    cache: Path, repo: str, files: dict[str, bytes], commit: str | None = None, ref: str = "main"
):
    """`files` as `repo`'s snapshot `commit` in `cache` (default: a hash of the files); `ref` points at it."""
    commit = commit or hashlib.sha1(b"".join(sorted(files.values()))).hexdigest()
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / blob).write_bytes(data)
        os.symlink(Path("..") / ".." / "blobs" / blob, snap / name)
    (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)  # refs/refs/pr/1 for a pull request
    (folder / "refs" / ref).write_text(commit)
    return snap


def tl_state(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """A random model's state dict as TransformerLens saves it (its mask and IGNORE buffers included):
    float32, the config's own weight initialisation, biases and LayerNorm parameters moved off
    their 0 and 1 by Normal(0, 0.05)."""
    state = dict(random_model(cfg, seed=seed, dtype=torch.float32, bias_std=0.05).state_dict())
    for l in range(cfg.n_layers):
        state[f"blocks.{l}.attn.mask"] = torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool))
        state[f"blocks.{l}.attn.IGNORE"] = torch.tensor(-1e5)
    return state


def pth(state: dict[str, torch.Tensor]) -> bytes:
    buffer = _io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def neel_config(cfg: ModelConfig) -> dict:
    """config.json as NeelNanda's attn-only repositories spell it (and fields TransformerLens drops)."""
    return {
        "d_model": cfg.d_model, "n_layers": cfg.n_layers, "d_mlp": -1, "d_head": cfg.d_head,
        "n_heads": cfg.n_heads, "n_ctx": cfg.n_ctx, "d_vocab": cfg.d_vocab, "act_fn": "solu_ln",
        "attn_only": True, "normalization": cfg.normalization_type,
        "shortformer_pos": cfg.positional_embedding_type == "shortformer",
        "tokenizer_name": "NeelNanda/gpt-neox-tokenizer-digits", "lr": 0.001, "batch_size": 288,
        "seed": 1234, "use_attn_result": False, "ln_eps": 1e-5,
    }  # fmt: skip


def tokenizer_json(text: str, vocab_size: int) -> bytes:
    """A small byte-level BPE tokenizer.json, as a public repository ships one."""
    from pipeline.data import tokenizer

    return tokenizer.train(text.splitlines(keepends=True), vocab_size).to_str().encode()


def word_level_tokenizer(words: list[str]) -> bytes:
    """A word-level tokenizer.json without an unknown token: it loads, and encodes only `words`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode()


def socket_guard(directory: Path) -> Path:
    """A sitecustomize.py in `directory` that makes every socket connection fail: put it on
    PYTHONPATH and no Python process below can reach the network."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        "import socket\n"
        "def _refuse(*args, **kwargs):\n"
        "    raise OSError('network refused by the test (sitecustomize)')\n"
        "socket.socket.connect = _refuse\n"
        "socket.socket.connect_ex = _refuse\n"
        "socket.create_connection = _refuse\n"
    )
    return directory
