"""What a cluster does with its processes one by one: status, liveness, signals, kills and
stack dumps. A part of :class:`~jaxsys_kernel.cluster.Cluster`."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from ..telemetry.memory import local_rss
from .launchers import stack_file
from .records import ClusterError
from .teardown import pid_alive

__all__ = ["ProcessControl"]


class ProcessControl:
    """The per-process methods of :class:`~jaxsys_kernel.cluster.Cluster` (a mixin)."""

    def engine_ids(self, ranks: Sequence[int] | None = None) -> list[int]:
        """Engine ids serving the given ranks, in rank order.

        Parameters
        ----------
        ranks : sequence of int, optional
            Process indices; all when omitted.

        Returns
        -------
        list of int
        """
        self._require_ready()
        ranks = self.ranks if ranks is None else ranks
        return [self.processes[r].engine_id for r in ranks]

    def status(self) -> list[dict]:
        """Describe every process: rank, engine, pid, host, devices, state and memory.

        Returns
        -------
        list of dict
            One dict per process, in rank order; ``rss`` is its resident memory in bytes
            when it runs on this machine (else None).
        """
        self.refresh_states()
        return [{**p.to_dict(), "rss": local_rss(p.host, p.pid)} for p in self.processes]

    def job(self) -> dict | None:
        """The scheduler job the processes run in: ``job_id``, ``state`` (with the
        scheduler's reason) and ``nodes``; None for clusters outside any scheduler."""
        return self._launcher.job()

    def refresh_states(self) -> None:
        """Mark processes whose engine has gone away as ``dead``."""
        if self.client is None or self.state != "ready":
            return
        alive = set(self.client.ids)
        ready = [p for p in self.processes if p.state == "ready"]
        gone = {p.rank for p in self._launcher.processes_gone(ready)}
        for p in ready:
            if p.rank in gone:
                p.mark_dead(self._launcher.death_reason(p))
            elif p.engine_id not in alive:
                p.mark_dead(f"the hub dropped its engine {p.engine_id} (missed heartbeats)")

    def gone_now(self, ranks) -> dict[int, str]:
        """The processes of ``ranks`` known to be gone without asking the hub (a pid that
        is gone, a pod or a job that ended), each with why; the hub itself notices only
        after its missed heartbeats (seconds).

        Parameters
        ----------
        ranks : iterable of int

        Returns
        -------
        dict of int to str
        """
        ready = [self.processes[r] for r in ranks if self.processes[r].state == "ready"]
        return {
            p.rank: self._launcher.death_reason(p) for p in self._launcher.processes_gone(ready)
        }

    def kill_process(self, rank: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> float:
        """Send a signal to one process and, for SIGKILL, wait until it is gone.

        SIGINT and SIGTERM are sent and nothing more: SIGTERM is a preemption notice
        that JAX's notifier receives (see ``multihost_utils.reached_preemption_sync_point``),
        and the program decides whether and when its processes end; one that exits is
        found dead as any other.

        Parameters
        ----------
        rank : int
            The process.
        sig : int
            SIGKILL (default), SIGTERM or SIGINT.
        timeout : float
            Seconds to wait for the process to exit after SIGKILL.

        Returns
        -------
        float
            Seconds until the process was gone (until the signal was sent, for SIGINT
            and SIGTERM).
        """
        self._require_ready()
        self._check_rank(rank)
        t0 = time.perf_counter()
        p = self.processes[rank]
        if p.state == "dead":
            raise ClusterError(
                f"process {rank} is already dead" + (f": {p.died}" if p.died else "")
            )
        self.interrupt([rank], sig=sig)
        if sig in (signal.SIGINT, signal.SIGTERM):
            return time.perf_counter() - t0
        if self._launcher.engine_pids_here and p.pid:
            deadline = time.monotonic() + timeout
            while pid_alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if pid_alive(p.pid):
                raise ClusterError(
                    f"process {rank} (pid {p.pid}, {_described(p.pid)}) is still alive "
                    f"{timeout:g} s after {signal.Signals(sig).name}"
                )
        p.mark_dead(f"killed with {signal.Signals(sig).name}")
        return time.perf_counter() - t0

    def interrupt(self, ranks: Sequence[int] | None = None, sig: int = signal.SIGINT) -> list[int]:
        """Send a signal (SIGINT by default) to the given processes.

        Local engines are signalled directly; remote ones through ipyparallel's nanny.

        Parameters
        ----------
        ranks : sequence of int, optional
            Processes to signal; all when omitted.
        sig : int
            Signal number.

        Returns
        -------
        list of int
            The ranks that were signalled.
        """
        self._require_ready()
        ranks = self.ranks if ranks is None else list(ranks)
        return self._launcher.signal(self.processes, self.client, ranks, sig)

    def dump_stacks(self, ranks: Sequence[int], timeout: float = 2.0) -> dict[int, str]:
        """Ask processes for the Python stacks of all their threads, without stopping them.

        Local processes get SIGUSR1 and their dumps are read from their stack files; the
        dumps of processes on other hosts come back as telemetry.

        Parameters
        ----------
        ranks : sequence of int
            Processes to ask.
        timeout : float
            Seconds to wait for the dumps (at least 3 s for processes on other hosts).

        Returns
        -------
        dict
            The dump text by rank; ranks whose dump did not arrive in time are missing.
        """
        return self._launcher.dump_stacks(
            list(ranks), timeout, self.interrupt, self.stack_file, self.telemetry
        )

    def stack_file(self, rank: int) -> Path:
        """Where process ``rank`` (of the current incarnation) writes stack dumps."""
        return stack_file(self.world.profile, rank, self.world.incarnation)


def _described(pid: int) -> str:
    """A process's state and parent, for an error about it."""
    try:
        proc = psutil.Process(pid)
        return f"{proc.status()}, parent {proc.ppid()}"
    except psutil.Error as e:
        return type(e).__name__
