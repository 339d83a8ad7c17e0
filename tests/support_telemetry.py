"""Plays many telemetry agents against a real TelemetryHub, over its real socket.

:class:`SimulatedAgents` starts a few worker processes; each opens one ZeroMQ PUSH socket
per simulated rank (CurveZMQ with the hub's key, as a real agent does) and sends what a
real agent sends: a heartbeat per rank every interval, compile requests and cache hits, a
cache-directory size now and then. Ranks listed in ``silent_after`` stop beating after that
many seconds, as a killed process does, so the hub's liveness goes from alive to dead.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time

from jaxsys_kernel.telemetry import schema

WORKERS = 4
START_TIMEOUT = 30.0


def _events(rank: int, tick: int) -> list[tuple[str, dict]]:
    """What rank ``rank`` sends at heartbeat number ``tick``."""
    out = [(schema.HEARTBEAT, {"busy": tick % 4 == 0, "devices": [rank]})]
    if tick % 5 == rank % 5:
        out.append(
            (schema.MONITORING, {"name": "/jax/compilation_cache/compile_requests_use_cache"})
        )
        out.append((schema.MONITORING, {"name": "/jax/compilation_cache/cache_hits"}))
    if tick % 10 == rank % 10:
        out.append((schema.CACHE_DIR, {"entries": tick, "bytes": 1000 * tick}))
    return out


def _play(address, key, ranks, interval, silent_after, stop, ready) -> None:
    """One worker: a socket per rank, events every interval until ``stop`` is set."""
    import zmq

    ctx = zmq.Context()
    socks = {}
    for r in ranks:
        s = ctx.socket(zmq.PUSH)
        s.linger = 0
        s.sndhwm = 1000
        if key:
            public, secret = zmq.curve_keypair()
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = key.encode(), public, secret
        s.connect(address)
        socks[r] = s
    ready.release()
    t0, tick = time.monotonic(), 0
    try:
        while not stop.is_set():
            now = time.monotonic()
            for r, s in socks.items():
                if r in silent_after and now - t0 > silent_after[r]:
                    continue
                for kind, payload in _events(r, tick):
                    with _dropped():
                        s.send_string(
                            json.dumps(schema.event(kind, r, 1, time.time(), **payload)),
                            zmq.NOBLOCK,
                        )
            tick += 1
            stop.wait(max(0.0, t0 + tick * interval - time.monotonic()))
    finally:
        for s in socks.values():
            s.close(linger=0)
        ctx.term()


class _dropped:
    # A full queue drops the event, as a real agent does.
    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        import zmq

        return typ is not None and issubclass(typ, zmq.Again)


class SimulatedAgents:
    """``n`` simulated agents in ``workers`` processes, reporting to ``hub``.

    Parameters
    ----------
    hub : TelemetryHub
        The real hub (its address and public key are used).
    n : int
        Ranks to simulate, 0..n-1.
    interval : float
        Seconds between heartbeats.
    silent_after : dict, optional
        Rank -> seconds after which it stops sending.
    workers : int
        Processes sharing the ranks.

    Use as a context manager: the workers are stopped and joined on exit, and killed if
    they do not stop.
    """

    def __init__(self, hub, n, interval=1.0, silent_after=None, workers=WORKERS):
        self.hub, self.n, self.interval = hub, n, interval
        self.silent_after = dict(silent_after or {})
        self.workers = min(workers, n)
        self._ctx = mp.get_context("spawn")
        self._stop = self._ctx.Event()
        self.procs: list = []

    def __enter__(self) -> SimulatedAgents:
        ready = self._ctx.Semaphore(0)
        for w in range(self.workers):
            ranks = list(range(w, self.n, self.workers))
            p = self._ctx.Process(
                target=_play,
                args=(
                    self.hub.address,
                    self.hub.public_key,
                    ranks,
                    self.interval,
                    self.silent_after,
                    self._stop,
                    ready,
                ),
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        deadline = time.monotonic() + START_TIMEOUT
        for w in range(self.workers):
            if not ready.acquire(timeout=max(0.1, deadline - time.monotonic())):
                self.__exit__(None, None, None)
                raise TimeoutError(f"only {w} of {self.workers} simulator workers started")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def pids(self) -> list[int]:
        """The workers' pids (for orphan checks)."""
        return [p.pid for p in self.procs]


def wait_for(condition, what: str, timeout: float = 30.0, every: float = 5.0):
    """Poll ``condition()`` until it returns a true value, printing progress; return it."""
    t0 = time.monotonic()
    shown = t0
    while True:
        value = condition()
        if value:
            return value
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        if now - shown >= every:
            print(f"waiting for {what} ({now - t0:.0f} s)", flush=True)
            shown = now
        time.sleep(0.05)
