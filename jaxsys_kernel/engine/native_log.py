"""Reading the native log of the process that serves JAX's coordination service.

JAX logs nothing when its coordination service refuses a TLS handshake. gRPC does, once
its ``handshaker`` tracer is on (``GRPC_TRACE=handshaker``, ``GRPC_VERBOSITY=INFO``): one
record per failed handshake, naming the peer's address and the TLS error. Those records go
to file descriptor 2. :class:`NativeLogWatch` reads fd 2's lines in process 0 (the engine's
native output reader, :mod:`jaxsys_kernel.engine.output`, hands them over), turns each
refused handshake into a telemetry event, and keeps everything else, except the INFO
records that only exist because the tracer had to be turned on.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

from .. import contract
from .fdpipe import FdReader, LineAssembler

# glog/absl prefix: level, MMDD, time, thread id, file:line]
_HEADER = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ ([^:\s]+):\d+\] ")
# Lines that continue a gRPC INFO record: gRPC prints a status's source trace and the
# handshaker's arguments on lines of their own.
_CONTINUATION = re.compile(rb"^(=== Source Location Trace|\S+\.(cc|h):\d+\s*$| |\s*$)")
_REFUSAL_ERROR = re.compile(
    r"CallNextHandshakerLocked: error=(?!OK\b)(.*?)(?:\n=== Source Location Trace|\n? shutdown=)",
    re.S,
)
_PEER = re.compile(r"grpc\.internal\.endpoint_peer_address=([^,}\s]+)")
# Printed once by gRPC when its verbosity is raised; it would alarm users for nothing.
_VERBOSITY_WARNING = b"is not suitable for production"

# The launcher's switches for process 0 (kept here under their old names too).
ENV_WATCH = contract.WATCH_HANDSHAKES
ENV_DROP_INFO = contract.DROP_NATIVE_INFO


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
    """Reads fd 2's lines in process 0 and reports refused TLS handshakes.

    Parameters
    ----------
    on_refusal : callable
        Called with ``{"peer", "error"}`` for every refused handshake, on the calling thread.
    drop_info : bool
        Swallow INFO records (they are only there because the tracer was turned on).

    Notes
    -----
    In an engine, the native output reader feeds it every whole fd 2 line
    (:meth:`feed_line`); what it swallows stays in the process's native log. On its own,
    :meth:`install` puts it in front of fd 2 and passes what it keeps on to whatever fd 2
    was before.
    """

    def __init__(self, on_refusal: Callable[[dict], None], drop_info: bool = True):
        self.on_refusal = on_refusal
        self.drop_info = drop_info
        self.refused = 0
        self.dropped = 0
        self._record: list[bytes] | None = None
        self._reported = False
        self._reader: FdReader | None = None
        self._lines = LineAssembler()
        self._thread: threading.Thread | None = None

    def install(self) -> NativeLogWatch:
        """Put the watch in front of fd 2 on its own and start reading.

        If reading ever fails, fd 2 gets back what it was, so writers never block.
        """
        self._reader = FdReader((2,), self._pass_on, name="jaxsys-native-log").install()
        self._thread = self._reader._thread
        return self

    def _pass_on(self, fd: int, chunk: bytes) -> None:
        out = b"".join(self.feed_line(line) for line in self._lines.feed(chunk))
        if out:
            try:
                os.write(self._reader.downstream(fd), out)
            except OSError:
                pass

    def feed_line(self, line: bytes) -> bytes:
        """Take one line of fd 2 output; return what to keep (maybe ``b""``).

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


def watch_from_env() -> NativeLogWatch | None:
    """A watch reporting refusals as telemetry, if the launcher asked for one.

    Only process 0 is started with ``$JAXSYS_WATCH_HANDSHAKES``. The watch is not
    installed: the caller feeds it fd 2's lines. Its telemetry socket is opened now,
    because refusals matter most while the others are still joining, before the agent
    would otherwise start (it starts once JAX is up).

    Returns
    -------
    NativeLogWatch or None
    """
    if not os.environ.get(contract.WATCH_HANDSHAKES):
        return None
    # Deferred: only processes that watch handshakes (process 0 with mTLS) report them.
    from ..telemetry import schema
    from . import agent

    def report(refusal: dict) -> None:
        agent.publish(schema.REFUSED, **refusal)

    watch = NativeLogWatch(report, drop_info=bool(os.environ.get(contract.DROP_NATIVE_INFO)))
    agent.connect_from_env(contract.rank_from_env())
    return watch
