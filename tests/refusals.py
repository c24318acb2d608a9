"""What a refusal shows, checked without quoting its words: one line that names what the user
must find (the key or file, the value, the numbers involved)."""

from __future__ import annotations

import pytest


def one_line(caught, *named) -> str:
    """The message of `caught` (a pytest ExceptionInfo, an exception, or a string), checked to be
    one line holding each of `named` (as str); returned for further checks."""
    text = str(caught.value if isinstance(caught, pytest.ExceptionInfo) else caught)
    assert "\n" not in text.strip(), text
    for part in named:
        assert str(part) in text, (part, text)
    return text
