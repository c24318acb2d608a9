"""The one error type for user mistakes (pipeline/errors.py): where the mistake is, its value shown
with repr, the parent key or the file added once at the edge, and a malformed error refused."""

from __future__ import annotations

import pytest

from pipeline.errors import UserError, require, under, within


def test_the_message_is_the_key_the_value_by_repr_and_the_problem():
    e = UserError("model.n_heads", "p", "four")
    assert (e.where, e.problem, e.value) == ("model.n_heads", "p", "four")
    assert str(e) == "model.n_heads = 'four': p"
    assert str(UserError("model.safetensors", "p")) == "model.safetensors: p"  # no value: none shown
    assert str(UserError("k", "p", None)) == "k = None: p"  # None is a value


@pytest.mark.parametrize("where,problem", [("", "p"), ("k", ""), (None, "p"), ("k", None)])
def test_an_error_without_a_key_or_a_problem_is_a_bug_not_a_user_error(where, problem):
    with pytest.raises(TypeError):
        UserError(where, problem)


def test_under_puts_the_key_under_each_parent_once_and_within_names_the_file():
    with pytest.raises(UserError) as caught:
        with within("params.yaml"), under("model"):
            require(False, "n_heads", "p", 0)
    assert (caught.value.where, caught.value.value) == ("params.yaml: model.n_heads", 0)
    assert str(caught.value) == "params.yaml: model.n_heads = 0: p"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # one line, no chain
    assert UserError("k", "p").under("").where == "k"


def test_require_passes_when_ok_and_other_errors_pass_through_untouched():
    require(True, "k", "p")
    with pytest.raises(ValueError, match="^x$"), within("f"), under("s"):
        raise ValueError("x")
