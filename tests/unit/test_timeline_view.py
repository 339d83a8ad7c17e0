"""The timeline view's static form: a PNG of every process's spans and a line per process,
as the mesh and sharding views carry, for notebooks read where widgets do not run."""

from __future__ import annotations

import numpy as np

from jaxsys_kernel.widgets.raster import rgb
from jaxsys_kernel.widgets.timeline import COLOURS, ROW, TimelineView, timeline_picture

from .test_widgets_fallback import bundle, colour_count, decode_png


def info() -> dict:
    """p1 runs nine times longer than p0, then waits in an all-reduce."""
    return {
        "kind": "timeline",
        "end_us": 1000.0,
        "processes": [
            {
                "rank": 0,
                "executable_us": 100.0,
                "spans": [
                    {"kind": "executable", "name": "step", "start": 0.0, "dur": 100.0},
                    {"kind": "collective", "name": "all-reduce", "start": 100.0, "dur": 850.0},
                ],
            },
            {
                "rank": 1,
                "executable_us": 900.0,
                "spans": [
                    {"kind": "line", "name": "line 3", "start": 0.0, "dur": 950.0},
                    {"kind": "executable", "name": "step", "start": 0.0, "dur": 900.0},
                    {"kind": "collective", "name": "all-reduce", "start": 900.0, "dur": 50.0},
                ],
            },
        ],
    }


def rows_of(pixels: np.ndarray, n: int) -> list[np.ndarray]:
    """The picture's process rows, found by the executable colour's first appearance."""
    blue = np.all(pixels == np.array(rgb(COLOURS["executable"]), np.uint8), axis=-1)
    first = int(np.argmax(blue.any(axis=1))) - 8  # the spans sit 8 px below a row's top
    return [pixels[first + i * ROW : first + (i + 1) * ROW] for i in range(n)]


def first_span_x(row: np.ndarray) -> int:
    """The column where a row's first executable starts."""
    blue = np.all(row == np.array(rgb(COLOURS["executable"]), np.uint8), axis=-1)
    return int(np.argmax(blue.any(axis=0)))


def test_the_bundle_carries_a_png_and_text_as_the_other_views_do():
    data = bundle(TimelineView(info()))
    # No SVG and no HTML: untrusted notebooks prefer or strip them (see widgets/fallback.py).
    assert set(data) == {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"}
    assert data["text/plain"].splitlines() == [
        "p0: 0.100 ms in executables; longest all-reduce 0.850 ms",
        "p1: 0.900 ms in executables; longest step 0.900 ms",
    ]
    pixels = decode_png(data["image/png"])
    assert pixels.shape[1] == 900 and pixels.shape[0] > 2 * ROW


def test_span_lengths_follow_their_durations_on_one_axis():
    pixels = decode_png(bundle(TimelineView(info()))["image/png"])
    p0, p1 = rows_of(pixels, 2)
    blue0, blue1 = colour_count(p0, COLOURS["executable"]), colour_count(p1, COLOURS["executable"])
    orange0 = colour_count(p0, COLOURS["collective"])
    orange1 = colour_count(p1, COLOURS["collective"])
    # 100 us against 900 us of executables; 850 us against 50 us of waiting in the collective
    # (the white names written inside wide spans take a few pixels off).
    assert 7 < blue1 / blue0 < 11, (blue0, blue1)
    assert 12 < orange0 / orange1 < 20, (orange0, orange1)
    # Only p1 has a cell line, drawn thin above its spans.
    assert colour_count(p0, COLOURS["line"]) == 0 < colour_count(p1, COLOURS["line"])
    # Both rows start their spans at the same x: one time axis.
    assert first_span_x(p0) == first_span_x(p1)


def test_the_slowest_process_is_marked_and_more_processes_make_a_taller_picture():
    two = timeline_picture(info())
    many = info()
    many["processes"] += [{**p, "rank": p["rank"] + 2} for p in many["processes"]]
    four = timeline_picture(many)
    assert four.height - two.height >= 2 * ROW
    # The label column is as wide as "p1 (slowest)": a lone process has no such mark.
    alone = timeline_picture({**info(), "processes": info()["processes"][:1]})
    assert first_span_x(rows_of(two.pixels, 1)[0]) > first_span_x(rows_of(alone.pixels, 1)[0])


def test_an_empty_timeline_is_text_only():
    data = bundle(TimelineView({"kind": "timeline", "end_us": 0.0, "processes": []}))
    assert "image/png" not in data and data["text/plain"] == "<empty timeline>"
    assert data["application/vnd.jupyter.widget-view+json"]
