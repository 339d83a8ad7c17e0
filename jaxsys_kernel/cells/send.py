"""The thin sender: a cell's requests to its processes, and the loop that drives a cell.

A cell leaves the kernel as one execute request per process through the controller's
direct queue, or (:data:`BROADCAST`) as one message to its broadcast scheduler, which
hands each process its own copy. Either way each process's reply and output come back on
their own, so nothing about a process's part of the cell is merged before collation.

Callbacks run on the ipyparallel client's IO thread and only put ``(rank, kind, payload)``
on a queue (:mod:`~jaxsys_kernel.cells.inbox`); the kernel's main thread takes everything
waiting off at once and feeds the cell machine, so a KeyboardInterrupt from the stop
button lands here, where it can be handled.
"""

from __future__ import annotations

import os
import queue
import time
import weakref
from collections.abc import Callable, Sequence

from .. import _compat
from ..engine import hooks as engine_hooks
from ..errors import CellError, ClusterError
from .divergence import DivergenceCheck, DivergenceWatch
from .inbox import Events, Inbox
from .result import CellRun, MultihostInterrupt, interrupt_summary
from .run import DONE, INTERRUPT, JUDGE, CellMachine
from .sink import Sink

# The longest the loop blocks on the queue before looking at the clock again.
POLL = 0.5
# The most events taken off the queue before the machine looks at its timers again.
BATCH = 256
# Seconds between looks for processes of a running cell that died (a pid gone, a pod
# ended): the hub would say so only after its missed heartbeats, and a process waiting in
# a collective for the dead one never fails on its own, so without this a death would be
# known only seconds later.
PROBE_S = 0.25
# Whether a cell goes out as one message through the controller's broadcast scheduler
# (True), or as one request per process through its direct queue (False). Both carry every
# part of the cell path; on a small machine the direct queue is the quicker (the broadcast
# scheduler is one more Python process that copies the request for, and relays the reply
# of, every process), so it stays the default. JAXSYS_CELL_BROADCAST=1 turns it on.
BROADCAST = os.environ.get("JAXSYS_CELL_BROADCAST") == "1"


def send_cell(cluster, code: str, ranks: Sequence[int]) -> Events:
    """Send ``code`` to the processes ``ranks``; their events arrive on the returned queue."""
    events = Events(expected=2 * len(ranks))
    inboxes = [Inbox(events, r) for r in ranks]
    engine_ids = cluster.engine_ids(list(ranks))

    def hook(i: int, future) -> None:
        inboxes[i].attach(future)

    if BROADCAST:
        _compat.broadcast_execute(cluster.client, engine_ids, code, hook)
    else:
        _compat.send_execute(cluster.client, cluster.view, engine_ids, code, hook)
    return events


# Per cluster, the (engine id, pid) of every engine whose cell hooks are installed: a
# process started again (a rejoin, a world restart) needs them once more.
_hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ensure_hooks(cluster, ranks: Sequence[int]) -> None:
    """Install the engine-side cell hooks where they are not yet (one request, once).

    Raises
    ------
    CellError
        A process could not install them; the message names it and why.
    """
    done = _hooked.setdefault(cluster, set())
    idents = {r: (cluster.processes[r].engine_id, cluster.processes[r].pid) for r in ranks}
    missing = [r for r in ranks if idents[r] not in done]
    if not missing:
        return
    calls = cluster.call(missing, engine_hooks.install, timeout=10.0)
    bad = {r: repr(e) for r, e in calls.errors.items()}
    bad.update({r: "no answer in 10 s" for r in calls.missing})
    bad.update({r: "not an IPython engine" for r, ok in calls.results.items() if not ok})
    if bad:
        told = "; ".join(f"process {r}: {why}" for r, why in sorted(bad.items()))
        raise CellError(
            f"could not set up the per-cell hooks ({told}); run the cell with --no-check "
            "and without --thread-guard, or %jaxsys restart"
        )
    done.update(idents[r] for r in missing)


