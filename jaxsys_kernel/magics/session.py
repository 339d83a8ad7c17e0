"""The kernel-side state behind the magics: one cluster, SPMD mode, and typed operations.

Every magic is a thin parser over a method here, so tests can call the methods directly.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError

from .. import _compat, cells, contract
from .._ranges import format_procs, parse_procs
from ..cells import guard, hang
from ..cells.spmd import LOCAL_PREFIXES, is_local_cell, make_spmd_transformer

# The SPMD routing lives with the cell path; its names stay importable from here.
__all__ = ["LOCAL_PREFIXES", "MultihostSession", "is_local_cell", "make_spmd_transformer"]
from ..cluster import Cluster
from . import actions_guard


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{seconds:.1f} s"


def _short_notice(line: str) -> str:
    """A refusal notice without the prefix and the pointer, for the dashboard's log."""
    return line.removeprefix("jaxsys: the coordination service ").split(". The cluster")[0]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"${name}={raw!r} is not a whole number; set it to e.g. 4") from None
    if value < 1:
        raise UsageError(f"${name}={raw!r} must be at least 1")
    return value


class MultihostSession:
    """State of one jaxsys kernel: its cluster, its SPMD mode and its defaults.

    Parameters
    ----------
    shell : IPython.core.interactiveshell.InteractiveShell, optional
        The shell whose namespace receives pulled values.
    """

    # Whether cells run under jax.thread_guard unless told otherwise (%jaxsys start --thread-guard).
    thread_guard = False

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
        self.last_summaries: dict[str, dict] = {}
        self.dashboard = None
        self._unsubscribe = None
        # Set by the kernel: returns a subshell id for widget controls (None without one).
        self.control_subshell = lambda: None
        # Refused handshakes already told to the user, by (address, error).
        self._refusals_told: dict[tuple[str, str], int] = {}
        # The rotation (its rotated_at) whose outcome was already told.
        self._rotation_told: float | None = None

    # -- cluster lifecycle ------------------------------------------------------------------

    def defaults(self) -> dict:
        """Cluster options from the environment (set in the kernelspec)."""
        return {
            "hosts": _env_int(contract.HOSTS, 4),
            "devices_per_host": _env_int(contract.DEVICES_PER_HOST, 2),
            "launcher": os.environ.get(contract.LAUNCHER, "local"),
        }

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
        if self.cluster is not None and self.cluster.state != "stopped":
            raise UsageError(
                f"a cluster of {self.cluster.nprocs} processes is already running; "
                "use %jaxsys restart, or %jaxsys stop first"
            )
        d = self.defaults()
        try:
            cluster = Cluster(
                hosts=d["hosts"] if hosts is None else hosts,
                devices_per_host=d["devices_per_host"]
                if devices_per_host is None
                else devices_per_host,
                launcher=d["launcher"] if launcher is None else launcher,
                cache_dir=cache_dir,
                **kwargs,
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.cluster = cluster
        self.broken = None
        self.still_running = set()
        self._refusals_told = {}
        cluster.start_sync()
        print(
            f"jaxsys: {cluster.nprocs} processes x {cluster.devices_per_host} devices ready in "
            f"{cluster.ready_seconds:.1f} s (coordinator {cluster.coordinator_address})\n"
            f"security: {cluster.security}",
            file=sys.stderr,
        )
        return cluster

    def ensure_cluster(self) -> Cluster:
        """Return the running cluster, starting one with the defaults if there is none."""
        if self.cluster is None or self.cluster.state == "stopped":
            return self.start()
        return self.cluster

    def require_cluster(self) -> Cluster:
        """Return the running cluster or raise a UsageError that says how to start one."""
        if self.cluster is None or self.cluster.state == "stopped":
            raise UsageError("no cluster is running; start one with %jaxsys start")
        return self.cluster

    def stop(self) -> float | None:
        """Stop the cluster, if any. Returns the seconds it took."""
        if self.cluster is None or self.cluster.state == "stopped":
            return None
        return self.cluster.kill()

    def restart(self) -> float:
        """Restart the whole JAX world. Returns the seconds until it was ready again.

        A restart that fails stops the cluster; the user is told how to go on.
        """
        cluster = self.require_cluster()
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
        return took

    def kill_process(self, rank: int, signal_name: str = "KILL") -> float:
        """Send SIGKILL/SIGTERM/SIGINT to one process; returns the seconds it took."""
        import signal

        from ..cluster import ClusterError

        cluster = self.require_cluster()
        try:
            return cluster.kill_process(rank, getattr(signal, f"SIG{signal_name}"))
        except ClusterError as e:
            raise UsageError(str(e)) from None

    def kill_message(self, rank: int, signal_name: str, took: float) -> str:
        """What a kill did, and what the survivors will see."""
        cluster = self.require_cluster()
        if signal_name == "INT":
            return f"jaxsys: sent SIGINT to process {rank}"
        head = f"jaxsys: process {rank} killed with SIG{signal_name}; gone after {took:.2f} s."
        if cluster.recoverable:
            return (
                f"{head} The others keep running: JAX declares it dead after "
                f"{cluster.heartbeat_timeout:g} s without heartbeats, and live_devices then "
                f"leaves out its devices. %jaxsys restart {rank} brings it back."
            )
        return f"{head} Without recoverability the others will stop too: %jaxsys restart."

    def restart_process(self, rank: int) -> float:
        """Replace one process, which rejoins the running JAX world."""
        from ..cluster import ClusterError

        cluster = self.require_cluster()
        try:
            took = cluster.restart_process_sync(rank)
        except ClusterError as e:
            raise UsageError(str(e)) from None
        self.still_running.discard(rank)
        return took

    def show_dashboard(self, max_rate: float = 10.0):
        """A live dashboard: mesh, sharding, cache hits and liveness of every process.

        The mesh and sharding panes show the last ones displayed in a ``%%multihost`` cell;
        cache and liveness update from telemetry while cells run, at most ``max_rate``
        times a second. A new dashboard takes over the live updates from the previous one.
        """
        from ..cluster.audit import refusal_notice
        from ..widgets import Dashboard

        cluster = self.require_cluster()
        hub = cluster.telemetry
        if hub is None:
            raise UsageError("this cluster runs without telemetry; start one with telemetry on")
        if self._unsubscribe is not None:
            self._unsubscribe()
        dash = Dashboard(
            mesh=self.last_summaries.get("mesh"), sharding=self.last_summaries.get("sharding")
        )
        previous: dict[int, str] = {}
        # Refusals from before the dashboard are in %jaxsys security; the log shows new ones.
        told = {(r.host, r.error): r.attempts for r in hub.refusals()}
        transfers_told: dict[int, dict] = {}

        def refresh(h) -> None:
            cluster.refresh_states()
            lives = h.liveness({p.rank: p.state for p in cluster.processes})
            changes = []
            for live in lives:
                if previous.get(live.rank) != live.state:
                    before = previous.get(live.rank, "-")
                    changes.append(
                        f"{time.strftime('%H:%M:%S')} p{live.rank}: {before} -> {live.state}"
                    )
                    previous[live.rank] = live.state
            for line in refusal_notice(told, h.refusals()):
                changes.append(f"{time.strftime('%H:%M:%S')} {_short_notice(line)}")
            changes += actions_guard.transfer_notice(transfers_told, h.transfer_counts())
            health = h.health().line()
            with dash.live.hold_sync():
                if dash.live.telemetry_health != health:
                    dash.live.telemetry_health = health
                dash.update(
                    cache=[c.to_dict() for c in h.cache_stats()],
                    live=[live.to_dict() for live in lives],
                    append=changes,
                )

        refresh(hub)
        self._attach_controls(dash.live)
        self.dashboard = dash
        self._unsubscribe = hub.subscribe(refresh, max_rate=max_rate)
        return dash

    def _attach_controls(self, view) -> None:
        """Serve the view's buttons on a subshell, so they work while a cell blocks."""
        subshell = self.control_subshell()
        if subshell is None:
            return
        view.on_control(lambda action, rank: self.control(view, action, rank))
        # Pinning the comm keeps the clicks on the subshell even though updates are
        # published from other threads.
        _compat.route_comm_to_subshell(view.comm, subshell)

    def control(self, view, action: str, rank: int | None) -> None:
        """Carry out a control button's action (runs on the control subshell)."""
        import signal

        from ..cells import report

        cluster = self.cluster
        stamp = time.strftime("%H:%M:%S")

        def say(text: str) -> None:
            view.control_status = text
            view.update(append=[f"{stamp} {text}"])

        try:
            if cluster is None or cluster.state != "ready":
                say("no cluster is running")
            elif action == "stop":
                # The cell waits in the main thread: interrupt it as the stop button would.
                os.kill(os.getpid(), signal.SIGINT)
                say("stop: interrupting the running cell")
            elif action == "stacks":
                ranks = cluster.ranks if rank is None else [int(rank)]
                stacks = cluster.dump_stacks(ranks)
                for r in ranks:
                    view.update(append=[f"{stamp} p{r} {report.innermost(stacks.get(r, ''))}"])
                say(f"stacks of {format_procs(ranks)}: innermost frames in the log")
            elif action == "kill" and rank is not None:
                took = cluster.kill_process(int(rank))
                say(f"p{rank} killed (gone after {took:.2f} s)")
            elif action == "restart" and rank is not None:
                say(f"p{rank} restarting...")
                took = cluster.restart_process_sync(int(rank))
                say(f"p{rank} rejoined in {took:.1f} s")
            elif action == "restart-world":
                say("restarting the JAX world...")
                took = self.restart()
                say(f"JAX world restarted in {took:.1f} s")
            else:
                say(f"unknown control {action!r}")
        except Exception as e:  # noqa: BLE001 - a control reports its failure in the view
            say(f"{action} failed: {e}")

    def rotate_certs(self) -> list[int]:
        """Issue new certificates to every process; returns their serial numbers."""
        from ..cluster import ClusterError
        from ..cluster.pki import PKIError

        cluster = self.require_cluster()
        try:
            return cluster.rotate_certs()
        except (ClusterError, PKIError) as e:
            raise UsageError(str(e)) from None

    def refusals(self) -> list:
        """The running cluster's refused handshakes (empty without a cluster or mTLS)."""
        return [] if self.cluster is None else self.cluster.refusal_records()

    def report_refusals(self, *_args) -> None:
        """Tell the user, after a cell, who the coordination service refused meanwhile.

        Registered as a ``post_run_cell`` hook; prints nothing when nothing is new. A
        telemetry receiver found stopped is started again here, and said so.
        """
        from ..cluster.audit import refusal_notice

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
                file=sys.stderr,
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
        guard.check_processes(cluster, ranks, self.still_running)
        if self.broken and not force:
            raise UsageError(hang.world_broken_message(self.broken))
        warning = self.ledger.record(ranks, cluster.ranks, code)
        if warning:
            print(warning, file=sys.stderr)
        policy = hang.HangPolicy(
            on_hang, cluster.dump_stacks, timeout=timeout, grace=grace, code=code
        )
        if self.thread_guard if thread_guard is None else thread_guard:
            actions_guard.arm_thread_guard(cluster, ranks)
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
            )
        finally:
            self.broken = policy.broken or self.broken
        if run.hang_action == "restart":
            took = self.restart()
            print(f"jaxsys: JAX world restarted in {took:.1f} s", file=sys.stderr)
        else:
            # Processes that outlived the cell (an interrupt that could not free them) would
            # run the next cell only after this one: remember them.
            self.still_running |= set(run.by_status("running"))
        cells.raise_for_run(run)
        return cells.cell_result(run, sink)

    def _remember_summary(self, summary: dict) -> None:
        self.last_summaries[summary.get("kind", "")] = summary
        if self.dashboard is not None:
            if summary.get("kind") == "mesh":
                self.dashboard.update(mesh=summary)
            elif summary.get("kind") == "sharding":
                self.dashboard.update(sharding=summary)

    # -- values -----------------------------------------------------------------------------

    def pull(self, name: str, proc: int = 0) -> Any:
        """Bring the value named ``name`` from process ``proc`` into the kernel.

        A jax.Array that spans processes arrives as the full global numpy array; gathering
        it is a collective, so every process takes part.
        """
        import ipyparallel as ipp

        from ..engine import probes

        cluster = self.require_cluster()
        if not name.isidentifier():
            raise UsageError(f"%pull takes a variable name, got {name!r}")
        if not 0 <= proc < cluster.nprocs:
            raise UsageError(
                f"--proc {proc} is outside this cluster's processes 0-{cluster.nprocs - 1}"
            )
        ref = ipp.Reference(name)
        client = cluster.client
        try:
            kind = client[cluster.processes[proc].engine_id].apply_sync(probes.describe_value, ref)
        except ipp.RemoteError as e:
            if e.ename == "NameError":
                raise UsageError(f"{name!r} is not defined on process {proc}") from None
            raise
        if kind["kind"] == "global":
            kinds = cluster.view.apply_sync(probes.describe_value, ref)
            differing = [r for r, k in enumerate(kinds) if k != kind]
            if differing:
                raise UsageError(
                    f"{name!r} differs between processes (see {format_procs(differing)}); every "
                    "process must hold the same global array to gather it"
                )
            values = cluster.view.apply_sync(probes.fetch_value, ref, proc)
            value = values[proc]
        else:
            try:
                value = client[cluster.processes[proc].engine_id].apply_sync(
                    probes.fetch_value, ref, proc
                )
            except ipp.RemoteError as e:
                if e.ename == "TypeError":
                    raise UsageError(f"cannot pull {name!r}: {e.evalue}") from None
                raise
        return value

    # -- completion and inspection from process 0 ----------------------------------------------

    def remote_code(self, code: str, cursor_pos: int) -> tuple[str, int] | None:
        """If ``code`` runs on the engines, return it (and the cursor) as the engines see it."""
        if self.cluster is None or self.cluster.state != "ready":
            return None
        first, nl, rest = code.partition("\n")
        if first.lstrip().startswith("%%multihost"):
            offset = len(first) + len(nl)
            if cursor_pos < offset:
                return None
            return rest, cursor_pos - offset
        if self.spmd and not is_local_cell(code):
            return code, cursor_pos
        return None

    def remote_complete(self, code: str, cursor_pos: int) -> dict | None:
        """Completion reply from process 0, or None when the kernel should answer."""
        from ..engine import probes

        target = self.remote_code(code, cursor_pos)
        if target is None:
            return None
        body, pos = target
        offset = len(code) - len(body)
        try:
            reply = self._apply0(probes.complete, body, pos)
        except Exception:  # noqa: BLE001 - fall back to local completion, never fail a keypress
            return None
        reply["cursor_start"] = reply.get("cursor_start", pos) + offset
        reply["cursor_end"] = reply.get("cursor_end", pos) + offset
        for comp in reply.get("metadata", {}).get("_jupyter_types_experimental", []):
            comp["start"] += offset
            comp["end"] += offset
        return reply

    def remote_inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> dict | None:
        """Inspection reply from process 0, or None when the kernel should answer."""
        from ..engine import probes

        target = self.remote_code(code, cursor_pos)
        if target is None:
            return None
        body, pos = target
        try:
            return self._apply0(probes.inspect, body, pos, detail_level)
        except Exception:  # noqa: BLE001 - fall back to local inspection
            return None

    def _apply0(self, fn, *args, timeout: float = 5.0):
        cluster = self.cluster
        ar = cluster.client[cluster.processes[0].engine_id].apply_async(fn, *args)
        return ar.get(timeout=timeout)
