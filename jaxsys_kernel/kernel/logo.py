"""The jaxsys mark for the kernelspec: four device squares in process colours and a ``j``.

Jupyter shows ``logo-32x32.png`` and ``logo-64x64.png`` from a kernelspec's folder on the
launcher tile and in the kernel picker (``logo-svg.svg`` where it prefers vectors). The
mark is drawn here, in code, so that the files in ``share/jupyter/kernels/jaxsys`` and those
``jaxsys install-kernel`` writes are the same picture::

    python -m jaxsys_kernel.kernel.logo share/jupyter/kernels/jaxsys

The four squares are a 2 x 2 mesh of devices coloured like processes 0-3 in the views
(:data:`jaxsys_kernel.data.draw.PALETTE`); the white ``j`` runs across them.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import numpy as np

from ..data.draw import PALETTE

#: The PNG sizes Jupyter looks for, and their file names.
SIZES = (32, 64)
SVG_NAME = "logo-svg.svg"

# The mark on a 100 x 100 grid: squares (top-left corners, side, corner radius), the j's dot
# (centre, radius) and its stem (left, top, width), which ends at HOOK_Y in a half ring of
# radius HOOK_R (measured to the middle of the stroke) bending to the left.
_SQUARES = [(4, 4), (52, 4), (4, 52), (52, 52)]
_SIDE, _CORNER = 44, 8
_DOT = (56.0, 24.0, 8.0)
_STEM = (49.0, 38.0, 14.0)
_HOOK_Y, _HOOK_R = 72.0, 14.0
_WHITE = (255, 255, 255)
_SUPERSAMPLE = 4


def png_name(size: int) -> str:
    """``logo-32x32.png`` for 32."""
    return f"logo-{size}x{size}.png"


def _rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _rounded(x, y, x0, y0, side, r):
    """Whether each point lies in a rounded square."""
    cx = np.clip(x, x0 + r, x0 + side - r)
    cy = np.clip(y, y0 + r, y0 + side - r)
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def _j(x, y):
    """Whether each point lies in the j: a dot, a stem and a hook to the left at its foot."""
    dx, dy, dr = _DOT
    dot = (x - dx) ** 2 + (y - dy) ** 2 <= dr * dr
    sx, top, width = _STEM
    half = width / 2
    stem = (x >= sx) & (x <= sx + width) & (y >= top) & (y <= _HOOK_Y)
    # The hook: the lower half of a ring whose right side continues the stem.
    cx = sx + half - _HOOK_R
    d2 = (x - cx) ** 2 + (y - _HOOK_Y) ** 2
    hook = (d2 <= (_HOOK_R + half) ** 2) & (d2 >= (_HOOK_R - half) ** 2) & (y >= _HOOK_Y)
    # A round end where the hook stops, on the left.
    end = (x - (cx - _HOOK_R)) ** 2 + (y - _HOOK_Y) ** 2 <= half**2
    return dot | stem | hook | end


def logo_pixels(size: int) -> np.ndarray:
    """The mark as ``size`` x ``size`` RGBA pixels (transparent around the squares)."""
    n = size * _SUPERSAMPLE
    coords = (np.arange(n) + 0.5) * (100.0 / n)
    x, y = np.meshgrid(coords, coords)
    rgba = np.zeros((n, n, 4), dtype=np.float64)
    for (x0, y0), colour in zip(_SQUARES, PALETTE, strict=False):
        inside = _rounded(x, y, x0, y0, _SIDE, _CORNER)
        rgba[inside, :3] = _rgb(colour)
        rgba[inside, 3] = 255
    letter = _j(x, y)
    rgba[letter, :3] = _WHITE
    rgba[letter, 3] = 255
    # Average each block of samples: edges come out smooth at either size. Colour is
    # weighted by coverage so that a half-covered pixel is not darkened towards black.
    blocks = rgba.reshape(size, _SUPERSAMPLE, size, _SUPERSAMPLE, 4)
    alpha = blocks[..., 3].mean(axis=(1, 3))
    weighted = (blocks[..., :3] * blocks[..., 3:]).sum(axis=(1, 3))
    cover = blocks[..., 3].sum(axis=(1, 3))[..., None]
    colour = np.divide(weighted, cover, out=np.zeros_like(weighted), where=cover > 0)
    out = np.concatenate([colour, alpha[..., None]], axis=-1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def logo_png(size: int) -> bytes:
    """The mark as PNG bytes (8-bit RGBA), ``size`` pixels square."""
    pixels = logo_pixels(size)
    rows = np.zeros((size, 1 + size * 4), dtype=np.uint8)
    rows[:, 1:] = pixels.reshape(size, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + chunk(b"IEND", b"")
    )


def logo_svg() -> str:
    """The mark as SVG, on the same 100 x 100 grid as the PNGs."""
    squares = "".join(
        f'<rect x="{x0}" y="{y0}" width="{_SIDE}" height="{_SIDE}" rx="{_CORNER}" fill="{colour}"/>'
        for (x0, y0), colour in zip(_SQUARES, PALETTE, strict=False)
    )
    dx, dy, dr = _DOT
    sx, top, width = _STEM
    mid, r = sx + width / 2, _HOOK_R
    # The stem and hook as one stroke with a square top, as in the PNGs: down the stem, half
    # a circle to the left, and a round end.
    j = (
        f'<circle cx="{dx:g}" cy="{dy:g}" r="{dr:g}" fill="#fff"/>'
        f'<path d="M{mid:g} {top:g}V{_HOOK_Y:g}A{r:g} {r:g} 0 0 1 {mid - 2 * r:g} {_HOOK_Y:g}" '
        f'fill="none" stroke="#fff" stroke-width="{width:g}" stroke-linecap="butt"/>'
        f'<circle cx="{mid - 2 * r:g}" cy="{_HOOK_Y:g}" r="{width / 2:g}" fill="#fff"/>'
    )
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 100 100">'
        f"<title>jaxsys</title>{squares}{j}</svg>\n"
    )


def write_logos(folder: str | Path) -> list[Path]:
    """Write the PNG logos and the SVG into ``folder``; returns the files written."""
    folder = Path(folder)
    written = []
    for size in SIZES:
        path = folder / png_name(size)
        path.write_bytes(logo_png(size))
        written.append(path)
    svg = folder / SVG_NAME
    svg.write_text(logo_svg())
    written.append(svg)
    return written


if __name__ == "__main__":
    for path in write_logos(sys.argv[1] if len(sys.argv) > 1 else "."):
        print(path)
