"""Data-loading plans on simulated devices: reads, bytes, replicas, merging and drawing.

No JAX here: the shardings are :class:`FakeNamedSharding` over :func:`fake_devices`, whose
layouts ``test_summaries`` checks against JAX itself (and ``test_data_load`` checks plans of
real shardings against these).
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsys_kernel.data import draw
from jaxsys_kernel.data.planner import (
    box_of,
    merge_boxes,
    plan,
    runs_of,
)
from jaxsys_kernel.engine.simulate import FakeNamedSharding, fake_devices, fake_mesh

STATIC = Path(__file__).parents[2] / "jaxsys_kernel" / "widgets" / "static"


def sharding(n_dev, per_proc, mesh_shape, names, spec, order=None):
    devs = fake_devices(n_dev, per_proc)
    if order is not None:
        devs = [devs[i] for i in order]
    return FakeNamedSharding(fake_mesh(devs, mesh_shape, names), spec)


def covered(boxes, shape) -> np.ndarray:
    """How many times each element is covered by ``boxes``."""
    count = np.zeros(shape, dtype=np.int32)
    for box in boxes:
        count[tuple(slice(a, b) for a, b in box)] += 1
    return count


# ------------------------------------------------------------------------ the page's cases


def test_pure_data_parallel_reads_a_quarter_each():
    # 4 processes x 2 devices, the batch split over all 8 devices along dim 0.
    p = plan((64, 128), sharding(8, 2, (8,), ("batch",), ("batch",)), "float32")
    assert p.nbytes == 64 * 128 * 4
    for proc in p.processes:
        assert proc.nbytes == p.nbytes // 4
        assert len(proc.reads) == 1 and proc.runs == 1
        (read,) = proc.reads
        assert read.index == ((16 * proc.process, 16 * (proc.process + 1)), (0, 128))
        assert read.shared_with == ()
        assert len(read.devices) == 2
    assert p.total_read == p.nbytes and p.amplification == 1.0
    assert [procs for _, procs in p.data_groups()] == [(0,), (1,), (2,), (3,)]


def test_column_sharding_is_one_read_of_many_runs():
    # The page's first layout: each device gets a (64, 16) column block.
    p = plan((64, 128), sharding(8, 2, (8,), ("x",), (None, "x")), "float32")
    for proc in p.processes:
        (read,) = proc.reads
        assert read.index == ((0, 64), (32 * proc.process, 32 * (proc.process + 1)))
        assert read.runs == 64  # one per row: the slow layout for a row-major file
    rows = plan((64, 128), sharding(8, 2, (8,), ("x",), ("x",)), "float32")
    assert all(p.runs == 1 for p in rows.processes)


def test_two_d_sharding_merges_a_process_blocks():
    # Mesh (4, 2): a process's two devices sit side by side along y, so its blocks join
    # into whole rows.
    p = plan((64, 128), sharding(8, 2, (4, 2), ("x", "y"), ("x", "y")))
    for proc in p.processes:
        assert [r.index for r in proc.reads] == [
            ((16 * proc.process, 16 * proc.process + 16), (0, 128))
        ]
    # Mesh (2, 4): a process's devices are columns 0-1 or 2-3 of one row of the mesh.
    q = plan((64, 128), sharding(8, 2, (2, 4), ("x", "y"), ("x", "y")))
    assert [r.index for r in q.for_process(1).reads] == [((0, 32), (64, 128))]


def test_blocks_that_cannot_merge_stay_separate_reads():
    # Devices of process 0 are the diagonal of a 2 x 2 mesh: two reads, never the square.
    s = sharding(4, 2, (2, 2), ("x", "y"), ("x", "y"), order=[0, 2, 3, 1])
    p = plan((8, 8), s, "int8")
    reads = sorted(r.index for r in p.for_process(0).reads)
    assert reads == [((0, 4), (0, 4)), ((4, 8), (4, 8))]
    assert p.for_process(0).nbytes == 32
    assert (covered(reads, (8, 8)) <= 1).all()


def test_full_replication_every_process_reads_everything():
    p = plan((64, 128), sharding(8, 2, (4, 2), ("x", "y"), ()), "float32")
    assert p.replicas == 8
    for proc in p.processes:
        assert proc.nbytes == p.nbytes
        (read,) = proc.reads
        assert read.shared_with == tuple(q for q in range(4) if q != proc.process)
    assert p.amplification == 4.0


def test_partial_replication_within_processes():
    # Each copy split over the two devices of one process: every process needs the lot.
    p = plan((64, 128), sharding(8, 2, (4, 2), ("copies", "x"), ("x",)), "float32")
    assert all(proc.nbytes == p.nbytes for proc in p.processes)
    assert p.replicas == 4


def test_partial_replication_across_processes():
    # Each copy split over two devices on different processes: p0 and p1 need the first
    # half, p2 and p3 the second (the page's second partial-replication example).
    p = plan((64, 128), sharding(8, 2, (2, 4), ("x", "copies"), ("x",)), "float32")
    assert [r.index for r in p.for_process(0).reads] == [((0, 32), (0, 128))]
    assert [r.index for r in p.for_process(3).reads] == [((32, 64), (0, 128))]
    assert p.for_process(0).reads[0].shared_with == (1,)
    assert [procs for _, procs in p.data_groups()] == [(0, 1), (2, 3)]


def test_model_parallel_within_a_process_reads_each_batch_once():
    # 2 processes x 4 devices; each model replica is two devices of one process.
    s = sharding(8, 4, (4, 2), ("replica", "model"), ("replica",))
    per_process = plan((16, 3), s, "float32")
    per_device = plan((16, 3), s, "float32", strategy="device")
    for proc in per_process.processes:
        assert proc.nbytes == 8 * 3 * 4
        assert len(proc.reads) == 1 and len(proc.reads[0].devices) == 4
    for proc in per_device.processes:
        # Both devices of a replica read the same rows: twice the bytes.
        assert proc.nbytes == 2 * 8 * 3 * 4
        assert len(proc.reads) == 4


def test_model_parallel_across_processes_pairs_processes():
    # 4 processes x 2 devices; each replica's two devices are on processes p and p + 2.
    s = sharding(8, 2, (4, 2), ("replica", "model"), ("replica",), order=[0, 4, 1, 5, 2, 6, 3, 7])
    p = plan((8, 16), s, "float32")
    assert [procs for _, procs in p.data_groups()] == [(0, 2), (1, 3)]
    assert p.for_process(0).reads[0].index == ((0, 4), (0, 16))
    assert p.for_process(2).reads[0].index == ((0, 4), (0, 16))
    assert p.for_process(0).reads[0].shared_with == (2,)
    assert all(proc.nbytes == p.nbytes // 2 for proc in p.processes)


def test_strategy_all_reads_everything_everywhere():
    s = sharding(8, 2, (8,), ("batch",), ("batch",))
    p = plan((64, 128), s, "float32", strategy="all")
    assert all(proc.nbytes == p.nbytes for proc in p.processes)
    assert p.amplification == 4.0
    assert all(b["readers"] == [0, 1, 2, 3] for b in p.summary()["blocks"])


def test_read_for_locates_each_device_shard():
    s = sharding(8, 2, (4, 2), ("x", "y"), ("x", "y"))
    p = plan((64, 128), s)
    proc = p.for_process(2)
    for dev, box in proc.devices:
        k, inner = proc.read_for(dev)
        read = proc.reads[k]
        got = tuple(
            (read.index[d][0] + sl.start, read.index[d][0] + sl.stop) for d, sl in enumerate(inner)
        )
        assert got == box
    with pytest.raises(KeyError):
        proc.read_for(0)


def test_dtype_sets_the_bytes():
    s = sharding(4, 2, (4,), ("b",), ("b",))
    assert plan((8, 10), s, np.int16).for_process(0).nbytes == 4 * 10 * 2
    assert plan((8, 10), s, "float64").nbytes == 8 * 10 * 8


def test_errors_name_what_was_wrong():
    s = sharding(4, 2, (4,), ("b",), ("b",))
    with pytest.raises(ValueError, match="unknown strategy 'row'"):
        plan((8, 2), s, strategy="row")
    with pytest.raises(ValueError, match="process 7 holds no device"):
        plan((8, 2), s).for_process(7)
    with pytest.raises(ValueError, match="negative"):
        plan((-1, 2), s)
    with pytest.raises(ValueError, match="strided"):
        box_of((slice(0, 8, 2),), (8,))


# ----------------------------------------------------------------------------- merging


def test_runs_of():
    shape = (4, 6, 8)
    assert runs_of(((0, 4), (0, 6), (0, 8)), shape) == 1
    assert runs_of(((1, 3), (0, 6), (0, 8)), shape) == 1
    assert runs_of(((0, 4), (2, 4), (0, 8)), shape) == 4
    assert runs_of(((0, 4), (0, 6), (0, 4)), shape) == 24
    assert runs_of(((0, 0), (0, 6), (0, 8)), shape) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)),
    st.data(),
)
def test_merge_covers_exactly_the_same_elements(grid, data):
    cells = list(itertools.product(*(range(g) for g in grid)))
    chosen = data.draw(st.lists(st.sampled_from(cells), min_size=1, unique=True))
    shape = tuple(2 * g for g in grid)
    boxes = [tuple((2 * c, 2 * c + 2) for c in cell) for cell in chosen]
    merged = merge_boxes(boxes, shape)
    assert (covered(merged, shape) == covered(boxes, shape)).all()
    assert len(merged) <= len(boxes)


def test_merge_finds_one_box_for_full_rows_columns_and_blocks():
    shape = (8, 8)
    quarters = [((r, r + 4), (c, c + 4)) for r in (0, 4) for c in (0, 4)]
    assert merge_boxes(quarters, shape) == [((0, 8), (0, 8))]
    col = [((r, r + 2), (2, 4)) for r in range(0, 8, 2)]
    assert merge_boxes(col, shape) == [((0, 8), (2, 4))]
    # An L of three quarters needs two boxes; the pick with fewer runs keeps whole rows.
    ell = quarters[:3]
    merged = merge_boxes(ell, shape)
    assert merged == [((0, 4), (0, 8)), ((4, 8), (0, 4))]


def test_4096_devices_plan_is_quick():
    import time

    s = sharding(4096, 4, (64, 64), ("x", "y"), ("x", "y"))
    t0 = time.perf_counter()
    p = plan((4096, 4096), s, "float32")
    assert time.perf_counter() - t0 < 10
    assert len(p.processes) == 1024
    assert all(len(proc.reads) == 1 for proc in p.processes)
    assert p.total_read == p.nbytes


# ------------------------------------------------------------------------ summary, drawing


@pytest.fixture
def dp_plan():
    return plan((64, 128), sharding(8, 2, (8,), ("batch",), ("batch",)), "float32")


def test_summary_is_json(dp_plan):
    s = dp_plan.summary()
    assert json.loads(json.dumps(s)) == s
    assert s["kind"] == "dataplan"
    assert [p["nbytes"] for p in s["processes"]] == [8192] * 4
    assert s["edges"][0] == [0, 8, 16, 24, 32, 40, 48, 56, 64]


def test_text_table(dp_plan):
    text = str(dp_plan)
    assert text.splitlines()[0] == (
        "DataPlan float32[64, 128] (32.0 KiB) · P('batch',) · one reader per process"
    )
    assert re.search(r"p2\s+d4-5\s+1\s+1\s+8\.0 KiB\s+25\.0%\s+-", text)
    assert "total read 32.0 KiB = 1.00 × the batch" in text
    assert "p1 reads [16:32, 0:128] -> d2-3" in text


def test_svg_is_well_formed_and_coloured_by_process(dp_plan):
    html = dp_plan.svg()
    svg = ET.fromstring(html)[0]
    assert svg.tag.endswith("svg")
    fills = {e.get("fill") for e in svg.iter() if e.get("fill")}
    assert {draw.process_colour(p) for p in range(4)} <= fills
    text = " ".join(e.text or "" for e in svg.iter())
    assert "8.0 KiB (25%)" in text


def test_svg_of_large_and_odd_shapes():
    big = plan((4096, 64), sharding(64, 2, (64,), ("b",), ("b",)), "float32")
    svg = big.svg()
    ET.fromstring(svg)
    assert f"… {32 - draw.MAX_ROWS} more processes" in svg
    one_d = plan((16,), sharding(4, 2, (4,), ("b",), ("b",)), "float32")
    ET.fromstring(one_d.svg())
    three_d = plan((4, 6, 8), sharding(4, 2, (2, 2), ("x", "y"), ("x", None, "y")), "int8")
    ET.fromstring(three_d.svg())
    assert three_d.for_process(0).nbytes == 2 * 6 * 8


def test_repr_is_one_line_and_str_the_table(dp_plan):
    from IPython.lib.pretty import pretty

    # A cell ending in a plan shows the view; its value's text stays one line.
    assert (
        pretty(dp_plan)
        == repr(dp_plan)
        == (
            "DataPlan(float32[64, 128], P('batch',), strategy='process', processes=4, "
            "reads 32768 bytes of a 32768-byte batch)"
        )
    )
    assert str(dp_plan).startswith("DataPlan float32[64, 128]")


def test_palettes_agree():
    """The SVG fallback, the plan view and the sharding view colour processes alike."""

    def palette(js: str) -> list[str]:
        body = re.search(r"const PALETTE = \[(.*?)\];", js, re.S).group(1)
        return re.findall(r'"(#[0-9a-f]{6})"', body)

    views = palette((STATIC / "shared.js").read_text())
    plan_js = palette((STATIC / "dataplan.js").read_text())
    assert views == plan_js == draw.PALETTE


# ------------------------------------------------------------------------------ the view


def test_view_state_and_bundle(dp_plan):
    from jaxsys_kernel.widgets import DataPlanView, view_for

    view = view_for(dp_plan.summary())
    assert isinstance(view, DataPlanView)
    state = view.get_state()
    assert state["_view_kind"] == "dataplan"
    assert state["_esm"] == (STATIC / "dataplan.js").read_text()
    assert state["_css"] == (STATIC / "views.css").read_text()
    data, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == str(dp_plan)
    assert "text/html" not in data  # untrusted notebooks would prefer it to the picture
    assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG")


def test_view_rejects_other_summaries():
    import traitlets

    from jaxsys_kernel.widgets import DataPlanView

    with pytest.raises(traitlets.TraitError, match="dataplan"):
        DataPlanView({"kind": "mesh"})
    assert DataPlanView().text() == "<empty data plan>"


def test_front_end_reads_the_python_trait_names():
    from jaxsys_kernel.widgets import DataPlanView

    js = (STATIC / "dataplan.js").read_text()
    synced = {
        n
        for n in DataPlanView.class_trait_names(sync=True)
        if not n.startswith("_") and n not in ("layout", "tabbable", "tooltip")
    }
    listed = re.search(r"const traits = \[([^\]]*)\]", js).group(1)
    assert set(re.findall(r'"(\w+)"', listed)) == synced
    for name in synced:
        assert f'model.get("{name}")' in js


def test_bytes_shares_are_exact_for_any_process_count():
    for n_proc in (1, 2, 3, 4, 8):
        s = sharding(2 * n_proc, 2, (2 * n_proc,), ("b",), ("b",))
        p = plan((24 * n_proc, 5), s, "float32")
        assert {proc.nbytes for proc in p.processes} == {p.nbytes // n_proc}
        assert math.isclose(p.amplification, 1.0)
