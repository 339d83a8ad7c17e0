"""A small raster canvas that writes PNG: filled boxes and text in a built-in pixel font.

The views' static pictures are PNG because PNG is the one form every notebook reader shows:
JupyterLab and Notebook 7 render ``image/png`` in untrusted notebooks (their sanitizer strips
inline SVG from ``text/html``, and ``image/svg+xml`` counts as unsafe), nbconvert embeds it
offline, and GitHub's renderer shows it. Pictures of meshes and shardings are boxes and short
labels, so a NumPy canvas, a 5 x 7 pixel font drawn at twice its size and ``zlib`` are all it
takes; no imaging library is needed in the kernel.

This module never imports JAX.
"""

from __future__ import annotations

import functools
import struct
import zlib

import numpy as np

#: Pixels each font pixel becomes; a character is then 10 x 14 pixels and advances 12.
SCALE = 2
CHAR_W = 6 * SCALE
CHAR_H = 7 * SCALE
LINE_H = CHAR_H + 6

# Each glyph is seven rows of five pixels, a row as a number whose bit 16 is the leftmost
# pixel. Characters not listed are drawn as "?".
_ROWS = {
    " ": (0, 0, 0, 0, 0, 0, 0), "!": (4, 4, 4, 4, 4, 0, 4), '"': (10, 10, 0, 0, 0, 0, 0),
    "#": (10, 10, 31, 10, 31, 10, 10), "$": (4, 15, 20, 14, 5, 30, 4),
    "%": (24, 25, 2, 4, 8, 19, 3), "&": (12, 18, 20, 8, 21, 18, 13), "'": (4, 4, 0, 0, 0, 0, 0),
    "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8), "*": (0, 4, 21, 14, 21, 4, 0),
    "+": (0, 4, 4, 31, 4, 4, 0), ",": (0, 0, 0, 0, 12, 4, 8), "-": (0, 0, 0, 31, 0, 0, 0),
    ".": (0, 0, 0, 0, 0, 12, 12), "/": (0, 1, 2, 4, 8, 16, 0),
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31), "3": (31, 2, 4, 2, 1, 17, 14), "4": (2, 6, 10, 18, 31, 2, 2),
    "5": (31, 16, 30, 1, 1, 17, 14), "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14), "9": (14, 17, 17, 15, 1, 2, 12),
    ":": (0, 12, 12, 0, 12, 12, 0), ";": (0, 12, 12, 0, 12, 4, 8), "<": (2, 4, 8, 16, 8, 4, 2),
    "=": (0, 0, 31, 0, 31, 0, 0), ">": (8, 4, 2, 1, 2, 4, 8), "?": (14, 17, 1, 2, 4, 0, 4),
    "@": (14, 17, 1, 13, 21, 21, 14), "A": (14, 17, 17, 31, 17, 17, 17),
    "B": (30, 17, 17, 30, 17, 17, 30), "C": (14, 17, 16, 16, 16, 17, 14),
    "D": (28, 18, 17, 17, 17, 18, 28), "E": (31, 16, 16, 30, 16, 16, 31),
    "F": (31, 16, 16, 30, 16, 16, 16), "G": (14, 17, 16, 23, 17, 17, 15),
    "H": (17, 17, 17, 31, 17, 17, 17), "I": (14, 4, 4, 4, 4, 4, 14),
    "J": (7, 2, 2, 2, 2, 18, 12), "K": (17, 18, 20, 24, 20, 18, 17),
    "L": (16, 16, 16, 16, 16, 16, 31), "M": (17, 27, 21, 21, 17, 17, 17),
    "N": (17, 17, 25, 21, 19, 17, 17), "O": (14, 17, 17, 17, 17, 17, 14),
    "P": (30, 17, 17, 30, 16, 16, 16), "Q": (14, 17, 17, 17, 21, 18, 13),
    "R": (30, 17, 17, 30, 20, 18, 17), "S": (15, 16, 16, 14, 1, 1, 30),
    "T": (31, 4, 4, 4, 4, 4, 4), "U": (17, 17, 17, 17, 17, 17, 14),
    "V": (17, 17, 17, 17, 17, 10, 4), "W": (17, 17, 17, 21, 21, 21, 10),
    "X": (17, 17, 10, 4, 10, 17, 17), "Y": (17, 17, 10, 4, 4, 4, 4),
    "Z": (31, 1, 2, 4, 8, 16, 31), "[": (14, 8, 8, 8, 8, 8, 14), "\\": (0, 16, 8, 4, 2, 1, 0),
    "]": (14, 2, 2, 2, 2, 2, 14), "^": (4, 10, 17, 0, 0, 0, 0), "_": (0, 0, 0, 0, 0, 0, 31),
    "`": (8, 4, 0, 0, 0, 0, 0), "a": (0, 0, 14, 1, 15, 17, 15),
    "b": (16, 16, 22, 25, 17, 17, 30), "c": (0, 0, 14, 16, 16, 17, 14),
    "d": (1, 1, 13, 19, 17, 17, 15), "e": (0, 0, 14, 17, 31, 16, 14),
    "f": (6, 9, 8, 28, 8, 8, 8), "g": (0, 15, 17, 17, 15, 1, 14),
    "h": (16, 16, 22, 25, 17, 17, 17), "i": (4, 0, 12, 4, 4, 4, 14), "j": (2, 0, 6, 2, 2, 18, 12),
    "k": (16, 16, 18, 20, 24, 20, 18), "l": (12, 4, 4, 4, 4, 4, 14),
    "m": (0, 0, 26, 21, 21, 17, 17), "n": (0, 0, 22, 25, 17, 17, 17),
    "o": (0, 0, 14, 17, 17, 17, 14), "p": (0, 0, 30, 17, 30, 16, 16),
    "q": (0, 0, 13, 19, 15, 1, 1), "r": (0, 0, 22, 25, 16, 16, 16),
    "s": (0, 0, 14, 16, 14, 1, 30), "t": (8, 8, 28, 8, 8, 9, 6), "u": (0, 0, 17, 17, 17, 19, 13),
    "v": (0, 0, 17, 17, 17, 10, 4), "w": (0, 0, 17, 17, 21, 21, 10),
    "x": (0, 0, 17, 10, 4, 10, 17), "y": (0, 0, 17, 17, 15, 1, 14), "z": (0, 0, 31, 2, 4, 8, 31),
    "{": (2, 4, 4, 8, 4, 4, 2), "|": (4, 4, 4, 4, 4, 4, 4), "}": (8, 4, 4, 2, 4, 4, 8),
    "~": (0, 0, 8, 21, 2, 0, 0), "×": (0, 17, 10, 4, 10, 17, 0), "·": (0, 0, 0, 12, 12, 0, 0),
    "…": (0, 0, 0, 0, 0, 0, 21), "→": (0, 4, 2, 31, 2, 4, 0), "↓": (4, 4, 4, 21, 14, 4, 0),
    "—": (0, 0, 0, 31, 0, 0, 0), "≥": (8, 4, 2, 4, 8, 0, 31),
}  # fmt: skip


