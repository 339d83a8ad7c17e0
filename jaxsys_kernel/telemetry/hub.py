"""The kernel side of telemetry: one PULL socket, one thread, per-process aggregates."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable

from .. import contract
from . import schema
from .refusals import explain_refusal

# Compilation-cache and compile events, by the names JAX 0.12 records them under.
CACHE_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
TIME_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"

# A process whose last heartbeat is older than this (in heartbeat intervals) is late.
LATE_AFTER_INTERVALS = 3.0
# Distinct (address, error) pairs kept; a scan from many addresses must not grow the kernel.
MAX_REFUSAL_SOURCES = 256


class TelemetryHub:
    """Receives the agents' events and keeps live per-process numbers.

    Parameters
    ----------
    nprocs : int
        Number of processes in the cluster.
    bind : str
        Address to listen on (loopback for local clusters).
    curve : bool
        Encrypt the link with CurveZMQ (the agents get the public key).
    interval : float
        The agents' heartbeat interval, used to judge lateness.
    advertise : str, optional
        The host the agents connect to, when it differs from ``bind`` (``0.0.0.0``).
    """

    def __init__(
        self,
        nprocs: int,
        bind: str = "127.0.0.1",
        curve: bool = True,
        interval: float = 1.0,
        advertise: str | None = None,
    ):
        import zmq

        self.nprocs = nprocs
        self.interval = interval
        self._lock = threading.Lock()
        self._subscribers: list[_Throttled] = []
        self.received = 0
        self.last_event_at: dict[int, float] = {}
        self.first_event_at: dict[int, float] = {}
        self.recent: deque[dict] = deque(maxlen=200)
        # Refusals outlive world restarts: they are the cluster's security history.
        self._refusals: dict[tuple[str, str], schema.Refusal] = {}
        self.refused_attempts = 0
        self.reset(nprocs)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.linger = 0
        self.public_key: str | None = None
        if curve:
            public, secret = zmq.curve_keypair()
            sock.curve_server = True
            sock.curve_secretkey = secret
            self.public_key = public.decode("ascii")
        port = sock.bind_to_random_port(f"tcp://{bind}")
        self.address = f"tcp://{advertise or bind}:{port}"
        self._sock = sock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jaxsys-telemetry-hub", daemon=True)
        self._thread.start()

    def reset(self, nprocs: int | None = None) -> None:
        """Forget all numbers (after a world restart the processes start from zero)."""
        with self._lock:
            if nprocs is not None:
                self.nprocs = nprocs
            self._cache = {r: schema.CacheStats(rank=r) for r in range(self.nprocs)}
            self._beats: dict[int, dict] = {}
            self._stacks: dict[int, tuple[int, str]] = {}
            self.last_event_at = {}

    def env(self) -> dict[str, str]:
        """Environment variables that make an engine's agent report here."""
        env = {contract.TELEMETRY: self.address, contract.HEARTBEAT_INTERVAL: f"{self.interval:g}"}
        if self.public_key:
            env[contract.TELEMETRY_KEY] = self.public_key
        return env

    def subscribe(
        self, callback: Callable[[TelemetryHub], None], max_rate: float = 100.0
    ) -> Callable[[], None]:
        """Call ``callback(hub)`` after new events, at most ``max_rate`` times a second.

        Calls happen on the hub's thread. Returns a function that unsubscribes.
        """
        sub = _Throttled(callback, 1.0 / max_rate)
        with self._lock:
            self._subscribers.append(sub)

        def unsubscribe() -> None:
            with self._lock:
                if sub in self._subscribers:
                    self._subscribers.remove(sub)

        return unsubscribe

    def cache_stats(self) -> list[schema.CacheStats]:
        """Current compilation-cache numbers, by process."""
        with self._lock:
            return [
                schema.CacheStats(**{**vars(s), "last_functions": list(s.last_functions)})
                for s in self._cache.values()
            ]

    def stack_dump(self, rank: int) -> tuple[int, str]:
        """The latest stack dump relayed by process ``rank``, numbered from 1 (0: none yet)."""
        with self._lock:
            return self._stacks.get(rank, (0, ""))

    def refusals(self) -> list[schema.Refusal]:
        """Handshakes the coordination service refused, by address and reason, oldest first."""
        with self._lock:
            return sorted(
                (schema.Refusal(**vars(r)) for r in self._refusals.values()),
                key=lambda r: r.first,
            )

    def liveness(
        self, states: dict[int, str] | None = None, now: float | None = None
    ) -> list[schema.Liveness]:
        """Liveness by process, from heartbeats and the cluster's own view of its processes.

        Parameters
        ----------
        states : dict, optional
            The cluster's state for each rank (``ready``, ``dead``, ``restarting``...).
        now : float, optional
            Wall-clock time to judge heartbeat ages against.
        """
        now = time.time() if now is None else now
        out = []
        with self._lock:
            for r in range(self.nprocs):
                beat = self._beats.get(r)
                cluster_state = (states or {}).get(r, "ready")
                age = None if beat is None else max(0.0, now - beat["recv"])
                if cluster_state in ("dead", "restarting"):
                    state = cluster_state
                elif beat is None:
                    state = "unknown"
                elif age > LATE_AFTER_INTERVALS * self.interval:
                    state = "stuck" if beat["busy"] else "dead"
                else:
                    state = "alive"
                out.append(
                    schema.Liveness(
                        rank=r,
                        state=state,
                        heartbeat_age=age,
                        busy=bool(beat and beat["busy"]),
                        devices=list(beat["devices"]) if beat else [],
                        incarnation=beat["inc"] if beat else 0,
                    )
                )
        return out

    def close(self) -> None:
        """Stop the thread and close the socket."""
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)

    # -- internals -----------------------------------------------------------------------------

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_tick = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last_tick >= 1.0:
                # Heartbeat ages grow without any event arriving; let views show that.
                last_tick = time.monotonic()
                with self._lock:
                    for sub in self._subscribers:
                        sub.dirty = True
            if poller.poll(100):
                while True:
                    try:
                        raw = self._sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._apply(json.loads(raw))
                    except (ValueError, KeyError, TypeError):
                        continue  # a malformed event is dropped, never fatal
            self._notify()

    def _apply(self, ev: dict) -> None:
        if ev.get("v") != schema.SCHEMA_VERSION:
            return
        rank = int(ev["rank"])
        now = time.time()
        with self._lock:
            if rank not in self._cache:
                return
            self.received += 1
            self.last_event_at[rank] = now
            self.first_event_at.setdefault(rank, now)
            self.recent.append(ev)
            kind = ev["kind"]
            if kind == schema.HEARTBEAT:
                # Ages are measured on the kernel's clock: hosts' clocks may disagree.
                self._beats[rank] = {**ev, "recv": now}
            elif kind == schema.CACHE_DIR:
                self._cache[rank].entries = int(ev.get("entries", 0))
                self._cache[rank].bytes = int(ev.get("bytes", 0))
            elif kind == schema.MONITORING:
                self._monitoring(self._cache[rank], ev)
            elif kind == schema.REFUSED:
                self._refused(ev, now)
            elif kind == schema.STACKS:
                seq = self._stacks.get(rank, (0, ""))[0] + 1
                self._stacks[rank] = (seq, str(ev.get("text", "")))
            for sub in self._subscribers:
                sub.dirty = True

    def _refused(self, ev: dict, now: float) -> None:
        peer, error = str(ev["peer"]), str(ev.get("error", ""))
        host, _, port = peer.rpartition(":")
        if not host:
            host, port = peer, ""
        key = (host, error)
        entry = self._refusals.get(key)
        if entry is None:
            if len(self._refusals) >= MAX_REFUSAL_SOURCES:
                return
            reason, identity = explain_refusal(error)
            entry = self._refusals[key] = schema.Refusal(
                host=host, reason=reason, identity=identity, error=error, first=now
            )
        entry.attempts += 1
        entry.last = now
        entry.last_port = int(port) if port.isdigit() else 0
        self.refused_attempts += 1

    @staticmethod
    def _monitoring(stats: schema.CacheStats, ev: dict) -> None:
        name = ev.get("name")
        if name == CACHE_REQUEST:
            stats.requests += 1
        elif name == CACHE_HIT:
            stats.hits += 1
        elif name == TIME_SAVED:
            stats.time_saved += float(ev.get("duration", 0.0))
        elif name == BACKEND_COMPILE:
            stats.compiles += 1
            stats.compile_time += float(ev.get("duration", 0.0))
            fun = ev.get("fun_name")
            if fun:
                stats.last_functions = ([fun] + [f for f in stats.last_functions if f != fun])[:5]

    def _notify(self) -> None:
        with self._lock:
            subs = list(self._subscribers)
        for sub in subs:
            sub.maybe_call(self)


class _Throttled:
    def __init__(self, callback, min_gap: float):
        self.callback = callback
        self.min_gap = min_gap
        self.dirty = False
        self.last = 0.0

    def maybe_call(self, hub) -> None:
        now = time.monotonic()
        if self.dirty and now - self.last >= self.min_gap:
            self.dirty = False
            self.last = now
            try:
                self.callback(hub)
            except Exception:  # noqa: BLE001 - a broken widget must not stop telemetry
                pass
