"""Data shapes shared by the engines, the kernel and the widgets.

Everything here is plain data: dataclasses that turn into JSON-ready dicts, so the same
shapes travel over the telemetry socket, live in widget traits and are saved in notebooks.
``SCHEMA_VERSION`` changes whenever a field changes meaning.
"""

from __future__ import annotations

import copy as _copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..errors import ProtocolError

SCHEMA_VERSION = 1

# Event kinds sent by an engine's agent (see engine/agent.py).
HEARTBEAT = "heartbeat"  # about once a second: busy flag, device ids, incarnation
MONITORING = "monitoring"  # one jax.monitoring event or duration
CACHE_DIR = "cache_dir"  # entries and bytes in the persistent cache directory
STACKS = "stacks"  # a faulthandler dump of every thread, relayed from a remote process
REFUSED = "refused"  # process 0's coordination service refused a TLS handshake: peer, error
# Compilation-cache accounting (engine/cache.py): a process's set-up, what one compile
# request became, and why one request missed.
CACHE_CONFIG = "cache_config"
CACHE_COMPILE = "cache_compile"
CACHE_MISS = "cache_miss"
CACHE_KINDS = (CACHE_CONFIG, CACHE_COMPILE, CACHE_MISS)
# Transfers the transfer guard logged on a process so far, by direction (engine/guards.py).
TRANSFERS = "transfers"
_DIRECTIONS = {"host-to-device": "h2d", "device-to-host": "d2h", "device-to-device": "d2d"}


def transfer_counts_text(counts: dict[str, int]) -> str:
    """``6 h2d, 0 d2h, 0 d2d``: one process's logged transfers, by direction."""
    return ", ".join(f"{counts.get(kind, 0)} {short}" for kind, short in _DIRECTIONS.items())


TRANSFER_KINDS = ("host-to-device", "device-to-host", "device-to-device")

# The largest event the kernel reads. A relayed stack dump (at most 256 Ki characters) is the
# biggest an agent sends; anything larger is refused before it is parsed.
MAX_MESSAGE_BYTES = 1 << 20
# Text fields are cut to these lengths, so one event cannot hold the kernel's memory.
MAX_STACK_TEXT = 512 * 1024
MAX_TEXT = 4096
MAX_DEVICES = 1 << 16
# Ranks, incarnations and counts beyond this are not ours: JSON numbers are unbounded.
MAX_INT = 1 << 62


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


