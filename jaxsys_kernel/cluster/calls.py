"""Running a function on chosen processes: the one way the kernel side asks engines for
anything outside a cell.

:meth:`Cluster.call` sends ``fn(*args)`` to every chosen process at once and gathers the
answers within one deadline; :meth:`Cluster.submit` is its non-blocking half, for callers
that watch the requests while they run (the barrier streams what each process prints).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .records import ClusterError

__all__ = ["Calls", "EngineCalls", "ProcessNotRunning"]


class ProcessNotRunning(ClusterError):
    """A request was aimed at a process that is not running; the message says its state."""


@dataclass
class Calls:
    """What each process answered to one :meth:`~EngineCalls.call`.

    Attributes
    ----------
    results : dict
        The return value by rank, for the processes that answered.
    errors : dict
        The exception by rank, for the processes that raised (ipyparallel's
        ``RemoteError``, with ``ename`` and ``evalue``).
    missing : list of int
        Processes that did not answer within the timeout (their requests stay queued).
    timeout : float
        The seconds they were given.
    """

    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    timeout: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every process answered without raising."""
        return not self.errors and not self.missing

    def values(self) -> dict[int, Any]:
        """The results by rank, once every process answered.

        Raises
        ------
        ClusterError
            Naming the first process that did not answer in time.
        Exception
            The first process's own error (in rank order), if one raised.
        """
        if self.missing:
            raise ClusterError(
                f"process {self.missing[0]} did not answer within {self.timeout:g} s (it may "
                "still be busy with an earlier cell)"
            )
        self.raise_first()
        return self.results

    def raise_first(self) -> None:
        """Re-raise the error of the first process (in rank order) that raised, if any."""
        if self.errors:
            raise self.errors[min(self.errors)]


def _ipp_timeout(exc: BaseException) -> bool:
    # ipyparallel raises its own TimeoutError subclass from AsyncResult.get.
    return isinstance(exc, TimeoutError)


class EngineCalls:
    """The mixin that gives :class:`~jaxsys_kernel.cluster.Cluster` ``call`` and ``submit``."""

    def submit(self, ranks: Sequence[int], fn: Callable, *args: Any, **kwargs: Any) -> dict:
        """Send ``fn(*args, **kwargs)`` to the processes ``ranks`` without waiting.

        Parameters
        ----------
        ranks : sequence of int
            The processes; each must be running.
        fn : callable
            A picklable function (engine-side functions live in ``jaxsys_kernel.engine``).

        Returns
        -------
        dict
            ipyparallel's ``AsyncResult`` by rank.

        Raises
        ------
        ProcessNotRunning
            If a chosen process is not running; nothing is sent then.
        """
        self._require_ready()
        engines = {}
        for r in ranks:
            self._check_rank(r)
            info = self.processes[r]
            if info.state != "ready" or info.engine_id is None:
                raise ProcessNotRunning(
                    f"process {r} is {info.state}; %jaxsys restart brings it back"
                )
            engines[r] = info.engine_id
        return {r: self.client[e].apply_async(fn, *args, **kwargs) for r, e in engines.items()}

    def call(
        self, ranks: Sequence[int] | None, fn: Callable, *args: Any, timeout: float = 10.0, **kwargs
    ) -> Calls:
        """Run ``fn(*args, **kwargs)`` on the processes ``ranks`` and gather their answers.

        Every request leaves at once; all share one deadline of ``timeout`` seconds.

        Parameters
        ----------
        ranks : sequence of int or None
            The processes; all when None.
        fn : callable
            A picklable function.
        timeout : float
            Seconds for all the answers together.

        Returns
        -------
        Calls
            Results, errors and the processes that did not answer, by rank.

        Raises
        ------
        ProcessNotRunning
            If a chosen process is not running; nothing is sent then.

        Examples
        --------
        >>> cluster.call([0, 1], os.getpid).results            # doctest: +SKIP
        {0: 4121, 1: 4122}
        """
        ranks = self.ranks if ranks is None else list(ranks)
        pending = self.submit(ranks, fn, *args, **kwargs)
        out = Calls(timeout=timeout)
        deadline = time.monotonic() + timeout
        for r, reply in pending.items():
            try:
                out.results[r] = reply.get(timeout=max(0.01, deadline - time.monotonic()))
            except Exception as e:  # noqa: BLE001 - each process's failure is reported by rank
                if _ipp_timeout(e):
                    out.missing.append(r)
                else:
                    out.errors[r] = e
        return out
