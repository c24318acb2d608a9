"""The tiny project's stages, origin to dynamics, run in-process on dvc_repo.TINY (seed 0, 20
steps, checkpoints at 0, 10 and 20): the real files each stage writes, for the tests of what
training saves, what dynamics reproduces, the dynamics figure and the dynamics stage's output."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from dvc_repo import TINY

from pipeline import params

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("origin", "train", "weights", "composition", "heads", "dynamics")


def run(root: Path, last: str = "dynamics") -> dict[str, Path]:
    """Run STAGES up to `last` into root/<stage>; {stage: its directory, "root", "params"}."""
    p = root / "params.yaml"
    p.write_text(params.dump(params.compose(TINY, conf_dir=ROOT / "conf")))
    out = {n: root / n for n in STAGES[: STAGES.index(last) + 1]}

    def stage(name, *argv):
        if name in out:
            assert import_module(f"stages.{name}").main(["--params", str(p), *argv]) == 0

    stage("origin", "--seed", "0", "--out", str(root / "origin"))
    origin = str(root / "origin" / "origin.json")
    stage("train", "--seed", "0", "--origin", origin, "--out", str(root / "train"), "--no-progress")
    model, config = str(root / "train" / "model.safetensors"), str(root / "train" / "config.json")
    stage("weights", "--model", model, "--config", config, "--out", str(root / "weights"))
    weights = str(root / "weights" / "heads.safetensors")
    stage("composition", "--weights", weights, "--out", str(root / "composition"))
    scores, invariant = (str(root / "composition" / f"{name}.csv") for name in ("scores", "invariant"))
    stage("heads", "--model", model, "--config", config, "--weights", weights,
          "--scores", scores, "--invariant", invariant, "--out", str(root / "heads"))  # fmt: skip
    stage("dynamics", "--checkpoints", str(root / "train" / "checkpoints"), "--config", config,
          "--out", str(root / "dynamics"), "--no-progress")  # fmt: skip
    return out | {"root": root, "params": p}
