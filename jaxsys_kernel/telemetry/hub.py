"""The kernel side of telemetry: one PULL socket, one thread, per-process aggregates.

Anyone holding the telemetry key can send here (any code on an engine can read it), so
every message is checked before it is used: whatever fails is dropped and counted by
reason, and the receive loop survives anything a message can do to it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from .. import contract
from ..protocol import ProcessState, shown_state
from . import schema
from .refusals import explain_refusal

# A process whose last heartbeat is older than this (in heartbeat intervals) is late.
LATE_AFTER_INTERVALS = 3.0
# Distinct (address, error) pairs kept; a scan from many addresses must not grow the kernel.
MAX_REFUSAL_SOURCES = 256
# The recent-events history keeps events up to this size whole, larger ones as a stub, so
# it holds at most HISTORY_LENGTH * HISTORY_EVENT_BYTES whatever the senders send.
HISTORY_LENGTH = 200
HISTORY_EVENT_BYTES = 4096
# Messages queued in ZeroMQ per sender while the loop is busy, each at most
# schema.MAX_MESSAGE_BYTES: this bounds what a fast sender can park in the kernel.
RECEIVE_QUEUE = 64
# A loop that fails this often within CRASH_WINDOW seconds is left stopped and reported.
MAX_CRASHES = 5
CRASH_WINDOW = 60.0


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
        self.nprocs = nprocs
        self.interval = interval
        self._lock = threading.Lock()
        self._subscribers: list[_Throttled] = []
        self.received = 0
        self.last_event_at: dict[int, float] = {}
        self.first_event_at: dict[int, float] = {}
        self.recent: deque[dict] = deque(maxlen=HISTORY_LENGTH)
        # Refusals outlive world restarts: they are the cluster's security history.
        self._refusals: dict[tuple[str, str], schema.Refusal] = {}
        self.refused_attempts = 0
        self._health = schema.HubHealth()
        self._crashes: deque[float] = deque(maxlen=MAX_CRASHES)
        self._told_dead = False
        self.reset(nprocs)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.linger = 0
        # ZeroMQ refuses a larger message from its header, before it allocates the body,
        # and closes the sender's connection; _take checks the size again.
        sock.maxmsgsize = schema.MAX_MESSAGE_BYTES
        sock.rcvhwm = RECEIVE_QUEUE
        self.public_key: str | None = None
        if curve:
            public, secret = zmq.curve_keypair()
            sock.curve_server = True
            sock.curve_secretkey = secret
            self.public_key = public.decode("ascii")
        port = sock.bind_to_random_port(f"tcp://{bind}")
        self.address = f"tcp://{advertise or bind}:{port}"
        self._sock = sock
        # Failed handshakes and closed connections are only visible through a monitor.
        self._monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_DISCONNECTED
        )
        self._stop = threading.Event()
        self._start_thread()

    def reset(self, nprocs: int | None = None) -> None:
        """Forget all numbers (after a world restart the processes start from zero)."""
        with self._lock:
            if nprocs is not None:
                self.nprocs = nprocs
            self._cache = {r: schema.CacheStats(rank=r) for r in range(self.nprocs)}
            self._beats: dict[int, dict] = {}
            self._stacks: dict[int, tuple[int, str]] = {}
            self._transfers: dict[int, dict[str, int]] = {}
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
            return [s.copy() for s in self._cache.values()]

    def cache_totals(self) -> dict[str, float]:
        """The compilation-cache numbers summed over every process (no per-process copies:
        the comm's state needs only these, four times a second)."""
        keys = ("requests", "hits", "compiles", "entries", "bytes", "time_saved", "compile_time")
        with self._lock:
            stats = list(self._cache.values())
            return {k: sum(getattr(s, k) for s in stats) for k in keys}

    def stack_dump(self, rank: int) -> tuple[int, str]:
        """The latest stack dump relayed by process ``rank``, numbered from 1 (0: none yet)."""
        with self._lock:
            return self._stacks.get(rank, (0, ""))

    def transfer_counts(self) -> dict[int, dict[str, int]]:
        """Per process, the transfers its transfer guard logged so far, by direction."""
        with self._lock:
            return {r: dict(c) for r, c in sorted(self._transfers.items())}

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
        states = states or {}
        late = LATE_AFTER_INTERVALS * self.interval
        # Without a receiver, silence says nothing about the processes.
        receiving = self._thread.is_alive()
        with self._lock:
            for r in range(self.nprocs):
                beat = self._beats.get(r)
                age = None if beat is None else max(0.0, now - beat["recv"])
                if beat is None or not receiving:
                    heard = ProcessState.UNKNOWN
                elif age > late:
                    heard = ProcessState.STUCK if beat["busy"] else ProcessState.DEAD
                else:
                    heard = ProcessState.ALIVE
                # The cluster's record (none: the heartbeats decide) and the heartbeats, in
                # the views' one vocabulary.
                state = shown_state(states.get(r), heard)
                moved = self._transfers.get(r)
                out.append(
                    schema.Liveness(
                        rank=r,
                        state=state.value,
                        heartbeat_age=age,
                        busy=bool(beat and beat["busy"]),
                        devices=list(beat["devices"]) if beat else [],
                        incarnation=beat["inc"] if beat else 0,
                        transfers=dict(moved) if moved else {},
                    )
                )
        return out

    def health(self) -> schema.HubHealth:
        """The receiver's state: alive, events taken and dropped by reason, the last error."""
        with self._lock:
            h = self._health
            return schema.HubHealth(
                **{**vars(h), "alive": self._thread.is_alive(), "dropped": dict(h.dropped)}
            )

    def check(self) -> str | None:
        """Start the receive thread again if it stopped; say so once.

        Returns
        -------
        str or None
            A line for the user when the thread had stopped (it runs again, unless the hub
            was closed), None when all is well.
        """
        if self._thread.is_alive() or self._stop.is_set():
            return None
        with self._lock:
            self._health.restarts += 1
            error = self._health.last_error or "no error recorded"
        self._crashes.clear()
        self._start_thread()
        return (
            f"jaxsys: telemetry had stopped receiving ({error}); it was restarted. "
            "Liveness and refusals from meanwhile are missing; %jaxsys security shows its health."
        )

    def history_bytes(self) -> int:
        """Bytes the recent-events history and the stack dumps hold (an upper bound)."""
        with self._lock:
            stacks = sum(len(text) for _, text in self._stacks.values())
            return sum(e.get("_bytes", 0) for e in self.recent) + stacks

    def close(self) -> None:
        """Stop the thread, close the sockets and let go of what the events held."""
        self._stop.set()
        self._thread.join(timeout=2)
        try:
            self._sock.disable_monitor()
        except Exception:  # noqa: BLE001 - the socket may already be unusable
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        with self._lock:
            self.recent.clear()
            self._stacks = {}
            self._beats = {}

    # -- internals -----------------------------------------------------------------------------

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="jaxsys-telemetry-hub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The receive loop, started again after a failure unless it fails too often."""
        while not self._stop.is_set():
            try:
                self._loop()
                return
            except Exception as e:  # noqa: BLE001 - recorded; the loop goes on or is reported
                now = time.monotonic()
                self._crashes.append(now)
                with self._lock:
                    self._health.last_error = _error_line("receive loop failed", e)
                if len(self._crashes) == MAX_CRASHES and now - self._crashes[0] < CRASH_WINDOW:
                    return  # health() and check() report it; check() starts it again
                with self._lock:
                    self._health.restarts += 1
                self._stop.wait(0.1)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        last_tick = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - last_tick >= 1.0:
                # Heartbeat ages grow without any event arriving; let views show that.
                last_tick = time.monotonic()
                with self._lock:
                    for sub in self._subscribers:
                        sub.dirty = True
            ready = dict(poller.poll(100))
            if self._monitor in ready:
                self._watch_connections()
            if self._sock in ready:
                # A bounded batch: the ticks and subscribers go on under a flood.
                for _ in range(1000):
                    try:
                        raw = self._sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._take(raw)
            self._notify()

    def _watch_connections(self) -> None:
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())["event"]
            with self._lock:
                if event == zmq.EVENT_DISCONNECTED:
                    self._health.disconnects += 1
                else:
                    self._health.handshakes_refused += 1

    def _take(self, raw: bytes) -> None:
        """Apply one message, or drop it and count why; never raises."""
        try:
            self._apply(schema.decode(raw), len(raw))
        except schema.Malformed as e:
            self._drop(e.reason, e)
        except Exception as e:  # noqa: BLE001 - whatever a message causes, it costs only itself
            self._drop(f"failed: {type(e).__name__}", e)

    def _drop(self, reason: str, error: BaseException) -> None:
        with self._lock:
            dropped = self._health.dropped
            dropped[reason] = dropped.get(reason, 0) + 1
            self._health.last_error = _error_line(f"dropped ({reason})", error)

    def _remember(self, ev: dict, size: int) -> None:
        if size > HISTORY_EVENT_BYTES:
            ev = {k: ev[k] for k in ("v", "kind", "rank", "inc", "t")}
            ev["truncated_from"] = size
            size = 256
        self.recent.append({**ev, "_bytes": size})

    def _apply(self, ev: dict, size: int) -> None:
        rank = ev["rank"]
        now = time.time()
        with self._lock:
            if rank not in self._cache:
                raise schema.Malformed("unknown process", f"rank {rank}")
            self.received += 1
            self._health.accepted += 1
            self.last_event_at[rank] = now
            self.first_event_at.setdefault(rank, now)
            self._remember(ev, size)
            # decode() let through only the kinds of schema.KIND_TABLE, which names the handler.
            getattr(self, schema.KIND_TABLE[ev["kind"]].handler)(rank, ev, now)
            for sub in self._subscribers:
                sub.dirty = True

    # -- one handler per event kind (named in schema.KIND_TABLE), called under the lock --

    def _on_heartbeat(self, rank: int, ev: dict, now: float) -> None:
        # Ages are measured on the kernel's clock: hosts' clocks may disagree.
        self._beats[rank] = {**ev, "recv": now}

    def _on_cache_dir(self, rank: int, ev: dict, now: float) -> None:
        self._cache[rank].entries = ev["entries"]
        self._cache[rank].bytes = ev["bytes"]

    def _on_cache_event(self, rank: int, ev: dict, now: float) -> None:
        # What a compile request became, per process: schema.CacheStats.apply.
        self._cache[rank].apply(ev)

    def _on_transfers(self, rank: int, ev: dict, now: float) -> None:
        self._transfers[rank] = ev["counts"]

    def _on_stacks(self, rank: int, ev: dict, now: float) -> None:
        seq = self._stacks.get(rank, (0, ""))[0] + 1
        self._stacks[rank] = (seq, ev["text"])

    def _on_refused(self, rank: int, ev: dict, now: float) -> None:
        peer, error = ev["peer"], ev["error"]
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
        # isdigit() alone takes digits int() refuses (superscripts).
        entry.last_port = int(port) if port.isascii() and port.isdigit() else 0
        self.refused_attempts += 1

    def _notify(self) -> None:
        with self._lock:
            subs = list(self._subscribers)
        for sub in subs:
            sub.maybe_call(self)


def _error_line(what: str, error: BaseException) -> str:
    return f"{time.strftime('%H:%M:%S')} {what}: {str(error)[:200]}"


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
