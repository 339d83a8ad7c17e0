"""A process that dies during start-up is reported within JAX's heartbeat timeout + 1 s.

The readiness gate holds every process until all have done their imports; a process that
dies while the gate holds the others (played by ``JAXSYS_IMPORT_DELAY``: it is killed in
its slow import) must not leave them waiting for the start's deadline, nor for longer than
JAX itself would take to declare it dead once joined.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from jaxsys_kernel import Cluster, ClusterStartError

from ..harness import wait_no_processes

# JAX's heartbeat timeout for these starts (seconds): the report must come within it + 1 s.
HEARTBEAT_S = 1.0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_a_death_in_a_slow_import_is_reported_within_the_heartbeat(tag, sig):
    killed: list[float] = []

    def progress(event):
        # Killed the first time the gate names it as still importing.
        if "waiting for p1 (importing JAX)" in event.stage and not killed:
            pid = c.world.processes[1].pid
            killed.append(time.monotonic())
            os.kill(pid, sig)

    c = Cluster(
        hosts=2,
        devices_per_host=1,
        process_env={1: {"JAXSYS_IMPORT_DELAY": "1:120"}},
        progress=progress,
        init_timeout=4,
        heartbeat_timeout=HEARTBEAT_S,
    )
    started = time.monotonic()
    with pytest.raises(ClusterStartError) as info:
        c.start_sync()
    assert killed, f"the gate never named p1 as importing: {info.value}"
    took = time.monotonic() - killed[0]
    message = str(info.value)
    assert took <= HEARTBEAT_S + 1.0, (took, message)
    assert message.startswith("process 1 "), message
    assert f"killed by {sig.name}" in message, message
    # Not the start's own deadline: far sooner than the import delay would have ended.
    assert time.monotonic() - started < 120
    assert c.state == "stopped"
    assert not wait_no_processes(tag, timeout=10)
