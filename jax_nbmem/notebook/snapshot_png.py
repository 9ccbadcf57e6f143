"""The panel's SVG snapshot as a PNG, for viewers that show no SVG.

A sanitised view keeps an image but drops markup: nbconvert's HTML sanitiser removes
``image/svg+xml`` and escapes HTML, and JupyterLab draws SVG only in trusted notebooks, while
``image/png`` passes everywhere. This draws the SVG of
:func:`jax_nbmem.notebook.snapshot.figure_svg` (and only its small vocabulary: ``line``,
``rect``, ``text``, ``path`` of ``M H V L Z``) with Pillow, so the PNG and the SVG are one
drawing. Pillow, not a general SVG rasteriser: it ships wheels for every platform JAX does,
needs no system library (cairosvg needs libcairo) and brings its own font, so the picture's
words come out the same on a server without fonts. Without Pillow there is no PNG
(:func:`svg_to_png` returns None) and the SVG still shows where it can.
"""

from __future__ import annotations

import functools
import io
import logging
import re
import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["svg_to_png"]

log = logging.getLogger("jax_nbmem")

_NS = "{http://www.w3.org/2000/svg}"
_FONT_PX = 11
_PATH_TOKEN = re.compile(r"[MHVLZ]|-?[0-9.]+(?:e-?[0-9]+)?")
_RGBA = re.compile(r"rgba?\(([^)]*)\)")
_ANCHORS = {"start": "ls", "middle": "ms", "end": "rs"}
# Glyphs the SVG uses that Pillow's own font lacks, and what stands for them.
_GLYPHS = str.maketrans({"↑": "^"})


@functools.lru_cache(maxsize=256)
def _colour(value: str | None) -> tuple[int, int, int] | None:
    """An RGB colour, an ``rgba()`` one blended over white; None for none or unreadable."""
    if not value or value == "none":
        return None
    match = _RGBA.fullmatch(value.strip())
    if match:
        parts = [float(p) for p in match.group(1).split(",")]
        alpha = parts[3] if len(parts) > 3 else 1.0
        return tuple(round(c * alpha + 255 * (1 - alpha)) for c in parts[:3])  # type: ignore[return-value]
    from PIL import ImageColor

    try:
        return ImageColor.getrgb(value)[:3]
    except ValueError:
        return None


def _style(element: ET.Element, name: str) -> str | None:
    """An attribute, or the same property in the element's ``style``."""
    for declaration in element.get("style", "").split(";"):
        key, _, value = declaration.partition(":")
        if key.strip() == name:
            return value.strip()
    return element.get(name)


def _subpaths(d: str) -> list[tuple[list[tuple[float, float]], bool]]:
    """The points of each subpath of ``d`` (absolute M, H, V, L, Z) and whether it closes."""
    paths: list[tuple[list[tuple[float, float]], bool]] = []
    points: list[tuple[float, float]] = []
    tokens = _PATH_TOKEN.findall(d)
    at, command = 0, ""
    while at < len(tokens):
        token = tokens[at]
        if token in "MLHVZ":
            command, at = token, at + 1
            if command == "Z" and points:
                paths.append((points, True))
                points = []
            continue
        if command in "ML":
            point = (float(token), float(tokens[at + 1]))
            if command == "M" and points:
                paths.append((points, False))
            points = [point] if command == "M" else [*points, point]
            command = "L" if command == "M" else command  # more pairs after M are lines
            at += 2
            continue
        if points and command == "H":
            points.append((float(token), points[-1][1]))
        elif points and command == "V":
            points.append((points[-1][0], float(token)))
        at += 1
    if points:
        paths.append((points, False))
    return paths


