"""The commands a user gives the cluster from any surface, each declared once.

A :class:`Command` names one thing to do (``restart``, ``kill``...), whether it takes a
process, which surfaces offer it (``%jaxsys``, the sidebar's buttons, the dashboard's
buttons, the ``jaxsys`` comm) and the one handler that carries it out. Every surface
dispatches through :func:`run` (which reports a failure as a :class:`Result`) or
:func:`call` (which raises it, as a magic should), so a name means the same on all of
them: ``restart`` with a process replaces that process, without one the whole JAX world.

The comm's older names stay accepted (:data:`ALIASES`); the wire declaration in
:mod:`jaxsys_kernel.protocol` and the front ends' button lists are compared with this
table by the unit tests.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from IPython.core.error import UsageError

from .._ranges import format_procs
from ..cells import report
from ..cluster.watch import Watched
from ..errors import ConfigError, ProtocolError
from . import recovery

#: Where a command can be given: the ``%jaxsys`` magic, the JupyterLab sidebar's buttons
#: (and its command palette), the dashboard's buttons, and the ``jaxsys`` comm.
SURFACES = ("jaxsys", "sidebar", "dashboard", "comm")

#: Seconds ``stop-cluster`` waits for an interrupted cell to end before stopping anyway.
STOP_WAIT = 30.0

#: Told of every command carried out, on any surface: ``listener(surface, name, rank,
#: result)``. The comm tells the sidebar what the other surfaces did (its log shows all).
LISTENERS: list[Callable[[str, str, int | None, Any], None]] = []


@dataclass(frozen=True)
class Result:
    """What a command did, the same on every surface.

    Attributes
    ----------
    ok : bool
        Whether it did what was asked.
    code : str
        ``ok``, ``no-cluster``, ``unknown`` (no such command here), ``needs-process``,
        ``usage`` (refused, the message says why) or ``failed`` (it raised).
    message : str
        One line for the user.
    log : tuple of str
        Further lines (a dump of stacks, what happened on the way).
    took : float, optional
        Seconds it took, for a surface that words its own message.
    """

    ok: bool
    code: str
    message: str
    log: tuple[str, ...] = ()
    took: float | None = None


@dataclass
class Call:
    """One invocation: the session, the process (or None), and what the surface offers."""

    session: Any
    rank: int | None
    options: dict[str, Any] = field(default_factory=dict)
    #: Shows a line while the command runs (a view's status); ignored where nobody looks.
    progress: Callable[[str], None] = lambda _line: None
    #: Set while no cell runs (the comm knows); ``stop-cluster`` waits for it.
    cell_done: threading.Event | None = None


@dataclass(frozen=True)
class Command:
    """One command: its name, whether it takes a process, where it is offered, its handler.

    ``process`` is ``"none"``, ``"optional"`` or ``"required"``; ``needs_cluster`` makes
    :func:`run` answer ``no-cluster`` unless a cluster is ready.
    """

    name: str
    process: str
    surfaces: frozenset[str]
    handler: Callable[[Call], Result]
    needs_cluster: bool = True
    #: Whether a kernel that only watches a cluster (``%jaxsys watch``) may give it.
    read_only: bool = False


# -- the handlers -----------------------------------------------------------------------------


def interrupt_cell() -> None:
    """Interrupt the kernel's running cell, as the notebook's stop button does (the cell
    waits in the main thread; SIGINT reaches it there)."""
    os.kill(os.getpid(), signal.SIGINT)


def _start(c: Call) -> Result:
    cluster = c.session.start(**c.options)
    return Result(True, "ok", f"{cluster.nprocs} processes ready in {cluster.ready_seconds:.1f} s")


def _stop_cluster(c: Call) -> Result:
    log = []
    if c.cell_done is not None and not c.cell_done.is_set():
        # A cell waiting on the engines would wait forever once they are gone: interrupt
        # it, and let it end before the teardown.
        interrupt_cell()
        ended = c.cell_done.wait(STOP_WAIT)
        log.append(
            "interrupted the running cell"
            if ended
            else f"the running cell did not end within {STOP_WAIT:g} s of SIGINT"
        )
    took = c.session.stop()
    if took is None:
        return Result(False, "no-cluster", "no cluster is running", tuple(log))
    return Result(True, "ok", f"cluster stopped in {took:.1f} s", tuple(log), took)


def _interrupt(c: Call) -> Result:
    interrupt_cell()
    return Result(True, "ok", "interrupt: interrupting the running cell")


def _stacks(c: Call) -> Result:
    cluster = c.session.cluster
    ranks = cluster.ranks if c.rank is None else [c.rank]
    stacks = cluster.dump_stacks(ranks)
    # Stamped, as a log's lines are: the frames stay apart from a later dump's.
    stamp = time.strftime("%H:%M:%S")
    log = []
    for r in ranks:
        first, *rest = report.process_stack(stacks.get(r, ""))
        log.append(f"{stamp} p{r} {first}")
        log.extend(f"{stamp}     {line}" for line in rest)
    return Result(
        True,
        "ok",
        f"stacks of {format_procs(ranks)} in the log (your code first, or idle)",
        tuple(log),
    )


def _kill(c: Call) -> Result:
    sig = c.options.get("signal", "KILL")
    took = c.session.kill_process(c.rank, sig)
    if sig in ("TERM", "INT"):
        # Sent, not waited for: the program decides what a notice or an interrupt does.
        return Result(True, "ok", f"sent SIG{sig} to p{c.rank}", took=took)
    return Result(True, "ok", f"p{c.rank} killed (gone after {took:.2f} s)", took=took)


def _restart(c: Call) -> Result:
    if c.rank is None:
        c.progress("restarting the JAX world...")
        took = c.session.restart()
        return Result(
            True, "ok", f"JAX world restarted in {took:.1f} s", (recovery.WORLD_LOST,), took
        )
    c.progress(f"p{c.rank} restarting...")
    # The session's restart, not the cluster's: it also forgets that the old process was
    # still busy with an earlier cell, so the next cell is not refused as out of step.
    took = c.session.restart_process(c.rank)
    # It starts empty: what it lacks, and what a collective needs now, on every surface.
    lines = tuple(recovery.rejoin_lines(c.session.cluster, c.rank))
    return Result(True, "ok", f"p{c.rank} rejoined in {took:.1f} s", lines, took)


def _watch(c: Call) -> Result:
    own = getattr(c.session, "cluster", None)
    if own is not None and own.state != "stopped":
        raise UsageError(
            f"this kernel runs a cluster of its own ({own.nprocs} processes): %jaxsys stop "
            "it first, then %jaxsys watch NAME"
        )
    try:
        watched = Watched(c.options["name"])
    except ConfigError as e:
        raise UsageError(str(e)) from None
    c.session.watching = watched
    return Result(True, "ok", watched.headline(), ("%jaxsys status shows its processes",))


def _unwatch(c: Call) -> Result:
    watched = getattr(c.session, "watching", None)
    if watched is None:
        raise UsageError("this kernel watches no cluster (%jaxsys watch NAME starts watching one)")
    c.session.watching = None
    return Result(True, "ok", f"stopped watching cluster {watched.name!r}; it runs on")


# -- the table ----------------------------------------------------------------------------------

_ALL = frozenset(SURFACES)
_BUTTONS = frozenset({"sidebar", "dashboard", "comm"})
_SIDEBAR = frozenset({"sidebar", "comm"})  # the sidebar's buttons speak over the comm
_DASHBOARD = frozenset({"dashboard", "comm"})
_MAGIC = frozenset({"jaxsys"})

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        # A cluster with the kernel's defaults (%jaxsys start takes every option instead).
        Command("start", "none", _SIDEBAR, _start, needs_cluster=False),
        # The teardown, a running cell interrupted first (%jaxsys stop calls session.stop too).
        Command("stop-cluster", "none", _SIDEBAR, _stop_cluster, needs_cluster=False),
        # The running cell, as the notebook's stop button.
        Command("interrupt", "none", _DASHBOARD, _interrupt),
        # Where each process is (one process, or all).
        Command("stacks", "optional", _BUTTONS, _stacks),
        Command("kill", "required", _ALL, _kill),
        # One process, which rejoins the running world; without one, the whole world.
        Command("restart", "optional", _ALL, _restart),
        # A read-only view of a cluster another process owns (cluster/watch.py), and its end;
        # while a kernel watches, every command not marked read_only is refused.
        Command("watch", "none", _MAGIC, _watch, needs_cluster=False, read_only=True),
        Command("unwatch", "none", _MAGIC, _unwatch, needs_cluster=False, read_only=True),
    )
}

#: Older names still accepted, with the command they mean; an alias takes no process.
ALIASES = {"stop": "interrupt", "restart-world": "restart"}


def offered(surface: str) -> tuple[str, ...]:
    """The commands a surface offers, in the table's order."""
    return tuple(name for name, c in COMMANDS.items() if surface in c.surfaces)


