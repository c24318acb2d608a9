"""Checkpoint files: safetensors state dicts, written byte-stable and atomically, and read
without ever unpickling.

`.safetensors` is read by safetensors; `.pt`/`.pth` only through
`torch.load(weights_only=True)`, which refuses anything but tensors and containers.
This module knows files, not models: `pipeline.model.tl_checkpoint` checks a state dict
against our model, so the analysis stages, which read only files, import no model code.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from . import io
from .errors import UserError

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# Buffers a HookedTransformer keeps in its state dict: the causal mask, a constant, and a rotary
# model's waves (computed from its config).
TL_BUFFERS = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")


def save_state(
    path: str | Path, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write a state dict as safetensors, atomically; tensors are made contiguous CPU copies.

    The same tensors and metadata always give the same bytes: safetensors writes the
    metadata in hash-map order (it varies from call to call with two keys or more), so
    the header is rewritten with sorted keys.
    """
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in sorted(state.items())}
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    return io.write_bytes(path, _sorted_header(save(tensors, metadata=meta)))


def _sorted_header(raw: bytes) -> bytes:
    """safetensors bytes with the JSON header's keys (and metadata keys) sorted, same length."""
    n = int.from_bytes(raw[:8], "little")  # header length; the header is JSON padded with spaces
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | dict(sorted(header.items()))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(text) <= n, "a re-ordered header cannot be longer"
    return raw[:8] + text + b" " * (n - len(text)) + raw[8 + n :]


def load_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a state dict and its metadata. `.safetensors`, or `.pt`/`.pth` with weights_only."""
    path = Path(path)
    if not path.is_file():
        raise UserError(str(path), "checkpoint not found")
    if path.suffix in TORCH_SUFFIXES:
        try:
            with (
                warnings.catch_warnings()
            ):  # e.g. "Detected pickle protocol 4": the refusal below says it all
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle refused by weights_only, or a damaged file
            raise UserError(
                str(path), f"refused: not a plain tensor checkpoint ({_refusal_reason(e)})"
            ) from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = state["state_dict"]
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(str(path), "refused: expected a mapping of names to tensors")
        return dict(state), {}
    if path.suffix != ".safetensors":
        raise UserError(
            str(path), f"unknown checkpoint format {path.suffix!r}: use .safetensors, .pt or .pth"
        )
    try:
        with safe_open(str(path), framework="pt") as f:  # one read: metadata and tensors
            return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            str(path), f"not a readable safetensors file ({str(e).splitlines()[0][:200]})"
        ) from None


def _refusal_reason(e: Exception) -> str:
    """Why torch's weights-only unpickler refused a file, in a few words.

    Its message advises re-running with weights_only=False, which would run the file's
    code: we keep only the line naming what the pickle asked for."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # it may hold terminal colour codes
    found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if found:
        return (
            f"it would call or build {found.group(1)}: loading it could run code; "
            "save plain tensors or safetensors"
        )
    lines = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in text.splitlines()]
    lines = [
        line
        for line in lines
        if line and "weights_only" not in line and not line.startswith("Weights only load failed")
    ]
    return (lines[0].split(". ")[0] if lines else type(e).__name__)[:200]  # the first sentence


# --- checkpoints through training (train's checkpoints/, read by the dynamics stage) ------

INDEX = "index.json"  # {"seed": N, "checkpoints": [{"step", "tokens", "file"}, ...]} in step order


def step_file(step: int) -> str:
    return f"step{step:07d}.safetensors"


class StepWriter:
    """Saves training's checkpoints into `directory` as `train` hands them over
    (`pipeline.model.train.SaveCheckpoint`), then their index."""

    def __init__(self, directory: Path, seed: int):
        self.directory, self.seed, self.entries = Path(directory), seed, []

    def __call__(self, step: int, tokens: int, state: Mapping[str, torch.Tensor]) -> None:
        name = step_file(step)
        save_state(self.directory / name, state, {"seed": self.seed, "step": step, "tokens": tokens})
        self.entries.append({"step": step, "tokens": tokens, "file": name})

    def write_index(self) -> Path:
        return io.write_json(self.directory / INDEX, {"seed": self.seed, "checkpoints": self.entries})


def read_index(directory: str | Path) -> list[dict]:
    """The checkpoints listed in `directory`/index.json: each a step, the tokens seen by then
    and its file (which must exist), in increasing step order; one-line errors naming the file."""
    path = Path(directory) / INDEX
    index = io.read_json(path)
    entries = index.get("checkpoints") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{path}: checkpoints", "missing or empty: expected a list of {step, tokens, file}")
    previous = -1
    for i, entry in enumerate(entries):
        where = f"{path}: checkpoints[{i}]"
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("step", "tokens")
        ):
            raise UserError(where, "expected {step: int, tokens: int, file: str}", entry)
        if entry["step"] <= previous:
            raise UserError(
                f"{where}.step", f"must be greater than the one before ({previous})", entry["step"]
            )
        previous = entry["step"]
        if entry.get("file") != step_file(entry["step"]):
            raise UserError(f"{where}.file", f"expected {step_file(entry['step'])!r}", entry.get("file"))
        if not (Path(directory) / entry["file"]).is_file():
            raise UserError(
                str(Path(directory) / entry["file"]), "checkpoint not found (listed in index.json)"
            )
    return entries
