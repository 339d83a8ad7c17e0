"""Native output (fd 1 and fd 2) as whole lines: chatter to the log, the rest to the cell."""

from __future__ import annotations

import os
import random
import re
import tempfile
import threading
import time

import pytest

from jaxsys_kernel import contract
from jaxsys_kernel.engine import output
from jaxsys_kernel.engine.chatter import GlooFilter, is_stderr_chatter
from jaxsys_kernel.engine.fdpipe import FdReader, LineAssembler
from jaxsys_kernel.engine.native_log import NativeLogWatch
from jaxsys_kernel.engine.state import STATE

from .test_native_log import _record


def gloo_writes(rank: int, peers: int) -> list[bytes]:
    """gloo's connection message as its eight write() calls (seen with strace)."""
    return [
        b"[Gloo] Rank ",
        str(rank).encode(),
        b" is connected to ",
        str(peers).encode(),
        b" peer ranks. ",
        b"Expected number of connected peer ranks is : ",
        str(peers).encode(),
        b"\n",
    ]


def interleave(writers: list[list[bytes]], rng: random.Random) -> bytes:
    """One possible order of every writer's writes, each writer's own order kept."""
    queues = [list(w) for w in writers]
    out = []
    while any(queues):
        out.append(rng.choice([q for q in queues if q]).pop(0))
    return b"".join(out)


def split_anywhere(data: bytes, rng: random.Random, most: int = 5) -> list[bytes]:
    """``data`` cut at random byte boundaries."""
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, min(most, len(data) - 1))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def filter_stream(stream: bytes, rng: random.Random) -> bytes:
    """Read ``stream`` in random chunks, reassemble lines, cut gloo out; what is kept."""
    lines, gloo, out = LineAssembler(), GlooFilter(), []
    for chunk in split_anywhere(stream, rng, most=len(stream) // 4):
        out += [gloo.feed_line(line) for line in lines.feed(chunk)]
    tail = lines.flush()
    if tail is not None:
        out.append(gloo.feed_line(tail))
    out.append(gloo.flush())
    return b"".join(out)


# -- reassembly ------------------------------------------------------------------------------


def test_any_chunking_gives_back_the_same_whole_lines():
    rng = random.Random(7)
    for _ in range(300):
        # Two writers, each cut at any byte boundary, interleaved at those boundaries.
        a = [b"alpha %d\n" % i for i in range(5)]
        b = [b"beta\n", b"\n", b"gamma \xc3\xa9 \r\n"]
        stream = interleave(
            [split_anywhere(b"".join(a), rng), split_anywhere(b"".join(b), rng)], rng
        )
        lines = LineAssembler()
        got = []
        for chunk in split_anywhere(stream, rng, most=20):
            got += lines.feed(chunk)
        assert lines.pending == b"" and lines.flush() is None
        assert b"".join(got) == stream  # every byte exactly once, in order
        assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in got)


def test_a_partial_line_waits_for_its_newline_and_is_bounded():
    lines = LineAssembler(max_partial=10)
    assert lines.feed(b"abc") == []
    assert lines.pending == b"abc"
    assert lines.feed(b"def\nxy") == [b"abcdef\n"]
    assert lines.flush() == b"xy\n" and lines.flush() is None
    # Past the bound, a partial line is let through as a line of its own.
    assert lines.feed(b"0123456789AB") == [b"0123456789AB\n"]
    assert lines.pending == b""


# -- gloo's chatter ----------------------------------------------------------------------------

OTHER_LINES = [
    b"native hello\n",
    b"E1201 12:00:00.123456   42 client.cc:80] Polling for error 7 failed\n",
    b"warn: a b c\n",
    b"x\n",
]


def test_gloo_alone_leaves_nothing():
    rng = random.Random(1)
    for _ in range(300):
        stream = interleave([gloo_writes(0, 1), gloo_writes(12, 15), gloo_writes(3, 1)], rng)
        assert filter_stream(stream, rng) == b""


def test_gloo_interleaved_with_whole_lines_keeps_every_other_byte_exactly_once():
    # Native loggers (absl, glog, gRPC) write each line in one call; gloo's eight writes
    # from two threads land anywhere between them; reads cut the result anywhere.
    rng = random.Random(2)
    for _ in range(2000):
        stream = interleave([gloo_writes(0, 1), gloo_writes(10, 15), list(OTHER_LINES)], rng)
        assert filter_stream(stream, rng) == b"".join(OTHER_LINES), stream


def test_gloo_interleaved_with_writes_cut_anywhere_leaves_no_fragment():
    # A writer that writes its lines in arbitrary pieces: every byte of its text comes
    # out once and in order; only gloo's digits and newline are ambiguous next to it,
    # so its lines here have none and the comparison ignores where lines break.
    rng = random.Random(3)
    text = [b"native hello\n", b"warn: a b c\n", b"x\n"]
    for _ in range(2000):
        pieces = [p for line in text for p in split_anywhere(line, rng)]
        stream = interleave([gloo_writes(0, 1), gloo_writes(10, 15), pieces], rng)
        kept = filter_stream(stream, rng)
        assert re.sub(rb"[\d\n]", b"", kept) == re.sub(rb"\n", b"", b"".join(text)), stream
        assert not re.search(rb"Gloo|Rank|connected|peer|Expected", kept)


