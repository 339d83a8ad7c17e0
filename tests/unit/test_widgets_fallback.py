"""The views' static forms: the mesh and the sharding carry a PNG picture (what untrusted
Lab, nbconvert and GitHub all show) and a text summary; the tables carry HTML and text."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np
import pytest

from jaxsys_kernel.data.draw import process_colour
from jaxsys_kernel.engine.simulate import FakeNamedSharding
from jaxsys_kernel.engine.summaries import fake_devices, fake_mesh, mesh_info, sharding_info
from jaxsys_kernel.widgets import CacheView, Dashboard, LiveDevicesView, MeshView, ShardingView
from jaxsys_kernel.widgets.pictures import mesh_caption, sharding_caption
from jaxsys_kernel.widgets.raster import rgb, text_width


def bundle(view) -> dict:
    data, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data  # the live view stays first
    return data


def decode_png(b64: str) -> np.ndarray:
    """The pixels of an 8-bit RGB PNG as written by the views (height x width x 3)."""
    raw = base64.b64decode(b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", raw[16:26])
    assert (depth, colour) == (8, 2)
    idat, i = b"", 8
    while i < len(raw):
        (n,) = struct.unpack(">I", raw[i : i + 4])
        if raw[i + 4 : i + 8] == b"IDAT":
            idat += raw[i + 8 : i + 8 + n]
        i += 12 + n
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * 3)
    assert not rows[:, 0].any()  # filter type 0 on every row
    return rows[:, 1:].reshape(height, width, 3)


def colour_count(pixels: np.ndarray, colour: str) -> int:
    return int(np.all(pixels == np.array(rgb(colour), np.uint8), axis=-1).sum())


def mesh():
    return fake_mesh(fake_devices(8, 2), (4, 2), ("x", "y"))


def test_mesh_is_a_png_grid_in_its_process_colours_and_a_text_line():
    data = bundle(MeshView(mesh_info(mesh())))
    assert "text/html" not in data  # an untrusted notebook would prefer it to the picture
    assert data["text/plain"].startswith("Mesh(x=4, y=2): 8 devices of processes p0-3")
    pixels = decode_png(data["image/png"])
    areas = [colour_count(pixels, process_colour(p)) for p in range(4)]
    # Two cells per process, of equal size; no fifth colour.
    assert min(areas) > 2 * 40 * 40 and max(areas) - min(areas) < 0.05 * max(areas), areas
    assert colour_count(pixels, process_colour(4)) == 0
    assert mesh_caption(mesh_info(mesh()))[1] == "rows: x · columns: y"


def test_sharding_png_is_sized_to_its_blocks():
    m = fake_mesh(fake_devices(16, 4), (4, 4), ("x", "y"))
    info = sharding_info((FakeNamedSharding(m, ("x", "y")), (4, 4)), dtype="float32")
    data = bundle(ShardingView(info))
    assert "text/html" not in data
    pixels = decode_png(data["image/png"])
    height, width, _ = pixels.shape
    # 16 blocks of 96 x 52 plus three caption lines and a legend: not a 480-pixel poster.
    assert height < 340 and width < 600, pixels.shape
    for p in range(4):  # each process's row of four blocks, most of it its colour
        assert colour_count(pixels, process_colour(p)) > 0.7 * 4 * 96 * 52
    assert sharding_caption(info)[2] == "rows: dim 0 (4) · columns: dim 1 (4)"


def test_a_block_held_by_two_processes_is_split_between_their_colours():
    info = sharding_info((FakeNamedSharding(mesh(), (None, "y")), (8, 6)))
    pixels = decode_png(bundle(ShardingView(info))["image/png"])
    areas = [colour_count(pixels, process_colour(p)) for p in range(4)]
    assert min(areas) > 0.5 * max(areas) > 0, areas  # two blocks, each striped by four


@pytest.mark.parametrize(
    "shape,spec,dims,want",
    [
        ((), (), (0, 1), "a scalar: one value, held by 8 devices on 4 processes"),
        ((8,), ("x",), (0, 1), "dim 0 (8) across"),
        ((8, 6), ("x", None), (0, 1), "rows: dim 0 (8) · columns: dim 1 (6)"),
        ((8, 6, 4), ("x", None, "y"), (2, 0), "rows: dim 2 (4) · columns: dim 0 (8) · dims 1: "
         "first block shown"),
    ],
)  # fmt: skip
def test_captions_are_right_for_every_rank(shape, spec, dims, want):
    info = sharding_info((FakeNamedSharding(mesh(), spec), shape), dtype="float32")
    lines = sharding_caption(info, dims)
    assert lines[-1] == want
    assert lines[0].startswith(f"float32[{', '.join(map(str, shape))}]")
    assert not any("dims 0 and 1" in line for line in lines)
    decode_png(bundle(ShardingView(info, dims=dims))["image/png"])


def test_a_replicated_scalar_on_thousands_of_devices_keeps_its_label_inside():
    big = fake_mesh(fake_devices(4098, 2049), (4098,), ("x",))
    info = sharding_info((FakeNamedSharding(big, ()), ()), dtype="float32")
    pixels = decode_png(bundle(ShardingView(info))["image/png"])
    # The one block is 120 px wide; its label is "d0-4097" (7 characters of 12 px).
    assert pixels.shape[1] < 700 and "2049,4096" not in bundle(ShardingView(info))["text/plain"]


def test_cache_and_liveness_tables():
    cache = bundle(CacheView([{"rank": 0, "requests": 4, "hits": 3, "time_saved": 1.25}]))
    assert (
        "<td>p0</td><td>4</td><td>3</td><td>1</td><td>75%</td><td>1.25</td>" in cache["text/html"]
    )
    assert cache["text/plain"].splitlines()[1].split() == [
        "p0",
        "4",
        "3",
        "1",
        "75%",
        "1.25",
        "0.00",
    ]
    live = bundle(
        LiveDevicesView(
            [{"rank": 1, "state": "dead", "heartbeat_age": 4.0, "devices": [2, 3]}],
            [f"line {i}" for i in range(20)],
        )
    )
    assert "<td>p1</td><td>dead</td><td>4.0</td>" in live["text/html"]
    assert live["text/plain"].splitlines()[-1] == "line 19" and "line 9\n" not in live["text/plain"]


def test_logged_transfers_get_a_column_once_a_process_has_some():
    quiet = bundle(LiveDevicesView([{"rank": 0, "state": "alive", "devices": [0]}]))
    assert "transfers logged" not in quiet["text/plain"]
    counts = {"host-to-device": 6, "device-to-host": 1, "device-to-device": 0}
    live = bundle(
        LiveDevicesView(
            [
                {"rank": 0, "state": "alive", "devices": [0], "transfers": counts},
                {"rank": 1, "state": "alive", "devices": [1]},
            ]
        )
    )
    header, p0, p1 = live["text/plain"].splitlines()[:3]
    assert header.rstrip().endswith("transfers logged")
    assert p0.rstrip().endswith("6 h2d, 1 d2h, 0 d2d") and p1.rstrip().endswith("-")
    assert "<td>6 h2d, 1 d2h, 0 d2d</td>" in live["text/html"]


def test_empty_views_say_so():
    assert bundle(MeshView())["text/plain"] == "<empty mesh>"
    assert bundle(ShardingView())["text/plain"] == "<empty sharding>"
    assert bundle(CacheView())["text/plain"] == "<no cache statistics>"


def test_dashboard_carries_all_four_parts_in_one_picture():
    dash = Dashboard(mesh=mesh_info(mesh()), cache=[{"rank": 0, "requests": 1, "hits": 1}])
    data, _ = dash._repr_mimebundle_()
    assert "text/html" not in data
    pixels = decode_png(data["image/png"])
    assert all(colour_count(pixels, process_colour(p)) > 0 for p in range(4))
    alone = decode_png(bundle(MeshView(mesh_info(mesh())))["image/png"])
    assert pixels.shape[0] > alone.shape[0]  # the tables are drawn below the mesh
    assert (
        data["text/plain"].startswith("Mesh(x=4, y=2)") and "<empty sharding>" in data["text/plain"]
    )


def test_real_device_ids_in_the_thousands_widen_cells_and_blocks_to_fit_their_labels():
    # On CPU, JAX numbers process 1's devices from 2048: the labels must not be cut.
    info = mesh_info(fake_mesh(fake_devices(4, 2), (2, 2), ("x", "y")))
    info["devices"] = [0, 1, 2048, 2049]
    pixels = decode_png(bundle(MeshView(info))["image/png"])
    cell = text_width("d2049") + 8
    assert colour_count(pixels, process_colour(1)) >= 2 * (cell - 1) ** 2 * 0.8, pixels.shape
    s = sharding_info((FakeNamedSharding(mesh(), ("x", None)), (8, 6)), dtype="float32")
    for b in s["blocks"]:
        b["holders"] = [[h[0] + 2048, h[1]] for h in b["holders"]]
    pixels = decode_png(bundle(ShardingView(s))["image/png"])
    block_w = text_width("d2048-2049") + 10
    # Each row of blocks is as wide as its label needs (not the 120 px a short label gets).
    for p in range(4):
        columns = np.nonzero(np.all(pixels == np.array(rgb(process_colour(p)), np.uint8), -1))[1]
        assert columns.max() - columns.min() + 2 >= block_w, (p, columns.min(), columns.max())
