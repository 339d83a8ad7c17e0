"""Intruders for any listening port: junk, plaintext HTTP/2, a ZeroMQ peer without a key,
one with a wrong key, a TLS client without a certificate. Each connects, says its piece and
hangs up within a second; none needs the port's protocol to answer. Shared by the hostile
tests and bench/hostile.py."""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# ZMTP 3.0 greeting: signature, version 3.0, mechanism (20 bytes), as-server, filler.
ZMTP_SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"


def zmtp_greeting(mechanism: bytes = b"NULL") -> bytes:
    return ZMTP_SIGNATURE + b"\x03\x00" + mechanism.ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


# A NULL READY command with socket type PUSH, then one short message.
ZMTP_READY = b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH"
ZMTP_MESSAGE = b"\x00\x05hello"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

# Telemetry events a key holder may send: what the old receiver died of, and more.
MALFORMED = [
    b"[1, 2, 3]",  # a list: AttributeError on .get
    b'{"v": 1, "kind": "heartbeat", "rank": 1e999, "inc": 0, "t": 0}',  # OverflowError
    b'"just a string"',
    b"null",
    b"\xff\xfe\x00garbage",
    b"{" * 100_000,  # RecursionError in the parser
    b'{"v": 1, "kind": "heartbeat", "rank": NaN, "inc": 0, "t": 0}',
    b'{"v": 1, "kind": "heartbeat", "rank": true, "inc": 0, "t": 0}',
    b'{"v": 1, "kind": "heartbeat", "rank": -1, "inc": 0, "t": 0}',
    b'{"v": 1, "kind": "heartbeat", "rank": 7, "inc": 0, "t": 0}',  # no such process
    b'{"v": 1, "kind": "heartbeat", "rank": ' + b"9" * 5000 + b', "inc": 0, "t": 0}',
    b'{"v": 1, "kind": "heartbeat", "rank": 0, "inc": 0, "t": 0, "devices": "abc"}',
    b'{"v": 1, "kind": "heartbeat", "rank": 0, "inc": 0, "t": 0, "devices": [1e999]}',
    b'{"v": 1, "kind": "cache_dir", "rank": 0, "inc": 0, "t": 0, "entries": 1e999}',
    b'{"v": 1, "kind": "monitoring", "rank": 0, "inc": 0, "t": 0, "name": 5}',
    b'{"v": 1, "kind": "monitoring", "rank": 0, "inc": 0, "t": 0, "name": "x", "duration": 1e999}',
    b'{"v": 1, "kind": "refused", "rank": 0, "inc": 0, "t": 0, "peer": ["a"]}',
    b'{"v": 1, "kind": "stacks", "rank": 0, "inc": 0, "t": 0, "text": {"a": 1}}',
    b'{"v": 1, "kind": "no-such-kind", "rank": 0, "inc": 0, "t": 0}',
    b'{"v": 99, "kind": "heartbeat", "rank": 0, "inc": 0, "t": 0}',
    b'{"v": 1, "kind": "heartbeat", "rank": 0, "inc": 0, "t": Infinity}',
]

KINDS = ("junk", "http2", "zmtp-null", "zmq-wrong-key", "tls-no-cert")


@dataclass
class Attempt:
    """One intruder at one port, and how the port answered."""

    address: str
    kind: str
    outcome: str  # "closed", "silent" (kept open, said nothing), "answered", "refused"
    detail: str = ""


def _read(sock: socket.socket, limit: float, size: int = 64) -> bytes:
    sock.settimeout(limit)
    data = b""
    deadline = time.monotonic() + limit
    try:
        while len(data) < size and time.monotonic() < deadline:
            chunk = sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
    except (TimeoutError, OSError):
        pass
    return data


def _raw(host: str, port: int, payload: bytes, limit: float) -> tuple[str, bytes]:
    try:
        with socket.create_connection((host, port), timeout=limit) as s:
            s.sendall(payload)
            data = _read(s, limit)
            return ("answered" if data else "silent"), data
    except ConnectionRefusedError:
        return "refused", b""
    except OSError as e:
        return "closed", str(e).encode()


def zmtp_mechanism(host: str, port: int, limit: float = 1.0) -> str:
    """The security mechanism a ZeroMQ server announces in its greeting ('' if none).

    A CurveZMQ server says ``CURVE`` before anything is decrypted, so this tells what
    protects a port without a key. Only our signature and version are sent: the server
    answers with the rest of its greeting, and nothing unread makes it reset the link.
    """
    try:
        with socket.create_connection((host, port), timeout=limit) as s:
            s.sendall(zmtp_greeting()[:11])
            data = _read(s, limit)
    except OSError:
        return ""
    if len(data) >= 32 and data[:1] == b"\xff" and data[9:10] == b"\x7f":
        return data[12:32].rstrip(b"\x00").decode("ascii", "replace")
    return ""


