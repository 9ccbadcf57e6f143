"""The snapshot's PNG: the same drawing as its SVG, small, and absent (said) without Pillow."""

import base64
import builtins
import io

from PIL import Image

from jax_nbmem.notebook import snapshot_png
from jax_nbmem.notebook.figure import build_figure
from jax_nbmem.notebook.snapshot import figure_svg, picture_bundle
from jax_nbmem.notebook.snapshot_png import svg_to_png
from tests.notebook.test_figure import GIB, MIB, gpu, record, sample

OTHERS_RED = (0xD6, 0x27, 0x28)  # the "other processes" line's colour in the figure


def _figure(cells: int = 12) -> dict:
    samples = [sample(i, gpu(self_bytes=(i % 7) * 300 * MIB, others=20 * GIB)) for i in range(200)]
    records = [
        record(n, n * 10, 0, (n % 5) * 200 * MIB, (n % 3) * 100 * MIB, success=n != 4)
        for n in range(1, cells + 1)
    ]
    return build_figure(samples, records, gpu_index=0)


def _image(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def test_the_png_draws_the_svgs_lines_bars_and_words_at_its_size():
    svg = figure_svg(_figure())
    image = _image(svg_to_png(svg))
    assert image.size == (960, 440)
    colours = {colour for _, colour in image.getcolors(maxcolors=1 << 16)}
    assert OTHERS_RED in colours or any(
        abs(r - OTHERS_RED[0]) + abs(g - OTHERS_RED[1]) + abs(b - OTHERS_RED[2]) < 30
        for r, g, b in colours
    )
    # The bars' panel (lower quarter) holds the blue of "cell peak", and the left margin the
    # dark grey of the axis' words.
    lower = image.crop((62, 330, 950, 410))
    assert any(b > 150 and r < 80 for _, (r, g, b) in lower.getcolors(1 << 16))
    margin = image.crop((0, 40, 60, 300))
    assert any(max(pixel) < 120 for _, pixel in margin.getcolors(1 << 16))


def test_a_png_of_a_later_state_differs_and_stays_small():
    early, late = (svg_to_png(figure_svg(_figure(n))) for n in (3, 12))
    assert early != late
    assert len(late) < 40_000, len(late)


def test_the_picture_bundle_has_svg_and_png_and_says_when_png_is_missing(monkeypatch):
    figure = _figure()
    bundle = picture_bundle(figure)
    assert bundle["image/svg+xml"] == figure_svg(figure)
    assert base64.b64decode(bundle["image/png"]) == svg_to_png(bundle["image/svg+xml"])
    real_import = builtins.__import__

    def no_pillow(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pillow)
    without = picture_bundle(figure)
    assert "image/png" not in without and "image/svg+xml" in without
    assert "no PNG without Pillow" in without["text/plain"]
    assert picture_bundle(None) == {"text/plain": "(jax_nbmem: no picture of the panel yet)"}


def test_an_svg_it_cannot_read_gives_no_png_and_no_exception():
    assert snapshot_png.svg_to_png("<svg") is None
