"""pipeline/cli.py: a device that is not available is refused naming its key and value; the
allocator settings the heads and dynamics stages ask for take on glibc."""

from __future__ import annotations

import pytest
import torch

from pipeline.cli import resolve_device
from pipeline.errors import UserError


def test_an_unavailable_device_names_its_key() -> None:
    if torch.cuda.is_available():
        assert resolve_device("cuda", "analysis.device") == torch.device("cuda")
    else:
        with pytest.raises(UserError) as caught:
            resolve_device("cuda", "analysis.device")
        message = str(caught.value)
        assert "\n" not in message and message.startswith("analysis.device = 'cuda': "), message
    assert resolve_device("cpu", "analysis.device") == torch.device("cpu")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto", "analysis.device").type == want


def test_keep_freed_memory_takes_on_glibc() -> None:
    """The heads and dynamics stages' allocator settings (pipeline.cli.keep_freed_memory): glibc
    takes them (this project's machines are Linux); anywhere else the call is a no-op."""
    import platform

    from pipeline.cli import keep_freed_memory

    took = keep_freed_memory()
    assert took is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
