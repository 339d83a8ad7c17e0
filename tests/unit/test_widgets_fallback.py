"""The views' static renderings: every view's mime bundle carries HTML (SVG for the mesh and
the sharding) and a text summary of the same picture, for GitHub, nbconvert and terminals."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from jaxsys_kernel.data.draw import process_colour
from jaxsys_kernel.engine.simulate import FakeNamedSharding
from jaxsys_kernel.engine.summaries import fake_devices, fake_mesh, mesh_info, sharding_info
from jaxsys_kernel.widgets import CacheView, Dashboard, LiveDevicesView, MeshView, ShardingView

SVG = "{http://www.w3.org/2000/svg}"


def bundle(view) -> dict:
    data, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data  # the live view stays first
    return data


def svg_of(html: str) -> ET.Element:
    return ET.fromstring(re.search(r"<svg.*</svg>", html, re.S).group(0))


def mesh():
    return fake_mesh(fake_devices(8, 2), (4, 2), ("x", "y"))


def test_mesh_svg_has_one_cell_per_device_in_its_process_colour():
    data = bundle(MeshView(mesh_info(mesh())))
    assert data["text/plain"].startswith("Mesh(x=4, y=2): 8 devices of processes p0-3")
    root = svg_of(data["text/html"])
    cells = root.findall(f"{SVG}rect")
    assert len(cells) == 8
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert texts[:4] == ["d0", "p0", "d1", "p0"] and texts[-2:] == ["d7", "p3"]
    assert [c.get("fill") for c in cells] == [process_colour(p) for p in [0, 0, 1, 1, 2, 2, 3, 3]]
    # A 4 x 2 mesh: four rows of two.
    assert float(root.get("height")) == 2 * float(root.get("width"))


def test_sharding_svg_draws_each_block_with_its_processes():
    info = sharding_info((FakeNamedSharding(mesh(), ("x", None)), (8, 6)))
    data = bundle(ShardingView(info))
    text = data["text/plain"]
    assert "P('x', None) over shape (8, 6): 4 blocks of shape (2, 6), x2 replicated" in text
    assert "[0:2, 0:6] on d0-1 (p0)" in text
    root = svg_of(data["text/html"])
    texts = [t.text for t in root.findall(f"{SVG}text")]
    assert texts == ["d0-1", "p0 x2", "d2-3", "p1 x2", "d4-5", "p2 x2", "d6-7", "p3 x2"]
    fills = [r.get("fill") for r in root.findall(f"{SVG}rect") if r.get("fill") != "none"]
    assert fills == [process_colour(p) for p in range(4)]


def test_a_block_held_by_two_processes_is_split_between_their_colours():
    info = sharding_info((FakeNamedSharding(mesh(), (None, "y")), (8, 6)))
    root = svg_of(bundle(ShardingView(info))["text/html"])
    fills = [r.get("fill") for r in root.findall(f"{SVG}rect") if r.get("fill") != "none"]
    assert fills == [process_colour(p) for p in range(4)] * 2  # two blocks, four processes


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


def test_dashboard_carries_all_four_pictures():
    dash = Dashboard(mesh=mesh_info(mesh()), cache=[{"rank": 0, "requests": 1, "hits": 1}])
    data, _ = dash._repr_mimebundle_()
    assert data["text/html"].count("<svg") == 1 and "<table>" in data["text/html"]
    assert (
        data["text/plain"].startswith("Mesh(x=4, y=2)") and "<empty sharding>" in data["text/plain"]
    )
