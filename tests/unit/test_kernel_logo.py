"""The kernelspec carries the jaxsys logo: the packaged folder and every install have
``logo-32x32.png`` and ``logo-64x64.png`` (valid PNGs of their size) and the SVG."""

from __future__ import annotations

import struct
import tomllib
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_server.services.kernelspecs.handlers import kernelspec_model

from jaxsys_kernel.kernel import logo
from jaxsys_kernel.kernel.spec import KERNEL_NAME, install_kernel_spec

ROOT = Path(__file__).parents[2]
SHARED = ROOT / "share" / "jupyter" / "kernels" / "jaxsys"


def read_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGBA or RGB PNG without filters (what a reader must be able to)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        chunks.setdefault(kind, b"")
        chunks[kind] += body
        pos += 12 + length
    assert b"IEND" in chunks
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8 and colour in (2, 6)
    channels = 4 if colour == 6 else 3
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8)
    rows = rows.reshape(height, 1 + width * channels)
    assert not rows[:, 0].any(), "filtered rows: this reader expects none"
    return rows[:, 1:].reshape(height, width, channels)


def check_logos(folder: Path) -> None:
    for size in (32, 64):
        pixels = read_png((folder / f"logo-{size}x{size}.png").read_bytes())
        assert pixels.shape[:2] == (size, size)
        # A mark, not a blank: the four process colours and the white j are all there.
        opaque = pixels[pixels[..., 3] == 255][:, :3]
        colours = {tuple(c) for c in opaque}
        assert (255, 255, 255) in colours
        assert len(colours) >= 5
        # Transparent at the corners (the squares are rounded), opaque in the middle.
        assert pixels[0, 0, 3] == 0 and pixels[size // 2, size // 2, 3] == 255
    svg = (folder / logo.SVG_NAME).read_text()
    assert svg.startswith("<svg") and "<title>jaxsys</title>" in svg


def test_the_packaged_kernelspec_has_the_logos():
    check_logos(SHARED)
    # The files are what the drawing code draws: one source for both.
    for size in logo.SIZES:
        assert (SHARED / logo.png_name(size)).read_bytes() == logo.logo_png(size), (
            "share/ is stale: python -m jaxsys_kernel.kernel.logo share/jupyter/kernels/jaxsys"
        )
    assert (SHARED / logo.SVG_NAME).read_text() == logo.logo_svg()
    # The wheel ships that folder as the kernelspec.
    shared_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    mapping = shared_data["targets"]["wheel"]["shared-data"]
    assert mapping["share/jupyter/kernels/jaxsys"] == "share/jupyter/kernels/jaxsys"


def test_install_kernel_writes_the_logos_and_jupyter_lists_them(tmp_path):
    where = Path(install_kernel_spec(prefix=str(tmp_path)))
    check_logos(where)
    manager = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    found = manager.get_all_specs()[KERNEL_NAME]
    # The model Jupyter Server's REST API gives the launcher tile and the kernel picker.
    model = kernelspec_model(
        SimpleNamespace(base_url="/"), KERNEL_NAME, found["spec"], found["resource_dir"]
    )
    assert {"logo-32x32", "logo-64x64", "logo-svg"} <= set(model["resources"])


@pytest.mark.parametrize("size", logo.SIZES)
def test_the_mark_is_the_same_picture_at_both_sizes(size):
    small = logo.logo_pixels(32).astype(float)
    other = logo.logo_pixels(size).astype(float)
    factor = size // 32
    shrunk = other.reshape(32, factor, 32, factor, 4).mean(axis=(1, 3))
    assert np.abs(shrunk[..., 3] - small[..., 3]).mean() < 8
