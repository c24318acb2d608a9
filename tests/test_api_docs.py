"""docs/api.md runs as written: its ```python blocks, in order, as one notebook session, in a fresh
process outside the repository (so `import attn_circuits` is the installed package, as a user's
notebook has it, not this checkout's `pipeline`), offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"

pytestmark = [pytest.mark.interop, pytest.mark.slow]


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.S | re.M)


def test_the_page_has_the_notebook_steps():
    code = "\n".join(blocks())
    assert len(blocks()) >= 6
    for step in ("from attn_circuits import api", "api.composition(", "api.weights_of(", "api.heads("):
        assert step in code, step
    assert "from_pretrained" not in code  # nothing to download


def test_every_python_block_runs_in_order(tmp_path):
    pytest.importorskip("transformer_lens")
    script = tmp_path / "api_page.py"
    script.write_text("\n\n".join(blocks()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)  # the installed attn_circuits, not this checkout's folders
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.strip() for line in proc.stdout.splitlines()]
    # the page's equalities: a state dict, a folder, and the two halves of heads() alone
    assert lines.count("True") == 4 and "False" not in lines, proc.stdout
    assert "attn_circuits" not in proc.stderr  # no warning or traceback from the library
