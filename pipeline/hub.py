"""Public checkpoints and tokenizers by name, from the local Hugging Face cache: never downloaded.

`train.checkpoint=hf:NeelNanda/Attn_Only_2L512W_C4_Code` (or `hf:ORG/NAME@REVISION`) and
`data.tokenizer.pretrained=hf:EleutherAI/gpt-neox-20b` name a repository snapshot that
`hf download` (`huggingface-cli download` before huggingface_hub 1.0), or any earlier
`from_pretrained`, put in the cache. `huggingface_hub` resolves it with `local_files_only`,
so HF_HOME and HF_HUB_CACHE are respected and no socket is opened. Anything missing is one
line naming the download command to run.

In a snapshot:
- the weights: `model.safetensors` (or the one `*.safetensors`), else TransformerLens's
  `*final.pth` (its rule for NeelNanda's repositories), else the one `*.pth` or `*.pt`,
  read with `weights_only=True` (pipeline/checkpoint.py);
- the config: `config.json`, in HookedTransformerConfig's fields or NeelNanda's spelling
  (translated as TransformerLens translates it: pipeline/model/tl_checkpoint.py). A repository that
  ships no config.json is read only when `KNOWN` says what its weights cannot tell
  (positions, normalisation); the sizes then come from the weights' shapes.

Torch-free: the origin and tokenizer stages import it, and the config schema its name check
(`require_hub_name`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import io
from .errors import UserError, require

PREFIX = "hf:"
# A snapshot in the local Hugging Face cache by name: hf:ORG/NAME[@REVISION]
HUB_SPEC = re.compile(r"hf:(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")


def require_hub_name(value: str, key: str) -> re.Match:
    """A snapshot's name, `hf:ORG/NAME[@REVISION]`, parsed; else a one-line refusal naming `key`.
    A revision is a branch, tag or commit as git spells one: no part of it empty or starting
    with "." (so `..`, `.` and `main/..` never name a folder of the cache). Reads no cache: the
    config schema checks a name with it (pipeline/config.py)."""
    found = HUB_SPEC.fullmatch(value)
    problem = "must be hf:ORG/NAME or hf:ORG/NAME@REVISION (a snapshot in the Hugging Face cache)"
    require(found is not None, key, problem, value)
    revision = found["revision"]
    if revision is not None and any(part == "" or part.startswith(".") for part in revision.split("/")):
        problem = f"revision {revision!r} is not a branch, tag or commit (a part is empty or starts with '.')"
        raise UserError(key, problem, value)
    return found


# What the weights of a repository without config.json cannot tell, from the code its
# authors publish. ARENA (chapter 1.2, "Induction heads") builds attn_only_2L_half with
# HookedTransformerConfig(d_model=768, d_head=64, n_heads=12, n_layers=2, n_ctx=2048,
# d_vocab=50278, normalization_type=None, positional_embedding_type="shortformer",
# tokenizer_name="EleutherAI/gpt-neox-20b").
KNOWN: dict[str, dict] = {
    "callummcdougall/attn_only_2L_half": {
        "positional_embedding_type": "shortformer",
        "normalization_type": None,
        "attn_only": True,
        "tokenizer_name": "EleutherAI/gpt-neox-20b",
    },
}


@dataclass(frozen=True)
class Spec:
    repo: str
    revision: str | None  # None: the cache's `main`

    def download(self, file: str | None = None) -> str:
        """The command that puts this snapshot (or one file of it) in the cache."""
        parts = ["hf download", self.repo, *([file] if file else [])]
        if self.revision:
            parts += ["--revision", self.revision]
        return " ".join(parts)


def is_hub(value: str | None) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def parse(value: str, key: str) -> Spec:
    """`hf:ORG/NAME` or `hf:ORG/NAME@REVISION`, refused in one line naming `key`."""
    found = require_hub_name(value, key)
    return Spec(found["repo"], found["revision"])


def cache_dir() -> Path:
    from huggingface_hub import constants  # HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub

    return Path(constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class Snapshot:
    spec: Spec
    path: Path  # .../models--ORG--NAME/snapshots/<commit>
    commit: str

    def record(self) -> dict:
        return {"repo": self.spec.repo, "revision": self.spec.revision or "main", "commit": self.commit}


def snapshot(value: str, key: str) -> Snapshot:
    """The cached snapshot `value` names (module doc), or a one-line refusal with the command to run."""
    spec = parse(value, key)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir()
    folder = cache / ("models--" + spec.repo.replace("/", "--"))
    advice = f"run `{spec.download()}` first (nothing is downloaded at run time)"
    if not folder.is_dir():
        raise UserError(key, f"{spec.repo} is not in the Hugging Face cache {cache}: {advice}", value)
    commit = _commit(folder, spec, key, value)
    try:  # the library's own lookup of that commit (it also refuses a snapshot it knows is incomplete)
        path = Path(snapshot_download(spec.repo, revision=commit, local_files_only=True, cache_dir=cache))
    except LocalEntryNotFoundError:
        revision = spec.revision or "main"
        raise UserError(
            key, f"revision {revision} of {spec.repo} is not in the cache {cache}: {advice}", value
        ) from None
    return Snapshot(spec, path, commit)


COMMIT = re.compile(r"[0-9a-f]{40}")  # a commit as the cache names its snapshots
SHORT_COMMIT = re.compile(r"[0-9a-f]{4,39}")  # git's abbreviations (7 by default)


def _commit(folder: Path, spec: Spec, key: str, value: str) -> str:
    """The commit `spec`'s revision resolves to in the cache folder of its repository: a commit
    hash, or the one a file under refs/ holds (`main`; a branch or tag; `refs/pr/1`, cached as
    refs/refs/pr/1). Refused in one line: a revision that names a folder of refs/ (`refs/pr`), a
    ref that is empty or not a commit hash (an interrupted or disk-full write: the cache is
    damaged, and `hf download` writes it again), and a commit with no snapshot."""
    revision = spec.revision or "main"
    advice = f"run `{spec.download()}` first (nothing is downloaded at run time)"
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        refs = folder / "refs"
        ref = refs / revision  # `parse` refused a part that is empty or starts with ".": no way out of refs/
        if ref.is_dir():
            inside = sorted(p.relative_to(refs).as_posix() for p in ref.rglob("*") if p.is_file())
            problem = f"revision {revision} names a folder (refs/{revision}), not a branch, tag or commit"
            problem += f": name one of {', '.join(inside[:4])}" if inside else ""
            raise UserError(key, problem, value)
        if not ref.exists() and SHORT_COMMIT.fullmatch(revision):  # the cache names snapshots by
            # full commit only (as `hf download --revision` needs one): a short hash is no ref
            held = sorted(
                p.name for p in (folder / "snapshots").glob(f"{revision}*") if COMMIT.fullmatch(p.name)
            )
            found = f" (the cache holds {', '.join(held[:2])})" if held else ""
            problem = f"revision {revision} is a short commit hash: give the full 40-character commit{found}"
            raise UserError(key, problem, value)
        if not ref.exists():
            problem = f"revision {revision} of {spec.repo} is not in the cache {folder.parent}: {advice}"
            raise UserError(key, problem, value)
        try:
            commit = ref.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as e:
            commit, reason = "", f"unreadable ({getattr(e, 'strerror', None) or type(e).__name__})"
        else:
            reason = "empty" if not commit else f"not a commit hash ({commit[:20]!r})"
        if not COMMIT.fullmatch(commit):
            problem = (
                f"the Hugging Face cache is damaged: {ref} is {reason} (an interrupted or disk-full "
                f"download): run `{spec.download()}` to write it again"
            )
            raise UserError(key, problem, value)
    if not (folder / "snapshots" / commit).is_dir():
        named = (
            f"revision {revision} (commit {commit[:12]})" if commit != revision else f"commit {commit[:12]}"
        )
        raise UserError(key, f"{named} of {spec.repo} is not in the cache {folder.parent}: {advice}", value)
    return commit


def _one(snap: Snapshot, found: list[Path], what: str, key: str, value: str) -> Path | None:
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise UserError(
            key,
            f"{snap.spec.repo} has several {what} ({names}): name one in a copy under train.checkpoint_dir",
            value,
        )
    return found[0] if found else None


def weights(snap: Snapshot, key: str, value: str) -> Path:
    """The snapshot's weights file (module doc)."""
    files = sorted(p for p in snap.path.rglob("*") if p.is_file())
    chosen = next((p for p in files if p.name == "model.safetensors"), None)
    chosen = chosen or _one(
        snap, [p for p in files if p.suffix == ".safetensors"], "safetensors files", key, value
    )
    chosen = chosen or _one(
        snap, [p for p in files if p.name.endswith("final.pth")], "*final.pth files", key, value
    )
    chosen = chosen or _one(snap, [p for p in files if p.suffix in (".pth", ".pt")], ".pth files", key, value)
    if chosen is None:
        problem = (
            f"the cached snapshot {snap.commit[:12]} of {snap.spec.repo} has no weights "
            f"(.safetensors, *final.pth, .pth): run `{snap.spec.download()}`"
        )
        raise UserError(key, problem, value)
    return chosen


