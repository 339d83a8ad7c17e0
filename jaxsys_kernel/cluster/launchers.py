"""Where engines run and how they are reached: one class per launcher kind, chosen once.

Each launcher owns the engine environment, launching (with ipyparallel's launchers),
signalling, killing, where stack dumps come from, whether engine pids are pids of this
machine, where the coordinator runs, and whether a single process can be restarted. Nothing
else in the package asks which kind a cluster uses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .. import _compat, contract
from .._ranges import format_procs
from . import stacks
from .profile import engine_file
from .security import handshake_trace_env
from .teardown import killpg_all, launcher_pids, pid_alive, sub_launchers, wait_gone

if TYPE_CHECKING:
    from .config import ClusterConfig
    from .records import ProcessInfo

log = logging.getLogger("jaxsys.cluster")

# The hub completes an engine's registration only after seeing its heart for about two
# periods: ipyparallel's default 3 s period makes start-up take 6 s. At 250 ms, with 20
# misses allowed, an engine is still only declared dead after 5 s without a heartbeat.
HEARTBEAT_PERIOD_MS = 250
HEARTBEAT_MISSES = 20
# Engines check the controller's heartbeat every period + 500 ms: 20 misses is 15 s.
SSH_HEARTBEAT_MISSES = 20
# Seconds a kill of engines waits for the local ones to be gone.
ENGINE_KILL_WAIT_S = 5.0
# Seconds a kill over ssh waits for the hosts to answer.
SSH_KILL_TIMEOUT_S = 10.0


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


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_part(host: str) -> str:
    """``user@node7:2222`` -> ``node7``: what goes into a certificate."""
    return host.rpartition("@")[2].split(":")[0]


class Launcher:
    """How the engines of one cluster are started, signalled and killed.

    Subclasses set the class attributes below and override what differs. An instance is
    made once per cluster (:func:`make_launcher`) and keeps, for the cluster's lifetime,
    its ipyparallel ``Cluster`` (``ipp``) and which engine set serves each rank.

    Parameters
    ----------
    config : ClusterConfig
    """

    #: The name users give (``Cluster(launcher=...)``).
    name: ClassVar[str]
    #: Processes are named by host (``hosts=[...]``), not counted.
    needs_host_names: ClassVar[bool] = False
    #: ``addresses`` and ``process_prefix`` place processes (network namespaces, taskset).
    places_processes: ClassVar[bool] = False
    #: ipyparallel has an engine launcher of this name that takes ``launcher_options``.
    takes_options: ClassVar[bool] = True
    #: Engine (and nanny) pids are pids on this machine.
    engine_pids_here: ClassVar[bool] = False
    #: Launcher processes (mpiexec, sbatch...) run on this machine.
    launcher_pids_here: ClassVar[bool] = True
    #: A single process can be restarted into the running world.
    restarts_one_process: ClassVar[bool] = False
    #: Engines read a complete copy of the controller's engine file (see bringup.py).
    uses_engine_file_copy: ClassVar[bool] = False
    #: With no ``controller_ip``, everything listens on loopback.
    loopback_only: ClassVar[bool] = False

    def __init__(self, config: ClusterConfig):
        self.config = config
        self.ipp = None
        self.engine_sets: dict[int, str] = {}

    # -- the controller ------------------------------------------------------------------

    def make_ipp_cluster(self, profile: Path, secure: bool):
        """The ipyparallel ``Cluster`` that runs the controller and launches engines."""
        import ipyparallel as ipp

        controller_args = [
            f"--HeartMonitor.period={HEARTBEAT_PERIOD_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
        ]
        if secure:
            # Engines and the client pick up the server key from the connection files.
            controller_args.append("--IPController.enable_curve=True")
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
            "engine_launcher_class": self.name,
        }

    def telemetry_addresses(self) -> tuple[str, str]:
        """Where the kernel's telemetry socket listens, and the address engines connect to
        (see :func:`telemetry_addresses`)."""
        return telemetry_addresses(self.name, self.config.controller_ip)

    @classmethod
    def default_options(cls) -> dict[str, Any]:
        """``launcher_options`` that apply when the user does not give them."""
        return {}

    # -- the coordinator and certificates ---------------------------------------------------

    def certificate_hosts(self) -> list[str] | None:
        """Each process's host, for its certificate (None when unknown in advance)."""
        return [host_part(h) for h in self.config.host_names or ()] or None

    def early_coordinator(self) -> str | None:
        """The coordinator's address, if it can be chosen before launch (engines then join
        while they register); None when process 0's host is only known afterwards."""
        return None

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
        env = {"PYTHONUNBUFFERED": "1", **engine.to_env()}
        if cfg.recoverable:
            env["JAX_ENABLE_RECOVERABILITY"] = "1"
        env["XLA_FLAGS"] = _xla_flags(cfg.devices_per_host)
        env.update(self._platform_env())
        if cfg.cache_dir:
            env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(cfg.cache_dir)
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

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        # Stack files of other hosts cannot be read from here (engine/bootstrap.py).
        return {"relay_stacks": True}

    def _platform_env(self) -> dict[str, str]:
        return {}

    def nanny_args(self) -> list[str]:
        """Engine arguments about ipyparallel's nanny (which relays signals)."""
        return []

    def engine_args(self, rank: int, ctx: EngineContext) -> list[str]:
        """The ``ipengine`` arguments for the engine of ``rank``."""
        return [
            # Ask the hub for engine id == rank, so that process i is engine i.
            f"--IPEngine.id={rank}",
            *self.nanny_args(),
            # Engines start alongside the controller and wait for its file.
            f"--IPEngine.wait_for_url_file={self.config.register_timeout:g}",
        ]

    # -- launching ----------------------------------------------------------------------------

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        """Start the engines of every rank (without waiting for them to register)."""
        # MPI and Slurm start every rank in one job; the rank comes from their env.
        env = self.engine_env(0, ctx)
        env.pop(contract.PROCESS_ID)
        set_id = f"all-i{ctx.incarnation}"
        await self.ipp.start_engines(
            n=self.config.nprocs,
            engine_set_id=set_id,
            environment=env,
            **self.config.launcher_options,
        )
        self.engine_sets = dict.fromkeys(self.config.ranks, set_id)

    async def launch_rank(self, rank: int, set_id: str, ctx: EngineContext) -> None:
        """Start the engine of one rank as an engine set of its own."""
        raise NotImplementedError(f"the {self.name} launcher starts every rank in one job")

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

    def kill_remote(self, engine_sets: Sequence) -> None:
        """SIGKILL the engines these launchers started on other hosts, where they run."""

    def kill_engines(self, engine_sets: Sequence, local_pids: Sequence[int] = ()) -> None:
        """SIGKILL the engines these launchers started, where they run, and wait (bounded)
        until the local ones are gone. Blocking: call it off the event loop."""
        self.kill_remote(engine_sets)
        here = (
            [pid for es in engine_sets for pid in launcher_pids(es)]
            if self.launcher_pids_here
            else []
        )
        pids = [*local_pids, *here]
        killpg_all(pids)
        wait_gone(pids, ENGINE_KILL_WAIT_S)

    def kill_rank(self, rank: int, p: ProcessInfo) -> None:
        """SIGKILL the engine of one rank (blocking), if it may still run."""
        es = self.engine_set(rank)
        if not self.engine_pids_here:
            self.kill_engines([es] if es else [])
        # A local process already gone is not signalled again: its pid may be reused.
        elif p.pid and pid_alive(p.pid):
            self.kill_engines([es] if es else [], [p.pid])


