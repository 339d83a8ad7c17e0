"""Processes joining JAX wait for process 0's coordination service to listen
(``engine/joining.py``) without ever being counted among the connections it refused."""

from __future__ import annotations

import socket
import time

import pytest

from jaxsys_kernel import Cluster

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]


def test_joining_processes_are_never_counted_as_refused(tag):
    c = Cluster(hosts=2, devices_per_host=1, standby=0, progress=lambda e: None)
    c.start_sync()
    try:
        c.restart_sync()  # a second join, into a fresh world
        # One knock without TLS of our own: once its refusal has reached the kernel, any
        # refusal the joins caused (they came first) has reached it too.
        host, _, port = c.coordinator_address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        deadline = time.monotonic() + 30
        while not c.refusals():
            assert time.monotonic() < deadline, "the knock's refusal never reached the kernel"
            time.sleep(0.1)
        assert [r["attempts"] for r in c.refusals()] == [1], c.refusals()
    finally:
        c.kill()
