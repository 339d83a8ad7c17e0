"""The kernel-side state behind the magics: one cluster, SPMD mode, and typed operations.

Every magic is a thin parser over a method here, so tests can call the methods directly.
The session is made of parts, one concern each: :class:`~.lifecycle.Lifecycle` (start,
stop, restarts, certificates), :class:`~.dashboard_wiring.DashboardWiring`,
:class:`~.controls.Controls` (buttons on a subshell) and :class:`~.remote.RemoteValues`
(``%pull``, completion, inspection); the cells are run here.
"""

from __future__ import annotations

import sys

from IPython.core.error import UsageError

from .. import cells
from .._ranges import parse_procs
from ..cells import guard, hang, timeline
from ..cells.result import notebook_cell_number
from ..cells.spmd import LOCAL_PREFIXES, is_local_cell, make_spmd_transformer
from ..cluster import Cluster
from . import deaths, hints, recovery, waits
from .boundary import usage_boundary
from .controls import Controls
from .dashboard_wiring import DashboardWiring
from .lifecycle import Lifecycle
from .remote import RemoteValues

# The SPMD routing lives with the cell path; its names stay importable from here.
__all__ = ["LOCAL_PREFIXES", "MultihostSession", "is_local_cell", "make_spmd_transformer"]


@usage_boundary
class MultihostSession(Lifecycle, DashboardWiring, Controls, RemoteValues):
    """State of one jaxsys kernel: its cluster, its SPMD mode and its defaults.

    Parameters
    ----------
    shell : IPython.core.interactiveshell.InteractiveShell, optional
        The shell whose namespace receives pulled values.
    """

    # Whether cells run under jax.thread_guard unless told otherwise (%jaxsys start --thread-guard).
    thread_guard = False
    # Whether cells compare the processes' dispatches as they run (%jaxsys divergence).
    divergence = True

    def __init__(self, shell=None):
        self.shell = shell
        self.cluster: Cluster | None = None
        self.spmd = False
        self.default_timeout: float | None = None
        # Once a process fails, how long the others may run on before the cell is judged
        # hung, and what is then done about it.
        self.default_grace: float = 10.0
        self.default_on_hang: str = "interrupt"
        # Why the JAX world cannot be trusted with a collective (None when it can).
        self.broken: str | None = None
        # Processes still busy with a cell that ended without them.
        self.still_running: set[int] = set()
        # Per process, the cells it was asked to run since the last cell that ran
        # everywhere: the same-program guard compares them.
        self.ledger = guard.Ledger()
        # Processes waiting for others that do not run the cell (None: no such wait), and
        # who is told when that changes (the comm pushes its state).
        self.waiting: str | None = None
        self.state_listeners: list = []
        # Names defined by cells run on some processes only, for NameError's hint.
        self.partial_names = hints.PartialNames()
        self.last_summaries: dict[str, dict] = {}
        # Dispatches reported in earlier cells (the divergence check leaves them out).
        self.dispatches_seen: set = set()
        self.dashboard = None
        self._unsubscribe = None
        # Set by the kernel: returns a subshell id for widget controls (None without one).
        self.control_subshell = lambda: None
        # Refused handshakes already told to the user, by (address, error).
        self._refusals_told: dict[tuple[str, str], int] = {}
        # The rotation (its rotated_at) whose outcome was already told.
        self._rotation_told: float | None = None

    # -- cells ------------------------------------------------------------------------------

    def parse_procs(self, text: str | None) -> list[int]:
        """Turn a ``--procs`` value into ranks, raising UsageError on bad input."""
        cluster = self.require_cluster()
        if text is None:
            return cluster.ranks
        try:
            return parse_procs(text, cluster.nprocs)
        except ValueError as e:
            raise UsageError(f"--procs: {e}") from None

    def run_cell(
        self,
        code: str,
        procs: str | None = None,
        *,
        timeout: float | None = None,
        collate: bool = True,
        all_displays: bool = False,
        grace: float | None = None,
        on_hang: str | None = None,
        force: bool = False,
        thread_guard: bool | None = None,
        check: bool | None = None,
        profile: bool | str = False,
    ) -> cells.CellResult | None:
        """Run a cell on the selected processes; raise if any of them failed.

        Returns
        -------
        CellResult or None
            The cell's value, for the kernel to display.
        """
        cluster = self.ensure_cluster()
        ranks = self.parse_procs(procs)
        timeout = self.default_timeout if timeout is None else timeout
        grace = self.default_grace if grace is None else grace
        on_hang = on_hang or self.default_on_hang
        guard.check_options(timeout, grace, on_hang)
        number = self._admit(cluster, ranks, code, force)
        policy = hang.HangPolicy(
            on_hang, cluster.dump_stacks, timeout=timeout, grace=grace, code=code
        )
        hooks = self._hooks(thread_guard, check, profile)
        sink = cells.Sink(on_summary=self._remember_summary)
        try:
            run = cells.execute(
                cluster,
                code,
                ranks,
                timeout=timeout,
                collate=collate,
                all_displays=all_displays,
                on_interrupt=policy.interrupting,
                sink=sink,
                grace=grace,
                on_hang=policy,
                hooks=hooks,
                known=self.dispatches_seen,
                label=f"<cell [{number}]>" if number is not None else "<cell>",
                on_wait=waits.check_for(cluster, ranks, sink, self._wait, code),
                wait_notice=waits.WAIT_NOTICE,
            )
        finally:
            self.broken = policy.broken or self.broken
            self._wait(None) if self.waiting else None
        if profile and run.hang_action is None:
            # Never raises: the cell's own results come next whatever happens to the trace.
            timeline.after_cell(cluster, ranks, profile)
        self._after_run(run)
        return cells.cell_result(run, sink)

    def _admit(self, cluster, ranks: list[int], code: str, force: bool) -> int | None:
        """Refuse a cell its processes cannot run, warn if they are out of step, remember
        what it defines where; returns the cell's number in the notebook."""
        guard.check_processes(cluster, ranks, self.still_running)
        if self.broken and not force:
            raise UsageError(hang.world_broken_message(self.broken))
        number = notebook_cell_number()
        label = guard.cell_label(number, code)
        if warning := self.ledger.record(ranks, cluster.ranks, code, label):
            print(warning, file=sys.stderr)
        self.partial_names.record(ranks, cluster.ranks, code, label)
        return number

    def _wait(self, said: str | None) -> None:
        """Show (or, with None, clear) a wait in the state the views read."""
        self.waiting = said
        for listener in list(self.state_listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a broken view must not fail the cell
                pass

    def _hooks(self, thread_guard: bool | None, check: bool | None, profile) -> dict:
        """The engine-side hooks a cell runs under: the session's defaults unless the
        cell's options say otherwise."""
        wanted = {
            "thread_guard": self.thread_guard if thread_guard is None else thread_guard,
            "divergence": self.divergence if check is None else check,
            "profile": bool(profile),
        }
        return {name: {} for name, on in wanted.items() if on}

    def _after_run(self, run: cells.CellRun) -> None:
        """Restart the world if the hang doctor chose to, remember who is still busy, and
        raise if any process failed."""
        if run.hang_action == "restart":
            took = self.restart()
            print(f"jaxsys: JAX world restarted in {took:.1f} s. {recovery.WORLD_LOST}")
        else:
            # Processes that outlived the cell (an interrupt that could not free them) would
            # run the next cell only after this one: remember them.
            self.still_running |= set(run.by_status("running"))
        # A death in the cell's numbering and the process's own words, not the client's.
        deaths.explain_run(self.cluster, run, notebook_cell_number())
        self.partial_names.explain_run(run)
        cells.raise_for_run(run)