class LocalLauncher(Launcher):
    """Processes on this machine, one engine set per rank, signalled directly (no nanny)."""

    name = "local"
    places_processes = True
    takes_options = False
    engine_pids_here = True
    restarts_one_process = True
    uses_engine_file_copy = True
    loopback_only = True

    def _controller_kwargs(self) -> dict[str, Any]:
        return {"controller_ip": self.config.controller_ip or "127.0.0.1"}

    def certificate_hosts(self) -> list[str] | None:
        return self.config.addresses

    def early_coordinator(self) -> str | None:
        return f"{self.config.addresses[0]}:{_free_local_port()}"

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        fields: dict[str, Any] = {"parent_pid": os.getpid()}
        if ctx.profile is not None:
            fields["stack_file"] = str(stack_file(ctx.profile, rank, ctx.incarnation))
            fields["native_log"] = str(native_log_file(ctx.profile, rank, ctx.incarnation))
        return fields

    def _platform_env(self) -> dict[str, str]:
        return {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}

    def nanny_args(self) -> list[str]:
        # The nanny relays signals to remote engines. Local engines are signalled directly,
        # and starting a nanny costs each engine ~1 s of start-up on a busy machine.
        return ["--IPEngine.enable_nanny=False"]

    def engine_args(self, rank: int, ctx: EngineContext) -> list[str]:
        return [*super().engine_args(rank, ctx), f"--IPEngine.url_file={engine_file(ctx.profile)}"]

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        for rank in self.config.ranks:
            await self.launch_rank(rank, f"p{rank}-i{ctx.incarnation}", ctx)

    async def launch_rank(self, rank: int, set_id: str, ctx: EngineContext) -> None:
        kwargs: dict[str, Any] = {
            "environment": self.engine_env(rank, ctx),
            "engine_args": self.engine_args(rank, ctx),
        }
        prefix = self.config.process_prefix.get(rank)
        if prefix:
            kwargs["engine_cmd"] = [*prefix, sys.executable, "-m", "ipyparallel.engine"]
        await self.ipp.start_engines(n=1, engine_set_id=set_id, **kwargs)
        self.engine_sets[rank] = set_id

    def _signal_here(self, processes, ranks, sig):
        sent, rest = [], []
        for r in ranks:
            p = processes[r]
            if not p.pid:
                rest.append(r)
                continue
            try:
                os.kill(p.pid, sig)
                sent.append(r)
            except ProcessLookupError:
                pass
        return sent, rest

    def process_gone(self, p: ProcessInfo) -> bool:
        # Checked directly: the hub notices only after missed heartbeats.
        return p.pid is not None and not pid_alive(p.pid)

    def dump_stacks(self, ranks, timeout, send_signal, stack_files, telemetry):
        return stacks.local_stacks({r: stack_files(r) for r in ranks}, send_signal, timeout)


