"""The ``jaxsys`` comm: the cluster's state for the JupyterLab extension, and its commands.

The front end (``labextension/``) opens one comm with target :data:`TARGET` per kernel. The
kernel pushes the state of its cluster over it (from the telemetry hub's subscription, at
most :data:`MAX_RATE` times a second, and after every cell and command); the front end
sends commands back. The schema, version :data:`SCHEMA_VERSION`, is JSON both ways
(declared in :mod:`jaxsys_kernel.protocol`):

front end -> kernel
    ``{"type": "command", "action": ACTION, "rank": int | null, "id": str}``: one of
    :data:`ACTIONS`. The dashboard's control buttons send the same ``{"action", "rank"}``
    pair (as widget custom messages), and both are carried out by the one command registry
    (:mod:`jaxsys_kernel.magics.commands`); the reply's ``ok`` is its result's. ``restart``
    with a rank replaces that process, without one the whole world (``restart-world`` is its
    old name). ``{"type": "refresh"}`` asks for the state, and
    ``{"type": "group", "group": int | null}`` opens one group of a large cluster's summary.
kernel -> front end
    ``{"type": "state", "v": 1, "state": STATE}`` (see :func:`cluster_state`) and
    ``{"type": "reply", "id": str, "action": ACTION, "ok": bool, "message": str,
    "log": [str]}`` once a command is done, and ``{"type": "event", "surface": str,
    "action": str, "rank": int | null, "ok": bool, "message": str, "log": [str]}`` when
    another surface (``%jaxsys``, the dashboard) carried one out.

Commands are served on the kernel's control subshell, like the dashboard's buttons, so
they work while a cell blocks the shell.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

from .. import _compat, protocol
from .._version import __version__
from ..errors import ProtocolError
from ..magics import commands
from ..magics.dashboard_wiring import launch_counts, process_liveness
from ..magics.health import health
from ..telemetry import aggregate

TARGET = "jaxsys"
SCHEMA_VERSION = protocol.SCHEMA_VERSION

#: Every action the comm accepts: the registry's commands offered on the comm
#: (:mod:`jaxsys_kernel.magics.commands`), and the old names still accepted.
ACTIONS = (*commands.offered("comm"), *commands.ALIASES)
#: Actions that cannot run without a process.
RANK_ACTIONS = commands.needing_process()

#: Most state pushes a second from telemetry (cells and commands push at once).
MAX_RATE = 4.0
#: Comms kept open at once: a reloaded page opens a new one and never closes the old.
MAX_COMMS = 8
#: What a cell ended by a sidebar command says of it, under its KeyboardInterrupt.
INTERRUPTING = {
    "stop-cluster": "interrupted from the sidebar: its Stop stops the cluster",
    "interrupt": "interrupted from the sidebar",
    "stop": "interrupted from the sidebar",
}
#: Log lines an event from another surface carries at most (a stack dump's are many).
MAX_EVENT_LOG = 200
#: Seconds ``stop-cluster`` waits for an interrupted cell to end before stopping anyway.
STOP_WAIT = commands.STOP_WAIT

# Liveness states that put the status bar into its warning state.
WARNING_STATES = protocol.WARNING_STATES


class CommandError(ProtocolError):
    """A command message that names no known action or process."""


def parse_command(data: Any) -> tuple[str, int | None, str]:
    """Check a command message; returns ``(action, rank, id)``.

    Parameters
    ----------
    data : dict
        ``{"action": ..., "rank": ..., "id": ...}``; ``type`` may be ``"command"`` or absent
        (a dashboard control message).

    Raises
    ------
    CommandError
        Naming what was wrong: an unknown action, or a rank that is missing or not a
        whole number.
    """
    if not isinstance(data, dict):
        raise CommandError(f"a command is a JSON object, got {type(data).__name__}")
    action = data.get("action")
    if action not in ACTIONS:
        raise CommandError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    rank = data.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise CommandError(f"{action}: rank must be a process number, got {rank!r}")
    if action in RANK_ACTIONS and rank is None:
        raise CommandError(f'{action} needs a process: add "rank": N')
    return action, rank, str(data.get("id", ""))


def _process_rows(cluster, lives: dict) -> list[dict]:
    rows = []
    incarnation, restarts = launch_counts(cluster)
    for p in cluster.processes:
        live = lives.get(p.rank)
        if live is not None:
            state, age, busy = live.state, live.heartbeat_age, live.busy
        else:
            # No telemetry: the cluster's own view is all there is.
            state, age, busy = protocol.shown_state(p.state).value, None, False
        rows.append(
            {
                "rank": p.rank,
                "host": p.host,
                "pid": p.pid,
                "devices": list(p.devices),
                "state": state,
                "heartbeat_age": age,
                "busy": busy,
                "error": p.died,
                # Which launch this process is: the world's incarnation, and how often the
                # process was restarted alone since the cluster started.
                "incarnation": live.incarnation if live is not None else incarnation,
                "restarts": restarts.get(p.rank, 0),
            }
        )
    return rows


def _cache_summary(hub) -> dict | None:
    if hub is None:
        return None
    if hasattr(hub, "cache_totals"):
        total = hub.cache_totals()
    else:  # a hub without totals (an older one, or a test's)
        stats = hub.cache_stats()
        keys = ("requests", "hits", "compiles", "entries", "bytes", "time_saved", "compile_time")
        total = {key: sum(getattr(s, key) for s in stats) for key in keys}
    total["hit_rate"] = total["hits"] / total["requests"] if total["requests"] else None
    return total


def cluster_state(session, *, cell_running: bool = False, group: int | None = None) -> dict:
    """The state the front end draws: the cluster, its processes, cache and security.

    Parameters
    ----------
    session : MultihostSession
        The kernel's session.
    cell_running : bool
        Whether a cell is running in the kernel now.
    group : int, optional
        The group of the summary whose rows to send, for clusters above
        :data:`~jaxsys_kernel.telemetry.aggregate.ROWS_UP_TO` processes.

    Returns
    -------
    dict
        ``kernel`` (pid, version), ``cell_running``, ``health`` (the cluster's state in one
        word, why, and whether to warn: see :mod:`jaxsys_kernel.magics.health`) and
        ``cluster``: None when no cluster runs or one is being torn down, else ``state``
        (``starting``, ``ready``, ``restarting``), ``nprocs``,
        ``alive``, ``devices``, ``live_devices``, ``warning`` (a process is dead or stuck),
        ``processes`` (rank, host, pid, devices, state, heartbeat_age, busy, error,
        incarnation, restarts; above
        ``ROWS_UP_TO`` processes only those of the open ``group``), ``summary`` (None up to
        ``ROWS_UP_TO`` processes, else by state, by group and by error), ``cache``
        (totals and ``hit_rate``, None without telemetry), ``security`` and
        ``heartbeat_timeout``.
    """
    out = {
        "kernel": {"pid": os.getpid(), "version": __version__},
        "cell_running": cell_running,
        "time": time.time(),
        "health": health(None).to_dict(),
        "cluster": None,
    }
    cluster = session.cluster
    if cluster is None or cluster.state in ("stopped", "stopping"):
        return out
    cluster.refresh_states()
    hub = cluster.telemetry
    lives = {}
    if hub is not None and cluster.processes:
        lives = {live.rank: live for live in process_liveness(cluster)}
    rows = _process_rows(cluster, lives)
    said = _health(session, cluster, rows)
    out["health"] = said.to_dict()
    alive = [r for r in rows if r["state"] == "alive"]
    out["cluster"] = {
        "state": cluster.state,
        "nprocs": cluster.nprocs,
        "alive": len(alive),
        "devices": sum(len(r["devices"]) for r in rows),
        "live_devices": sum(len(r["devices"]) for r in alive),
        "warning": any(r["state"] in WARNING_STATES for r in rows),
        **_rows_or_summary(rows, group),
        "cache": _cache_summary(hub),
        "security": cluster.security,
        "heartbeat_timeout": cluster.heartbeat_timeout,
    }
    return out


def _health(session, cluster, rows: list[dict]):
    """The cluster's state in one word, with the session's out-of-step and waiting news."""
    states = {r["rank"]: r["state"] for r in rows}
    broken, waiting = getattr(session, "broken", None), getattr(session, "waiting", None)
    return health(cluster, broken, states, waiting)


def _rows_or_summary(rows: list[dict], group: int | None) -> dict:
    """Every row for small clusters; a summary and one open group's rows for large ones."""
    if len(rows) <= aggregate.ROWS_UP_TO:
        return {"processes": rows, "summary": None, "group": None}
    summary = aggregate.summarize(rows)
    if group is not None and not 0 <= group < len(summary["groups"]):
        group = None
    opened = [] if group is None else aggregate.group_rows(rows, group, len(rows))
    return {"processes": opened, "summary": summary, "group": group}