def test_a_gloo_message_cut_by_the_end_of_a_cell_is_still_chatter():
    gloo = GlooFilter()
    writes = gloo_writes(0, 1)
    # The cell ends after four of gloo's writes; the held partial is let out as a line.
    assert gloo.feed_line(b"".join(writes[:4]) + b"\n") == b""
    assert gloo.flush() == b""
    assert gloo.feed_line(b"".join(writes[4:])) == b""
    assert gloo.feed_line(b"\n") == b"\n"  # an empty line of the program's own


def test_lines_that_only_look_like_gloo_are_kept():
    gloo = GlooFilter()
    for line in (b"Rank 3 is ready\n", b"12 peers\n", b"\n", b"[Gloo] said hello\n"):
        assert gloo.feed_line(line) == line


def test_stderr_start_up_chatter():
    assert is_stderr_chatter(
        b"W1130 12:00:00.000001    42 log.cc:102] Log level INFO is not suitable for production.\n"
    )
    assert is_stderr_chatter(
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    )
    assert not is_stderr_chatter(b"E1130 12:00:00.000003    42 client.cc:80] Polling failed\n")


# -- the reader on real descriptors ------------------------------------------------------------


class FakeFds:
    """Two descriptors standing for fd 1 and fd 2, each a file we can read back."""

    def __init__(self, tmp_path):
        self.paths = [tmp_path / "out", tmp_path / "err"]
        self.fds = tuple(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in self.paths)

    def downstream(self, i: int) -> bytes:
        return self.paths[i].read_bytes()

    def close(self):
        for fd in self.fds:
            os.close(fd)


@pytest.fixture
def fake_fds(tmp_path):
    fds = FakeFds(tmp_path)
    yield fds
    fds.close()


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def make_output(fake_fds, tmp_path, watch=None):
    sent: list[tuple[str, str, dict]] = []
    log = open(tmp_path / "native.log", "ab")  # noqa: SIM115 - closed by the test
    out = output.NativeOutput(
        log, lambda *a: sent.append(a), watch=watch, fds=fake_fds.fds
    ).install()
    return out, sent, log


def test_lines_reach_the_running_cell_whole_and_the_log_always(fake_fds, tmp_path):
    out, sent, log = make_output(fake_fds, tmp_path)
    fd_out, fd_err = fake_fds.fds
    try:
        os.write(fd_out, b"before the cell\n")
        cell = {"msg_id": "m1"}
        out.cell_started(cell)
        for piece in gloo_writes(0, 1)[:3]:
            os.write(fd_out, piece)
        os.write(fd_out, b"native ")
        os.write(fd_err, b"to stderr\n")
        for piece in gloo_writes(0, 1)[3:]:
            os.write(fd_out, piece)
        os.write(fd_out, b"hello\n")
        os.write(fd_out, b"no newline yet")
        out.cell_finished()  # reads everything written so far, on this thread
        os.write(fd_out, b"after the cell\n")
        wait_for(lambda: b"after the cell" in (tmp_path / "native.log").read_bytes())
    finally:
        out.reader.restore()
        log.close()
    stdout = "".join(text for name, text, _ in sent if name == "stdout")
    stderr = "".join(text for name, text, _ in sent if name == "stderr")
    assert stdout == "native hello\nno newline yet\n"
    assert stderr == "to stderr\n"
    assert all(header == {"msg_id": "m1"} for _, _, header in sent)
    logged = (tmp_path / "native.log").read_bytes()
    for text in (b"before the cell\n", b"[Gloo] Rank 0", b"to stderr\n", b"after the cell\n"):
        assert text in logged
    # Nothing reached what the descriptors were before: they belong to the reader now.
    assert fake_fds.downstream(0) == b"" and fake_fds.downstream(1) == b""


