"""The engine side of the divergence check, without JAX: frames, lines, the logger filter."""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import SimpleNamespace

from jaxsys_kernel.engine import divergence


def frame(filename, lineno, back=None, name="f", f_locals=None):
    code = SimpleNamespace(co_filename=filename, co_name=name)
    return SimpleNamespace(f_code=code, f_lineno=lineno, f_back=back, f_locals=f_locals or {})


def test_the_users_line_is_the_innermost_cell_frame():
    cell = frame("/tmp/ipykernel_12/3456.py", 7)
    helper = frame("/tmp/ipykernel_12/3456.py", 3, back=cell)
    jax_frame = frame("/site-packages/jax/_src/pjit.py", 1100, back=helper)
    assert divergence.user_line(jax_frame) == 3
    assert divergence.user_line(frame("/lib/x.py", 1)) is None
    assert divergence.user_line(frame("<ipython-input-4-abc>", 2)) == 2


def test_records_that_are_not_jaxs_dispatch_pass_untouched():
    rec = divergence.Recorder(publish=lambda r: None)
    plain = logging.LogRecord("jax._src.util", logging.WARNING, "x", 1, "other", (), None)
    assert rec.filter(plain)


def test_jaxs_dispatch_record_is_kept_out_of_the_cell_when_the_check_turned_it_on():
    seen = []
    rec = divergence.Recorder(publish=seen.append)
    rec.ours = True
    msg = "\nDISTRIBUTED_DEBUG_BEGIN\nRunning pjit'd function: f\nDISTRIBUTED_DEBUG_END"
    record = logging.LogRecord("jax._src.util", logging.WARNING, "x", 1, msg, (), None)
    assert rec.filter(record) is False  # not active: nothing recorded, still hidden
    assert seen == []
    rec.ours = False
    assert rec.filter(record) is True  # the user asked for these records: they stay


def test_a_failure_while_recording_stops_the_check_not_the_dispatch(capsys, monkeypatch):
    rec = divergence.Recorder(publish=lambda r: None)
    rec.active = True

    def broken(_frame):
        raise RuntimeError("boom")

    monkeypatch.setattr(rec, "_record", broken)
    msg = "\nDISTRIBUTED_DEBUG_BEGIN\nx\nDISTRIBUTED_DEBUG_END"
    record = logging.LogRecord("jax._src.util", logging.WARNING, "x", 1, msg, (), None)
    assert rec.filter(record) is True
    assert rec.active is False
    assert "the divergence check stopped for this cell" in capsys.readouterr().err


def test_records_are_cut_to_what_the_kernel_accepts():
    from jaxsys_kernel.cells.divergence_records import BadRecord, checked
    from jaxsys_kernel.engine import divergence as engine_side

    name = engine_side.clip("f" * 50_000)
    args = engine_side.clip_list(["f32[8]"] * 20_000)
    assert len(name) == engine_side.TEXT_LIMIT and name.endswith("...(50000 characters in all)")
    assert len(args) == engine_side.ITEMS_LIMIT and args[-1] == "...(+19001 more)"
    record = {"kind": "dispatch", "name": name, "args": args, "shardings": [], "procs": [0, 1]}
    assert checked(record)["args"] == args
    try:
        checked({**record, "name": "f" * 50_000})
    except BadRecord as e:
        assert "name is 50,000 characters" in str(e)
    else:
        raise AssertionError("an over-long name was accepted")


def _fake_jax(monkeypatch) -> None:
    """Enough of JAX for start and stop: its config's dispatch-records option."""

    class Config:
        jax_distributed_debug = False

        def update(self, name, value):
            setattr(self, name, value)

    monkeypatch.setitem(sys.modules, "jax", SimpleNamespace(config=Config()))


def _samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "jaxsys-divergence"]


def _wait_for(done, within: float) -> bool:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def test_one_sampler_serves_every_cell_and_looks_only_while_one_runs(monkeypatch):
    _fake_jax(monkeypatch)
    seen: list[dict] = []
    rec = divergence.Recorder(publish=seen.append)
    before = len(_samplers())
    for _ in range(20):  # back-to-back cells: no thread started or joined for each
        rec.start()
        rec.stop()
    assert len(_samplers()) == before + 1 and seen == []
    # A cell that sits still is looked at once FIRST_LOOK seconds have passed, not before.
    began = time.monotonic()
    rec.start()
    assert _wait_for(lambda: seen, 5.0)
    assert time.monotonic() - began >= divergence.FIRST_LOOK
    assert seen[0]["kind"] == "where" and seen[0]["idle"] is True, seen
    rec.stop()
    # Once the cell ended nothing more is published, through two of the sampler's looks.
    count = len(seen)
    assert not _wait_for(lambda: len(seen) > count, 2.5 * divergence.SAMPLE)
    assert len(_samplers()) == before + 1


class _CountedEvent(threading.Event):
    def __init__(self):
        super().__init__()
        self.sets = 0

    def set(self):
        self.sets += 1
        super().set()


def test_cells_soon_after_one_another_begin_without_waking_the_sampler(monkeypatch):
    _fake_jax(monkeypatch)
    monkeypatch.setattr(divergence, "PARK", 0.3)
    seen: list[dict] = []
    rec = divergence.Recorder(publish=seen.append)
    rec._wake = wake = _CountedEvent()
    rec.start()
    rec.stop()
    # Idle for PARK seconds, the sampler waits to be woken; a cell wakes it.
    assert _wait_for(lambda: rec._parked, 5.0)
    monkeypatch.setattr(divergence, "PARK", 60.0)
    rec.start()
    assert wake.sets == 1 and not rec._parked
    rec.stop()
    # Cells that begin within PARK of the last one's end find it polling: none wakes it.
    for _ in range(20):
        rec.start()
        rec.stop()
    assert wake.sets == 1 and seen == []
    # A sampler woken from its park still looks at a cell FIRST_LOOK seconds in.
    monkeypatch.setattr(divergence, "PARK", 0.3)
    assert _wait_for(lambda: rec._parked, 5.0)
    began = time.monotonic()
    rec.start()
    assert wake.sets == 2
    assert _wait_for(lambda: seen, 5.0)
    assert time.monotonic() - began >= divergence.FIRST_LOOK
    assert seen[0]["kind"] == "where", seen
    rec.stop()
