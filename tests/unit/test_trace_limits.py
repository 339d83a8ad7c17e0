"""Profile traces from the engines are untrusted: every bound of cells/trace_limits.py and
the merge that goes on without a refused process, with the engine replaced by a fake that
answers the kernel's calls from bytes the test made."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib

import pytest

from jaxsys_kernel.cells import timeline, trace_limits
from jaxsys_kernel.cells.trace_limits import Limits, MiB, TraceRefused
from jaxsys_kernel.cluster.calls import Calls

ZEROS = bytes(16 * MiB)


def gzip_bomb(gib: int = 2) -> bytes:
    """One gzip member inflating to ``gib`` GiB of zeros, made in a few hundred ms.

    After a full flush the compressor starts afresh, so 16 MiB of zeros compress to the same
    block every time; the block is repeated instead of compressing gigabytes. The trailer's
    checksum is the first 16 MiB's: a reader that stops at its limit never gets there.
    """
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = c.compress(ZEROS) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(ZEROS) + c.flush(zlib.Z_FULL_FLUSH)
    return head + block * (gib * 64 - 1) + c.flush()


def trace(events: list[dict], mark_ts: float = 0.0) -> bytes:
    mark = {"ph": "X", "pid": 1, "tid": 1, "ts": mark_ts, "dur": 1.0, "name": timeline.MARK}
    return gzip.compress(json.dumps({"traceEvents": [mark, *events]}).encode())


def test_a_gzip_bomb_is_refused_at_the_limit_without_inflating_it():
    bomb = gzip_bomb(2)
    assert len(bomb) < 4 * MiB  # 2 GiB of zeros, a few MB on the wire
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(TraceRefused) as refused:
            trace_limits.inflate(bomb, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    took = time.perf_counter() - t0
    assert "process 3's trace is larger than 256 MiB decompressed" in str(refused.value)
    assert "profile fewer steps" in str(refused.value)
    # The limit, and a piece more, is all that was ever held (2 GiB if inflated at once).
    assert peak < trace_limits.LIMITS.decompressed + 64 * MiB, peak
    print(f"bomb {len(bomb)} bytes refused in {took:.2f} s, peak {peak / MiB:.0f} MiB")


def test_a_bomb_of_many_small_gzip_members_is_refused_too():
    member = gzip.compress(ZEROS, compresslevel=9)
    with pytest.raises(TraceRefused, match="larger than 1 MiB decompressed"):
        trace_limits.inflate(member * 128, 0, Limits(decompressed=1 * MiB))
    # Several members under the limit are one trace, as gzip reads them.
    assert trace_limits.inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), 0) == b"abcd"


def _gz(data: bytes) -> bytes:
    # A fixed mtime: a test id made from the bytes must be the same in every xdist worker.
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (_gz(b"{not json"), "process 1's trace is not JSON"),
        (_gz(b"\xff\xfe\x00"), "process 1's trace is not JSON"),
        (b"plain text, not gzip", "process 1's trace is not JSON"),
        (_gz(b"[" * 200_000 + b"]" * 200_000), "process 1's trace is not JSON"),
        (_gz(b'{"traceEvents": 7}'), "has no list of events"),
        (_gz(b"[]")[:-12], "truncated gzip stream"),
        (b"\x1f\x8b" + b"\x00" * 30, "not a readable gzip file"),
    ],
    ids=[
        "broken-json",
        "not-utf8",
        "not-gzip",
        "too-deep",
        "no-event-list",
        "truncated",
        "bad-header",
    ],
)
def test_a_trace_that_is_not_a_perfetto_json_file_is_refused_in_words(data, said):
    with pytest.raises(TraceRefused, match=said):
        trace_limits.events(data, 1, room=100)


def test_ten_million_tiny_events_are_refused_before_they_are_parsed():
    # 10 million {"ph":"X"} events, about 110 MB of JSON, gzipped while it is made.
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = b'{"ph":"X"},' * 1_000_000
    data = c.compress(b'{"traceEvents":[') + b"".join(c.compress(piece) for _ in range(10))
    data += c.compress(b'{"ph":"X"}]}') + c.flush()
    tracemalloc.start()
    try:
        with pytest.raises(TraceRefused) as refused:
            trace_limits.events(data, 2, room=trace_limits.LIMITS.events)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "process 2's trace holds about 10,000,002 JSON objects" in str(refused.value)
    assert "more than the limit of 4,000,000" in str(refused.value)
    # Counted on the text: the parsed events (about 1 GB of dicts) were never made.
    assert peak < 400 * MiB, peak


def test_many_small_values_are_refused_before_they_are_parsed():
    data = gzip.compress(b'{"traceEvents":[{"ph":"X","args":[' + b"1," * 2000 + b"1]}]}")
    with pytest.raises(TraceRefused, match="about 2,006 JSON values, more than the limit of 1,000"):
        trace_limits.events(data, 0, room=10, limits=Limits(values=1000))


def test_the_events_limit_counts_the_whole_merged_trace():
    events = [{"ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 1, "name": "e"} for i in range(60)]
    traces = {r: timeline.Fetched(r, trace(events), 100.0) for r in (0, 1)}
    offsets = {r: timeline.Offset(0.0, 0.0) for r in traces}
    small = Limits(events=100)
    merger = timeline.Merger(100e6, small)
    assert merger.add(traces[0], offsets[0])
    assert not merger.add(traces[1], offsets[1])
    assert "process 1's trace has 61 events" in merger.refused[1]
    assert "limit of 100 events in one merged trace" in merger.refused[1]
    assert merger.result()["metadata"]["jaxsys"]["processes"] == [0]


def test_too_many_traces_and_a_too_large_one_are_refused():
    traces = {r: timeline.Fetched(r, trace([]), 1.0) for r in range(3)}
    offsets = {r: timeline.Offset(0.0, 0.0) for r in traces}
    with pytest.raises(TraceRefused, match="3 traces are more than the limit of 2 merged"):
        timeline.merge(traces, offsets, Limits(files=2))
    with pytest.raises(TraceRefused, match="process 0's trace is 1000 bytes gzipped, more than"):
        trace_limits.inflate(bytes(1000), 0, Limits(compressed=999))


def test_events_with_odd_fields_are_merged_or_left_out_never_raise():
    odd = [
        {"ph": "M", "name": "process_name", "pid": [1], "args": "not a dict"},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": {"x": 1}, "args": {"name": 5}},
        {"ph": "X", "pid": [1], "tid": {"a": 1}, "ts": 5.0, "dur": 1.0, "name": "PjitFunction(f)"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": "soon", "dur": 1.0, "name": "dropped"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 6.0, "dur": [], "name": "dropped too"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 7.0, "dur": 1.0, "name": 12},
        "not an event",
    ]
    merged = timeline.merge(
        {0: timeline.Fetched(0, trace(odd), 1.0)}, {0: timeline.Offset(0.0, 0.0)}
    )
    names = [e.get("name") for e in merged["traceEvents"]]
    assert "PjitFunction(f)" in names and 12 in names
    assert "dropped" not in names and "dropped too" not in names
    s = timeline.summary(merged)
    assert [x["name"] for x in s["processes"][0]["spans"]] == ["f"]


class FakeEngines:
    """Answers the profile's engine calls from traces the test made, as Cluster.call does."""

    def __init__(self, traces: dict[int, bytes], info: dict | None = None):
        self.traces = traces
        self.info = info or {}
        self.discarded: list[int] = []

    def call(self, ranks, fn, *args, timeout=None):
        out = Calls(timeout=timeout or 0.0)
        for r in ranks:
            if fn.name == "clock":
                out.results[r] = time.time()
            elif fn.name == "trace_info":
                size = len(self.traces[r])
                out.results[r] = self.info.get(r, {"size": size, "mark_wall": 100.0, "chunk": 4})
            elif fn.name == "read_trace":
                offset, size = args
                out.results[r] = self.traces[r][offset : offset + min(size, 1 << 16)]
            elif fn.name == "discard":
                self.discarded.append(r)
                out.results[r] = True
        return out


