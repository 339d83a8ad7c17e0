"""The session's cluster lifecycle: start with the kernelspec's defaults, stop, restart
the world or one process, kill, certificates, and the notices printed after cells."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError

from ..cluster import Cluster, ClusterConfig
from ..cluster.audit import refusal_notice
from ..cluster.options import kernelspec_layer
from . import recovery, versions
from .actions_watch import refuse as refuse_watcher

#: Seconds a cell waits for a stop begun elsewhere (the sidebar's Stop) to end; a teardown
#: is bounded well within it (its kill and close waits are 3 s and 5 s).
STOP_SETTLE_S = 30.0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{seconds:.1f} s"


class Lifecycle:
    """Starting, stopping and restarting the session's cluster (a part of
    :class:`~jaxsys_kernel.magics.session.MultihostSession`)."""

    #: The cluster this kernel only watches (``%jaxsys watch``), or None: while it is set,
    #: starting, stopping and every cell on the processes are refused.
    watching = None

    def _settle(self) -> None:
        """Wait for a stop that another thread began (the sidebar's Stop) to end, so that
        what follows sees the cluster stopped, not processes being killed.

        Raises
        ------
        UsageError
            If the teardown has not ended within :data:`STOP_SETTLE_S`.
        """
        cluster = self.cluster
        if cluster is None or cluster.state != "stopping" or cluster.wait_stopped(1.0):
            return
        print("jaxsys: waiting for the cluster's stop to end ...", file=sys.stderr)
        if not cluster.wait_stopped(STOP_SETTLE_S):
            raise UsageError(
                f"the cluster is still stopping after {STOP_SETTLE_S:g} s; %jaxsys status "
                "shows what is left, %jaxsys stop tries again"
            )

    def defaults(self) -> dict:
        """The layer under the ``%jaxsys start`` line: the options the kernelspec's
        ``JAXSYS_*`` variables set (read by :func:`~jaxsys_kernel.cluster.options.
        kernelspec_layer`, as ``jaxsys cluster start`` and ``jaxsys job`` read them). What
        no layer sets is :class:`ClusterConfig`'s declared default.

        Raises
        ------
        ConfigError
            Naming the variable that holds no whole number of at least 1.
        """
        return kernelspec_layer(os.environ)

    def start(
        self,
        hosts: int | Sequence[str] | None = None,
        devices_per_host: int | None = None,
        launcher: str | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> Cluster:
        """Start a cluster, filling unset options from the environment.

        Raises
        ------
        UsageError
            If a cluster is already running or an option is invalid.
        """
        refuse_watcher(self, "%jaxsys start")
        self._settle()
        if self.cluster is not None and self.cluster.state != "stopped":
            raise UsageError(
                f"a cluster of {self.cluster.nprocs} processes is already running; "
                "use %jaxsys restart, or %jaxsys stop first"
            )
        # The kernelspec's options, under the line's, under an override of `jaxsys run`.
        line = dict(hosts=hosts, devices_per_host=devices_per_host, launcher=launcher, **kwargs)
        cluster = Cluster(**ClusterConfig.layered(self.defaults(), dict(line, cache_dir=cache_dir)))
        self.cluster = cluster
        self._forget_summaries()
        self.broken = None
        self.still_running = set()
        self._refusals_told = {}
        cluster.start_sync()
        print(
            f"jaxsys: {cluster.nprocs} processes x {cluster.devices_per_host} devices ready in "
            f"{cluster.ready_seconds:.1f} s (coordinator {cluster.coordinator_address})\n"
            f"security: {cluster.security}",
        )
        # A process on another jax, jaxlib or numpy than the kernel's environment is named.
        versions.warn_differences(cluster)
        return cluster

    def ensure_cluster(self) -> Cluster:
        """Return the running cluster, starting one with the defaults if there is none."""
        refuse_watcher(self, "%%multihost")
        self._settle()
        if self.cluster is None or self.cluster.state == "stopped":
            return self.start()
        return self.cluster

    def require_cluster(self) -> Cluster:
        """Return the running cluster or raise a UsageError that says how to start one."""
        refuse_watcher(self, "this command")
        self._settle()
        if self.cluster is None or self.cluster.state == "stopped":
            raise UsageError("no cluster is running; start one with %jaxsys start")
        return self.cluster

    def stop(self) -> float | None:
        """Stop the cluster, if any. Returns the seconds it took."""
        refuse_watcher(self, "%jaxsys stop")
        self._settle()
        if self.cluster is None or self.cluster.state == "stopped":
            return None
        return self.cluster.kill()

    def restart(self) -> float:
        """Restart the whole JAX world. Returns the seconds until it was ready again.

        A restart that fails stops the cluster; the user is told how to go on.
        """
        cluster = self.require_cluster()
        # The old world's devices go with it, whether or not the new one comes up.
        self._forget_summaries()
        try:
            took = cluster.restart_sync()
        except BaseException:
            if cluster.state == "stopped":
                print(
                    "jaxsys: the restart failed and the cluster was stopped; "
                    "start a new one with %jaxsys start",
                    file=sys.stderr,
                )
            raise
        self.broken = None
        self.still_running = set()
        self.ledger.reset()
        self.partial_names.reset()
        return took

    def kill_process(self, rank: int, signal_name: str = "KILL") -> float:
        """Send SIGKILL/SIGTERM/SIGINT to one process; returns the seconds it took."""
        cluster = self.require_cluster()
        return cluster.kill_process(rank, getattr(signal, f"SIG{signal_name}"))

    def kill_message(self, rank: int, signal_name: str, took: float) -> str:
        """What a kill did, and what the survivors will see."""
        cluster = self.require_cluster()
        if signal_name == "INT":
            return f"jaxsys: sent SIGINT to process {rank}"
        if signal_name == "TERM":
            return (
                f"jaxsys: sent SIGTERM to process {rank}: a preemption notice. The program's "
                "own preemption handling decides what follows (JAX's preemption sync point, "
                "which Orbax also honours, has every process save the same step); if the "
                "process exits, %jaxsys status shows it dead once it has."
            )
        head = f"jaxsys: process {rank} killed with SIG{signal_name}; gone after {took:.2f} s."
        return f"{head} {recovery.kill_guidance(cluster, rank)}"

    def restart_process(self, rank: int) -> float:
        """Replace one process, which rejoins the running JAX world."""
        cluster = self.require_cluster()
        took = cluster.restart_process_sync(rank)
        self.still_running.discard(rank)
        return took

    def rotate_certs(self) -> list[int]:
        """Issue new certificates to every process; returns their serial numbers."""
        return self.require_cluster().rotate_certs()

    def refusals(self) -> list:
        """The running cluster's refused handshakes (empty without a cluster or mTLS)."""
        return [] if self.cluster is None else self.cluster.refusal_records()

    def report_refusals(self, *_args) -> None:
        """Tell the user, after a cell, who the coordination service refused meanwhile.

        Registered as a ``post_run_cell`` hook; prints nothing when nothing is new. A
        telemetry receiver found stopped is started again here, and said so.
        """
        try:
            lines = refusal_notice(self._refusals_told, self.refusals())
            hub = self.cluster.telemetry if self.cluster is not None else None
            notice = hub.check() if hub is not None else None
            if notice:
                lines.append(notice)
        except Exception:  # noqa: BLE001 - a report must never fail the user's cell
            return
        for line in lines:
            print(line, file=sys.stderr)

    def report_rotation(self, *_args) -> None:
        """Tell the user, after a cell, once the rotated certificates are in use.

        Registered as a ``post_run_cell`` hook; prints once per rotation.
        """
        cluster = self.cluster
        rotation = cluster.rotation() if cluster is not None else None
        if rotation is None or rotation["rotated_at"] == self._rotation_told:
            return
        if rotation["in_use_at"] is not None:
            took = rotation["in_use_at"] - rotation["rotated_at"]
            print(
                f"jaxsys: the coordination service now presents the rotated certificate "
                f"(serial {rotation['serial']:#x}), {_duration(took)} after rotate-certs.",
            )
        elif rotation["gave_up"]:
            print(
                "jaxsys: 20 minutes after rotate-certs the coordination service still presents "
                "the old certificate; %jaxsys restart makes every process load the new ones.",
                file=sys.stderr,
            )
        else:
            return
        self._rotation_told = rotation["rotated_at"]

    def rotation_line(self) -> str | None:
        """One line on the latest rotation for ``%jaxsys status``, or None if there was none."""
        rotation = self.cluster.rotation() if self.cluster is not None else None
        if rotation is None:
            return None
        stamp = time.strftime("%H:%M:%S", time.localtime(rotation["rotated_at"]))
        if rotation["in_use_at"] is not None:
            since = time.strftime("%H:%M:%S", time.localtime(rotation["in_use_at"]))
            return f"certificates: rotated at {stamp}; presented by the coordination service since {since}"
        if rotation["gave_up"]:
            return f"certificates: rotated at {stamp}; never presented (%jaxsys restart loads them)"
        return (
            f"certificates: rotated at {stamp}; the coordination service still presents the old "
            "one (JAX re-reads the files about every 10 minutes)"
        )

    def shutdown(self) -> None:
        """Kill everything at once; used when the kernel shuts down."""
        if self.cluster is not None:
            self.cluster.kill()

    def status_rows(self) -> list[dict]:
        """One row per process: process, engine, pid, host, devices, state."""
        return self.require_cluster().status()
