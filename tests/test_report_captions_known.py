"""The report's figures by name, on a directory written by hand: known figures in ORDER with
their FIGURES caption, an SVG only where no PNG of its name exists, and a figure no one has
described yet captioned as such, so that the page says it needs one."""

from __future__ import annotations

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
