"""The cluster's parts without a cluster: validated options, launcher classes, engine
environments, generated blocking twins, stack dumps and teardown's hold on launcher files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import (
    make_launcher,
)
from jaxsys_kernel.cluster.records import ProcessInfo

from ..fakes import FakeClient
from ..sleepers import sleeping_children


@pytest.fixture
def sleeper():
    with sleeping_children() as (proc,):
        yield proc


def test_local_signals_go_straight_to_the_pid(sleeper):
    launcher = make_launcher(ClusterConfig(hosts=2))
    procs = [ProcessInfo(0, engine_id=5, pid=sleeper.pid), ProcessInfo(1, engine_id=6)]
    client = FakeClient()
    assert launcher.signal(procs, client, [0, 1], signal.SIGTERM) == [0, 1]
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    # A process whose pid is unknown is signalled through the hub.
    assert client.sent == [(signal.SIGTERM, [6])]
    assert launcher.process_gone(procs[0])


def test_remote_signals_go_through_the_nannies(sleeper):
    launcher = make_launcher(ClusterConfig(hosts=["a", "b"], launcher="ssh"))
    procs = [ProcessInfo(0, engine_id=3, pid=sleeper.pid), ProcessInfo(1, engine_id=4, pid=1)]
    client = FakeClient()
    assert launcher.signal(procs, client, [0, 1], signal.SIGINT) == [0, 1]
    assert client.sent == [(signal.SIGINT, [3, 4])]
    # A pid on another host says nothing about this machine's processes.
    assert sleeper.poll() is None and not launcher.process_gone(procs[0])


# -- stack dumps -------------------------------------------------------------------------------

_FAULTHANDLER_CHILD = """
import faulthandler, signal, sys, time
f = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
def waiting_here():
    print("armed", flush=True)  # from here on, every dump shows this frame
    time.sleep(60)
waiting_here()
"""


def test_local_stacks_come_from_the_stack_file(tmp_path):
    path = tmp_path / "stacks.txt"
    path.write_text("an older dump\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAULTHANDLER_CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "armed\n"
        launcher = make_launcher(ClusterConfig(hosts=2))
        signalled = []

        def send(ranks, sig):
            signalled.append((list(ranks), sig))
            for _ in ranks:
                os.kill(proc.pid, sig)

        files = {0: path, 1: tmp_path / "missing.txt"}
        out = launcher.dump_stacks([0, 1], 10.0, send, files.__getitem__, None)
    finally:
        proc.kill()
        proc.wait()
    # Only the dump written after the signal, and no signal to a process without a file.
    assert signalled == [([0], signal.SIGUSR1)]
    assert list(out) == [0] and "waiting_here" in out[0] and "older" not in out[0]
