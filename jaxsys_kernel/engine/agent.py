"""The telemetry agent inside each JAX process.

It forwards ``jax.monitoring`` events (compilation-cache requests and hits, compile
durations with the function's name), a heartbeat about once a second, and the size of the
persistent cache directory to the kernel over its own ZMQ PUSH socket. The socket is
independent of cell execution, so a cell that runs for minutes still reports live numbers,
and sending never blocks: when the kernel is not reading, events are dropped.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import zmq

from .. import contract
from ..telemetry import schema
from .state import STATE

ENV_ADDRESS = contract.TELEMETRY
ENV_SERVER_KEY = contract.TELEMETRY_KEY
ENV_INCARNATION = contract.INCARNATION
ENV_INTERVAL = contract.HEARTBEAT_INTERVAL

# Broken sockets replaced before telemetry gives up for this process: each costs a socket
# and a key pair, so a cell closing them in a loop cannot make the agent grow without bound.
MAX_REOPENS = 100

# The early-init thread starts the agent while the main thread may be connecting it.
_agent_lock = threading.Lock()


class Agent:
    """Sends one process's telemetry to the kernel.

    Parameters
    ----------
    address : str
        The kernel's PULL socket, ``tcp://host:port``.
    rank, incarnation : int
        Who is sending: the process index and which start of it this is.
    server_key : str, optional
        The kernel's CurveZMQ public key (Z85); the link is encrypted when given.
    interval : float
        Seconds between heartbeats.
    """

    def __init__(
        self,
        address: str,
        rank: int,
        incarnation: int = 0,
        server_key: str | None = None,
        interval: float = 1.0,
    ):
        self.rank = rank
        self.incarnation = incarnation
        self.interval = interval
        self.busy = False
        # Whether the last heartbeat sent said busy (see _cell_started).
        self._said_busy = False
        self._beat_lock = threading.Lock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._hooked = False
        self.started = False
        self.sent = 0
        self.dropped = 0
        self._zmq = zmq
        self._address = address
        self._server_key = server_key
        # Times the socket was found broken and opened again (closed by cell code, a
        # context torn down): telemetry is never worth failing a cell or a compile for.
        self.reopened = 0
        self._sock = self._open()
        self._thread = threading.Thread(target=self._beat, name="jaxsys-telemetry", daemon=True)

    def _open(self):
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.linger = 0
        # A bounded queue: a kernel that stops reading costs dropped events, never a stall.
        sock.sndhwm = 10_000
        if self._server_key:
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey = self._server_key.encode("ascii")
            sock.curve_publickey = public
            sock.curve_secretkey = secret
        sock.connect(self._address)
        return sock

    def start(self) -> Agent:
        """Register the JAX listeners and start the heartbeat thread."""
        # Deferred: the stack relay and the handshake watch load this module before JAX is
        # imported; start() runs once JAX has joined.
        import jax.monitoring

        self.started = True
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        # What each compile request became (hit, shared, compiled and why): engine/cache.py.
        # Deferred: cache imports JAX, which this module must not import (see above).
        from . import cache

        cache.install(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the heartbeat (listeners stay registered but send nothing)."""
        self._stop.set()

    def send(self, kind: str, **payload) -> None:
        """Send one event without blocking; drop it if the queue is full."""
        if self._stop.is_set():
            return
        msg = json.dumps(schema.event(kind, self.rank, self.incarnation, time.time(), **payload))
        with self._lock:
            try:
                self._sock.send_string(msg, self._zmq.NOBLOCK)
                self.sent += 1
            except self._zmq.Again:
                self.dropped += 1
            except self._zmq.ZMQError:
                # The socket is gone (closed from a cell, say): this event is lost, the
                # next one goes through a new socket. Raising here would fail the cell
                # or the compile whose hook or listener is sending.
                self.dropped += 1
                self._reopen()

    def _reopen(self) -> None:
        if self.reopened >= MAX_REOPENS:
            self._stop.set()  # the link cannot be mended: telemetry stops, the engine goes on
            return
        self.reopened += 1
        try:
            self._sock.close(linger=0)
        except self._zmq.ZMQError:
            pass
        try:
            self._sock = self._open()
        except self._zmq.ZMQError:
            self._stop.set()

    def _on_event(self, event: str, **kwargs) -> None:
        self.send(schema.MONITORING, name=event, **_plain(kwargs))

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        self.send(schema.MONITORING, name=event, duration=duration, **_plain(kwargs))

    def _hook_cells(self) -> None:
        # The IPython shell exists only once the engine has finished starting.
        if self._hooked:
            return
        try:
            # Deferred: guarded, so that a process without IPython still sends telemetry.
            from IPython import get_ipython
        except ImportError:
            self._hooked = True
            return
        shell = get_ipython()
        if shell is None:
            return
        shell.events.register("pre_run_cell", self._cell_started)
        shell.events.register("post_run_cell", self._cell_finished)
        self._hooked = True

    def _cell_started(self, *args) -> None:
        # Before the cell's code runs, the last beat sent says busy: were the cell to hold
        # the GIL from its first line, the beats stop there and the kernel shows the
        # process stuck, not dead. Back-to-back cells send it once, not once each.
        self.busy = True
        self._heartbeat(unless_said_busy=True)

    def _cell_finished(self, *args) -> None:
        # Said by the next periodic beat (within one interval), not now: a beat per cell
        # from every process cost a trivial cell at 64 processes about a tenth of its time.
        self.busy = False

    def _heartbeat(self, unless_said_busy: bool = False) -> None:
        # The flag is read and sent, and what was sent noted, in one step: a cell starting
        # meanwhile either is in this beat or sees that the beat said idle.
        with self._beat_lock:
            busy = self.busy
            if unless_said_busy and busy and self._said_busy:
                return
            self.send(schema.HEARTBEAT, busy=busy, devices=_local_device_ids())
            self._said_busy = busy

    def _beat(self) -> None:
        cache_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        n = 0
        while not self._stop.is_set():
            self._hook_cells()
            self._heartbeat()
            if cache_dir and n % 5 == 0:
                entries, size = _dir_usage(cache_dir)
                self.send(schema.CACHE_DIR, entries=entries, bytes=size)
            n += 1
            self._stop.wait(self.interval)