def needing_process() -> tuple[str, ...]:
    """The commands that cannot run without a process."""
    return tuple(name for name, c in COMMANDS.items() if c.process == "required")


def resolve(name: str, rank: int | None, surface: str) -> tuple[Command, int | None]:
    """The command ``name`` means on ``surface``, and its process.

    Raises
    ------
    UsageError
        For a name the surface does not offer, or a process missing or not taken.
    """
    if name in ALIASES:
        name, rank = ALIASES[name], None
    command = COMMANDS.get(name)
    if command is None or surface not in command.surfaces:
        offers = ", ".join(offered(surface))
        raise CommandRefused("unknown", f"unknown control {name!r} (offered here: {offers})")
    if command.process == "required" and rank is None:
        raise CommandRefused("needs-process", f"{name} needs a process")
    if command.process == "none":
        rank = None
    if rank is not None and (type(rank) is not int or rank < 0):
        raise CommandRefused(
            "usage", f"{name}: the process must be a number such as 2, got {rank!r}"
        )
    return command, rank


def _refuse_watcher(session, command: Command) -> None:
    """Refuse a command that changes the cluster when ``session`` only watches one."""
    watched = getattr(session, "watching", None)
    if watched is not None and not command.read_only:
        raise CommandRefused("usage", watched.refusal(command.name))