def _in_snapshot(snap: Snapshot, path: Path) -> dict[str, str]:
    """{"path", "sha256"} with the path relative to the snapshot: origin.json then holds no one's
    cache location (HF_HOME differs between colleagues), only the repository and commit."""
    return {"path": path.relative_to(snap.path).as_posix(), "sha256": io.sha256_file(path)}


def snapshot_file(record: dict, relative: str) -> Path:
    """Where a file that origin.json records relative to a snapshot (`record`: its "hub" entry,
    repository and commit) lies in this machine's cache."""
    folder = cache_dir() / ("models--" + record["repo"].replace("/", "--"))
    return folder / "snapshots" / record["commit"] / relative


def checkpoint(value: str, key: str = "train.checkpoint") -> dict:
    """origin.json for a checkpoint by name: the snapshot (repository, revision, commit), the
    weights and the config.json with their sha256 (paths relative to the snapshot:
    `snapshot_file`), or the `KNOWN` fields when it ships none."""
    snap = snapshot(value, key)
    weights_file = _in_snapshot(snap, weights(snap, key, value))
    chosen: dict = {"source": "load", "hub": snap.record(), "checkpoint": weights_file}
    config = snap.path / "config.json"
    if config.is_file():
        chosen["config"] = _in_snapshot(snap, config)
    elif snap.spec.repo in KNOWN:
        chosen["config"] = {"known": snap.spec.repo, "fields": KNOWN[snap.spec.repo]}
    else:
        problem = (
            f"the cached snapshot {snap.commit[:12]} of {snap.spec.repo} has no config.json "
            f"(run `{snap.spec.download('config.json')}`; repositories known without one: {', '.join(KNOWN)})"
        )
        raise UserError(key, problem, value)
    return chosen


def tokenizer_file(value: str, key: str = "data.tokenizer.pretrained") -> tuple[Path, dict]:
    """The snapshot's tokenizer.json and its record (repository, revision, commit, sha256)."""
    snap = snapshot(value, key)
    path = snap.path / "tokenizer.json"
    if not path.is_file():
        problem = (
            f"the cached snapshot {snap.commit[:12]} of {snap.spec.repo} has no tokenizer.json: "
            f"run `{snap.spec.download('tokenizer.json')}`"
        )
        raise UserError(key, problem, value)
    return path, snap.record() | {"file": "tokenizer.json", "sha256": io.sha256_file(path)}
