"""Data shapes shared by the engines, the kernel and the widgets.

Everything here is plain data: dataclasses that turn into JSON-ready dicts, so the same
shapes travel over the telemetry socket, live in widget traits and are saved in notebooks.
``SCHEMA_VERSION`` changes whenever a field changes meaning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 1

# Event kinds sent by an engine's agent (see engine/agent.py).
HEARTBEAT = "heartbeat"  # about once a second: busy flag, device ids, incarnation
MONITORING = "monitoring"  # one jax.monitoring event or duration
CACHE_DIR = "cache_dir"  # entries and bytes in the persistent cache directory
STACKS = "stacks"  # a faulthandler dump of every thread, relayed from a remote process
REFUSED = "refused"  # process 0's coordination service refused a TLS handshake: peer, error


def event(kind: str, rank: int, incarnation: int, t: float, **payload) -> dict:
    """Build one telemetry event as sent on the wire.

    Parameters
    ----------
    kind : str
        One of the event kinds above.
    rank : int
        The process that sends it.
    incarnation : int
        Which start of that process (it changes on restart).
    t : float
        Wall-clock time (``time.time()``) on the sender.
    **payload
        Kind-specific fields.
    """
    return {"v": SCHEMA_VERSION, "kind": kind, "rank": rank, "inc": incarnation, "t": t, **payload}


@dataclass
class CacheStats:
    """Compilation-cache numbers of one process.

    ``misses`` is ``requests - hits``: JAX's own miss event fires only when an entry is
    written, so it undercounts.
    """

    rank: int
    requests: int = 0
    hits: int = 0
    time_saved: float = 0.0
    compile_time: float = 0.0
    compiles: int = 0
    entries: int = 0
    bytes: int = 0
    last_functions: list[str] = field(default_factory=list)

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def to_dict(self) -> dict:
        """Fields plus the derived ``misses`` and ``hit_rate``."""
        d = asdict(self)
        d["misses"] = self.misses
        d["hit_rate"] = self.hit_rate
        return d


@dataclass
class Liveness:
    """Whether one process is alive, and how recently it said so.

    ``state`` is ``alive``, ``stuck`` (heartbeat late while a cell runs), ``dead``,
    ``restarting`` or ``unknown`` (no heartbeat yet).
    """

    rank: int
    state: str = "unknown"
    heartbeat_age: float | None = None
    busy: bool = False
    devices: list[int] = field(default_factory=list)
    incarnation: int = 0

    def to_dict(self) -> dict:
        """The fields as a dict."""
        return asdict(self)


@dataclass
class Refusal:
    """Handshakes the coordination service refused from one address for one reason.

    Attributes
    ----------
    host : str
        The peer's address, without the port (each attempt comes from a new port).
    reason : str
        Why it was refused, in words (see :func:`jaxsys_kernel.telemetry.refusals.explain_refusal`).
    identity : str
        The identities its certificate claimed, when the certificate got that far.
    error : str
        The TLS error as gRPC logged it.
    attempts : int
        How many handshakes were refused.
    first, last : float
        Wall-clock times (kernel clock) of the first and the latest attempt.
    last_port : int
        The source port of the latest attempt.
    """

    host: str
    reason: str
    identity: str = ""
    error: str = ""
    attempts: int = 0
    first: float = 0.0
    last: float = 0.0
    last_port: int = 0

    def to_dict(self) -> dict:
        """The fields as a dict."""
        return asdict(self)
