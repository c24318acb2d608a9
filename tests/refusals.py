"""What a test may check of a refusal: one line, the key or file it names, the value it names, the
numbers involved, and the error's type; never its wording, which is for the user and free to improve."""

from __future__ import annotations

import pytest

from pipeline.errors import UserError

NO_VALUE = object()  # a refusal that names a key or file and no value


def refused(caught: pytest.ExceptionInfo | UserError, where: str, value: object = NO_VALUE) -> str:
    """`caught` is a `UserError` of one line naming `where` (the key or file) and, when one is
    given, `value` (shown by repr: strings quoted); its message, for further facts."""
    error = caught.value if isinstance(caught, pytest.ExceptionInfo) else caught
    assert isinstance(error, UserError), type(error)
    message = str(error)
    assert "\n" not in message, message
    shown = "" if value is NO_VALUE else f" = {value!r}"
    assert message.startswith(f"{where}{shown}: "), message
    return message


def refused_line(err: str, where: str, value: object = NO_VALUE) -> str:
    """`err` (a stage's stderr) is one line, `error: ` and the key or file `where` and, when one
    is given, `value` (by repr); that line."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    shown = "" if value is NO_VALUE else f" = {value!r}"
    assert err.startswith(f"error: {where}{shown}: "), err
    return err.rstrip("\n")


def one_line(caught, *named) -> str:
    """The message of `caught` (a pytest ExceptionInfo, an exception, or a string), checked to be
    one line holding each of `named` (as str), where the key and value are not its first words;
    returned for further checks."""
    text = str(caught.value if isinstance(caught, pytest.ExceptionInfo) else caught)
    assert "\n" not in text.strip(), text
    for part in named:
        assert str(part) in text, (part, text)
    return text