class ClusterComms:
    """Serves the ``jaxsys`` comms of one kernel: state pushes and commands.

    Parameters
    ----------
    session : MultihostSession
        The kernel's session (its cluster and controls).
    control_subshell : callable
        Returns the id of the subshell that serves commands (None without subshells).
    max_rate : float
        Most pushes a second from the telemetry subscription.
    """

    def __init__(self, session, control_subshell=lambda: None, max_rate: float = MAX_RATE):
        self.session = session
        self.control_subshell = control_subshell
        self.max_rate = max_rate
        self.comms: list = []
        self._lock = threading.RLock()
        self._hub = None
        self._unsubscribe = None
        self._cell_done = threading.Event()
        self._cell_done.set()
        # Why the running cell is being interrupted from the sidebar (said when it ends).
        self._interrupted_because: str | None = None
        # The group of a large cluster's summary the front end opened (None: none).
        self.open_group: int | None = None
        # One feed for every comm: they all get the same messages, in version order.
        self._push_lock = threading.Lock()
        self._feed = aggregate.RowFeed()
        self._summary: dict | None = None
        # Comms whose front end reads deltas (version 2); the others get whole states.
        self._delta_comms: set[int] = set()
        # A cell's processes found waiting for others (or done waiting): the views show it.
        listeners = getattr(session, "state_listeners", None)
        if isinstance(listeners, list):
            listeners.append(self.push)

    # -- registration ---------------------------------------------------------------------

    def register(self, kernel) -> None:
        """Register the comm target and the cell hooks on ``kernel``."""
        kernel.comm_manager.register_target(TARGET, self.on_open)
        events = kernel.shell.events
        events.register("pre_run_cell", self._pre_run_cell)
        events.register("post_run_cell", self._post_run_cell)
        commands.LISTENERS.append(self._on_command)

    @property
    def cell_running(self) -> bool:
        """Whether a cell runs in the kernel's main shell now."""
        return not self._cell_done.is_set()

    def _pre_run_cell(self, *_args) -> None:
        self._cell_done.clear()
        self.push()

    def _post_run_cell(self, result=None, *_args) -> None:
        reason, self._interrupted_because = self._interrupted_because, None
        if reason and isinstance(getattr(result, "error_in_exec", None), KeyboardInterrupt):
            # In the cell's output, under its KeyboardInterrupt: who interrupted it, and why.
            print(f"jaxsys: {reason}", file=sys.stderr, flush=True)
        self._cell_done.set()
        self.push()

    # -- comms ----------------------------------------------------------------------------

    def on_open(self, comm, open_msg=None) -> None:
        """Take a comm the front end opened: serve it and send it the state.

        A front end that speaks another schema version gets a state naming both versions,
        and the comm is closed.
        """
        data = ((open_msg or {}).get("content") or {}).get("data") or {}
        mismatch = protocol.version_mismatch(data.get("v") if isinstance(data, dict) else None)
        theirs = data.get("v") if isinstance(data, dict) else None
        if mismatch:
            state = {"kernel": {"pid": os.getpid(), "version": __version__}, "error": mismatch}
            state.update(cell_running=self.cell_running, cluster=None)
            comm.send({"type": "state", "v": SCHEMA_VERSION, "state": state, "version": 0})
            comm.close()
            return
        subshell = self.control_subshell()
        if subshell is not None:
            _compat.route_comm_to_subshell(comm, subshell)
        comm.on_msg(self.on_msg)
        comm.on_close(lambda _msg, comm=comm: self._closed(comm))
        with self._lock:
            self.comms.append(comm)
            if theirs == SCHEMA_VERSION:
                self._delta_comms.add(id(comm))
            stale = self.comms[:-MAX_COMMS]
            del self.comms[:-MAX_COMMS]
        for old in stale:
            with contextlib.suppress(Exception):
                old.close()
        self.push(full=True)

    def _closed(self, comm) -> None:
        with self._lock:
            if comm in self.comms:
                self.comms.remove(comm)
            self._delta_comms.discard(id(comm))
            if not self.comms:
                self._subscribe(None)

    def on_msg(self, msg: dict) -> None:
        """Handle one message from the front end (on the control subshell)."""
        data = msg.get("content", {}).get("data", {})
        if isinstance(data, dict) and data.get("type") == "refresh":
            self.push(full=True)
            return
        if isinstance(data, dict) and data.get("type") == "group":
            group = data.get("group")
            self.open_group = group if type(group) is int and group >= 0 else None
            self.push()
            return
        try:
            action, rank, request = parse_command(data)
        except CommandError as e:
            action = data.get("action") if isinstance(data, dict) else None
            request = str(data.get("id", "")) if isinstance(data, dict) else ""
            self._send(
                {
                    "type": "reply",
                    "id": request,
                    "action": action,
                    "ok": False,
                    "message": str(e),
                    "log": [],
                }
            )
            return
        if action in INTERRUPTING and self.cell_running:
            self._interrupted_because = INTERRUPTING[action]
        result = self.run(action, rank)
        self._send(
            {
                "type": "reply",
                "id": request,
                "action": action,
                "ok": result.ok,
                "message": result.message,
                "log": list(result.log),
            }
        )
        # A command may change much (a new cluster, a restarted world): the whole state.
        self.push(full=True)

    # -- commands -------------------------------------------------------------------------

    def run(self, action: str, rank: int | None) -> commands.Result:
        """Carry out one action through the command registry; its result is the reply."""
        return commands.run(self.session, action, rank, surface="comm", cell_done=self._cell_done)

    def _on_command(self, surface: str, action: str, rank: int | None, result) -> None:
        """Tell the front ends what another surface did (``%jaxsys``, the dashboard): the
        sidebar's log shows every action. The comm's own commands get their reply instead."""
        if surface == "comm":
            return
        self._send(
            {
                "type": "event",
                "surface": surface,
                "action": action,
                "rank": rank,
                "ok": result.ok,
                "message": result.message,
                "log": list(result.log)[-MAX_EVENT_LOG:],
            }
        )
        self.push()

    # -- state ----------------------------------------------------------------------------

    def push(self, full: bool = False) -> None:
        """Send what changed in the state to every open comm (and follow the current hub).

        Parameters
        ----------
        full : bool
            Send the whole state instead (a comm opened, or a front end lost track).
        """
        with self._lock:
            if not self.comms:
                return
            cluster = self.session.cluster
            self._subscribe(None if cluster is None else cluster.telemetry)
        # Built and sent under one lock: the hub's thread, the control subshell and the
        # main thread all push, and deltas must arrive in the order of their versions.
        with self._push_lock:
            try:
                state = cluster_state(
                    self.session, cell_running=self.cell_running, group=self.open_group
                )
            except Exception as e:  # noqa: BLE001 - a broken state must not break cells
                state = {
                    "kernel": {"pid": os.getpid(), "version": __version__},
                    "error": str(e),
                    "cell_running": self.cell_running,
                    "cluster": None,
                }
            whole, delta = self._messages(state)
            with self._lock:
                comms = list(self.comms)
            for comm in comms:
                reads = not full and delta is not None and id(comm) in self._delta_comms
                with contextlib.suppress(Exception):
                    comm.send(delta if reads else whole)

    def _messages(self, state: dict) -> tuple[dict, dict | None]:
        """The state as a whole, and as a delta from the last push (None: no cluster)."""
        c = state.get("cluster")
        rows = self._feed.update(c["processes"] if c else [])
        summary = c.get("summary") if c else None
        changed = summary != self._summary
        self._summary = summary
        whole = {"type": "state", "v": SCHEMA_VERSION, "state": state, "version": rows["v"]}
        if c is None:
            return whole, None
        small = {k: v for k, v in c.items() if k not in ("processes", "summary")}
        out = {
            "type": "delta",
            "v": SCHEMA_VERSION,
            "state": {**state, "cluster": small},
            "rows": rows,
        }
        if changed:
            out["summary"] = summary
        return whole, out

    def _subscribe(self, hub) -> None:
        with self._lock:
            if hub is self._hub:
                return
            if self._unsubscribe is not None:
                self._unsubscribe()
            self._hub, self._unsubscribe = hub, None
            if hub is not None:
                self._unsubscribe = hub.subscribe(lambda _h: self.push(), max_rate=self.max_rate)

    def _send(self, data: dict) -> None:
        with self._lock:
            comms = list(self.comms)
        for comm in comms:
            # A comm the front end closed in the meantime is dropped on its close message.
            with contextlib.suppress(Exception):
                comm.send(data)

    def close(self) -> None:
        """Stop following telemetry and commands (the kernel is shutting down)."""
        self._subscribe(None)
        with contextlib.suppress(ValueError):
            commands.LISTENERS.remove(self._on_command)