class Driver:
    """Carries out what the machine decides, taking events off the queue in between.

    Parameters
    ----------
    machine : CellMachine
    events : Events
        ``(rank, kind, payload)`` tuples from :func:`send_cell`.
    interrupt : callable
        ``interrupt(ranks) -> ranks signalled`` (``Cluster.interrupt``).
    on_hang : callable, optional
        ``on_hang(run) -> action`` (a :class:`~jaxsys_kernel.cells.hang.HangPolicy`);
        ``interrupt`` without one.
    on_interrupt : callable, optional
        Called with the ranks about to be interrupted, just before they are signalled.
    watch : DivergenceWatch, optional
        Takes the divergence records off the queue before the machine sees them.
    probe : callable, optional
        ``probe(ranks) -> {rank: why}``: which of the running processes are known gone
        (``Cluster.gone_now``), asked every :data:`PROBE_S` seconds.
    """

    def __init__(
        self,
        machine: CellMachine,
        events: Events,
        interrupt: Callable[[list[int]], list[int]],
        on_hang: Callable[[CellRun], str] | None = None,
        on_interrupt: Callable[[list[int]], None] | None = None,
        watch: DivergenceWatch | None = None,
        probe: Callable[[set[int]], dict[int, str]] | None = None,
    ):
        self.machine = machine
        self.events = events
        self.interrupt = interrupt
        self.on_hang = on_hang
        self.on_interrupt = on_interrupt
        self.watch = watch
        self.probe = probe
        self._probed = machine.clock()

    def run(self) -> CellRun:
        """Drive the cell to its end.

        Raises
        ------
        MultihostInterrupt
            The user interrupted the cell.
        """
        try:
            while True:
                try:
                    if self.advance():
                        break
                except KeyboardInterrupt:
                    self.machine.interrupt_requested()
        finally:
            run = self.machine.finish()
        if self.machine.user_interrupted:
            raise MultihostInterrupt(run, interrupt_summary(run))
        return run

    def advance(self) -> bool:
        """Carry out one step; True once the cell is over."""
        m = self.machine
        step = m.step()
        if step.kind == DONE:
            return True
        if step.kind == JUDGE:
            m.judged(self.on_hang(m.run) if self.on_hang else "interrupt")
        elif step.kind == INTERRUPT:
            ranks = list(step.ranks)
            if self.on_interrupt is not None:
                self.on_interrupt(ranks)
            m.interrupted(self.interrupt(ranks))
        else:
            until = step.until
            # Asked once: the answer depends on the clock, and a deadline passed between two
            # asks would turn into None.
            deadline = self.watch.deadline() if self.watch is not None else None
            if deadline is not None:
                until = deadline if until is None else min(until, deadline)
            # At least a millisecond: a timer that did not move must not spin the loop.
            limit = POLL if self.probe is None else PROBE_S
            wait = limit if until is None else min(limit, max(0.001, until - m.clock()))
            self.take(wait)
            if self.watch is not None:
                self.watch.tick(m.running, m.run.failed())
            self._look_for_deaths()
        return False

    def _look_for_deaths(self) -> None:
        """Tell the machine of processes that died, as the hub's reply would later."""
        m = self.machine
        if self.probe is None or not m.running or m.clock() - self._probed < PROBE_S:
            return
        self._probed = m.clock()
        for rank, why in self.probe(set(m.running)).items():
            m.feed(rank, "reply", _Gone(f"process {rank} died: {why}"))

    def take(self, wait: float) -> None:
        """Feed the machine the next event (waiting up to ``wait`` s for one) and every
        event already behind it, up to :data:`BATCH`: a cell's replies arrive in bursts,
        and the machine's timers need looking at once per burst, not once per event."""
        for timeout in (wait, *([0.0] * (BATCH - 1))):
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                return
            if not (self.watch and self.watch.intercept(*event)):
                self.machine.feed(*event)


def execute(
    cluster,
    code: str,
    procs: Sequence[int] | None = None,
    *,
    timeout: float | None = None,
    collate: bool = True,
    all_displays: bool = False,
    window: float | None = None,
    sink: Sink | None = None,
    on_interrupt: Callable[[list[int]], None] | None = None,
    grace: float | None = None,
    on_hang: Callable[[CellRun], str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    hooks: dict[str, dict] | None = None,
    known: set | None = None,
    label: str = "<cell>",
    on_wait: Callable[[list[int]], None] | None = None,
    wait_notice: float | None = None,
) -> CellRun:
    """Run ``code`` on the given processes and stream their output as it arrives.

    Parameters
    ----------
    cluster, code, procs
        A ready cluster, the cell's source, and the processes to run on (all by default).
    timeout, grace, collate, all_displays, window
        How the run is judged and shown (see :class:`~jaxsys_kernel.cells.run.CellMachine`):
        seconds until the cell counts as hung, seconds the others may run on once one
        process has finished or failed, whether identical lines merge, whether every
        process's rich displays are published, how long a line waits for its twins.
    sink, on_interrupt, on_hang, clock
        Where output goes (the kernel's streams by default); called with the ranks about
        to be interrupted; asked what to do with a hung run (``"report"``, ``"interrupt"``,
        ``"restart"`` or ``"wait"``); the monotonic clock.
    hooks, known
        Engine-side cell hooks, ``{name: options}`` (:mod:`jaxsys_kernel.engine.hooks`); with
        ``divergence`` the processes' dispatches are compared while the cell runs, and
        ``known`` (the entries of earlier cells) gains this cell's.
    label, on_wait, wait_notice
        How the cell's file is named in what the processes print (e.g. ``<cell [7]>``);
        called once, ``wait_notice`` seconds in, with the processes still running the cell.

    Returns
    -------
    CellRun
        What each process did; errors are raised by :func:`raise_for_run`, not here.
    """
    procs = list(cluster.ranks if procs is None else procs)
    shown = {"collate": collate, "all_displays": all_displays, "window": window, "label": label}
    shown |= {"on_wait": on_wait, "wait_notice": wait_notice}
    machine = CellMachine(procs, sink or Sink(), clock=clock, timeout=timeout, grace=grace, **shown)
    code, watch = _with_hooks(cluster, code, procs, hooks, machine, known)
    events = send_cell(cluster, code, procs)
    try:
        probe = getattr(cluster, "gone_now", None)  # found dead before the hub says so
        return Driver(machine, events, cluster.interrupt, on_hang, on_interrupt, watch, probe).run()
    finally:
        if watch is not None and known is not None:
            known |= watch.check.seen


class _Gone:
    """A reply future for a process found dead before the hub says so."""

    def __init__(self, why: str):
        self._error = ClusterError(why)

    def exception(self) -> BaseException:
        return self._error


def _with_hooks(cluster, code: str, procs: list[int], hooks, machine, known):
    """The code as sent (wrapped in the engine-side hooks asked for) and the divergence
    watch over the run (None unless ``hooks`` has ``divergence``)."""
    if not hooks:
        return code, None
    ensure_hooks(cluster, procs)
    watch = None
    if "divergence" in hooks:
        check = DivergenceCheck(procs, machine.clock, known=known)
        watch = DivergenceWatch(check, machine.sink.stderr, engine_hooks.RECORD_MIME)
    return engine_hooks.wrap(code, hooks), watch