def test_many_threads_writing_at_once_lose_nothing(fake_fds, tmp_path):
    out, sent, log = make_output(fake_fds, tmp_path)
    fd_out = fake_fds.fds[0]
    out.cell_started({"msg_id": "m"})

    def writer(name: str):
        for i in range(200):
            os.write(fd_out, f"{name} line {i}\n".encode())

    def gloo(rank: int):
        for _ in range(20):
            for piece in gloo_writes(rank, 3):
                os.write(fd_out, piece)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    threads += [threading.Thread(target=gloo, args=(r,)) for r in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out.cell_finished()
    finally:
        out.reader.restore()
        log.close()
    lines = "".join(text for _, text, _ in sent).splitlines()
    for name in ("a", "b"):
        assert [x for x in lines if x.startswith(name)] == [f"{name} line {i}" for i in range(200)]
    assert len(lines) == 400


def test_process_0_s_watch_reports_refusals_and_keeps_its_info_records_in_the_log(
    fake_fds, tmp_path
):
    refusals = []
    watch = NativeLogWatch(refusals.append, drop_info=True)
    out, sent, log = make_output(fake_fds, tmp_path, watch=watch)
    fd_err = fake_fds.fds[1]
    try:
        out.cell_started({"msg_id": "m"})
        os.write(fd_err, b"".join(_record(b"UNKNOWN: CERTIFICATE_VERIFY_FAILED")))
        os.write(fd_err, b"E1130 12:00:00.000003    42 client.cc:80] a real error\n")
        out.cell_finished()
    finally:
        out.reader.restore()
        log.close()
    assert [r["peer"] for r in refusals] == ["10.1.2.3:5555"]
    assert [text for _, text, _ in sent] == [
        "E1130 12:00:00.000003    42 client.cc:80] a real error\n"
    ]
    assert b"CallNextHandshakerLocked" in (tmp_path / "native.log").read_bytes()


def test_a_dead_reader_gives_the_descriptors_back(fake_fds, tmp_path):
    def broken(fd, chunk):
        raise RuntimeError("reader broke")

    reader = FdReader(fake_fds.fds, broken).install()
    try:
        os.write(fake_fds.fds[0], b"lost\n")
        reader._thread.join(5)
        assert not reader.alive and isinstance(reader.error, RuntimeError)
        os.write(fake_fds.fds[0], b"out again\n")
        os.write(fake_fds.fds[1], b"err again\n")
    finally:
        reader.restore()
    assert fake_fds.downstream(0) == b"out again\n"
    assert fake_fds.downstream(1) == b"err again\n"


# -- the log -------------------------------------------------------------------------------------


def test_tail_reads_only_the_end(tmp_path):
    path = tmp_path / "log"
    lines = [f"line {i}\n" for i in range(50_000)]
    path.write_text("".join(lines))
    assert output.tail_file(str(path), 3) == "".join(lines[-3:])
    assert output.tail_file(str(path), 1) == lines[-1]
    assert output.tail_file(str(path), None) == "".join(lines)
    assert output.tail_file(str(path), 0) == ""
    assert output.tail_file(str(path), 10**6) == "".join(lines)
    path.write_text("a\nb\nno newline")
    assert output.tail_file(str(path), 2) == "b\nno newline"
    assert output.tail_file(str(tmp_path / "missing"), 5) == ""


def test_the_log_path_comes_from_the_environment(tmp_path):
    env = {contract.PROCESS_ID: "3", contract.INCARNATION: "2"}
    assert output.default_log_path({**env, contract.NATIVE_LOG: "/x/y.log"}) == "/x/y.log"
    (tmp_path / "log").mkdir()
    in_profile = output.default_log_path({**env, "IPP_PROFILE_DIR": str(tmp_path)})
    assert in_profile == str(tmp_path / "log" / contract.native_log_name(3, 2))
    elsewhere = output.default_log_path(env)
    assert os.path.dirname(elsewhere) == tempfile.gettempdir()
    assert "native-p3-i2" in os.path.basename(elsewhere)


def test_a_closed_descriptor_is_left_alone(fake_fds, tmp_path):
    # A number far above any descriptor in use (new pipes take the lowest free numbers).
    closed = 4000
    with pytest.raises(OSError):
        os.fstat(closed)
    with pytest.raises(OSError):
        FdReader((fake_fds.fds[0], closed), lambda fd, chunk: None).install()
    # The descriptor taken over first was given back.
    os.write(fake_fds.fds[0], b"still here\n")
    assert fake_fds.downstream(0) == b"still here\n"


def test_the_log_is_bounded_and_its_tail_spans_the_move(tmp_path, monkeypatch):
    log = output.NativeLog(str(tmp_path / "native.log"), max_bytes=100)
    for i in range(30):
        log.write(b"line %02d\n" % i)  # 8 bytes each: moved aside after 13 lines
    log.close()
    older = (tmp_path / "native.log.1").read_bytes()
    current = (tmp_path / "native.log").read_bytes()
    assert len(older) <= 108 and len(current) <= 108
    monkeypatch.setattr(STATE, "native_log_path", str(tmp_path / "native.log"))
    assert output.log_tail(3) == "line 27\nline 28\nline 29\n"
    wanted = current.count(b"\n") + 2
    assert output.log_tail(wanted).splitlines()[0] == f"line {29 - wanted + 1:02d}"
    assert output.log_tail(None) == (older + current).decode()


def test_a_failure_at_the_end_of_a_cell_gives_the_descriptors_back(fake_fds, tmp_path):
    out, sent, log = make_output(fake_fds, tmp_path)
    try:
        out.cell_started({"msg_id": "m"})
        os.write(fake_fds.fds[0], b"held")
        out.streams[fake_fds.fds[0]].gloo = None  # breaks the filter
        out.cell_finished()  # must not raise into the cell's hooks
        assert out.reader.error is not None
        os.write(fake_fds.fds[0], b"out again\n")
    finally:
        out.reader.restore()
        log.close()
    assert fake_fds.downstream(0) == b"out again\n"