class CommandRefused(ProtocolError, UsageError):
    """A command that a surface does not offer, or given without the process it needs;
    ``code`` is the :class:`Result` code it is reported with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def call(session, name: str, rank: int | None = None, *, surface: str = "jaxsys", **kw) -> Result:
    """Carry out a command and raise what it raises (for ``%jaxsys``).

    Parameters
    ----------
    session : MultihostSession
    name : str
        A command of :data:`COMMANDS` (or an alias).
    rank : int, optional
        The process, for a command that takes one.
    surface : str
        One of :data:`SURFACES`.
    **kw
        ``options`` (handed to the handler), ``progress`` and ``cell_done`` (see :class:`Call`).
    """
    command, rank = resolve(name, rank, surface)
    _refuse_watcher(session, command)
    try:
        result = command.handler(Call(session, rank, **kw))
    except Exception as e:
        _tell(surface, command.name, rank, Result(False, "failed", str(e)))
        raise
    return _tell(surface, command.name, rank, result)


def _tell(surface: str, name: str, rank: int | None, result: Result) -> Result:
    """Tell :data:`LISTENERS` what a command did; a listener's failure is not the command's."""
    for listener in list(LISTENERS):
        try:
            listener(surface, name, rank, result)
        except Exception:  # noqa: BLE001, S110 - a broken view must not fail the command
            pass
    return result


def run(session, name: str, rank: int | None = None, *, surface: str, **kw) -> Result:
    """Carry out a command and report any failure in the result (for buttons and the comm).

    Never raises for a command that fails: the result's ``ok`` and ``code`` say so.
    """
    try:
        command, rank = resolve(name, rank, surface)
        _refuse_watcher(session, command)
    except CommandRefused as e:
        return Result(False, e.code, str(e))
    cluster = getattr(session, "cluster", None)
    if command.needs_cluster and (cluster is None or cluster.state != "ready"):
        refused = Result(False, "no-cluster", "no cluster is running")
        return _tell(surface, command.name, rank, refused)
    try:
        result = command.handler(Call(session, rank, **kw))
    except UsageError as e:
        result = Result(False, "usage", str(e))
    except Exception as e:  # noqa: BLE001 - a button reports its failure, it never raises
        result = Result(False, "failed", f"{command.name} failed: {e}")
    return _tell(surface, command.name, rank, result)
