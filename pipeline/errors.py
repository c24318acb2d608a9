"""The one error type for user mistakes: a bad config key, file or value.

Stages catch it and print its message as a single line (no traceback unless
`--debug`), then exit non-zero. Anything else escaping a stage is a bug in the
pipeline and keeps its traceback.

Low-level code names only what it knows (a key inside a file, a field of a
section); the caller that knows the file or the parent key adds it once, at the
edge, as einops does: `with within("model.safetensors"): ...` turns
`blocks.0.attn.W_Q: contains NaN or inf` into
`model.safetensors: blocks.0.attn.W_Q: contains NaN or inf`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_NOTHING = object()


class UserError(Exception):
    """A mistake the user can fix: the message names the key, file or value.

    `where` is the config key (``model.n_heads``) or the file path the mistake is in;
    `value` is the offending value, shown with ``repr`` so that strings are quoted.
    """

    def __init__(self, where: str, problem: str, value: Any = _NOTHING):
        # the message's promise is a key or file and what is wrong with it: one without either is
        # our bug, not the user's, so it fails loudly here instead of printing "None: ..."
        if not (isinstance(where, str) and where and isinstance(problem, str) and problem):
            raise TypeError(f"UserError needs a key or file and a problem, got {where!r} and {problem!r}")
        self.where = where
        self.problem = problem
        self.value = value
        shown = "" if value is _NOTHING else f" = {value!r}"
        super().__init__(f"{where}{shown}: {problem}")

    def under(self, prefix: str) -> UserError:
        """The same error with its key under a parent key (``n_heads`` -> ``model.n_heads``)."""
        return UserError(f"{prefix}.{self.where}" if prefix else self.where, self.problem, self.value)

    def within(self, source: str) -> UserError:
        """The same error inside a file or object (``W_Q`` -> ``model.safetensors: W_Q``)."""
        return UserError(f"{source}: {self.where}", self.problem, self.value)


def require(ok: bool, where: str, problem: str, value: Any = _NOTHING) -> None:
    """Raise `UserError(where, problem, value)` unless `ok`: the same arguments, in the same order."""
    if not ok:
        raise UserError(where, problem, value)


@contextlib.contextmanager
def within(source: str) -> Iterator[None]:
    """Name `source` (a file, a config object) once for every `UserError` raised inside."""
    try:
        yield
    except UserError as e:
        raise e.within(source) from None


@contextlib.contextmanager
def under(prefix: str) -> Iterator[None]:
    """Put every `UserError` key raised inside under `prefix` (a config section)."""
    try:
        yield
    except UserError as e:
        raise e.under(prefix) from None