def _glyph(rows: tuple[int, ...]) -> np.ndarray:
    bits = np.array([[(r >> (4 - i)) & 1 for i in range(5)] for r in rows], dtype=bool)
    return np.kron(bits, np.ones((SCALE, SCALE), dtype=bool))


_GLYPHS = {c: _glyph(r) for c, r in _ROWS.items()}


@functools.cache  # a picture uses a few colours thousands of times
def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` or ``hsl(h, s%, l%)`` (the forms the process palette uses) as RGB bytes."""
    colour = colour.strip()
    if colour.startswith("#") and len(colour) == 7:
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]
    if colour.startswith("hsl(") and colour.endswith(")"):
        h, s, light = (float(v.strip().rstrip("%")) for v in colour[4:-1].split(","))
        return _hsl(h / 360, s / 100, light / 100)
    raise ValueError(f"unknown colour {colour!r}: expected #rrggbb or hsl(h, s%, l%)")


def _hsl(h: float, s: float, light: float) -> tuple[int, int, int]:
    a = s * min(light, 1 - light)

    def f(n: float) -> int:
        k = (n + h * 12) % 12
        return round(255 * (light - a * max(-1.0, min(k - 3, 9 - k, 1.0))))

    return f(0), f(8), f(4)


def text_width(text: str) -> int:
    """Pixels ``text`` takes in the built-in font."""
    return len(text) * CHAR_W


def fit(text: str, width: float) -> str:
    """``text`` cut to ``width`` pixels, ending in an ellipsis when cut."""
    room = int(width // CHAR_W)
    if len(text) <= room:
        return text
    return text[: room - 1] + "…" if room > 1 else ""


class Canvas:
    """An RGB picture on a white background; draw on it, then :meth:`png`.

    Parameters
    ----------
    width, height : int
        Size in pixels (at least 1).
    """

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = max(1, int(width)), max(1, int(height))
        self.pixels = np.full((self.height, self.width, 3), 255, dtype=np.uint8)

    def box(self, x: float, y: float, w: float, h: float, fill=None, edge=None) -> None:
        """A rectangle, filled with ``fill`` and/or outlined one pixel wide in ``edge``."""
        x0, y0 = max(0, round(x)), max(0, round(y))
        x1, y1 = min(self.width, round(x + w)), min(self.height, round(y + h))
        if x1 <= x0 or y1 <= y0:
            return
        if fill is not None:
            self.pixels[y0:y1, x0:x1] = rgb(fill)
        if edge is not None:
            c = rgb(edge)
            self.pixels[y0, x0:x1] = self.pixels[y1 - 1, x0:x1] = c
            self.pixels[y0:y1, x0] = self.pixels[y0:y1, x1 - 1] = c

    def text(self, x: float, y: float, text: str, colour: str = "#111111", centre=False) -> None:
        """``text`` with its top-left corner at (x, y), or centred on (x, y) if ``centre``."""
        if centre:
            x, y = x - text_width(text) / 2, y - CHAR_H / 2
        c = rgb(colour)
        x, y = round(x), round(y)
        for ch in text:
            glyph = _GLYPHS.get(ch, _GLYPHS["?"])
            h, w = glyph.shape
            gy0, gx0 = max(0, -y), max(0, -x)
            gy1, gx1 = min(h, self.height - y), min(w, self.width - x)
            if gy1 > gy0 and gx1 > gx0:
                mask = glyph[gy0:gy1, gx0:gx1]
                self.pixels[y + gy0 : y + gy1, x + gx0 : x + gx1][mask] = c
            x += CHAR_W

    def png(self) -> bytes:
        """The picture as PNG bytes (8-bit RGB, no filtering)."""
        rows = np.zeros((self.height, 1 + self.width * 3), dtype=np.uint8)
        rows[:, 1:] = self.pixels.reshape(self.height, -1)

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b"")
        )