def _plain(kwargs: dict) -> dict:
    return {k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in kwargs.items()}


def _local_device_ids() -> list[int]:
    jax = sys.modules.get("jax")
    if jax is None:
        return []
    try:
        return [d.id for d in jax.local_devices()]
    except Exception:  # noqa: BLE001 - before the backend exists there are no devices to list
        return []


def _dir_usage(path: str) -> tuple[int, int]:
    entries = size = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    entries += 1
                    size += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return entries, size


def publish(kind: str, **payload) -> None:
    """Send an event through this process's agent, or keep it until the agent starts.

    Parameters
    ----------
    kind : str
        An event kind from :mod:`jaxsys_kernel.telemetry.schema`.
    **payload
        Its fields (JSON-ready).
    """
    with _agent_lock:
        agent = STATE.agent
        if agent is None:
            STATE.agent_pending.append((kind, payload))
            return
    agent.send(kind, **payload)


def connect_from_env(rank: int) -> Agent | None:
    """Open the agent's socket, without its listeners and heartbeat, and send what waits.

    For events that matter before JAX has started (refused handshakes while processes
    join): the heartbeat reads the device list, which must not be touched before
    ``jax.distributed.initialize`` is done.

    Parameters
    ----------
    rank : int
        This process's index.

    Returns
    -------
    Agent or None
        The agent, or None without ``$JAXSYS_TELEMETRY``.
    """
    with _agent_lock:
        if STATE.agent is None:
            address = os.environ.get(ENV_ADDRESS)
            if not address:
                return None
            STATE.agent = Agent(
                address,
                rank,
                incarnation=int(os.environ.get(ENV_INCARNATION, "0")),
                server_key=os.environ.get(ENV_SERVER_KEY) or None,
                interval=float(os.environ.get(ENV_INTERVAL, "1.0")),
            )
        while STATE.agent_pending:
            kind, payload = STATE.agent_pending.popleft()
            STATE.agent.send(kind, **payload)
        return STATE.agent


def start_from_env(rank: int) -> Agent | None:
    """Start the agent if the launcher asked for telemetry (``$JAXSYS_TELEMETRY``).

    Parameters
    ----------
    rank : int
        This process's index.

    Returns
    -------
    Agent or None
        The running agent; the same one on repeated calls.
    """
    agent = connect_from_env(rank)
    with _agent_lock:
        if agent is not None and not agent.started:
            agent.start()
    return agent
