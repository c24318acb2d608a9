"""`python -m pipeline.overrides`: what each experiment changed, as the overrides that turn its
baseline into it, wrapped within 160 columns. (On a real experiment table: tests/test_experiments.py.)"""

from __future__ import annotations

from pipeline import overrides

# conf/ as a tiny stand-in: each setup's values, and a rule the real schema has (b <= a)
SETUPS = {"x": {"a": 1, "b": 1, "c": "kjv"}, "y": {"a": 5, "b": 2, "c": None}}


def compose(setup: str, keys: dict) -> dict | None:
    if setup not in SETUPS:
        return None
    out = {**SETUPS[setup], **keys}
    return out if out["b"] <= out["a"] else None  # refused, as a composition that does not validate


def test_values_as_hydra_overrides_write_them():
    assert overrides.flat({"m": {"n": 1, "l": [1, 2]}, "s": None}) == {"m.n": 1, "m.l": [1, 2], "s": None}
    assert [overrides.shown(v) for v in (None, True, [0, 1], 0.001, "kjv")] == [
        "null",
        "true",
        "[0,1]",
        "0.001",
        "kjv",
    ]
    assert overrides.quoted("it's") == "'it\\'s'" and overrides.quoted(["a", 1]) == "['a',1]"


def test_the_same_setup_is_every_key_that_differs_from_the_baseline():
    base = {"setup": "x", **SETUPS["x"], "seeds": [0]}
    new = {**base, "a": 3, "seeds": [0, 1]}
    assert overrides.changes(new, base, compose) == ["a=3", "seeds=[0,1]"]
    assert overrides.changes(base, base, compose) == []


def test_another_setup_is_the_setup_and_the_keys_that_differ_from_it():
    base = {"setup": "x", **SETUPS["x"]}
    # c=None is y's own value (dropped); a=1 differs from y's 5 though it equals the baseline's;
    # b=1 differs from y's 2 (and a=1 alone would leave y's b=2 above it, refused)
    new = {"setup": "y", "a": 1, "b": 1, "c": None}
    assert overrides.changes(new, base, compose) == ["setup=y", "a=1", "b=1"]
    assert overrides.changes({"setup": "y", **SETUPS["y"]}, base, compose) == ["setup=y"]
    # a setup this conf/ does not have: every key against the baseline, the setup first
    gone = {"setup": "z", "a": 1, "b": 1, "c": "kjv"}
    assert overrides.changes(gone, base, compose) == ["setup=z"]


def test_rows_of_dvc_exp_show_json():
    def entry(rev, name, params, exps=()):
        data = {"params": {"params.yaml": {"data": params}}} if params is not None else {}
        return {"rev": rev, "name": name, "data": data, "experiments": list(exps)}

    main = {"setup": "x", **SETUPS["x"]}
    shown = [
        entry("workspace", None, {**main, "a": 2}),
        entry(
            "base-commit",
            "main",
            main,
            [
                {"revs": [entry("e1", "wide", {**main, "a": 4})]},
                {"revs": [entry("e2", None, None)], "name": "broken"},
            ],
        ),
    ]
    found = list(overrides.rows(shown, compose))
    assert [(r[0], r[1], r[2]) for r in found[:3]] == [
        ("workspace", "x", ["a=2"]),
        ("main", "x", []),
        ("└── wide", "x", ["a=4"]),
    ]
    assert found[3][0] == "└── broken" and found[3][1] == "?"


def test_a_table_wraps_its_changes_within_its_width():
    many = [f"analysis.heads.thresholds.role_{i}=0.{i}" for i in range(30)]
    text = overrides.table([("workspace", "kjv-anneal", []), ("└── sweep-1", "synthetic", many)], 160)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 160 and len(lines) > 3
    rest = " ".join(line.strip() for line in lines[2:])
    assert rest.split(None, 3)[3].split("; ") == many  # nothing lost in the wrapping