def _dashed(draw: Any, points: list, fill: tuple, width: int, on: float, off: float) -> None:
    """A polyline drawn in dashes of *on* pixels with gaps of *off*."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        length = ((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5
        at = 0.0
        while at < length:
            end = min(at + on, length)
            a, b = at / length, end / length
            start = (x0 + (x1 - x0) * a, y0 + (y1 - y0) * a)
            draw.line([start, (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)], fill=fill, width=width)
            at = end + off


def _path(draw: Any, element: ET.Element) -> None:
    fill = _colour(_style(element, "fill"))
    stroke = _colour(_style(element, "stroke"))
    width = max(1, round(float(element.get("stroke-width", "1"))))
    dash = [float(n) for n in element.get("stroke-dasharray", "").split(",") if n]
    for points, closed in _subpaths(element.get("d", "")):
        if fill is not None and len(points) > 2:
            draw.polygon(points, fill=fill)
        if stroke is None or len(points) < 2:
            continue
        line = [*points, points[0]] if closed else points
        if len(dash) == 2:
            _dashed(draw, line, stroke, width, *dash)
        else:
            draw.line(line, fill=stroke, width=width, joint="curve")


@functools.lru_cache(maxsize=1)
def _font() -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=_FONT_PX)  # Pillow >= 10.1 with FreeType
    except TypeError:
        return ImageFont.load_default()


@functools.lru_cache(maxsize=1024)
def _glyphs(words: str, anchor: str, turned: bool) -> tuple[Any, int, int]:
    """*words* as a one-bit mask and where its corner goes from the anchor point.

    Kept: a refresh redraws mostly the same words (ticks, legend, labels), and drawing text
    is most of a picture's cost.
    """
    from PIL import Image, ImageDraw

    font = _font()
    left, top, right, bottom = font.getbbox(words, anchor=anchor)
    pad = _FONT_PX  # glyphs may reach past the box the font reports: drawn with room, cut
    left, top = left - pad, top - pad
    mask = Image.new("1", (right - left + pad, bottom - top + pad), 0)
    ImageDraw.Draw(mask).text((-left, -top), words, fill=1, font=font, anchor=anchor)
    inked = mask.getbbox() or (0, 0, 1, 1)
    mask = mask.crop(inked)
    left, top = left + inked[0], top + inked[1]
    if not turned:
        return mask, left, top
    # Turned a quarter to read bottom to top, centred on the anchor point.
    mask = mask.rotate(90, expand=True)
    return mask, -(mask.width // 2), -(mask.height // 2)


def _text(draw: Any, element: ET.Element) -> None:
    words = "".join(element.itertext()).translate(_GLYPHS)
    if not words.strip():
        return
    x, y = float(element.get("x", 0)), float(element.get("y", 0))
    fill = _colour(element.get("fill")) or (0, 0, 0)
    anchor = _ANCHORS.get(element.get("text-anchor", "start"), "ls")
    turned = "rotate(-90" in element.get("transform", "")
    mask, dx, dy = _glyphs(words, "ls" if turned else anchor, turned)
    draw.bitmap((round(x) + dx, round(y) + dy), mask, fill=fill)


def _draw(svg: str) -> Any:
    from PIL import Image, ImageDraw

    root = ET.fromstring(svg)
    width, height = round(float(root.get("width", 960))), round(float(root.get("height", 440)))
    # A palette image from the start: the figure has few colours, and no quantising to pay.
    image = Image.new("P", (width, height))
    image.putpalette([255, 255, 255])
    draw = ImageDraw.Draw(image)
    for element in root.iter():
        tag = element.tag.removeprefix(_NS)
        if tag == "line":
            ends = [float(element.get(k, 0)) for k in ("x1", "y1", "x2", "y2")]
            stroke = _colour(element.get("stroke")) or (0, 0, 0)
            width = max(1, round(float(element.get("stroke-width", "1"))))
            draw.line(ends, fill=stroke, width=width)
        elif tag == "rect":
            x, y = float(element.get("x", 0)), float(element.get("y", 0))
            w, h = float(element.get("width", 0)), float(element.get("height", 0))
            fill = _colour(_style(element, "fill"))
            if fill is not None:
                draw.rectangle([x, y, x + max(w - 1, 0), y + max(h - 1, 0)], fill=fill)
        elif tag == "path":
            _path(draw, element)
        elif tag == "text":
            _text(draw, element)
    return image


def svg_to_png(svg: str) -> bytes | None:
    """The PNG of *svg* (one of :func:`figure_svg`'s), or None without Pillow or on a fault."""
    try:
        image = _draw(svg)
    except ImportError:
        return None
    except Exception:  # an SVG this module does not read: the SVG still shows
        log.debug("jax_nbmem: the snapshot's PNG was not drawn", exc_info=True)
        return None
    out = io.BytesIO()
    # Fast deflate: a palette image of flat colours compresses well even so (about 15 KB).
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()
