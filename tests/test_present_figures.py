"""`figures.save` on a figure drawn here: both files written under the base name, at the dpi
asked, with no date in the SVG and no text chunk (matplotlib's version as `Software`) in the PNG,
so that the same figure gives the same bytes on any machine; the figure is closed."""

from __future__ import annotations

import matplotlib.pyplot as plt
from PIL import Image

from pipeline.present import figures


def test_save_writes_a_png_with_no_text_chunk_and_an_svg_with_no_date_then_closes_the_figure(tmp_path):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    paths = figures.save(fig, tmp_path / "f", dpi=50)
    assert paths == [tmp_path / "f.png", tmp_path / "f.svg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png", "f.svg"]  # no temporary left
    with Image.open(paths[0]) as png:
        assert png.format == "PNG" and png.size == (100, 50)  # 2 x 1 inches at 50 dpi
        assert png.text == {}  # matplotlib writes Software: Matplotlib version ... unless told not to
    svg = paths[1].read_text()
    assert svg.startswith("<?xml") and "<dc:date>" not in svg
    assert not plt.fignum_exists(fig.number)


def test_save_writes_only_the_formats_asked(tmp_path):
    fig, _ = plt.subplots(figsize=(1, 1))
    assert figures.save(fig, tmp_path / "g", formats=("svg",)) == [tmp_path / "g.svg"]
    assert [p.name for p in tmp_path.iterdir()] == ["g.svg"]


def test_save_writes_at_120_dpi_unless_asked(tmp_path):
    fig, _ = plt.subplots(figsize=(2, 1))
    (path,) = figures.save(fig, tmp_path / "h", formats=("png",))
    with Image.open(path) as png:
        assert png.size == (240, 120)  # 2 x 1 inches at 120 dpi
