"""Reading the native log of the process that serves JAX's coordination service.

JAX logs nothing when its coordination service refuses a TLS handshake. gRPC does, once
its ``handshaker`` tracer is on (``GRPC_TRACE=handshaker``, ``GRPC_VERBOSITY=INFO``): one
record per failed handshake, naming the peer's address and the TLS error. Those records go
to file descriptor 2, which ipykernel forwards into cell output. :class:`NativeLogWatch`
sits in front of fd 2 in process 0, turns each refused handshake into a telemetry event,
and passes everything else on unchanged, except the INFO records that only exist because
the tracer had to be turned on.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

# glog/absl prefix: level, MMDD, time, thread id, file:line]
_HEADER = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ ([^:\s]+):\d+\] ")
# Lines that continue a gRPC INFO record: gRPC prints a status's source trace and the
# handshaker's arguments on lines of their own.
_PARTIAL_HEADER = re.compile(rb"^[IWEF]\d")
_CONTINUATION = re.compile(rb"^(=== Source Location Trace|\S+\.(cc|h):\d+\s*$| |\s*$)")
_REFUSAL_ERROR = re.compile(
    r"CallNextHandshakerLocked: error=(?!OK\b)(.*?)(?:\n=== Source Location Trace|\n? shutdown=)",
    re.S,
)
_PEER = re.compile(r"grpc\.internal\.endpoint_peer_address=([^,}\s]+)")
# Printed once by gRPC when its verbosity is raised; it would alarm users for nothing.
_VERBOSITY_WARNING = b"is not suitable for production"

# A line this long without a newline is passed on as it is rather than held.
MAX_PARTIAL_LINE = 1 << 20

ENV_WATCH = "JAXSYS_WATCH_HANDSHAKES"
ENV_DROP_INFO = "JAXSYS_DROP_NATIVE_INFO"


def handshake_refusal(record: str) -> dict | None:
    """Return the refused peer and the TLS error if ``record`` is a failed server handshake.

    Parameters
    ----------
    record : str
        One gRPC log record, its continuation lines included.

    Returns
    -------
    dict or None
        ``{"peer": "host:port", "error": "..."}``, or None when the record is anything else:
        a successful step, a client-side handshake of this process, or an incomplete record.
    """
    m = _REFUSAL_ERROR.search(record)
    if m is None or "grpc.internal.server_credentials" not in record:
        return None
    peer = _PEER.search(record)
    if peer is None:
        return None
    return {"peer": strip_scheme(peer.group(1)), "error": " ".join(m.group(1).split())}


def strip_scheme(address: str) -> str:
    """``ipv4:10.0.0.2:5000`` -> ``10.0.0.2:5000``; ``ipv6:%5B::1%5D:5000`` -> ``[::1]:5000``.

    Parameters
    ----------
    address : str
        A gRPC-style address.

    Returns
    -------
    str
    """
    for scheme in ("ipv4:", "ipv6:"):
        if address.startswith(scheme):
            address = address[len(scheme) :]
    return address.replace("%5B", "[").replace("%5D", "]")


class NativeLogWatch:
    """A filter in front of this process's fd 2 that reports refused TLS handshakes.

    Parameters
    ----------
    on_refusal : callable
        Called with ``{"peer", "error"}`` for every refused handshake, on the watch's thread.
    drop_info : bool
        Swallow INFO records (they are only there because the tracer was turned on).

    Notes
    -----
    Install it after ipykernel has redirected fd 2 (that is, after the engine registered):
    the watch passes what it keeps on to whatever fd 2 was, so cell output is unchanged.
    """

    def __init__(self, on_refusal: Callable[[dict], None], drop_info: bool = True):
        self.on_refusal = on_refusal
        self.drop_info = drop_info
        self.refused = 0
        self.dropped = 0
        self._downstream: int | None = None
        self._read_fd: int | None = None
        self._record: list[bytes] | None = None
        self._reported = False
        self._thread: threading.Thread | None = None

    def install(self) -> NativeLogWatch:
        """Put the filter in front of fd 2 and start reading."""
        read_fd, write_fd = os.pipe()
        self._downstream = os.dup(2)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        self._thread = threading.Thread(target=self._run, name="jaxsys-native-log", daemon=True)
        self._thread.start()
        return self

    def feed_line(self, line: bytes) -> bytes:
        """Take one line of fd 2 output; return what to pass on (maybe ``b""``).

        Parameters
        ----------
        line : bytes
            One line, with its newline.
        """
        header = _HEADER.match(line)
        if header is None and self._record is not None and _CONTINUATION.match(line):
            self._record.append(line)
            self._check_record()
            return self._drop(line)
        self._record = None
        if header is not None and header.group(1) == b"I":
            self._record = [line]
            self._reported = False
            self._check_record()
            return self._drop(line)
        if _VERBOSITY_WARNING in line and header is not None and self.drop_info:
            return b""
        return line

    def _drop(self, line: bytes) -> bytes:
        if not self.drop_info:
            return line
        self.dropped += 1
        return b""

    def _check_record(self) -> None:
        record = self._record
        if self._reported or not record or b"CallNextHandshakerLocked" not in record[0]:
            return
        refusal = handshake_refusal(b"".join(record).decode("utf-8", "replace"))
        if refusal is not None:
            self.refused += 1
            self._reported = True
            try:
                self.on_refusal(refusal)
            except Exception:  # noqa: BLE001 - reporting must never cost the process its stderr
                pass

    def _run(self) -> None:
        try:
            self._filter()
        except Exception:  # noqa: BLE001 - see below
            # fd 2 must never end at a pipe nobody reads: once it filled, every writer,
            # gRPC's logging inside the coordination service included, would block. Only
            # our own pipe is replaced; if fd 2 was moved elsewhere meanwhile, it stays.
            try:
                if os.fstat(2).st_ino == os.fstat(self._read_fd).st_ino:
                    os.dup2(self._downstream, 2)
            except OSError:
                pass

    def _filter(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(self.feed_line(line + b"\n") for line in lines)
            if pending and (
                len(pending) > MAX_PARTIAL_LINE
                or (self._record is None and not _PARTIAL_HEADER.match(pending))
            ):
                # A partial line that is not a log record (e.g. a progress bar): pass it on now.
                out += pending
                pending = b""
            if out:
                try:
                    os.write(self._downstream, out)
                except OSError:
                    pass


_watch: NativeLogWatch | None = None


def watch_from_env() -> NativeLogWatch | None:
    """Install the watch if the launcher asked for it (``$JAXSYS_WATCH_HANDSHAKES``).

    Refusals go out as telemetry events. Calling it again does nothing.

    Returns
    -------
    NativeLogWatch or None
    """
    global _watch
    if _watch is not None or not os.environ.get(ENV_WATCH):
        return _watch
    from ..telemetry import schema
    from . import agent

    def report(refusal: dict) -> None:
        agent.publish(schema.REFUSED, **refusal)

    _watch = NativeLogWatch(report, drop_info=bool(os.environ.get(ENV_DROP_INFO))).install()
    # Refusals matter most while the others are still joining, before the agent would
    # otherwise start (it starts once JAX is up); its socket is needed now.
    from .bootstrap import process_rank

    agent.connect_from_env(process_rank())
    return _watch
