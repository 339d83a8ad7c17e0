"""The launcher base class: what every kind of launcher does, and what it may change.

Each launcher owns the engine environment, launching (with ipyparallel's launchers),
signalling, killing, where stack dumps come from, whether engine pids are pids of this
machine, where the coordinator runs, and whether a single process can be restarted.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import contract
from ..._ranges import format_procs
from .. import controller_ports, stacks
from ..allocation import Allocation
from ..security import handshake_trace_env
from ..teardown import (
    engine_start_times,
    killpg_all,
    launcher_pids,
    pid_alive,
    sub_launchers,
    wait_gone,
)
from .kind import LauncherKind

if TYPE_CHECKING:
    from ..records import ProcessInfo

log = logging.getLogger("jaxsys.cluster")

# The hub completes an engine's registration only after seeing its heart for about two
# periods: ipyparallel's default 3 s period makes start-up take 6 s. At 250 ms, with 20
# misses allowed, an engine is still only declared dead after 5 s without a heartbeat.
HEARTBEAT_PERIOD_MS = 250
HEARTBEAT_MISSES = 20
# Levels of the controller's broadcast scheduler tree below its root (ipyparallel's
# default is 1: a root and two leaves, three processes). Every broadcast request and reply
# passes through each level's Python process; a root that reaches the engines itself is
# quicker (one hop each way) and costs two processes fewer per cluster.
BROADCAST_DEPTH = 0
# Seconds a kill of engines waits for the local ones to be gone.
ENGINE_KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class EngineContext:
    """What the running cluster adds to the engines it launches.

    Attributes
    ----------
    incarnation : int
        Which world this is (1 at start, +1 at every world restart).
    coordinator : str or None
        The coordinator's address, when it is known before launch.
    profile : Path or None
        The cluster's profile directory.
    pki : ClusterPKI or None
        Certificates (mTLS), whose file names go into each engine's environment.
    telemetry : TelemetryHub or None
        Where the engines' agents report.
    """

    incarnation: int = 0
    coordinator: str | None = None
    profile: Path | None = None
    pki: Any = None
    telemetry: Any = None


def stack_file(profile: Path, rank: int, incarnation: int) -> Path:
    """Where process ``rank`` of one incarnation writes its stack dumps."""
    return profile / "log" / contract.stack_file_name(rank, incarnation)


def native_log_file(profile: Path, rank: int, incarnation: int) -> Path:
    """Where process ``rank`` of one incarnation keeps the native output kept out of cells."""
    return profile / "log" / contract.native_log_name(rank, incarnation)


def _xla_flags(devices: int) -> str:
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


def host_part(host: str) -> str:
    """``user@node7:2222`` -> ``node7``: what goes into a certificate."""
    return host.rpartition("@")[2].split(":")[0]


def listen_addresses(loopback_only: bool, controller_ip: str | None) -> tuple[str, str]:
    """Where a kernel-side socket listens, and the address engines connect to.

    Like ipyparallel's controller: loopback for local clusters, the given address when
    there is one, else every interface, with this machine's host name for the engines
    (``0.0.0.0`` would mean their own host to them).

    Returns
    -------
    tuple of str
        ``(bind, advertise)``.
    """
    if controller_ip and controller_ip != "*":
        return controller_ip, controller_ip
    if loopback_only and not controller_ip:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.gethostname()


class Launcher(LauncherKind):
    """How the engines of one cluster are started, signalled and killed.

    Subclasses set the class attributes of :class:`~.kind.LauncherKind` (what a launcher
    declares: its options and their flags, rank variables, allocation) and override what
    differs here. An instance is made once per cluster (:func:`make_launcher`) and keeps,
    for the cluster's lifetime, its ipyparallel ``Cluster`` (``ipp``) and which engine set
    serves each rank.

    Parameters
    ----------
    config : ClusterConfig
    """

    def __init__(self, config):
        self.config = config
        self.ipp = None
        self.engine_sets: dict[int, str] = {}
        # Ports held for a process that has yet to bind them (see engine/ports.py).
        self._held_ports: list[socket.socket] = []
        # The controller's, held for as long as it runs (see cluster/controller_ports.py).
        self._controller_ports: list[socket.socket] = []
        # The hosts the engines are started on (a scheduler's launcher gets its job later).
        self.allocation = self.make_allocation()

    def make_allocation(self) -> Allocation | None:
        """What the engines run on, held before they start: the hosts the cluster names, or
        this machine. A scheduler's launcher returns None and submits its job at launch."""
        names = [host_part(h) for h in self.config.host_names or ()]
        return Allocation(names or None, label="the named hosts" if names else None)

    # -- the controller ------------------------------------------------------------------

    def make_ipp_cluster(self, profile: Path, secure: bool):
        """The ipyparallel ``Cluster`` that runs the controller and launches engines."""
        # Deferred: importing ipyparallel takes most of a second, paid only once a cluster
        # starts, not when the kernel does.
        import ipyparallel as ipp

        controller_args = [
            f"--HeartMonitor.period={HEARTBEAT_PERIOD_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
            f"--IPController.broadcast_scheduler_depth={BROADCAST_DEPTH}",
            # No task records in the hub: jaxsys never asks the hub for a past result, and
            # the default in-memory store parses and keeps every request, reply and output
            # of every process (about 1.5 ms of the controller's CPU per process per cell).
            "--IPController.db_class=NoDB",
        ]
        if secure:
            # Engines and the client pick up the server key from the connection files.
            controller_args.append("--IPController.enable_curve=True")
        # A new controller's own: those of an earlier one (a restart) are let go.
        self.release_controller_ports()
        self._controller_ports = controller_ports.hold(controller_ports.count(BROADCAST_DEPTH))
        if self._controller_ports:
            controller_args.append(controller_ports.option(self._controller_ports))
        self.ipp = ipp.Cluster(
            profile_dir=str(profile),
            n=self.config.nprocs,
            # ipyparallel logs every killed process as a warning; our errors say more.
            log_level=logging.ERROR,
            controller_args=controller_args,
            shutdown_atexit=False,
            # Engines read the controller's connection file themselves, so they can be
            # launched before the controller has written it.
            send_engines_connection_env=False,
            **self._controller_kwargs(),
        )
        self.engine_sets = {}
        return self.ipp

    def _controller_kwargs(self) -> dict[str, Any]:
        # Remote engines must reach the controller; see docs/architecture.md.
        return {
            "controller_ip": self.config.controller_ip or "*",
            "engine_launcher_class": self.ipp_launcher or self.name,
        }

    def telemetry_addresses(self) -> tuple[str, str]:
        """Where the kernel's telemetry socket listens, and the address engines connect to
        (see :func:`listen_addresses`)."""
        return listen_addresses(self.loopback_only, self.config.controller_ip)

    # -- the coordinator and certificates ---------------------------------------------------

    def certificate_hosts(self) -> list[str] | None:
        """Each process's host, for its certificate (None when unknown in advance)."""
        return [host_part(h) for h in self.config.host_names or ()] or None

    def early_coordinator(self) -> str | None:
        """The coordinator's address, if it can be chosen before launch (engines then join
        while they register); None when process 0's host is only known afterwards."""
        return None

    def release(self) -> None:
        """At teardown: give back what the cluster held (ports; a scheduler's job)."""
        self.release_ports()
        self.release_controller_ports()

    def job(self) -> dict[str, Any] | None:
        """The allocation the engines run on: its ``job_id`` (None outside a scheduler),
        ``state``, ``nodes`` and how it is named (``allocation``); None before there is one."""
        alloc = self.allocation
        if alloc is None:
            return None
        status = alloc.poll()
        return {
            "job_id": alloc.job_id,
            "state": status.describe(),
            "nodes": status.hosts,
            "allocation": alloc.describe_job(),
        }

    def keep_allocation(self):
        """Keep what the engines run on past the next teardown (a scheduler's job, which
        ``%jaxsys attach`` can then reuse) and return its Allocation; None when nothing
        here outlives the cluster."""
        return None

    def release_ports(self) -> None:
        """Close the sockets holding ports for processes (the processes keep theirs)."""
        held, self._held_ports = self._held_ports, []
        for s in held:
            s.close()

    def release_controller_ports(self) -> None:
        """Close the sockets holding the controller's ports (at teardown)."""
        held, self._controller_ports = self._controller_ports, []
        controller_ports.release(held)

    def coordinator_host(self, p0_address: str) -> str:
        """The host the other processes reach process 0's coordination service at."""
        return p0_address

    # -- the engines' environment -------------------------------------------------------------

    def engine_env(self, rank: int, ctx: EngineContext) -> dict[str, str]:
        """Every environment variable the engine of ``rank`` is started with."""
        cfg = self.config
        engine = contract.EngineEnv(
            process_id=rank,
            num_processes=cfg.nprocs,
            coordinator=ctx.coordinator,
            init_timeout=float(cfg.init_timeout),
            heartbeat_timeout=(
                None if cfg.heartbeat_timeout is None else float(cfg.heartbeat_timeout)
            ),
            early_init=True,
            incarnation=ctx.incarnation,
            **self._engine_fields(rank, ctx),
        )
        env = {"PYTHONUNBUFFERED": "1", **engine.to_env(), **self.import_env()}
        if ctx.pki is not None:
            env.update(ctx.pki.env(rank))
        if ctx.telemetry is not None:
            env.update(ctx.telemetry.env())
        env.update(cfg.env)
        env.update(cfg.process_env.get(rank, {}))
        if ctx.pki is not None and rank == 0:
            # Process 0 serves the coordination service; see engine/native_log.py.
            env.update(handshake_trace_env(cfg.user_env(0)))
        return env

    def one_job_env(self, ctx: EngineContext) -> dict[str, str]:
        """The environment of every rank started in one job (MPI, Slurm), where each
        process learns its rank from the launcher's :attr:`rank_variables` (named in the
        environment), and from its rank which certificate and key are its own."""
        env = self.engine_env(0, ctx)
        env.pop(contract.PROCESS_ID)
        env[contract.RANK_VARIABLE_NAMES] = ",".join(self.rank_variables)
        if ctx.pki is not None:
            own, by_rank = ctx.pki.env(0), ctx.pki.env_by_rank()
            files = set(own) - set(by_rank)
            # Process 0's files become the paths by rank, unless the user set their own.
            if all(env.get(name) == own[name] for name in files):
                for name in files:
                    del env[name]
                env.update({k: v for k, v in by_rank.items() if k not in own})
        return env

    def import_env(self) -> dict[str, str]:
        """The settings of every rank that JAX reads (some when it is imported)."""
        cfg = self.config
        env = {}
        if cfg.recoverable:
            env["JAX_ENABLE_RECOVERABILITY"] = "1"
        env["XLA_FLAGS"] = _xla_flags(cfg.devices_per_host)
        env.update(self._platform_env())
        if cfg.cache_dir:
            env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(cfg.cache_dir)
        return env

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        # Stack files of other hosts cannot be read from here (engine/bootstrap.py).
        return {"relay_stacks": True}

    def _platform_env(self) -> dict[str, str]:
        return {}

    def nanny_args(self) -> list[str]:
        """Engine arguments about ipyparallel's nanny (which relays signals)."""
        return []

    def engine_args(self, rank: int, ctx: EngineContext, engine_id: int | None = None) -> list[str]:
        """The ``ipengine`` arguments for the engine of ``rank`` (a standby engine asks
        for the ``engine_id`` it was given)."""
        return [
            # Ask the hub for engine id == rank, so that process i is engine i; a standby
            # engine asks for an id of its own, so the kernel knows it on registration.
            f"--IPEngine.id={rank if engine_id is None else engine_id}",
            *self.nanny_args(),
            # Engines start alongside the controller and wait for its file.
            f"--IPEngine.wait_for_url_file={self.config.register_timeout:g}",
            # ipengine logs each request it handles at INFO: a line per process per cell in
            # its log file, for as long as the cluster lives. Warnings and errors still go.
            "--IPEngine.log_level=WARN",
        ]

    # -- launching ----------------------------------------------------------------------------

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        """Start the engines of every rank (without waiting for them to register): by
        default with one command, after :meth:`acquire`, every rank one environment."""
        await self.acquire(ctx, report)
        env = self.one_job_env(ctx)
        set_id = f"all-i{ctx.incarnation}"
        await self.ipp.start_engines(
            n=self.config.nprocs,
            engine_set_id=set_id,
            environment=env,
            **self.launch_options(),
        )
        self.engine_sets = dict.fromkeys(self.config.ranks, set_id)

    async def acquire(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        """Before a launch: get what the engines run on (a scheduler's job), reporting
        while it waits. Nothing by default: the allocation is there already."""

    def launch_options(self) -> dict[str, Any]:
        """The settings handed to ipyparallel's engine launcher."""
        return dict(self.config.launcher_options)

    async def launch_rank(
        self, rank: int, set_id: str, ctx: EngineContext, *, engine_id: int | None = None
    ) -> None:
        """Start the engine of one rank as an engine set of its own.

        With ``engine_id`` the engine is a standby kept for ``rank``: it asks the hub for
        that id and is not recorded as serving the rank until it takes over.
        """
        raise NotImplementedError(f"the {self.name} launcher starts every rank in one job")

    async def standby_launched(self) -> None:
        """Called once the standby engines of a refill have all been launched (a launcher
        that only notes each in :meth:`launch_rank` starts them here, together)."""

    def standby_gone(self, set_id: str, rank: int) -> bool:
        """Whether the standby engine of engine set ``set_id`` (kept for ``rank``) is known
        to have exited: its engine set is gone or has ended."""
        es = self.ipp.engines.get(set_id) if self.ipp is not None else None
        return es is None or any(getattr(s, "state", "") == "after" for s in sub_launchers(es))

    def takeover_settings(self, rank: int, ctx: EngineContext) -> dict[str, str]:
        """What a standby engine kept for ``rank`` is told when it joins incarnation
        ``ctx.incarnation``: the variables that name the incarnation and its files."""
        per_incarnation = {contract.INCARNATION, contract.STACK_FILE, contract.NATIVE_LOG}
        return {k: v for k, v in self.engine_env(rank, ctx).items() if k in per_incarnation}

    def engine_set(self, rank: int):
        """The ipyparallel engine-set launcher serving ``rank``, or None."""
        set_id = self.engine_sets.get(rank)
        if self.ipp is None or set_id is None:
            return None
        return self.ipp.engines.get(set_id)

    def forget_rank(self, rank: int) -> None:
        """Drop the engine set of ``rank`` from ipyparallel's books (its engine is gone)."""
        if self.ipp is not None:
            self.ipp.engines.pop(self.engine_sets.get(rank), None)

    # -- signalling ---------------------------------------------------------------------------

    def signal(
        self, processes: Sequence[ProcessInfo], client, ranks: Sequence[int], sig: int
    ) -> list[int]:
        """Send ``sig`` to the processes of ``ranks``; returns the ranks signalled."""
        sent, remote = self._signal_here(processes, ranks, sig)
        if remote:
            try:
                targets = [processes[r].engine_id for r in remote]
                client.send_signal(sig, targets=targets, block=False)
                sent.extend(remote)
            except Exception as e:  # noqa: BLE001 - report, do not hide, then carry on
                log.warning("could not signal processes %s: %s", format_procs(remote), e)
        return sorted(sent)

    def _signal_here(
        self, processes: Sequence[ProcessInfo], ranks: Sequence[int], sig: int
    ) -> tuple[list[int], list[int]]:
        """Signal what can be signalled directly; returns (signalled, for the nannies)."""
        return [], list(ranks)

    def process_gone(self, p: ProcessInfo) -> bool:
        """Whether a process is known to be gone without asking the hub."""
        return False

    def processes_gone(self, processes: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        """Those of ``processes`` that :meth:`process_gone` would say are gone (a launcher
        that can ask about all of them at once overrides it)."""
        return [p for p in processes if self.process_gone(p)]

    def death_reason(self, p: ProcessInfo) -> str:
        """Why :meth:`process_gone` said the process is gone."""
        return f"its pid {p.pid} is gone"

    def dump_stacks(
        self,
        ranks: Sequence[int],
        timeout: float,
        send_signal: Callable[[list[int], int], object],
        stack_files: Callable[[int], Path],
        telemetry,
    ) -> dict[int, str]:
        """Stacks of every thread of the processes of ``ranks``, by rank."""
        # Stack files of other hosts cannot be read from here: the engines relay them.
        return stacks.relayed_stacks(telemetry, ranks, send_signal, timeout)

    # -- killing ------------------------------------------------------------------------------

    def kill_remote(self, engine_sets: Sequence, processes: Sequence[ProcessInfo] = ()) -> None:
        """SIGKILL the engines these launchers started on other hosts, where they run
        (with the process groups of ``processes``' engines where the launcher can)."""

    def kill_engines(self, engine_sets: Sequence, processes: Sequence[ProcessInfo] = ()) -> None:
        """SIGKILL the engines these launchers started, where they run, and wait (bounded)
        until the local ones are gone. Blocking: call it off the event loop.

        Of ``processes`` (those being killed), each :meth:`local_engines` goes with its
        process group, unless its pid now names another process.
        """
        self.kill_remote(engine_sets, processes)
        here = (
            [pid for es in engine_sets for pid in launcher_pids(es)]
            if self.launcher_pids_here
            else []
        )
        own = self.local_engines(processes)
        pids = [*(p.pid for p in own), *here]
        killpg_all(pids, engine_start_times(own))
        wait_gone(pids, ENGINE_KILL_WAIT_S)

    def nannies_gone(self) -> bool:
        """Whether the last :meth:`kill_engines` is known to have ended the engines' nannies
        too (their hosts were deleted), so that none of them will tell the hub of its
        engine's death and a world restart need not wait for them."""
        return False

    def local_engines(self, processes: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        """The processes whose engine pids are pids of this machine: a teardown kills
        them here, each with its process group (what its cells started)."""
        return [p for p in processes if p.pid] if self.engine_pids_here else []

    def kill_rank(self, rank: int, p: ProcessInfo) -> None:
        """SIGKILL the engine of one rank (blocking), if it may still run."""
        es = self.engine_set(rank)
        if not self.engine_pids_here:
            self.kill_engines([es] if es else [])
        # A local process already gone is not signalled again: its pid may be reused.
        elif p.pid and pid_alive(p.pid):
            self.kill_engines([es] if es else [], [p])