def _zmq_wrong_key(host: str, port: int, limit: float) -> tuple[str, bytes]:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    other, _ = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = other, public, secret
    try:
        sock.connect(f"tcp://{host}:{port}")
        sock.send(b"let me in", zmq.NOBLOCK)
    except zmq.ZMQError as e:
        return "closed", str(e).encode()
    try:
        answered = sock.poll(int(limit * 1000))
        return ("answered" if answered else "silent"), b""
    finally:
        sock.close(linger=0)


def _tls(host: str, port: int, limit: float) -> tuple[str, bytes]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=limit) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.settimeout(limit)
                data = tls.recv(1)  # TLS 1.3: a refusal arrives after the handshake
                return ("answered" if data else "closed"), data
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        return "closed", str(e).encode()
    except (TimeoutError, OSError) as e:
        return "silent", str(e).encode()


def knock(address: str, kind: str, limit: float = 1.0) -> Attempt:
    """Send one intruder of ``kind`` to ``address`` (``host:port``)."""
    host, port_text = address.rsplit(":", 1)
    port = int(port_text)
    if kind == "junk":
        outcome, data = _raw(host, port, os.urandom(4096), limit)
    elif kind == "http2":
        outcome, data = _raw(host, port, HTTP2_PREFACE, limit)
    elif kind == "zmtp-null":
        outcome, data = _raw(host, port, zmtp_greeting() + ZMTP_READY + ZMTP_MESSAGE, limit)
    elif kind == "zmq-wrong-key":
        outcome, data = _zmq_wrong_key(host, port, limit)
    elif kind == "tls-no-cert":
        outcome, data = _tls(host, port, limit)
    else:
        raise ValueError(f"no intruder {kind!r}; one of {', '.join(KINDS)}")
    return Attempt(address, kind, outcome, data[:80].hex())


def knock_all(addresses: Iterable[str], kinds: Iterable[str] = KINDS) -> list[Attempt]:
    """Every intruder at every address, a few at a time; each hangs up within a second."""
    jobs = [(a, k) for a in addresses for k in kinds]
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda job: knock(*job), jobs))


# -- cells for a jaxsys kernel -------------------------------------------------------------------

# Run in the kernel: the audit, and psutil's listening sockets of every process of the
# cluster (controller, its schedulers, engines, nannies) and of the kernel itself.
AUDIT_CELL = """
import json, os, psutil
from jaxsys_kernel.cluster.audit import audit
from jaxsys_kernel.cluster.teardown import census
from jaxsys_kernel.engine.probes import listening_sockets
_c = get_ipython()._jaxsys_session.cluster
_ctl = psutil.Process(_c._ipp.controller.pid)
_pids = {os.getpid(), *census(_c.world), *(q.pid for q in _ctl.children(recursive=True))}
print(json.dumps({
    "audit": [e.to_dict() for e in audit(_c)],
    "os": sorted({f"{h}:{p}" for pid in _pids for h, p in listening_sockets(pid)}),
    "rss": psutil.Process().memory_info().rss,
}))
"""

HEALTH_CELL = """
import json
_c = get_ipython()._jaxsys_session.cluster
_h = _c.telemetry
print(json.dumps({
    "health": _h.health().to_dict(),
    "live": [lv.state for lv in _h.liveness()],
    "refused": [r.host for r in _h.refusals()],
}))
"""

# Code any cell on an engine can run: the telemetry key is in its environment.
KEY_HOLDER = """%%multihost --procs 1
import json, os, time, zmq
_s = zmq.Context.instance().socket(zmq.PUSH)
_s.linger = 30000
_pub, _sec = zmq.curve_keypair()
_s.curve_serverkey = os.environ["JAXSYS_TELEMETRY_KEY"].encode()
_s.curve_publickey, _s.curve_secretkey = _pub, _sec
_s.connect(os.environ["JAXSYS_TELEMETRY"])
for _raw in {malformed!r}:
    _s.send(_raw)
_s.send(json.dumps({{"v": 1, "kind": "refused", "rank": 0, "inc": 1, "t": time.time(),
                     "peer": "10.9.8.7:4242", "error": "PEER_DID_NOT_RETURN_A_CERTIFICATE"}}).encode())
_huge = b'{{"v": 1, "kind": "stacks", "rank": 1, "inc": 1, "t": 0, "text": "' + b"x" * (50 << 20) + b'"}}'
for _ in range(8):
    _s.send(_huge)
del _huge
_s.close()
print("sent")
"""