class Malformed(ProtocolError):
    """An event the kernel does not take; ``reason`` is the short name it is counted under."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _no_constants(name: str):
    raise Malformed("not JSON", f"{name} is not a number")


def _int(ev: dict, key: str, default: int | None = None) -> int:
    value = ev.get(key, default)
    # bool is an int to Python, not to a sender: true as a rank is malformed.
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise Malformed("bad field", f"{key} is not a count: {str(value)[:40]}")
    return value


def _number(ev: dict, key: str, default: float | None = None) -> float:
    value = ev.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > MAX_INT:
        raise Malformed("bad field", f"{key} is not a finite number: {str(value)[:40]}")
    return float(value)


def _text(ev: dict, key: str, limit: int, default: str | None = None, tail: bool = False) -> str:
    value = ev.get(key, default)
    if not isinstance(value, str):
        raise Malformed("bad field", f"{key} is not text")
    return value[-limit:] if tail else value[:limit]


def _heartbeat(ev: dict) -> dict:
    busy, devices = ev.get("busy", False), ev.get("devices", [])
    if type(busy) is not bool:
        raise Malformed("bad field", "busy is not true or false")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise Malformed("bad field", "devices is not a list of device ids")
    return {"busy": busy, "devices": [_int({"d": d}, "d") for d in devices]}


def _cache_dir(ev: dict) -> dict:
    return {"entries": _int(ev, "entries", 0), "bytes": _int(ev, "bytes", 0)}


def _monitoring(ev: dict) -> dict:
    out = {"name": _text(ev, "name", MAX_TEXT)}
    if "duration" in ev:
        out["duration"] = _number(ev, "duration")
    if ev.get("fun_name") is not None:
        out["fun_name"] = _text(ev, "fun_name", 256)
    return out


def _stacks(ev: dict) -> dict:
    # The latest dump is at the end.
    return {"text": _text(ev, "text", MAX_STACK_TEXT, "", tail=True)}


def _transfers(ev: dict) -> dict:
    counts = ev.get("counts", {})
    if not isinstance(counts, dict) or not set(counts) <= set(TRANSFER_KINDS):
        raise Malformed("bad field", "counts is not a map of transfer kinds to counts")
    return {"counts": {k: _int(counts, k) for k in TRANSFER_KINDS if k in counts}}


def _refused(ev: dict) -> dict:
    return {"peer": _text(ev, "peer", 256), "error": _text(ev, "error", MAX_TEXT, "")}


def _cache_event(kind: str) -> Callable[[dict], dict]:
    return lambda ev: _cache_fields(kind, ev)


@dataclass(frozen=True)
class Kind:
    """How one event kind is read: its own fields, checked, with text cut to its bound
    (``fields``), and the name of the :class:`~jaxsys_kernel.telemetry.hub.TelemetryHub`
    method that takes it in (``handler``, called with the rank, the event and the time)."""

    fields: Callable[[dict], dict]
    handler: str


#: Every event kind an agent may send: the one place a kind is declared. A new kind needs
#: its entry here and its handler on the hub (tests/unit/test_single_declarations.py checks).
KIND_TABLE: dict[str, Kind] = {
    HEARTBEAT: Kind(_heartbeat, "_on_heartbeat"),
    MONITORING: Kind(_monitoring, "_on_cache_event"),
    CACHE_DIR: Kind(_cache_dir, "_on_cache_dir"),
    STACKS: Kind(_stacks, "_on_stacks"),
    REFUSED: Kind(_refused, "_on_refused"),
    **{kind: Kind(_cache_event(kind), "_on_cache_event") for kind in CACHE_KINDS},
    TRANSFERS: Kind(_transfers, "_on_transfers"),
}
KINDS = tuple(KIND_TABLE)


# The fields of the cache events and their types; all are optional.
_CACHE_FIELDS = {
    CACHE_CONFIG: {
        "dir": "text",
        "platform": "text",
        "min_compile_secs": "num",
        "min_entry_bytes": "num",
        "served": "bool",
        "why_not": "text",
        "jaxlib": "text",
        "explain": "bool",
    },
    CACHE_COMPILE: {
        "fun": "text",
        "module": "text",
        "key": "text",
        "outcome": "text",
        "requested": "bool",
        "seconds": "num",
        "compile_secs": "num",
        "saved": "num",
        "saved_at_least": "num",
        "measured": "bool",
        "retrieval": "num",
        "written": "bool",
        "reason": "text",
    },
    CACHE_MISS: {"cache": "text", "fun": "text", "reason": "text"},
}


def _cache_fields(kind: str, ev: dict) -> dict:
    out: dict = {}
    for key, typ in _CACHE_FIELDS[kind].items():
        if key not in ev:
            continue
        if typ == "text":
            out[key] = _text(ev, key, MAX_TEXT)
        elif typ == "num":
            out[key] = _number(ev, key)
        elif type(ev[key]) is bool:
            out[key] = ev[key]
        else:
            raise Malformed("bad field", f"{key} is not true or false")
    return out


def decode(raw: bytes) -> dict:
    """Parse and check one event as it arrived on the wire.

    Only the fields the kernel uses are kept, each of the type it expects, with text cut to
    its bound; a rank is not checked against the cluster's size (the hub does that).

    Parameters
    ----------
    raw : bytes
        The message.

    Returns
    -------
    dict
        ``v``, ``kind``, ``rank``, ``inc``, ``t`` and the kind's fields.

    Raises
    ------
    Malformed
        For anything else, with the reason it is counted under: ``too large``,
        ``not JSON``, ``not an object``, ``other version``, ``unknown kind`` or ``bad field``.
    """
    if len(raw) > MAX_MESSAGE_BYTES:
        raise Malformed("too large", f"{len(raw)} bytes")
    try:
        ev = json.loads(raw, parse_constant=_no_constants)
    except Malformed:
        raise
    except RecursionError:
        raise Malformed("not JSON", "nested too deeply") from None
    except ValueError as e:  # also undecodable bytes and integers with too many digits
        raise Malformed("not JSON", str(e)[:80]) from None
    if not isinstance(ev, dict):
        raise Malformed("not an object", type(ev).__name__)
    if ev.get("v") != SCHEMA_VERSION:
        raise Malformed("other version", str(ev.get("v"))[:20])
    kind = ev.get("kind")
    if kind not in KINDS:
        raise Malformed("unknown kind", str(kind)[:40])
    head = {
        "v": SCHEMA_VERSION,
        "kind": kind,
        "rank": _int(ev, "rank"),
        "inc": _int(ev, "inc", 0),
        "t": _number(ev, "t", 0.0),
    }
    return {**head, **KIND_TABLE[kind].fields(ev)}


@dataclass
class CacheStats:
    """Compilation-cache numbers of one process, and how each cache event changes them.

    ``requests`` and ``hits`` are JAX's own counts; ``misses`` is ``requests - hits`` (JAX's
    miss event fires only when an entry is written, so it undercounts). The rest comes from
    ``cache_compile`` events, one per compile request (engine/cache.py): ``shared`` were
    received from another process, ``compiles`` were compiled here (in ``compile_time``
    seconds, never counting hits or waits), and ``time_saved`` is the original compile time
    of every entry reused, never negative. A reused entry jaxsys has no record of counts in
    ``unmeasured_hits`` and adds the whole seconds JAX stored to ``time_saved_at_least``.
    ``served`` and ``why_not`` say whether the cache can serve this process at all.
    """

    rank: int
    requests: int = 0
    hits: int = 0
    shared: int = 0
    compiles: int = 0
    compile_time: float = 0.0
    time_saved: float = 0.0
    time_saved_at_least: float = 0.0
    unmeasured_hits: int = 0
    retrieval_time: float = 0.0
    wait_time: float = 0.0
    written: int = 0
    entries: int = 0
    bytes: int = 0
    last_functions: list[str] = field(default_factory=list)
    tracing_misses: int = 0
    last_misses: list[str] = field(default_factory=list)
    cache_dir: str = ""
    min_compile_secs: float | None = None
    min_entry_bytes: int | None = None
    served: bool | None = None
    why_not: str = ""
    jaxlib: str = ""

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

    def copy(self) -> CacheStats:
        """An independent copy (lists included)."""
        # Shallow, then the two lists: asdict's deep walk costs most of a 1,024-process
        # state push (bench/telemetry_scale.py).
        out = _copy.copy(self)
        out.last_functions = list(self.last_functions)
        out.last_misses = list(self.last_misses)
        return out

    def apply(self, ev: dict) -> None:
        """Count one decoded event of this process (monitoring or cache kinds)."""
        kind = ev.get("kind")
        if kind == MONITORING:
            if ev.get("name") == "/jax/compilation_cache/compile_requests_use_cache":
                self.requests += 1
            elif ev.get("name") == "/jax/compilation_cache/cache_hits":
                self.hits += 1
        elif kind == CACHE_CONFIG:
            self.cache_dir = ev.get("dir", self.cache_dir)
            self.min_compile_secs = ev.get("min_compile_secs", self.min_compile_secs)
            if "min_entry_bytes" in ev:
                self.min_entry_bytes = int(ev["min_entry_bytes"])
            self.served = ev.get("served", self.served)
            self.why_not = ev.get("why_not", self.why_not)
            self.jaxlib = ev.get("jaxlib", self.jaxlib)
        elif kind == CACHE_COMPILE:
            self._compiled(ev)
        elif kind == CACHE_MISS and ev.get("cache") == "tracing":
            self.tracing_misses += 1
            self._miss(f"{ev.get('fun', '?')} (tracing): {ev.get('reason', '')}")

    def _compiled(self, ev: dict) -> None:
        outcome = ev.get("outcome")
        if outcome == "hit":
            if ev.get("measured", True):
                self.time_saved += max(0.0, ev.get("saved", 0.0))
            else:
                self.unmeasured_hits += 1
                self.time_saved_at_least += max(0.0, ev.get("saved_at_least", 0.0))
            self.retrieval_time += max(0.0, ev.get("retrieval", 0.0))
        elif outcome == "shared":
            self.shared += 1
            self.wait_time += max(0.0, ev.get("seconds", 0.0))
        else:
            self.compiles += 1
            self.compile_time += max(0.0, ev.get("compile_secs", 0.0))
            self.written += 1 if ev.get("written") else 0
            if ev.get("reason"):
                self._miss(f"{ev.get('fun') or ev.get('module', '?')}: {ev['reason']}")
        fun = ev.get("fun")
        if fun:
            self.last_functions = ([fun] + [f for f in self.last_functions if f != fun])[:5]

    def _miss(self, line: str) -> None:
        self.last_misses = [*self.last_misses, line][-5:]


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
    #: Times the process was restarted alone since the cluster started (the kernel's count:
    #: a process restarted alone rejoins the same incarnation).
    restarts: int = 0
    #: Transfers its transfer guard logged so far, by direction (empty until it logs one).
    transfers: dict[str, int] = field(default_factory=dict)

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


@dataclass
class HubHealth:
    """How the kernel's telemetry receiver is doing.

    Attributes
    ----------
    alive : bool
        Whether its receive thread runs.
    accepted : int
        Events taken.
    dropped : dict
        Events refused, by reason (``not JSON``, ``bad field``, ``unknown process``...).
    last_error : str
        The latest refusal or failure, with its time; ``""`` when there was none.
    restarts : int
        How often the receive loop was started again after a failure.
    handshakes_refused : int
        Connections whose CurveZMQ handshake failed (no key or a wrong key).
    disconnects : int
        Connections that closed after a handshake: processes that stopped, or senders whose
        message exceeded the size limit (ZeroMQ closes those).
    """

    alive: bool = True
    accepted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    restarts: int = 0
    handshakes_refused: int = 0
    disconnects: int = 0

    def line(self) -> str:
        """One line for the user, e.g. ``telemetry: receiving; 812 events, 3 dropped (...)``."""
        state = "receiving" if self.alive else "NOT RECEIVING (the receive thread stopped)"
        parts = [f"telemetry: {state}; {self.accepted} event(s) taken"]
        if self.dropped:
            reasons = ", ".join(f"{n} {r}" for r, n in sorted(self.dropped.items()))
            parts.append(f"{sum(self.dropped.values())} dropped ({reasons})")
        if self.handshakes_refused:
            parts.append(f"{self.handshakes_refused} handshake(s) refused")
        if self.restarts:
            parts.append(f"receive loop restarted {self.restarts}x")
        text = "; ".join(parts)
        return text + (f"; last: {self.last_error}" if self.last_error else "")

    def to_dict(self) -> dict:
        """The fields as a dict."""
        return asdict(self)
