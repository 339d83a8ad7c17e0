"""The kernel's telemetry receiver against anything a key holder can send: malformed,
out-of-range, unknown and huge events are dropped and counted, and the receiver keeps
taking heartbeats and refusals afterwards. No cluster: the senders are plain sockets that
hold the key, as any code on an engine can."""

from __future__ import annotations

import json
import time

import pytest
import zmq

from jaxsys_kernel.telemetry import schema
from jaxsys_kernel.telemetry.hub import TelemetryHub

from ..fakes import FakeCluster
from ..intruders import MALFORMED


def beat(rank: int, **extra) -> bytes:
    ev = schema.event(schema.HEARTBEAT, rank, 1, time.time(), busy=False, devices=[rank])
    return json.dumps({**ev, **extra}).encode()


def refusal(port: int) -> bytes:
    ev = schema.event(
        schema.REFUSED,
        0,
        1,
        time.time(),
        peer=f"10.9.8.7:{port}",
        error="PEER_DID_NOT_RETURN_A_CERTIFICATE",
    )
    return json.dumps(ev).encode()


def wait_for(condition, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def hub():
    h = TelemetryHub(2, curve=True, interval=0.5)
    yield h
    h.close()


def key_holder(hub: TelemetryHub) -> zmq.Socket:
    """A PUSH socket with the hub's public key: what code on an engine can open."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.linger = 0
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = hub.public_key.encode()
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.connect(hub.address)
    return sock


def first_beats(hub: TelemetryHub, sock: zmq.Socket) -> None:
    """One heartbeat from each of the two processes, received."""
    for r in (0, 1):
        sock.send(beat(r))
    wait_for(lambda: hub.received >= 2, what="first heartbeats")


def test_malformed_events_are_dropped_and_counted_and_the_hub_keeps_going(hub):
    sock = key_holder(hub)
    try:
        first_beats(hub, sock)
        for raw in MALFORMED:
            sock.send(raw)
        for r in (0, 1):
            sock.send(beat(r))
        sock.send(refusal(4242))
        wait_for(lambda: hub.received >= 5, what="events after the malformed ones")
        wait_for(lambda: sum(hub.health().dropped.values()) >= len(MALFORMED), what="drops")
    finally:
        sock.close()
    health = hub.health()
    assert health.alive and health.accepted == 5
    assert sum(health.dropped.values()) == len(MALFORMED), health.dropped
    assert {"not an object", "bad field", "not JSON", "unknown process", "unknown kind"} <= set(
        health.dropped
    ), health.dropped
    assert health.last_error
    assert [lv.state for lv in hub.liveness()] == ["alive", "alive"]
    (refused,) = hub.refusals()
    assert refused.host == "10.9.8.7" and refused.last_port == 4242
    assert "dropped" in health.line() and "receiving" in health.line()


def test_a_process_still_joining_is_never_shown_alive(hub):
    """Its heartbeats can arrive before the kernel has seen it join the JAX world."""
    sock = key_holder(hub)
    try:
        first_beats(hub, sock)
    finally:
        sock.close()
    states = {0: "ready", 1: "starting"}
    assert [lv.state for lv in hub.liveness(states)] == ["alive", "restarting"]
    assert [lv.state for lv in hub.liveness({0: "ready", 1: "ready"})] == ["alive", "alive"]
    assert hub.liveness({0: "dead", 1: "restarting"})[0].state == "dead"


def test_a_failure_while_applying_an_event_is_caught_and_counted(hub, monkeypatch):
    calls = {"n": 0}
    apply = hub._apply

    def flaky(ev, size):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverflowError("something unforeseen")
        apply(ev, size)

    monkeypatch.setattr(hub, "_apply", flaky)
    sock = key_holder(hub)
    try:
        sock.send(beat(0))
        sock.send(beat(1))
        wait_for(lambda: hub.received >= 1, what="the second heartbeat")
    finally:
        sock.close()
    health = hub.health()
    assert health.alive and health.dropped == {"failed: OverflowError": 1}
    assert "something unforeseen" in health.last_error


def _failing_loop(monkeypatch, failures: dict) -> None:
    """Make every hub's receive loop raise while ``failures["left"]`` is positive."""
    loop = TelemetryHub._loop

    def patched(self):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("poller broke")
        loop(self)

    monkeypatch.setattr(TelemetryHub, "_loop", patched)


def test_a_crashing_receive_loop_is_restarted(monkeypatch):
    _failing_loop(monkeypatch, {"left": 1})
    hub = TelemetryHub(2, curve=True, interval=0.5)
    sock = key_holder(hub)
    try:
        sock.send(beat(0))
        wait_for(lambda: hub.received >= 1, what="a heartbeat after the restart")
        health = hub.health()
        assert health.alive and health.restarts == 1 and "poller broke" in health.last_error
    finally:
        sock.close()
        hub.close()


def test_a_loop_that_keeps_failing_is_reported_and_check_restarts_it(monkeypatch):
    failures = {"left": 1000}
    _failing_loop(monkeypatch, failures)
    hub = TelemetryHub(2, curve=True, interval=0.5)
    try:
        wait_for(lambda: not hub.health().alive, what="the loop to give up")
        health = hub.health()
        assert "poller broke" in health.last_error and "NOT RECEIVING" in health.line()
        # Without a receiver, silence is not death.
        assert [lv.state for lv in hub.liveness()] == ["unknown", "unknown"]
        failures["left"] = 0
        notice = hub.check()
        assert notice and "restarted" in notice and "poller broke" in notice
        assert hub.health().alive and hub.check() is None
        sock = key_holder(hub)
        try:
            sock.send(beat(1))
            wait_for(lambda: hub.received >= 1, what="a heartbeat after check()")
        finally:
            sock.close()
    finally:
        hub.close()


def test_handshakes_without_the_key_are_counted(hub):
    ctx = zmq.Context.instance()
    plain = ctx.socket(zmq.PUSH)
    wrong = ctx.socket(zmq.PUSH)
    other, _ = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    wrong.curve_serverkey, wrong.curve_publickey, wrong.curve_secretkey = other, public, secret
    for s in (plain, wrong):
        s.linger = 0
        s.connect(hub.address)
        s.send(beat(0))
    try:
        wait_for(lambda: hub.health().handshakes_refused >= 2, what="refused handshakes")
    finally:
        plain.close()
        wrong.close()
    assert hub.received == 0


def test_large_events_are_bounded_in_the_history_and_released_on_close():
    hub = TelemetryHub(2, curve=False, interval=0.5)
    # More events than the history keeps, the last ones near the largest a message may be.
    # Eight of those are enough: kept whole, one (1 MiB) would overflow the bound (800 KiB),
    # and 300 of them took most of a second to decode.
    small = json.dumps(schema.event(schema.STACKS, 1, 1, 0.0, text="y" * 100)).encode()
    text = "y" * (schema.MAX_MESSAGE_BYTES - 200)
    large = json.dumps(schema.event(schema.STACKS, 1, 1, 0.0, text=text)).encode()
    events = [small] * 292 + [large] * 8
    for raw in events:
        hub._take(raw)
    assert hub.received == 300
    assert hub.history_bytes() <= 200 * 4096
    assert hub.stack_dump(1)[0] == 300 and len(hub.stack_dump(1)[1]) == schema.MAX_STACK_TEXT
    hub.close()
    assert hub.history_bytes() == 0 and hub.stack_dump(1) == (0, "")


def test_the_dashboard_shows_the_receivers_health_and_a_stopped_one_is_said(monkeypatch, capsys):
    from jaxsys_kernel.magics.session import MultihostSession

    failures = {"left": 0}
    _failing_loop(monkeypatch, failures)
    hub = TelemetryHub(2, curve=False, interval=0.5)
    session = MultihostSession()
    session.cluster = FakeCluster(hub)
    try:
        hub._take(b"[1, 2, 3]")
        dash = session.show_dashboard()
        line = dash.live.telemetry_health
        assert line.startswith("telemetry: receiving") and "1 not an object" in line
        # A receiver that stops is started again after the next cell, and the user is told.
        failures["left"] = 1000

        def broken_notify():
            raise RuntimeError("subscriber bookkeeping broke")

        monkeypatch.setattr(hub, "_notify", broken_notify)
        wait_for(lambda: not hub.health().alive, what="the loop to give up")
        monkeypatch.undo()
        failures["left"] = 0
        session.report_refusals()
        err = capsys.readouterr().err
        assert "telemetry had stopped receiving" in err and "restarted" in err
        assert hub.health().alive
    finally:
        session._unsubscribe()
        hub.close()
