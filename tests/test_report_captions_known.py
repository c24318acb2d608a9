"""The report's figures by name, on a directory written by hand: known figures in ORDER with
their FIGURES caption, an SVG only where no PNG of its name exists, and a figure no one has
described yet captioned as such, so that the page says it needs one."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import UserError
from pipeline.present import report


def test_images_come_in_order_with_their_captions_and_an_undescribed_one_says_so(tmp_path):
    for name in ("zeta_plot.png", "new_measure.svg", "dynamics.png", "claims.png", "claims.svg"):
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "notes.txt").write_text("not an image")
    images = report.read_images(tmp_path)
    assert [i.name for i in images] == ["claims.png", "dynamics.png", "new_measure.svg", "zeta_plot.png"]
    assert [i.mime for i in images] == ["image/png", "image/png", "image/svg+xml", "image/png"]
    assert images[0].data == b"claims.png"
    assert images[0].caption == report.FIGURES["claims"]
    assert images[1].caption == report.FIGURES["dynamics"]
    todo = "No caption yet (add one to FIGURES in pipeline/present/report.py)."
    assert images[2].caption == report.Caption("new measure", "Figure: new measure", todo)
    assert images[3].caption == report.Caption("zeta plot", "Figure: zeta plot", todo)
    assert (
        report.figure(images[3], "f3")
        == '<figure id="f3"><img src="data:image/png;base64,emV0YV9wbG90LnBuZw==" '
        f'alt="Figure: zeta plot"><figcaption><strong>Figure: zeta plot.</strong> {todo} '
        '<span class="file">zeta_plot.png</span></figcaption></figure>'
    )


def test_images_follow_the_pages_order_not_the_alphabet_then_by_file_name(tmp_path):
    """ORDER puts claims before timing before ablation_loss (alphabetically the reverse); the
    figures no one ordered (aaa, x) come after them, by name, x.gif before x.jpg."""
    for name in ("aaa.png", "ablation_loss.png", "timing.png", "x.jpg", "x.gif", "claims.png"):
        (tmp_path / name).write_bytes(name.encode())
    images = report.read_images(tmp_path)
    assert [i.name for i in images] == [
        "claims.png",
        "timing.png",
        "ablation_loss.png",
        "aaa.png",
        "x.gif",
        "x.jpg",
    ]


def test_a_figure_with_no_caption_text_has_one_space_before_its_file_name():
    image = report.Image("x.png", b"x", "image/png", report.Caption("x", "Figure: x", ""))
    assert report.figure(image, "fx") == (
        '<figure id="fx"><img src="data:image/png;base64,eA==" alt="Figure: x"><figcaption>'
        '<strong>Figure: x.</strong> <span class="file">x.png</span></figcaption></figure>'
    )


def test_a_missing_figure_directory_is_named(tmp_path):
    with pytest.raises(UserError) as e:
        report.read_images(tmp_path / "figures")
    assert str(e.value) == f"{tmp_path / 'figures'}: figure directory not found"


FACTS = {
    "discovered": {"K": 5, "Q": 1, "V": 0},
    "shown": 4,
    "left_out": 2,
    "channel_discoveries": 3,
    "d_head": 16,
    "channels_shown": 8,
}


def test_the_channel_caption_counts_the_pairs_shown_and_left_out():
    text = report.channels_caption(FACTS)
    assert text.startswith(
        "4 of the 6 pairs whose corrected score is a discovery (K 5, Q 1, V 0); the 2 with the lowest "
        "calibrated z are left out, one heat map each. Rows: the writer's channels i"
    )
    assert "both strongest first (the leading 8 of 16, widened to every panel's top channel). " in text
    assert (
        "||OV^a N^b||^2 carried by writer channel i into reader channel j, s_i^2 t_j^2 (w_i . k_j)^2 "
        "over its sum" in text
    )
    assert text.endswith(
        "A star and a red frame: a channel discovery (3 shown), a pair that composes mainly through its "
        "top channel (its top share against a randomly rotated reader, FDR-controlled)."
    )
    every = report.channels_caption(FACTS | {"shown": 6, "left_out": 0, "channels_shown": 16})
    assert every.startswith("All 6 pairs whose corrected score is a discovery (K 5, Q 1, V 0), one heat map")
    assert "both strongest first (all 16). " in every
    none = FACTS | {"discovered": {"K": 0, "Q": 0, "V": 0}}
    assert report.channels_caption(none) == (
        "No pair's corrected score is a discovery in this seed, so there is no channel table to show."
    )


def test_the_channel_figure_is_captioned_from_its_facts_and_broken_facts_are_named(tmp_path):
    (tmp_path / "channels.png").write_bytes(b"png")
    (tmp_path / "channels.json").write_text(json.dumps(FACTS))
    (image,) = report.read_images(tmp_path)
    short, title = report.FIGURES["channels"].short, report.FIGURES["channels"].title
    assert image.caption == report.Caption(short, title, report.channels_caption(FACTS))
    (tmp_path / "channels.json").write_text(json.dumps({"discovered": {"K": 1}}))
    with pytest.raises(UserError) as e:
        report.read_images(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'channels.json'}: not the figures stage's facts of channels.png (KeyError('left_out'))"
    )
