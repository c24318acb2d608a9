"""Where each seed's model comes from: trained here, or a checkpoint (`train.source = load`).

The origin stage resolves `train.checkpoint` (under `train.checkpoint_dir`, "{seed}"
replaced by the seed) and records the checkpoint and the config.json beside it, with
their sha256, in `origin.json`; the train stage reads that file, not the params. So
the train stage depends on exactly the checkpoint it loads (its bytes, through the
sha256), and editing `train.checkpoint` while `train.source = train` reruns no training:
the origin stage writes the same bytes again.

`train.checkpoint=hf:ORG/NAME[@REVISION]` names a snapshot in the local Hugging Face cache
instead (`pipeline.hub`): origin.json then records the repository, the revision asked for,
the commit it resolved to, and the weights' and config's paths inside the snapshot (not in
anyone's cache: the same origin.json on every machine) with their sha256. DVC sees the cache
through that file: the origin stage reruns when `train.checkpoint` changes (or with
`dvc repro -f origin` after a download moved `main`), and everything downstream reruns
exactly when the recorded bytes differ. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from .. import hub, io
from ..config import TrainConfig
from ..errors import UserError


def checkpoint_path(t: TrainConfig, seed: int) -> Path:
    """`train.checkpoint` under `train.checkpoint_dir`, with "{seed}" replaced by the seed; a
    directory stands for the model.safetensors in it (TransformerLens 4.x's form: the weights
    under TransformerBridge's names and a TransformerBridgeConfig config.json, read by
    `pipeline.model.tl_checkpoint`)."""
    if t.checkpoint is None:  # TrainConfig.check requires it for source = load
        raise UserError("train.checkpoint", "required when train.source = 'load'")
    relative = t.checkpoint.replace("{seed}", str(seed))
    root = Path(t.checkpoint_dir)
    path = root / relative
    if not path.resolve().is_relative_to(root.resolve()):
        problem = f"must stay inside train.checkpoint_dir = {t.checkpoint_dir!r} (a DVC dependency)"
        raise UserError("train.checkpoint", problem, t.checkpoint)
    if path.is_dir():  # a saved model's directory (save_pretrained's, bridge_checkpoint's): its weights file
        if not (path / "model.safetensors").is_file():
            problem = f"{path} is a directory without model.safetensors: name the weights file"
            raise UserError("train.checkpoint", problem, t.checkpoint)
        path = path / "model.safetensors"
    if not path.is_file():
        problem = f"{path} not found (relative to train.checkpoint_dir = {t.checkpoint_dir!r})"
        raise UserError("train.checkpoint", problem, t.checkpoint)
    return path


def choose(t: TrainConfig, seed: int) -> dict:
    """origin.json: {"source": "train"}, or the checkpoint and its config.json with sha256."""
    if t.source != "load":
        return {"source": "train"}
    if hub.is_hub(t.checkpoint):
        return hub.checkpoint(t.checkpoint)
    path = checkpoint_path(t, seed)
    config = path.parent / "config.json"
    if not config.is_file():
        raise UserError(str(config), "file not found (the checkpoint's config.json, beside it)")
    return {"source": "load", "checkpoint": io.file_record(path), "config": io.file_record(config)}


def _is_entry(entry: object) -> bool:
    return isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("path", "sha256"))


def _is_known(entry: object) -> bool:  # a repository without config.json (pipeline.hub.KNOWN)
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("known"), str)
        and isinstance(entry.get("fields"), dict)
    )


def read(path: str | Path) -> dict:
    """origin.json as `choose` wrote it, or a one-line refusal naming the file (an empty,
    partial or hand-edited one would otherwise fail later with a KeyError)."""
    chosen = io.read_json(path)
    if isinstance(chosen, dict) and chosen.get("source") == "train":
        return chosen
    if isinstance(chosen, dict) and chosen.get("source") == "load":
        config = chosen.get("config")
        if _is_entry(chosen.get("checkpoint")) and (_is_entry(config) or _is_known(config)):
            return chosen
    problem = (
        'not the origin stage\'s output ({"source": "train"}, or "load" with the checkpoint and '
        "config.json, each a path and sha256): run dvc repro"
    )
    raise UserError(str(path), problem)


def checked(chosen: dict) -> tuple[Path, Path | dict]:
    """The checkpoint and config.json paths of origin.json, refused if either changed since;
    for a repository known without config.json, its `pipeline.hub.KNOWN` fields instead of a path."""
    config, snap = chosen["config"], chosen.get("hub")
    weights = _unchanged(chosen["checkpoint"], snap)
    return weights, dict(config["fields"]) if _is_known(config) else _unchanged(config, snap)


def _unchanged(entry: dict, snap: dict | None = None) -> Path:
    """The file an origin.json entry names, as recorded: under the repository root, or, for a
    snapshot (`snap`, origin.json's "hub"), relative to it in this machine's Hugging Face cache."""
    path = hub.snapshot_file(snap, entry["path"]) if snap else Path(entry["path"])
    if snap and not path.is_file():
        fetch = f"hf download {snap['repo']} --revision {snap['commit']}"
        problem = f"not in the Hugging Face cache: run `{fetch}`"
        raise UserError(str(path), problem)
    if not path.is_file() or io.sha256_file(path) != entry["sha256"]:
        raise UserError(str(path), "changed since the origin stage recorded it: run dvc repro")
    return path
