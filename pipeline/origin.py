"""Where each seed's model comes from: trained here, or a checkpoint (`train.source = load`).

The origin stage resolves `train.checkpoint` (under `train.checkpoint_dir`, "{seed}"
replaced by the seed) and records the checkpoint and the config.json beside it, with
their sha256, in `origin.json`; the train stage reads that file, not the params. So
the train stage depends on exactly the checkpoint it loads (its bytes, through the
sha256), and editing `train.checkpoint` while `train.source = train` reruns no training:
the origin stage writes the same bytes again. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import io
from pipeline.config import TrainConfig
from pipeline.errors import UserError


def checkpoint_path(t: TrainConfig, seed: int) -> Path:
    """`train.checkpoint` under `train.checkpoint_dir`, with "{seed}" replaced by the seed."""
    assert t.checkpoint is not None  # TrainConfig.check requires it for source = load
    relative = t.checkpoint.replace("{seed}", str(seed))
    root = Path(t.checkpoint_dir)
    path = root / relative
    if not path.resolve().is_relative_to(root.resolve()):
        problem = f"must stay inside train.checkpoint_dir = {t.checkpoint_dir!r} (a DVC dependency)"
        raise UserError("train.checkpoint", problem, t.checkpoint)
    if not path.is_file():
        problem = f"{path} not found (relative to train.checkpoint_dir = {t.checkpoint_dir!r})"
        raise UserError("train.checkpoint", problem, t.checkpoint)
    return path


def choose(t: TrainConfig, seed: int) -> dict:
    """origin.json: {"source": "train"}, or the checkpoint and its config.json with sha256."""
    if t.source != "load":
        return {"source": "train"}
    path = checkpoint_path(t, seed)
    config = path.parent / "config.json"
    if not config.is_file():
        raise UserError(str(config), "file not found (the checkpoint's config.json, beside it)")
    entry = lambda p: {"path": p.as_posix(), "sha256": io.sha256_file(p)}  # noqa: E731
    return {"source": "load", "checkpoint": entry(path), "config": entry(config)}


def _is_entry(entry: object) -> bool:
    return isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("path", "sha256"))


def read(path: str | Path) -> dict:
    """origin.json as `choose` wrote it, or a one-line refusal naming the file (an empty,
    partial or hand-edited one would otherwise fail later with a KeyError)."""
    chosen = io.read_json(path)
    if isinstance(chosen, dict) and chosen.get("source") == "train":
        return chosen
    if isinstance(chosen, dict) and chosen.get("source") == "load":
        if _is_entry(chosen.get("checkpoint")) and _is_entry(chosen.get("config")):
            return chosen
    problem = (
        'not the origin stage\'s output ({"source": "train"}, or "load" with the checkpoint and '
        "config.json, each a path and sha256): run dvc repro"
    )
    raise UserError(str(path), problem)


def checked(chosen: dict) -> tuple[Path, Path]:
    """The checkpoint and config.json paths of origin.json, refused if either changed since."""
    paths = []
    for key in ("checkpoint", "config"):
        path = Path(chosen[key]["path"])
        if not path.is_file() or io.sha256_file(path) != chosen[key]["sha256"]:
            raise UserError(str(path), "changed since the origin stage recorded it: run dvc repro")
        paths.append(path)
    return paths[0], paths[1]
