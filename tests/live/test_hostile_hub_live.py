"""The kernel's telemetry receiver against anything a key holder can send: malformed,
out-of-range, unknown and huge events are dropped and counted, and the receiver keeps
taking heartbeats and refusals afterwards. No cluster: the senders are plain sockets that
hold the key, as any code on an engine can."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil

from ..unit import test_hostile_hub as offline
from ..unit.test_hostile_hub import beat, key_holder, wait_for

hub = offline.hub  # the fixture the offline hub tests use


SENDER = textwrap.dedent(
    """
    import sys, zmq
    address, key, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.linger = 30000
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = key.encode(), public, secret
    sock.connect(address)
    head = b'{"v": 1, "kind": "stacks", "rank": 0, "inc": 1, "t": 0, "text": "'
    for _ in range(n):
        sock.send(head + b"x" * size + b'"}')
    sock.close()
    print("sent")
    """
)


def test_huge_events_leave_the_kernels_memory_alone(hub):
    me = psutil.Process()
    before = me.memory_info().rss
    out = subprocess.run(
        [sys.executable, "-c", SENDER, hub.address, hub.public_key, "8", str(50 << 20)],
        capture_output=True,
        timeout=120,
    )
    assert out.stdout.strip() == b"sent", out.stderr
    # The sender's connection is closed on the first oversized message; it reconnects.
    wait_for(lambda: hub.health().disconnects >= 1, what="the oversized sender's disconnect")
    grown = me.memory_info().rss - before
    assert grown < 16 << 20, f"RSS grew by {grown >> 20} MiB"
    sock = key_holder(hub)
    try:
        sock.send(beat(0))
        wait_for(lambda: hub.received >= 1, what="a heartbeat after the huge events")
    finally:
        sock.close()

