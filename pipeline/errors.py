"""The one error type for user mistakes: a bad config key, file or value.

Stages catch it and print its message as a single line (no traceback unless
`--debug`), then exit non-zero. Anything else escaping a stage is a bug in the
pipeline and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """A mistake the user can fix: the message names the key, file or value.

    `where` is the config key (``model.n_heads``) or the file path the mistake is in;
    `value` is the offending value, shown with ``repr`` so that strings are quoted.
    """

    _NOTHING = object()

    def __init__(self, where: str, problem: str, value: Any = _NOTHING):
        self.where = where
        self.problem = problem
        self.value = value
        shown = "" if value is UserError._NOTHING else f" = {value!r}"
        super().__init__(f"{where}{shown}: {problem}")

    def under(self, prefix: str) -> UserError:
        """The same error with its key placed under a parent key (``n_heads`` -> ``model.n_heads``)."""
        return UserError(f"{prefix}.{self.where}" if prefix else self.where, self.problem, self.value)


def require(ok: bool, where: str, value: Any, problem: str) -> None:
    """Raise `UserError(where, problem, value)` unless `ok`."""
    if not ok:
        raise UserError(where, problem, value)