class SshLauncher(Launcher):
    """One engine per named host, started over ssh; engines there are killed over ssh.

    Engines run without the death signal (the process that spawns them on their host exits
    at once), so when the kernel dies without a teardown they leave when the controller's
    heartbeats stop.
    """

    name = "ssh"
    needs_host_names = True
    launcher_pids_here = False
    restarts_one_process = True

    @classmethod
    def default_options(cls) -> dict[str, Any]:
        # Suits hosts that share this machine's filesystem.
        return {"remote_python": sys.executable}

    def coordinator_host(self, p0_address: str) -> str:
        # The name that reached process 0's host is the one to give the others: what that
        # host says of itself may be a loopback alias (Debian's 127.0.1.1).
        return host_part(self.config.host_names[0])

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        # The process that spawns an engine on its host exits at once; the engine must not
        # die with it. It goes when the controller stops answering its heartbeats.
        return {**super()._engine_fields(rank, ctx), "no_pdeathsig": True}

    def nanny_args(self) -> list[str]:
        # No death signal reaches an engine started over ssh: when the kernel dies, the
        # controller goes with it and the engine leaves once its heartbeats stop.
        return [f"--IPEngine.max_heartbeat_misses={SSH_HEARTBEAT_MISSES}"]

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        # Each launch is several ssh round trips; hosts are reached all at once.
        launched = 0
        total = self.config.nprocs
        report("engines launched over ssh", 0, total)

        async def launch(rank: int) -> None:
            nonlocal launched
            await self.launch_rank(rank, f"p{rank}-i{ctx.incarnation}", ctx)
            launched += 1
            report("engines launched over ssh", launched, total)

        await asyncio.gather(*(launch(r) for r in self.config.ranks))

    async def launch_rank(self, rank: int, set_id: str, ctx: EngineContext) -> None:
        """What ``ipyparallel.Cluster.start_engines`` does, with the blocking ssh calls of
        the launcher's ``start`` moved to a worker thread, so that hosts start in parallel.
        """
        from tornado.ioloop import IOLoop

        ipp = self.ipp
        # Launchers call back on the loop they were made on: this one, not the worker's.
        loop = IOLoop.current()
        kwargs: dict[str, Any] = {
            "environment": self.engine_env(rank, ctx),
            "engine_args": self.engine_args(rank, ctx),
            **self.config.launcher_options,
        }
        es = ipp.engine_launcher_class(
            work_dir=".",
            parent=ipp,
            log=ipp.log,
            profile_dir=ipp.profile_dir,
            cluster_id=ipp.cluster_id,
            engine_set_id=set_id,
            loop=loop,
            engines={self.config.host_names[rank]: {"n": 1, "loop": loop}},
            **kwargs,
        )
        # Known before it starts, so that a teardown meanwhile finds it.
        _compat.attach_engine_set(ipp, set_id, es)
        self.engine_sets[rank] = set_id
        await asyncio.to_thread(es.start, 1)

    def kill_remote(self, engine_sets: Sequence) -> None:
        """SIGKILL every engine started over ssh, on its host, all hosts at once."""
        launchers = [
            sub
            for es in engine_sets
            for sub in sub_launchers(es)
            if isinstance(getattr(sub, "pid", None), int) and sub.pid > 1
        ]

        def kill(sub) -> None:
            # The launcher would fetch the engine's log once it stopped; nobody reads it
            # now, and the host may be gone by then.
            _compat.forget_launcher_output(sub)
            try:
                _compat.ssh_kill(sub, sub.pid, signal.SIGKILL)
            except Exception:  # noqa: BLE001 - a host that cannot be reached keeps its engine
                pass

        deadline = time.monotonic() + SSH_KILL_TIMEOUT_S
        threads = []
        for sub in launchers:
            t = threading.Thread(target=kill, args=(sub,), daemon=True)
            try:
                t.start()
            except RuntimeError:  # at interpreter exit no thread can start: one at a time
                kill(sub)
            else:
                threads.append(t)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        # Each launcher keeps an ssh session open that waits for its engine; with the
        # engine gone it returns, and it must, before its host may go away under it.
        for sub in launchers:
            _compat.release_ssh_waiter(sub, deadline - time.monotonic())