def test_collect_leaves_out_a_refused_process_merges_the_rest_and_keeps_the_file(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    step = [{"ph": "X", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "name": "PjitFunction(f)"}]
    engines = FakeEngines({0: trace(step), 1: gzip_bomb(1), 2: trace(step)})
    monkeypatch.setattr(timeline, "show", lambda collected: None)
    got = timeline.after_cell(engines, [0, 1, 2])
    assert sorted(engines.discarded) == [0, 1, 2]  # every process's own trace removed
    assert list(got["refused"]) == [1] and "256 MiB decompressed" in got["refused"][1]
    path = got["path"]
    assert path.startswith(str(tmp_path / "jaxsys-traces" / "cell-")), path
    with gzip.open(path, "rt") as f:
        merged = json.load(f)
    assert merged["metadata"]["jaxsys"]["processes"] == [0, 2]
    # Two traces saved in the same second get names of their own.
    again = timeline.collect(FakeEngines({0: trace(step)}), [0], "cell")
    assert again["path"] != path and again["path"].endswith(".trace.json.gz")


def test_a_trace_that_cannot_be_merged_is_said_in_words_and_nothing_raises(tmp_path, capsys):
    lying = FakeEngines({0: trace([])}, info={0: {"size": "big", "mark_wall": 1.0}})
    assert timeline.after_cell(lying, [0], str(tmp_path)) is None
    err = capsys.readouterr().err
    assert "jaxsys: no merged trace: no trace could be merged: process 0 gave" in err, err
    over = FakeEngines({0: trace([])}, info={0: {"size": 1 << 40, "mark_wall": 1.0}})
    assert timeline.after_cell(over, [0], str(tmp_path)) is None
    assert "process 0's trace is 1048576 MiB gzipped" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_is_named(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert timeline.after_cell(FakeEngines({0: trace([])}), [0], str(blocked / "sub")) is None
    err = capsys.readouterr().err
    assert f"cannot write the merged trace in {blocked / 'sub'}" in err, err
    assert "--profile-dir" in err


def test_a_process_without_a_trace_is_left_out_and_the_others_merged(tmp_path):
    step = [{"ph": "X", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, "name": "PjitFunction(f)"}]

    class OneWithout(FakeEngines):
        def call(self, ranks, fn, *args, timeout=None):
            out = super().call(ranks, fn, *args, timeout=timeout)
            if fn.name == "trace_info":
                out.results[1] = None
            return out

    engines = OneWithout({0: trace(step), 1: trace(step)})
    got = timeline.collect(engines, [0, 1], "cell", tmp_path)
    assert got["refused"] == {
        1: "process 1 sent no trace (no trace: the cell was not profiled there)"
    }
    assert sorted(engines.discarded) == [0, 1]
