"""Engines silent at bring-up: blamed only when the kernel's own client was able to ask them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from tornado.ioloop import IOLoop

from jaxsys_kernel.cluster import first_answers
from jaxsys_kernel.cluster.records import ClusterStartError


class LoopThread:
    """A real tornado loop on its own thread, as ipyparallel's client runs its I/O."""

    def __init__(self):
        started = threading.Event()
        self.loop: IOLoop | None = None

        def run():
            asyncio.set_event_loop(asyncio.new_event_loop())
            self.loop = IOLoop.current()
            started.set()
            self.loop.start()

        self.thread = threading.Thread(target=run, name="client-io", daemon=True)
        self.thread.start()
        assert started.wait(10)

    def stop(self):
        self.loop.add_callback(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def io():
    t = LoopThread()
    yield t
    t.stop()


def world(io_loop, tmp_path):
    client = SimpleNamespace(_io_loop=io_loop, outstanding={"m1"})
    return SimpleNamespace(client=client, profile=tmp_path / "profile_jaxsys-1-x", keep_logs=False)


def silent_request():
    ar = concurrent.futures.Future()  # never answered
    ar.msg_ids = ["m0", "m1"]
    return ar


def test_engines_are_named_when_the_client_runs(io, tmp_path):
    w = world(io.loop, tmp_path)
    with pytest.raises(ClusterStartError, match=r"engine\(s\) 1 registered but did not answer"):
        asyncio.run(first_answers.answers(w, silent_request(), [0, 1], 0.1))
    assert w.keep_logs


def test_a_stuck_client_is_said_and_its_threads_logged(io, tmp_path, caplog):
    release = threading.Event()
    io.loop.add_callback(release.wait, 30)  # the client's I/O thread stuck
    w = world(io.loop, tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="jaxsys.cluster"):
            with pytest.raises(ClusterStartError) as raised:
                asyncio.run(first_answers.answers(w, silent_request(), [0, 1], 0.1))
    finally:
        release.set()
    text = str(raised.value)
    assert "the kernel's own client did not run" in text, text
    assert "may never have left the kernel" in text
    # Where the stuck thread was is in the log, by its name.
    stuck = caplog.text.split("thread client-io:")[1].split("\nthread ")[0]
    assert ", in wait\n" in stuck, caplog.text


def test_the_probe_sees_a_running_loop_at_once(io):
    assert asyncio.run(first_answers.loop_runs(SimpleNamespace(_io_loop=io.loop), 5.0))


# The end of a controller's log whose MUX queue could not bind its port (seen in a real run).
CONTROLLER_LOG = """\
2026-12-07 20:24:35.149 [IPController] task::using Python leastload Task scheduler
Process Process-5:
Traceback (most recent call last):
  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
  File "zmq/backend/cython/_zmq.py", line 190, in zmq.backend.cython._zmq._check_rc
    raise ZMQError(errno)
zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:57605')
2026-12-07 20:24:35.754 [IPController] ERROR | Monitor message without topic: [b'']
2026-12-07 20:24:35.800 [IPController] ERROR | a request it could not handle
Traceback (most recent call last):
  File "ipyparallel/controller/hub.py", line 1, in dispatch
KeyError: 'not a process that ended'
2026-12-07 20:24:36.296 [IPController] engine::Engine Connected: 1
"""


def test_a_controller_process_lost_at_start_is_said(io, tmp_path):
    w = world(io.loop, tmp_path)
    (w.profile / "log").mkdir(parents=True)
    (w.profile / "log" / "ipcontroller-1-x-99.log").write_text(CONTROLLER_LOG)
    began = time.monotonic()
    with pytest.raises(ClusterStartError) as raised:
        asyncio.run(first_answers.answers(w, silent_request(), [0, 1], 30.0))
    # Said at the first look at the controller's log, not when the 30 s are up.
    assert time.monotonic() - began < 10 * first_answers.CHECK_S
    text = str(raised.value)
    assert "a process of the controller ended at start" in text, text
    assert (
        "(Process-5: zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:57605'))"
        in text
    )
    # A traceback the controller only logged is not a process that ended.
    assert "KeyError" not in text
    # The controller's own ERROR lines are ordinary traffic, not a process's end.
    assert "Monitor message" not in text