class MpiLauncher(Launcher):
    """Every rank in one ``mpiexec`` job; ranks come from MPI's environment."""

    name = "mpi"


class SlurmLauncher(Launcher):
    """Every rank in one Slurm job; ranks come from Slurm's environment."""

    name = "slurm"


LAUNCHER_CLASSES: Mapping[str, type[Launcher]] = {
    cls.name: cls for cls in (LocalLauncher, SshLauncher, MpiLauncher, SlurmLauncher)
}
LAUNCHERS = tuple(LAUNCHER_CLASSES)


def make_launcher(config: ClusterConfig) -> Launcher:
    """The launcher a (validated) configuration asks for."""
    return LAUNCHER_CLASSES[config.launcher](config)


def telemetry_addresses(launcher: str, controller_ip: str | None) -> tuple[str, str]:
    """Where the kernel's telemetry socket listens, and the address engines connect to.

    Like ipyparallel's controller: loopback for local clusters, the given address when
    there is one, else every interface, with this machine's host name for the engines
    (``0.0.0.0`` would mean their own host to them).

    Parameters
    ----------
    launcher : str
        The cluster's launcher.
    controller_ip : str or None
        The ``controller_ip`` the cluster was given.

    Returns
    -------
    tuple of str
        ``(bind, advertise)``.
    """
    if controller_ip and controller_ip != "*":
        return controller_ip, controller_ip
    if LAUNCHER_CLASSES[launcher].loopback_only and not controller_ip:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.gethostname()
