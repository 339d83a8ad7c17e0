"""A cluster of JAX processes: one ipyparallel engine per host, process i = engine of rank i."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._ranges import format_procs
from ..engine import bootstrap
from .profile import make_profile, remove_profile

log = logging.getLogger("jaxsys.cluster")

LAUNCHERS = ("local", "ssh", "mpi", "slurm")

# The hub completes an engine's registration only after seeing its heart for about two
# periods: ipyparallel's default 3 s period makes start-up take 6 s. At 250 ms, with 20
# misses allowed, an engine is still only declared dead after 5 s without a heartbeat.
HEARTBEAT_PERIOD_MS = 250
HEARTBEAT_MISSES = 20
# Engines check the controller's heartbeat every period + 500 ms: 20 misses is 15 s.
SSH_HEARTBEAT_MISSES = 20
# After a rotation, how often the served certificate is checked, and for how long: JAX 0.12
# re-reads certificate files about every 10 minutes, so twice that means something is wrong.
ROTATION_POLL_S = 15.0
ROTATION_GIVE_UP_S = 20 * 60.0


class ClusterError(RuntimeError):
    """A cluster operation failed; the message names the processes involved."""

    def _render_traceback_(self) -> list[str]:
        # In a notebook the message is the whole story; the driver's frames are noise.
        return [f"{type(self).__name__}: {self}"]


class ClusterStartError(ClusterError):
    """The cluster could not be brought up; nothing it started is left running."""


@dataclass
class ProcessInfo:
    """What the kernel knows about one JAX process.

    Attributes
    ----------
    rank : int
        JAX process index (``jax.process_index()``).
    engine_id : int or None
        ipyparallel engine id serving this rank; None before registration.
    pid : int or None
        Operating-system pid of the engine.
    host : str
        Host name the process runs on.
    devices : list of int
        Ids of the process's local JAX devices.
    state : str
        ``starting``, ``ready``, ``dead`` or ``failed``.
    """

    rank: int
    engine_id: int | None = None
    pid: int | None = None
    host: str = ""
    address: str = ""
    nanny_pid: int | None = None
    devices: list[int] = field(default_factory=list)
    platform: str = ""
    state: str = "starting"

    def to_dict(self) -> dict:
        """Return the fields as a plain, JSON-ready dict."""
        return asdict(self)


@dataclass
class ProgressEvent:
    """One step of a long wait: ``done`` of ``total`` for a named stage."""

    stage: str
    done: int
    total: int


def _tail(text: str, lines: int = 15) -> str:
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def _output_tail(launcher) -> str:
    try:
        return _tail(launcher.get_output() or "")
    except Exception:  # noqa: BLE001 - the output is a hint; its absence is no error
        return ""


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """N JAX processes, each an ipyparallel engine, driven from one Python process.

    The cluster is async-first: every coroutine method has a ``*_sync`` twin. Both run the
    work on a private event-loop thread that lives as long as the cluster object, because
    engines die with the thread that launched them (see ``profile.py``).

    Parameters
    ----------
    hosts : int or sequence of str
        Number of processes, or host names (one process per entry) for ``ssh``.
    devices_per_host : int
        CPU devices each process simulates (``--xla_force_host_platform_device_count``);
        ignored for accelerator hosts where the hardware decides.
    launcher : {"local", "ssh", "mpi", "slurm"}
        ``local`` starts processes on this machine; the others use ipyparallel's launchers
        of the same name.
    cache_dir : str, optional
        Persistent compilation cache directory for every process.
    register_timeout, init_timeout : float
        Seconds allowed for engines to register and for ``jax.distributed.initialize``.
    env : mapping, optional
        Extra environment variables for every process.
    process_env : mapping of int to mapping, optional
        Extra environment variables for single processes, by rank.
    heartbeat_timeout : float, optional
        Seconds without heartbeats after which JAX declares a process dead (default 10;
        JAX's own default is 100).
    recoverable : bool
        Run JAX with ``jax_enable_recoverability``: when a process dies the others keep
        running (``live_devices`` tells them who is left) and a restarted process can
        rejoin. Without it, one death takes every process down.
    progress : callable, optional
        Called with a :class:`ProgressEvent` for every step of a long wait, on the thread
        that called the method. Defaults to a progress bar on stderr.
    secure : bool
        Mutual TLS for JAX's coordination service (certificates from a per-cluster CA, with
        ``verify_secure_credentials`` so a misconfiguration fails loudly) and CurveZMQ for
        ipyparallel's control channel. On by default.
    ca_file, cert_dir : str, optional
        Bring your own CA: ``cert_dir`` holds ``process-<i>.pem`` and ``process-<i>.key``
        for every process, signed by ``ca_file``.
    addresses : sequence of str, optional
        Local launcher only: the network address of each process's host (loopback by
        default). Process 0's address carries the coordination service, and each address
        goes into that process's certificate.
    controller_ip : str, optional
        Where the ipyparallel controller listens (loopback for local clusters).
    process_prefix : mapping of int to sequence of str, optional
        Local launcher only: a command prefix per process, e.g.
        ``["ip", "netns", "exec", "ns0"]`` or ``["taskset", "-c", "0"]``.
    telemetry : bool
        Run an agent in every process that streams heartbeats and compilation-cache events
        to ``self.telemetry`` (a :class:`~jaxsys_kernel.telemetry.hub.TelemetryHub`).
    launcher_options : mapping, optional
        Settings for ipyparallel's engine launcher of the ``ssh``, ``mpi`` or ``slurm``
        kind, by trait name, e.g. ``{"ssh_args": ["-i", "key"], "remote_python":
        "/opt/venv/bin/python"}``. For ``ssh``, ``remote_python`` defaults to this
        Python's path, which suits hosts that share its filesystem.

    Examples
    --------
    >>> with Cluster(hosts=2, devices_per_host=2) as cluster:      # doctest: +SKIP
    ...     cluster.view.apply_sync(lambda: __import__("jax").device_count())
    [4, 4]
    """

    def __init__(
        self,
        hosts: int | Sequence[str] = 4,
        devices_per_host: int = 2,
        launcher: str = "local",
        *,
        cache_dir: str | None = None,
        register_timeout: float = 60.0,
        init_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        process_env: Mapping[int, Mapping[str, str]] | None = None,
        heartbeat_timeout: float | None = 10.0,
        recoverable: bool = True,
        progress: Callable[[ProgressEvent], None] | None = None,
        secure: bool = True,
        ca_file: str | None = None,
        cert_dir: str | None = None,
        addresses: Sequence[str] | None = None,
        controller_ip: str | None = None,
        process_prefix: Mapping[int, Sequence[str]] | None = None,
        telemetry: bool = True,
        launcher_options: Mapping[str, Any] | None = None,
    ):
        if launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
        if isinstance(hosts, int):
            if hosts < 1:
                raise ValueError(f"hosts must be at least 1, got {hosts}")
            self.host_names: list[str] | None = None
            self.nprocs = hosts
        else:
            self.host_names = list(hosts)
            if not self.host_names:
                raise ValueError("hosts is an empty list; give at least one host name")
            self.nprocs = len(self.host_names)
        if launcher == "ssh" and self.host_names is None:
            raise ValueError("the ssh launcher needs host names: hosts=['node1', 'node2', ...]")
        if devices_per_host < 1:
            raise ValueError(f"devices_per_host must be at least 1, got {devices_per_host}")
        self.devices_per_host = devices_per_host
        self.launcher = launcher
        self.cache_dir = cache_dir
        self.register_timeout = register_timeout
        self.init_timeout = init_timeout
        self.env = dict(env or {})
        self.process_env = {int(k): dict(v) for k, v in (process_env or {}).items()}
        for rank in self.process_env:
            if not 0 <= rank < self.nprocs:
                raise ValueError(f"process_env names process {rank}, outside 0-{self.nprocs - 1}")
        self.heartbeat_timeout = heartbeat_timeout
        self.recoverable = recoverable
        if (ca_file is None) != (cert_dir is None):
            raise ValueError("give both ca_file and cert_dir to bring your own certificates")
        if not secure and ca_file is not None:
            raise ValueError("ca_file/cert_dir make no sense with secure=False")
        if (addresses is not None or process_prefix) and launcher != "local":
            raise ValueError("addresses and process_prefix apply to the local launcher only")
        if addresses is not None and len(addresses) != self.nprocs:
            raise ValueError(f"addresses has {len(addresses)} entries for {self.nprocs} processes")
        self.addresses = list(addresses) if addresses is not None else ["127.0.0.1"] * self.nprocs
        self.controller_ip = controller_ip
        if launcher_options and launcher == "local":
            raise ValueError("launcher_options apply to the ssh, mpi and slurm launchers")
        self.launcher_options = dict(launcher_options or {})
        if self.launcher_options:
            _check_launcher_options(launcher, self.launcher_options)
        if launcher == "ssh":
            self.launcher_options.setdefault("remote_python", sys.executable)
        self.process_prefix = {int(k): list(v) for k, v in (process_prefix or {}).items()}
        self.secure = secure
        self.telemetry_enabled = telemetry
        self.telemetry = None
        self.ca_file = ca_file
        self.cert_dir = cert_dir
        self.pki = None
        self._progress_cb = progress
        self._progress_q: queue.SimpleQueue[ProgressEvent] = queue.SimpleQueue()

        self.processes: list[ProcessInfo] = []
        self.client = None
        self.view = None
        self.coordinator_address: str | None = None
        self.state = "stopped"
        self.ready_seconds: float | None = None
        self._ipp = None
        self._profile = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._engine_sets: dict[int, str] = {}
        self._early_coordinator: str | None = None
        self._rank_restarts: dict[int, int] = {}
        self._incarnation = 0
        self.rotation_poll = ROTATION_POLL_S
        self._rotation: dict | None = None
        self._rotation_stop = threading.Event()
        _live_clusters.add(self)

    # -- the private loop ------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def main():
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            # Must outlive every engine: the parent-death signal fires when this thread ends.
            t = threading.Thread(target=main, name="jaxsys-cluster-loop", daemon=True)
            t.start()
            if not started.wait(10):
                raise ClusterError("the cluster's event loop did not start within 10 s")
            self._loop, self._loop_thread = loop, t
        return self._loop

    def _submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def _report(self, stage: str, done: int, total: int) -> None:
        self._progress_q.put(ProgressEvent(stage, done, total))

    def _drain_progress(self) -> None:
        while True:
            try:
                event = self._progress_q.get_nowait()
            except queue.Empty:
                return
            (self._progress_cb or _default_progress)(event)

    def _run_sync(self, coro: Coroutine) -> Any:
        fut = self._submit(coro)
        try:
            while True:
                try:
                    result = fut.result(timeout=0.05)
                except concurrent.futures.TimeoutError:
                    self._drain_progress()
                    continue
                self._drain_progress()
                return result
        except KeyboardInterrupt:
            # Let the coroutine clean up (it kills what it started) before re-raising.
            fut.cancel()
            try:
                fut.result(timeout=10)
            except BaseException:  # noqa: BLE001 - the interrupt is what we re-raise
                pass
            self._drain_progress()
            raise
        finally:
            _finish_progress()

    async def _run_async(self, coro: Coroutine) -> Any:
        fut = asyncio.wrap_future(self._submit(coro))
        try:
            while not fut.done():
                await asyncio.wait([fut], timeout=0.05)
                self._drain_progress()
            return fut.result()
        finally:
            _finish_progress()

    # -- public API ------------------------------------------------------------------------

    async def start(self) -> Cluster:
        """Start the controller and one engine per host, then initialise JAX everywhere.

        Returns
        -------
        Cluster
            ``self``, ready: ``processes``, ``client`` and ``view`` are set.

        Raises
        ------
        ClusterStartError
            When a process fails to start, register or join in time; the error names it and
            shows the tail of its output. Everything that was started is stopped.
        """
        return await self._run_async(self._start())

    def start_sync(self) -> Cluster:
        """Blocking twin of :meth:`start`."""
        return self._run_sync(self._start())

    async def stop(self) -> float:
        """Stop every process and the controller, and remove the cluster's profile.

        Returns
        -------
        float
            Seconds the teardown took.
        """
        return self.kill()

    def stop_sync(self) -> float:
        """Blocking twin of :meth:`stop`."""
        return self.kill()

    async def restart(self) -> float:
        """Restart the whole JAX world: every process is replaced and re-initialised.

        Returns
        -------
        float
            Seconds from the request until the new world is ready.
        """
        return await self._run_async(self._restart())

    def restart_sync(self) -> float:
        """Blocking twin of :meth:`restart`."""
        return self._run_sync(self._restart())

    def __enter__(self) -> Cluster:
        return self.start_sync()

    def __exit__(self, *exc) -> None:
        self.stop_sync()

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def ranks(self) -> list[int]:
        """All process indices, ``0..N-1``."""
        return list(range(self.nprocs))

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
        """Describe every process: rank, engine, pid, host, devices and state.

        Returns
        -------
        list of dict
            One dict per process, in rank order.
        """
        self.refresh_states()
        return [p.to_dict() for p in self.processes]

    def refresh_states(self) -> None:
        """Mark processes whose engine has gone away as ``dead``."""
        if self.client is None or self.state != "ready":
            return
        alive = set(self.client.ids)
        for p in self.processes:
            if p.state != "ready":
                continue
            # A local process is checked directly: the hub notices only after heartbeats.
            gone = p.engine_id not in alive or (
                self.launcher == "local" and p.pid is not None and not pid_alive(p.pid)
            )
            if gone:
                p.state = "dead"

    def kill_process(self, rank: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> float:
        """Send a signal to one process and, for fatal signals, wait until it is gone.

        Parameters
        ----------
        rank : int
            The process.
        sig : int
            SIGKILL (default), SIGTERM or SIGINT.
        timeout : float
            Seconds to wait for the process to exit.

        Returns
        -------
        float
            Seconds until the process was gone (or until the signal was sent, for SIGINT).
        """
        self._require_ready()
        if not 0 <= rank < self.nprocs:
            raise ClusterError(f"there is no process {rank}; this cluster has 0-{self.nprocs - 1}")
        t0 = time.perf_counter()
        p = self.processes[rank]
        if p.state == "dead":
            raise ClusterError(f"process {rank} is already dead")
        self.interrupt([rank], sig=sig)
        if sig == signal.SIGINT:
            return time.perf_counter() - t0
        if self.launcher == "local" and p.pid:
            deadline = time.monotonic() + timeout
            while pid_alive(p.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if pid_alive(p.pid):
                raise ClusterError(
                    f"process {rank} (pid {p.pid}) is still alive {timeout:g} s after "
                    f"{signal.Signals(sig).name}; JAX processes ignore SIGTERM: use SIGKILL"
                )
        p.state = "dead"
        return time.perf_counter() - t0

    async def restart_process(self, rank: int) -> float:
        """Replace one dead (or live) process and let it rejoin the running JAX world.

        Needs a recoverable cluster (the default) and the local launcher. Process 0 hosts
        JAX's coordination service, and on CPU it cannot rejoin: restart the world instead.
        After a rejoin, collectives must use a device set that was never used before
        (on CPU, gloo keeps communicators of the old incarnation for the old sets).

        Returns
        -------
        float
            Seconds until the new process had joined.
        """
        return await self._run_async(self._restart_process(rank))

    def restart_process_sync(self, rank: int) -> float:
        """Blocking twin of :meth:`restart_process`."""
        return self._run_sync(self._restart_process(rank))

    async def _restart_process(self, rank: int) -> float:
        self._require_ready()
        if not 0 <= rank < self.nprocs:
            raise ClusterError(f"there is no process {rank}; this cluster has 0-{self.nprocs - 1}")
        if rank == 0:
            raise ClusterError(
                "process 0 hosts JAX's coordination service and cannot rejoin it on CPU: "
                "restart the whole world (%jaxsys restart)"
            )
        if not self.recoverable:
            raise ClusterError(
                "this cluster runs without recoverability, so a single process cannot rejoin: "
                "restart the whole world"
            )
        if self.launcher not in ("local", "ssh"):
            raise ClusterError(
                "restarting a single process needs the local or the ssh launcher: "
                "restart the whole world"
            )
        t0 = time.perf_counter()
        p = self.processes[rank]
        launcher = self._engine_launcher(rank)
        # A local process already gone is not signalled again: its pid may be reused.
        if self._engines_elsewhere or (p.pid and pid_alive(p.pid)):
            await asyncio.to_thread(
                self._kill_engines, [launcher] if launcher else [], [p.pid] if p.pid else []
            )
        p.state = "restarting"
        self._unregister({p.engine_id} & set(self.client.ids))
        deadline = time.monotonic() + 5.0
        while p.engine_id in set(self.client.ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._ipp.engines.pop(self._engine_sets.get(rank), None)
        self._rank_restarts[rank] = self._rank_restarts.get(rank, 0) + 1
        old_uuids = self._engine_uuids()
        await self._launch_rank(rank, f"p{rank}-i{self._incarnation}-r{self._rank_restarts[rank]}")
        (eid,) = await self._wait_registered(
            time.monotonic() + self.register_timeout, old_uuids, n=1
        )
        info = (await self._identify([eid], expected=[rank]))[rank]
        self.processes[rank] = ProcessInfo(
            rank=rank,
            engine_id=eid,
            pid=info["pid"],
            host=info["host"],
            address=info["address"],
            nanny_pid=info["nanny_pid"],
        )
        await self._init_jax(self.init_timeout + 5, ranks=[rank])
        self.view = self.client[[q.engine_id for q in self.processes]]
        self.view.block = True
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
        sent = []
        remote = []
        for r in ranks:
            p = self.processes[r]
            if self.launcher == "local" and p.pid:
                try:
                    os.kill(p.pid, sig)
                    sent.append(r)
                except ProcessLookupError:
                    pass
            else:
                remote.append(r)
        if remote:
            try:
                self.client.send_signal(sig, targets=self.engine_ids(remote), block=False)
                sent.extend(remote)
            except Exception as e:  # noqa: BLE001 - report, do not hide, then carry on
                log.warning("could not signal processes %s: %s", format_procs(remote), e)
        return sorted(sent)

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
        from . import stacks

        ranks = list(ranks)
        if self.launcher != "local":
            return stacks.relayed_stacks(self.telemetry, ranks, self.interrupt, timeout)
        files = {r: self.stack_file(r) for r in ranks}
        return stacks.local_stacks(files, self.interrupt, timeout)

    def kill(self) -> float:
        """Tear the cluster down at once: SIGKILL every process group, close the client.

        Engines ignore SIGTERM once JAX is initialised, so a polite stop only adds seconds.
        Safe to call from any thread, more than once, and from ``atexit``.

        Returns
        -------
        float
            Seconds the teardown took.
        """
        t0 = time.perf_counter()
        self._rotation_stop.set()
        pids = self._all_pids()
        client, self.client, self.view = self.client, None, None
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:  # noqa: BLE001 - the client may already be half-closed
                pass
        _killpg_all(pids)
        if self._ipp is not None and self.launcher == "ssh":
            self._kill_engines(list(self._ipp.engines.values()))
        if self._ipp is not None:
            # Forget the launchers so ipyparallel does not try a slow stop later.
            self._ipp.engines = {}
            self._ipp.controller = None
            self._ipp = None
        _wait_gone(pids, timeout=3.0)
        if self._profile is not None:
            remove_profile(self._profile)
            self._profile = None
        for p in self.processes:
            p.state = "dead"
        self.pki = None
        if self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
        self.state = "stopped"
        return time.perf_counter() - t0

    # -- internals -------------------------------------------------------------------------

    def _require_ready(self) -> None:
        if self.state != "ready" or self.client is None:
            raise ClusterError("the cluster is not running; start it first")

    def _engine_launcher(self, rank: int):
        set_id = self._engine_sets.get(rank)
        if self._ipp is None or set_id is None:
            return None
        return self._ipp.engines.get(set_id)

    @property
    def _engines_elsewhere(self) -> bool:
        # An ssh launcher's pids are the engines' pids on their hosts, never ones here.
        return self.launcher == "ssh"

    def _kill_engines(self, launchers: Sequence, local_pids: Sequence[int] = ()) -> None:
        """SIGKILL the engines these launchers started, where they run, and wait (bounded)
        until the local ones are gone. Blocking: call it off the event loop."""
        if self._engines_elsewhere:
            _kill_over_ssh(launchers)
            return
        pids = [*local_pids, *(pid for es in launchers for pid in _launcher_pids(es))]
        _killpg_all(pids)
        _wait_gone(pids, 5.0)

    def _all_pids(self) -> list[int]:
        """Every pid the cluster may have started: launchers, engines, nannies."""
        pids: set[int] = set()
        if self._ipp is not None:
            ctl = self._ipp.controller
            if ctl is not None and getattr(ctl, "pid", None):
                pids.add(ctl.pid)
            if not self._engines_elsewhere:
                for es in list(self._ipp.engines.values()):
                    pids.update(_launcher_pids(es))
        for p in self.processes:
            for pid in (p.pid, p.nanny_pid):
                if pid and self.launcher == "local":
                    pids.add(pid)
        # Launchers report -1 for a process that never started.
        return sorted(pid for pid in pids if isinstance(pid, int) and pid > 1)

    def _engine_env(self, rank: int) -> dict[str, str]:
        env = {
            "JAXSYS_PROCESS_ID": str(rank),
            "JAXSYS_NUM_PROCESSES": str(self.nprocs),
            "JAXSYS_PARENT_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
            "JAXSYS_EARLY_INIT": "1",
            "JAXSYS_INIT_TIMEOUT": f"{self.init_timeout:g}",
        }
        if self._early_coordinator:
            env["JAXSYS_COORDINATOR"] = self._early_coordinator
        if self.heartbeat_timeout is not None:
            env["JAXSYS_HEARTBEAT_TIMEOUT"] = f"{self.heartbeat_timeout:g}"
        if self.recoverable:
            env["JAX_ENABLE_RECOVERABILITY"] = "1"
        if self.launcher != "local":
            # Remote launchers start engines from a shell, not from this process.
            env.pop("JAXSYS_PARENT_PID")
        if self.launcher == "ssh":
            # The process that spawns an engine on its host exits at once; the engine must
            # not die with it. It goes when the controller stops answering its heartbeats.
            env["JAXSYS_NO_PDEATHSIG"] = "1"
        if self.launcher != "local":
            # Stack files of other hosts cannot be read from here (engine/bootstrap.py).
            env["JAXSYS_RELAY_STACKS"] = "1"
        flags = [
            f
            for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={self.devices_per_host}")
        env["XLA_FLAGS"] = " ".join(flags)
        if self.launcher == "local":
            env.setdefault("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
        if self.cache_dir:
            env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(self.cache_dir)
        if self.pki is not None:
            env.update(self.pki.env(rank))
        if self._profile is not None and self.launcher == "local":
            env["JAXSYS_STACK_FILE"] = str(self.stack_file(rank))
        if self.telemetry is not None:
            env.update(self.telemetry.env())
            env["JAXSYS_INCARNATION"] = str(self._incarnation)
        env.update(self.env)
        env.update(self.process_env.get(rank, {}))
        if self.pki is not None and rank == 0:
            # Process 0 serves the coordination service; see engine/native_log.py.
            env.update(self._handshake_trace_env())
        return env

    def _handshake_trace_env(self) -> dict[str, str]:
        """gRPC settings that make process 0 log each refused handshake, for the kernel."""
        from ..engine import native_log

        user = {**os.environ, **self.env, **self.process_env.get(0, {})}
        env = {native_log.ENV_WATCH: "1"}
        tracers = [t for t in user.get("GRPC_TRACE", "").split(",") if t]
        env["GRPC_TRACE"] = ",".join(
            [*tracers, "handshaker"] if "handshaker" not in tracers else tracers
        )
        if "GRPC_VERBOSITY" not in user:
            # gRPC traces at INFO. The INFO records this adds are dropped in the process;
            # a user who chose a verbosity gets to see what it shows.
            env["GRPC_VERBOSITY"] = "INFO"
            env[native_log.ENV_DROP_INFO] = "1"
        return env

    def _make_ipp_cluster(self):
        import ipyparallel as ipp

        controller_args = [
            f"--HeartMonitor.period={HEARTBEAT_PERIOD_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
        ]
        if self.secure:
            # Engines and the client pick up the server key from the connection files.
            controller_args.append("--IPController.enable_curve=True")
        kwargs: dict[str, Any] = {}
        if self.launcher == "local":
            kwargs["controller_ip"] = self.controller_ip or "127.0.0.1"
        else:
            # Remote engines must reach the controller; see docs/architecture.md.
            kwargs["controller_ip"] = self.controller_ip or "*"
            kwargs["engine_launcher_class"] = self.launcher
        cluster = ipp.Cluster(
            profile_dir=str(self._profile),
            n=self.nprocs,
            # ipyparallel logs every killed process as a warning; our errors say more.
            log_level=logging.ERROR,
            controller_args=controller_args,
            shutdown_atexit=False,
            # Engines read the controller's connection file themselves, so they can be
            # launched before the controller has written it.
            send_engines_connection_env=False,
            **kwargs,
        )
        return cluster

    async def _launch_engines(self) -> None:
        ipp_cluster = self._ipp
        self._incarnation += 1
        # Local engines learn the coordinator at launch and join while they register; remote
        # ones learn it afterwards, from rank 0's host.
        self._early_coordinator = (
            f"{self.addresses[0]}:{_free_local_port()}" if self.launcher == "local" else None
        )
        tag = f"i{self._incarnation}"
        if self.launcher == "ssh":
            # Each launch is several ssh round trips; hosts are reached all at once.
            launched = 0
            self._report("engines launched over ssh", 0, self.nprocs)

            async def launch(rank: int) -> None:
                nonlocal launched
                await self._launch_rank(rank, f"p{rank}-{tag}")
                launched += 1
                self._report("engines launched over ssh", launched, self.nprocs)

            await asyncio.gather(*(launch(r) for r in self.ranks))
        elif self.launcher == "local":
            for rank in self.ranks:
                await self._launch_rank(rank, f"p{rank}-{tag}")
        else:
            # MPI and Slurm start every rank in one job; the rank comes from their env.
            env = self._engine_env(0)
            env.pop("JAXSYS_PROCESS_ID")
            set_id = f"all-{tag}"
            await ipp_cluster.start_engines(
                n=self.nprocs, engine_set_id=set_id, environment=env, **self.launcher_options
            )
            self._engine_sets = dict.fromkeys(self.ranks, set_id)

    async def _launch_rank(self, rank: int, set_id: str) -> None:
        """Start the engine of one rank (one engine set), with its own environment."""
        # Ask the hub for engine id == rank, so that process i is engine i.
        kwargs: dict[str, Any] = {
            "environment": self._engine_env(rank),
            "engine_args": [
                f"--IPEngine.id={rank}",
                *self._nanny_args(),
                # Engines start alongside the controller and wait for its file.
                f"--IPEngine.wait_for_url_file={self.register_timeout:g}",
            ],
        }
        if self.launcher == "local":
            kwargs["engine_args"].append(f"--IPEngine.url_file={self._engine_file()}")
        if self.launcher == "ssh":
            kwargs.update(self.launcher_options)
            await self._launch_over_ssh(rank, set_id, kwargs)
            return
        if rank in self.process_prefix:
            kwargs["engine_cmd"] = [
                *self.process_prefix[rank],
                sys.executable,
                "-m",
                "ipyparallel.engine",
            ]
        await self._ipp.start_engines(n=1, engine_set_id=set_id, **kwargs)
        self._engine_sets[rank] = set_id

    async def _launch_over_ssh(self, rank: int, set_id: str, kwargs: dict[str, Any]) -> None:
        """What ``ipyparallel.Cluster.start_engines`` does, with the blocking ssh calls of
        the launcher's ``start`` moved to a worker thread, so that hosts start in parallel.
        """
        from functools import partial

        from tornado.ioloop import IOLoop

        ipp = self._ipp
        # Launchers call back on the loop they were made on: this one, not the worker's.
        loop = IOLoop.current()
        es = ipp.engines[set_id] = ipp.engine_launcher_class(
            work_dir=".",
            parent=ipp,
            log=ipp.log,
            profile_dir=ipp.profile_dir,
            cluster_id=ipp.cluster_id,
            engine_set_id=set_id,
            loop=loop,
            engines={self.host_names[rank]: {"n": 1, "loop": loop}},
            **kwargs,
        )
        self._engine_sets[rank] = set_id
        await asyncio.to_thread(es.start, 1)
        es.on_stop(partial(ipp._engines_stopped, set_id))

    def _make_pki(self):
        from .pki import ClusterPKI

        cluster_id = self._ipp.cluster_id
        if self.ca_file is not None:
            return ClusterPKI.from_user(self.ca_file, self.cert_dir, cluster_id, self.nprocs)
        hosts = (
            self.addresses
            if self.launcher == "local"
            else [_host_part(h) for h in self.host_names or ()] or None
        )
        return ClusterPKI.create(self._profile / "pki", cluster_id, self.nprocs, hosts)

    def rotate_certs(self) -> list[int]:
        """Issue new certificates for every process in place, signed by the same CA.

        JAX re-reads certificate files periodically (every 10 minutes in 0.12), so running
        processes switch to the new ones without a restart.

        Returns
        -------
        list of int
            The serial numbers of the new certificates, by process.
        """
        self._require_ready()
        if self.pki is None:
            raise ClusterError(
                "this cluster runs without mTLS; there are no certificates to rotate"
            )
        if not self.pki.can_rotate:
            raise ClusterError(
                "this cluster uses your CA, and jaxsys holds no CA key: issue new certificates "
                "with your CA and replace the files in the certificate directory in place"
            )
        serials = self.pki.rotate()
        self._watch_rotation(serials[0])
        return serials

    def rotation(self) -> dict | None:
        """Where the latest certificate rotation stands, or None if there was none.

        After :meth:`rotate_certs` a background thread asks the coordination service every
        ``rotation_poll`` seconds which certificate it presents, until it is the new one
        (or for at most 20 minutes). Only process 0's certificate can be observed this way:
        it is the one the service presents; the others switch on the same schedule.

        Returns
        -------
        dict or None
            ``rotated_at`` (wall-clock time), ``serial`` (process 0's new serial),
            ``in_use_at`` (when the service was first seen presenting it, or None) and
            ``gave_up`` (True if it never did within 20 minutes).
        """
        return None if self._rotation is None else dict(self._rotation)

    def _watch_rotation(self, serial: int) -> None:
        from .pki import peer_certificate_serial

        self._rotation_stop.set()
        stop = self._rotation_stop = threading.Event()
        state = self._rotation = {
            "rotated_at": time.time(),
            "serial": serial,
            "in_use_at": None,
            "gave_up": False,
        }
        deadline = time.monotonic() + ROTATION_GIVE_UP_S

        def watch() -> None:
            while not stop.wait(self.rotation_poll):
                if self.state == "stopped" or self.pki is None:
                    return
                if time.monotonic() > deadline:
                    state["gave_up"] = True
                    return
                try:
                    served = peer_certificate_serial(
                        self.coordinator_address, self.pki.credentials(0), timeout=2.0
                    )
                except Exception:  # noqa: BLE001 - mid-restart the service may be away
                    continue
                if served == serial:
                    state["in_use_at"] = time.time()
                    return

        threading.Thread(target=watch, name="jaxsys-rotation", daemon=True).start()

    @property
    def security(self) -> str:
        """One line saying how the cluster's links are protected."""
        if not self.secure:
            return (
                "INSECURE: no mTLS on the coordination service, no CurveZMQ on the control channel"
            )
        origin = "your CA" if self.ca_file else "a per-cluster CA"
        return f"mTLS on the coordination service ({origin}), CurveZMQ on the control channel"

    def _refusals_since(self, t: float) -> list[str]:
        """Why a process that never joined may have been turned away: the refusals since t."""
        lines = []
        for r in self.refusals():
            if r["last"] >= t:
                lines.append(
                    f"meanwhile the coordination service refused {r['attempts']} connection(s) "
                    f"from {r['host']}: {r['reason']}"
                )
        return lines

    @property
    def reports_refusals(self) -> bool:
        """Whether refused handshakes can be reported: mTLS, telemetry, and a gRPC
        verbosity (if the user chose one) at which its handshake trace is printed."""
        if self.pki is None and not self.secure:
            return False
        if not self.telemetry_enabled:
            return False
        user = {**os.environ, **self.env, **self.process_env.get(0, {})}
        return user.get("GRPC_VERBOSITY", "INFO").upper() in ("INFO", "DEBUG")

    def refusals(self) -> list[dict]:
        """Connections the coordination service refused, by address and reason.

        Process 0 reports each refused TLS handshake (no certificate, another CA, an
        identity outside the cluster's prefix...) to the kernel as it happens. The list
        survives world restarts.

        Returns
        -------
        list of dict
            ``host``, ``reason``, ``identity``, ``error``, ``attempts``, ``first``, ``last``
            and ``last_port`` for each address and reason, oldest first; empty for clusters
            without mTLS or telemetry.
        """
        return [r.to_dict() for r in self.refusal_records()]

    def refusal_records(self) -> list:
        """:meth:`refusals` as :class:`~jaxsys_kernel.telemetry.schema.Refusal` records."""
        if self.telemetry is None or self.pki is None:
            return []
        return self.telemetry.refusals()

    def stack_file(self, rank: int) -> Path:
        """Where process ``rank`` (of the current incarnation) writes stack dumps."""
        return self._profile / "log" / f"stacks-p{rank}-i{self._incarnation}.txt"

    def _engine_file(self) -> Path:
        return self._profile / "security" / "jaxsys-engine.json"

    async def _publish_engine_file(self, deadline: float) -> None:
        """Copy the controller's engine connection file once it is complete.

        The controller creates that file empty and fills it afterwards, so an engine that
        only waits for it to exist can read nothing. Engines wait for this copy instead,
        which appears atomically.
        """
        import json

        src = (
            Path(self._ipp.profile_dir)
            / "security"
            / f"ipcontroller-{self._ipp.cluster_id}-engine.json"
        )
        dst = self._engine_file()
        while True:
            try:
                text = src.read_text()
                json.loads(text)
                break
            except (OSError, ValueError):
                problem = self._controller_failure()
                if problem:
                    raise ClusterStartError(problem) from None
                if time.monotonic() > deadline:
                    raise ClusterStartError(
                        f"the controller did not write {src} within {self.register_timeout:g} s"
                    ) from None
                await asyncio.sleep(0.02)
        tmp = dst.with_suffix(".tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, dst)

    def _nanny_args(self) -> list[str]:
        # The nanny relays signals to remote engines. Local engines are signalled directly,
        # and starting a nanny costs each engine ~1 s of start-up on a busy machine.
        if self.launcher == "local":
            return ["--IPEngine.enable_nanny=False"]
        if self.launcher == "ssh":
            # No death signal reaches an engine started over ssh: when the kernel dies, the
            # controller goes with it and the engine leaves once its heartbeats stop.
            return [f"--IPEngine.max_heartbeat_misses={SSH_HEARTBEAT_MISSES}"]
        return []

    def _unregister(self, engine_ids: set[int]) -> None:
        """Tell the hub that these engines are gone, as a nanny would, freeing their ids."""
        import json

        import zmq

        if not engine_ids or self._ipp is None:
            return
        path = (
            Path(self._ipp.profile_dir)
            / "security"
            / f"ipcontroller-{self._ipp.cluster_id}-engine.json"
        )
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        from ipyparallel import util

        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 1000
        try:
            serverkey = info.get("curve_serverkey")
            util.connect(
                sock,
                f"{info['interface']}:{info['registration']}",
                curve_serverkey=serverkey.encode("ascii") if serverkey else None,
            )
            for eid in sorted(engine_ids):
                self.client.session.send(sock, "unregistration_request", content={"id": eid})
        finally:
            sock.close()

    def _launcher_failure(self, rank: int) -> str | None:
        es = self._engine_launcher(rank)
        if es is None:
            return None
        for sub in _sub_launchers(es):
            state = getattr(sub, "state", "running")
            if state == "after":
                code = (getattr(sub, "stop_data", None) or {}).get("exit_code")
                return f"exited with code {code} before it was ready; its output ends with:\n{_output_tail(sub)}"
        return None

    def _controller_failure(self) -> str | None:
        ctl = self._ipp.controller if self._ipp is not None else None
        if ctl is not None and getattr(ctl, "state", "") == "after":
            return f"the ipyparallel controller exited early; its output ends with:\n{_output_tail(ctl)}"
        return None

    def _engine_uuids(self) -> set[str]:
        return set(self.client._engines.values())

    async def _wait_registered(
        self, deadline: float, exclude: set[str], n: int | None = None
    ) -> list[int]:
        """Wait for ``n`` (all) engines whose uuids are not in ``exclude``; return their ids."""
        n = self.nprocs if n is None else n
        last = -1
        while True:
            # A restarted rank may get its old engine id back; only the uuid is new.
            new = sorted(
                eid for eid, uuid in dict(self.client._engines).items() if uuid not in exclude
            )
            k = len(new)
            if k != last:
                self._report("engines registered", min(k, n), n)
                last = k
            if k >= n:
                return new[:n]
            problem = self._controller_failure()
            if problem:
                raise ClusterStartError(problem)
            failed = {r: msg for r in self.ranks if (msg := self._launcher_failure(r))}
            if failed:
                raise ClusterStartError(
                    "\n".join(f"process {r} {msg}" for r, msg in sorted(failed.items()))
                )
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"only {k} of {n} engines registered within {self.register_timeout:g} s; "
                    f"the engine logs are in {self._profile}/log"
                )
            await asyncio.sleep(0.05)

    async def _identify(
        self, engine_ids: list[int], expected: Sequence[int] | None = None
    ) -> dict[int, dict]:
        ar = self.client[engine_ids].apply_async(bootstrap.describe_process)
        infos = await asyncio.wait_for(asyncio.wrap_future(ar), timeout=30)
        by_rank: dict[int, dict] = {}
        for eid, info in zip(engine_ids, infos, strict=True):
            info["engine_id"] = eid
            if info["rank"] in by_rank:
                raise ClusterStartError(
                    f"two engines claim process {info['rank']}: engines "
                    f"{by_rank[info['rank']]['engine_id']} and {eid}"
                )
            by_rank[info["rank"]] = info
        missing = sorted(set(self.ranks if expected is None else expected) - set(by_rank))
        if missing:
            raise ClusterStartError(f"no engine reported rank(s) {missing}")
        return by_rank

    async def _init_jax(self, deadline_s: float, ranks: Sequence[int] | None = None) -> None:
        n = self.nprocs
        ranks = self.ranks if ranks is None else list(ranks)
        p0 = self.processes[0]
        if self._early_coordinator:
            self.coordinator_address = bind = self._early_coordinator
        elif 0 not in ranks and self.coordinator_address:
            # A process rejoining the running world: same coordinator, nothing to bind.
            bind = None
        else:
            port = self.client[p0.engine_id].apply_sync(bootstrap.free_port)
            # Over ssh, the name that reached process 0's host is the one to give the others:
            # what that host says of itself may be a loopback alias (Debian's 127.0.1.1).
            host0 = _host_part(self.host_names[0]) if self.launcher == "ssh" else p0.address
            self.coordinator_address = f"{host0}:{port}"
            bind = f"[::]:{port}"
        ars = {
            p.rank: self.client[p.engine_id].apply_async(
                bootstrap.initialize,
                self.coordinator_address,
                n,
                p.rank,
                bind_address=bind,
                timeout=self.init_timeout,
                heartbeat_timeout=self.heartbeat_timeout,
            )
            for p in (self.processes[r] for r in ranks)
        }
        deadline = time.monotonic() + deadline_s
        started_at = time.time()
        last = -1
        first_error_at = None
        while True:
            done = [r for r, ar in ars.items() if ar.done()]
            errors = {r: ars[r].exception() for r in done if ars[r].exception() is not None}
            ok = [r for r in done if r not in errors]
            if len(ok) != last:
                self._report("processes initialised", len(ok), len(ranks))
                last = len(ok)
            if len(ok) == len(ranks):
                break
            if first_error_at is None and (
                errors or any(self._launcher_failure(r) for r in ranks if r not in done)
            ):
                first_error_at = time.monotonic()
            # Once one process has failed the others can only wait for it: give their
            # own errors a moment to arrive, then report everything at once.
            if (first_error_at is not None and time.monotonic() - first_error_at > 1.0) or (
                time.monotonic() > deadline
            ):
                lines = []
                for r in ranks:
                    if r in errors:
                        lines.append(f"process {r} raised {_short_error(errors[r])}")
                    elif r in ok:
                        lines.append(f"process {r} initialised")
                    else:
                        why = self._launcher_failure(r)
                        lines.append(
                            f"process {r} {why}" if why else f"process {r} did not finish joining"
                        )
                head = (
                    "jax.distributed.initialize failed"
                    if errors
                    else f"jax.distributed.initialize did not complete within {deadline_s:g} s"
                )
                lines.extend(self._refusals_since(started_at))
                raise ClusterStartError(head + ":\n" + "\n".join(lines))
            await asyncio.sleep(0.05)
        for r in ranks:
            result = ars[r].get()
            p = self.processes[r]
            p.devices = result["local_devices"]
            p.platform = result["platform"]
            p.state = "ready"

    async def _bring_up_engines(
        self, t_deadline: float, exclude: set[str], launched: bool = False
    ) -> None:
        if not launched:
            await self._launch_engines()
        # On a restart the hub may still list the killed engines for a moment.
        engine_ids = await self._wait_registered(t_deadline, exclude)
        infos = await self._identify(engine_ids)
        self.processes = [
            ProcessInfo(
                rank=r,
                engine_id=infos[r]["engine_id"],
                pid=infos[r]["pid"],
                host=infos[r]["host"],
                address=infos[r]["address"],
                nanny_pid=infos[r]["nanny_pid"],
            )
            for r in self.ranks
        ]
        await self._init_jax(self.init_timeout + 5)
        self.view = self.client[[p.engine_id for p in self.processes]]
        self.view.block = True

    async def _start(self) -> Cluster:
        if self.state != "stopped":
            raise ClusterError(f"the cluster is already {self.state}; stop it first")
        t0 = time.perf_counter()
        self.state = "starting"
        self.processes = [ProcessInfo(rank=r) for r in self.ranks]
        try:
            self._profile = make_profile()
            self._ipp = self._make_ipp_cluster()
            if self.secure:
                self.pki = self._make_pki()
            if self.telemetry_enabled:
                from ..telemetry.hub import TelemetryHub

                bind, advertise = telemetry_addresses(self.launcher, self.controller_ip)
                self.telemetry = TelemetryHub(
                    self.nprocs, bind=bind, curve=self.secure, advertise=advertise
                )
            await self._ipp.start_controller()
            deadline = time.monotonic() + self.register_timeout
            # Engines boot (Python, IPython, `import jax`) while the controller starts.
            await self._launch_engines()
            if self.launcher == "local":
                await self._publish_engine_file(deadline)
            if self.secure:
                _quiet_curve_signing_warning()
            self.client = await asyncio.wait_for(
                self._ipp.connect_client(), timeout=self.register_timeout
            )
            await self._bring_up_engines(deadline, exclude=set(), launched=True)
        except BaseException:
            self.kill()
            raise
        self.state = "ready"
        self.ready_seconds = time.perf_counter() - t0
        return self

    async def _restart(self) -> float:
        self._require_ready()
        t0 = time.perf_counter()
        old_launchers = [
            es for es in (self._engine_launcher(rank) for rank in self.ranks) if es is not None
        ]
        old_ids = {p.engine_id for p in self.processes}
        old_uuids = self._engine_uuids()
        old_sets = set(self._engine_sets.values())
        self.state = "restarting"
        for p in self.processes:
            p.state = "restarting"
        try:
            await asyncio.to_thread(self._kill_engines, old_launchers)
            if self.telemetry is not None:
                self.telemetry.reset()
            for set_id in old_sets:
                self._ipp.engines.pop(set_id, None)
            # Without this the hub frees the ids only after missed heartbeats, seconds later.
            self._unregister(old_ids & set(self.client.ids))
            deadline = time.monotonic() + 5.0
            while old_ids & set(self.client.ids) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await self._bring_up_engines(
                time.monotonic() + self.register_timeout, exclude=old_uuids
            )
        except BaseException:
            self.kill()
            raise
        self.state = "ready"
        self.ready_seconds = time.perf_counter() - t0
        return self.ready_seconds


class _CurveSigningFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Message signing is disabled")


_curve_filter = _CurveSigningFilter()


def _quiet_curve_signing_warning() -> None:
    # With CurveZMQ, ipyparallel gives its sessions an empty HMAC key (Curve authenticates
    # and encrypts instead), and jupyter_client then warns that signing is disabled: on a
    # secure cluster that warning says the opposite of the truth.
    from traitlets.log import get_logger

    logger = get_logger()
    if _curve_filter not in logger.filters:
        logger.addFilter(_curve_filter)


def pid_alive(pid: int | None) -> bool:
    """Whether a local process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - psutil races with the exit; alive is the safe answer
        return True


def _short_error(exc: BaseException) -> str:
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return f"{ename}: {evalue}"


def _sub_launchers(es) -> list:
    subs = getattr(es, "launchers", None)
    return list(subs.values()) if subs else [es]


def _check_launcher_options(launcher: str, options: Mapping[str, Any]) -> None:
    """Refuse names the launcher does not have: traitlets would ignore them silently."""
    from ipyparallel.cluster.launcher import find_launcher_class

    cls = find_launcher_class(launcher, "engine")
    known = set(cls.class_trait_names(config=True))
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"launcher_options: {', '.join(unknown)} is not a setting of ipyparallel's "
            f"{cls.__name__}; it has {', '.join(sorted(known))}"
        )


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
    if launcher == "local" and not controller_ip:
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.gethostname()


def _host_part(host: str) -> str:
    """``user@node7:2222`` -> ``node7``: what goes into a certificate."""
    return host.rpartition("@")[2].split(":")[0]


def _kill_over_ssh(engine_sets, timeout: float = 10.0) -> None:
    """SIGKILL every engine started over ssh, on its host, all hosts at once."""
    launchers = [
        sub
        for es in engine_sets
        for sub in _sub_launchers(es)
        if isinstance(getattr(sub, "pid", None), int) and sub.pid > 1
    ]

    def kill(sub) -> None:
        # The launcher would fetch the engine's log once it stopped; nobody reads it now,
        # and the host may be gone by then.
        sub._output = ""
        try:
            sub.ssh_sender.cmd_kill(sub.pid, signal.SIGKILL)
        except Exception:  # noqa: BLE001 - a host that cannot be reached keeps its engine
            pass

    threads = []
    for sub in launchers:
        t = threading.Thread(target=kill, args=(sub,), daemon=True)
        try:
            t.start()
        except RuntimeError:  # at interpreter exit no thread can start: one host at a time
            kill(sub)
        else:
            threads.append(t)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    # Each launcher keeps an ssh session open that waits for its engine; with the engine
    # gone it returns, and it must, before its host may go away under it.
    for sub in launchers:
        stop = getattr(sub, "_stop_waiting", None)
        if stop is not None:
            stop.set()
        waiter = getattr(sub, "_wait_thread", None)
        if waiter is not None:
            waiter.join(max(0.0, deadline - time.monotonic()))


def _launcher_pids(es) -> list[int]:
    pids = (getattr(sub, "pid", None) for sub in _sub_launchers(es))
    return [pid for pid in pids if isinstance(pid, int) and pid > 1]


def _killpg_all(pids: Sequence[int]) -> None:
    # Each launcher starts its process in a new session, so the pid is also the group id;
    # killing the group takes the controller's scheduler subprocesses with it.
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            # Not a group leader (e.g. a pid reported by the engine itself).
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        procs = alive
        if procs:
            time.sleep(0.02)


# -- progress ----------------------------------------------------------------------------

_bars: dict[str, Any] = {}


def _default_progress(event: ProgressEvent) -> None:
    from tqdm.std import tqdm

    bar = _bars.get(event.stage)
    if bar is None:
        _finish_progress()
        _bars[event.stage] = tqdm(
            total=event.total,
            initial=event.done,
            desc=event.stage,
            bar_format="{desc} {n}/{total} [{elapsed}]",
            mininterval=0,
        )
    elif bar.n != event.done:
        bar.n = event.done
        bar.refresh()


def _finish_progress() -> None:
    for stage in list(_bars):
        _bars.pop(stage).close()


# -- clean-up at exit ----------------------------------------------------------------------

_live_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()


@atexit.register
def _kill_all_at_exit() -> None:
    for cluster in list(_live_clusters):
        if cluster.state != "stopped":
            cluster.kill()
