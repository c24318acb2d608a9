"""The figures stage's channel figure (stages/figures.py): drawn byte-stably from the composition
stage's files, or not at all without them; tables that do not match the CSV are refused before
anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import synthetic_seeds as syn
from channel_tables import tables, write

from pipeline import params

# synthetic_seeds' true discoveries: K 1.0 <- 0.0, 1.1 <- 0.0, 1.0 <- 0.1; V 1.2 <- 0.2
FOUND = [("K", 0, 0, 1, 0), ("K", 0, 0, 1, 1), ("K", 0, 1, 1, 0), ("V", 0, 2, 1, 2)]


def stage_args(tmp_path: Path) -> list[str]:
    (tmp_path / "params.yaml").write_text(params.dump(params.compose(["analysis.figures.dpi=40"])))
    syn.scores()[lambda f: f["variant"] != "invariant"].to_csv(tmp_path / "scores.csv", index=False)
    return ["--params", str(tmp_path / "params.yaml"), "--scores", str(tmp_path / "scores.csv")]


def test_figures_stage_draws_the_channel_figure_byte_stably(tmp_path):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    csv, st = write(tmp_path, *tables({FOUND[0]: (1, 2)}, FOUND, channel_discovery=[FOUND[0]]))
    channel_args = ["--channels", str(csv), "--channel-shares", str(st)]
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert figures_stage.main([*args, *channel_args, "--out", str(out)]) == 0
    names = {"channels.png", "channels.svg", "channels.json"}
    assert names <= {p.name for p in outs[0].iterdir()}
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    facts = json.loads((outs[0] / "channels.json").read_text())
    assert facts["discovered"] == {"K": 3, "Q": 0, "V": 1} and facts["channel_discoveries"] == 1
    # without the channel files, no channel figure (the other figures as before)
    assert figures_stage.main([*args, "--out", str(tmp_path / "c")]) == 0
    assert not {p.name for p in (tmp_path / "c").iterdir()} & names


def test_figures_stage_refuses_tables_that_do_not_match_the_csv(tmp_path, capsys):
    from stages import figures as figures_stage

    args = stage_args(tmp_path)
    frame, shares = tables({}, FOUND)
    csv, st = write(tmp_path, frame, {**shares, "K": shares["K"][:-1]})
    out = tmp_path / "out"
    assert (
        figures_stage.main([*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)])
        != 0
    )
    err = capsys.readouterr().err
    assert "channels.safetensors" in err and re.search(r"\bK\b\D*\b9\b", err)  # the kind, its 9 pairs
    assert not out.exists()  # every input is checked before anything is written
    # a top channel (a block of directions 2-4) beyond the file's d_head = 4
    wide = frame.assign(writer_channel=2, writer_block=frame["writer_block"].where(frame.index != 3, 3))
    csv, st = write(tmp_path, wide, shares)
    args_wide = [*args, "--channels", str(csv), "--channel-shares", str(st), "--out", str(out)]
    assert figures_stage.main(args_wide) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "channels.safetensors" in err and "d_head = 4" in err
    assert not out.exists()
    csv, st = write(tmp_path, frame, shares)
    assert figures_stage.main([*args, "--channels", str(csv), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "--channels" in err and "--channel-shares" in err and err.count("\n") == 1  # names both
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    bad = ["--channels", str(csv), "--channel-shares", str(tmp_path / "bad.safetensors")]
    assert figures_stage.main([*args, *bad, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert str(tmp_path / "bad.safetensors") in err and err.count("\n") == 1
