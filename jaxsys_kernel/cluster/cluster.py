"""A cluster of JAX processes: one ipyparallel engine per host, process i = engine of rank i.

:class:`Cluster` is the facade; the work is done by its parts: ``config`` (the options,
validated), ``launchers`` (where engines run and how they are reached), ``bringup``
(registration and JAX initialisation), ``teardown``, ``security`` and ``loop`` (the private
event-loop thread and the generated ``*_sync`` twins).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import bringup, reply_limit, security, spare_world, standby, teardown
from .calls import Calls, EngineCalls
from .config import ClusterConfig
from .launchers import make_launcher, telemetry_addresses
from .launchers.registry import describe, names_where
from .loop import AsyncFirst
from .processes import ProcessControl
from .profile import controller_file
from .records import ClusterError, ClusterStartError, ProcessInfo, ProgressEvent
from .security import ROTATION_POLL_S, ClusterSecurity
from .teardown import pid_alive
from .world import World

log = logging.getLogger("jaxsys.cluster")

__all__ = [
    "Calls",
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ClusterStartError",
    "ProcessInfo",
    "ProgressEvent",
    "pid_alive",
    "telemetry_addresses",
]


def _from_config(name: str, doc: str | None = None) -> property:
    # An option's help is the one ClusterConfig declares; only derived values bring their own.
    if doc is None:
        doc = ClusterConfig.__dataclass_fields__[name].metadata["help"]
    return property(lambda self: getattr(self.config, name), doc=doc)


def _from_world(name: str, doc: str) -> property:
    # Read-only: only bring-up and teardown change the world.
    return property(lambda self: getattr(self.world, name), doc=doc)


class Cluster(EngineCalls, ProcessControl, ClusterSecurity, AsyncFirst):
    """N JAX processes, each an ipyparallel engine, driven from one Python process.

    The cluster is async-first: every coroutine method has a ``*_sync`` twin. Both run the
    work on a private event-loop thread that lives as long as the cluster object, because
    engines die with the thread that launched them (see ``profile.py``).

    Parameters
    ----------
    hosts, devices_per_host, launcher, **options
        The cluster's options by name: :class:`~jaxsys_kernel.cluster.config.ClusterConfig`
        declares each one once, with its type, default, meaning and command-line flag.
        A name it does not declare is a ``TypeError`` that names the known ones.
    config : ClusterConfig, optional
        Options made before, e.g. ``ClusterConfig.from_file(path)``; options given as well
        replace its own.
    progress : callable, optional
        Called with a :class:`ProgressEvent` for every step of a long wait, on the thread
        that called the method. Defaults to a progress line on stdout.

    Examples
    --------
    >>> with Cluster(hosts=2, devices_per_host=2) as cluster:      # doctest: +SKIP
    ...     cluster.view.apply_sync(lambda: __import__("jax").device_count())
    [4, 4]
    """

    def __init__(
        self,
        hosts: int | Sequence[str] | None = None,
        devices_per_host: int | None = None,
        launcher: str | None = None,
        *,
        config: ClusterConfig | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
        **options: Any,
    ):
        super().__init__(progress)
        leading = {"hosts": hosts, "devices_per_host": devices_per_host, "launcher": launcher}
        given = {k: v for k, v in leading.items() if v is not None}
        self.config = ClusterConfig.of(config, {**given, **options}, "Cluster")
        # Chosen once: nothing else asks which kind of launcher this is.
        self._launcher = make_launcher(self.config)
        # Everything bring-up fills in and teardown empties.
        self.world = World(self.config, self._launcher, report=self._report)
        self.state = "stopped"
        # Set while no teardown runs: a cell that finds the cluster "stopping" (the sidebar's
        # Stop runs on another thread) waits for it instead of taking dying processes.
        self._stopped = threading.Event()
        self._stopped.set()
        self._kill_lock = threading.RLock()
        self.ready_seconds: float | None = None
        self._ops: asyncio.Lock | None = None
        self.rotation_poll = ROTATION_POLL_S
        self._rotation = security.RotationWatch(lambda: self.rotation_poll)
        teardown.track(self)

    # What the world holds, read through the facade.
    processes = _from_world("processes", "One ProcessInfo per rank.")
    client = _from_world("client", "ipyparallel's client, while the cluster runs.")
    view = _from_world("view", "A blocking view on every engine, in rank order.")
    pki = _from_world("pki", "The cluster's certificates (mTLS), or None.")
    telemetry = _from_world("telemetry", "The telemetry hub, or None.")
    coordinator_address = _from_world("coordinator_address", "The coordination service.")

    # The options read through the facade, read-only; every other one is on ``config``.
    nprocs = _from_config("nprocs", "Number of JAX processes.")
    devices_per_host = _from_config("devices_per_host")
    launcher = _from_config("launcher")
    cache_dir = _from_config("cache_dir")
    register_timeout = _from_config("register_timeout")
    env = _from_config("env")
    heartbeat_timeout = _from_config("heartbeat_timeout")
    recoverable = _from_config("recoverable")
    secure = _from_config("secure")
    telemetry_enabled = _from_config("telemetry")
    ca_file = _from_config("ca_file")

    @property
    def _ipp(self):
        # ipyparallel's Cluster (controller and engine launchers), or None when stopped.
        return self.world.ipp

    @property
    def connection_file(self) -> Path | None:
        """The controller's client connection file (for ``ipyparallel.Client``), while running."""
        ipp = self.world.ipp
        return None if ipp is None else controller_file(ipp.profile_dir, ipp.cluster_id, "client")

    @property
    def ranks(self) -> list[int]:
        """All process indices, ``0..N-1``."""
        return self.config.ranks

    # -- lifecycle -------------------------------------------------------------------------

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
        async with self._one_operation():
            return await self._start()

    async def _start(self) -> Cluster:
        if self.state != "stopped":
            raise ClusterError(f"the cluster is already {self.state}; stop it first")
        world = self.world
        # Refused before anything starts: a launcher that cannot keep the standby asked for.
        world.standby = standby.for_launcher(self.config, self._launcher)
        world.spare_world = spare_world.for_launcher(self.config, self._launcher)
        t0 = time.perf_counter()
        self.state = "starting"
        world.processes = [ProcessInfo(rank=r) for r in self.ranks]
        try:
            await bringup.start_services(world)
            # Engines boot (Python, IPython, `import jax`) while the controller starts.
            # The registration clock starts once they are launched: a scheduler's job
            # may first wait in its queue for as long as the scheduler decides.
            await self._launch_engines()
            deadline = time.monotonic() + self.register_timeout
            if self._launcher.uses_engine_file_copy:
                await bringup.publish_engine_file(world, deadline)
            if self.secure:
                security.quiet_curve_signing_warning()
            # The controller answers the client's first request within what is left of the
            # registration time (ipyparallel's own 10 s is missed on a loaded machine).
            answer_s = max(10.0, deadline - time.monotonic())
            world.client = await asyncio.wait_for(
                reply_limit.connect_client(
                    world.ipp, lambda: teardown.controller_ended(world), timeout=answer_s
                ),
                timeout=self.register_timeout,
            )
            await bringup.bring_up_engines(world, deadline, exclude=set())
        except BaseException:
            self.kill()
            raise
        self.state = "ready"
        self.ready_seconds = time.perf_counter() - t0
        self._refill_standby()
        self._refill_spare_world()
        return self

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
        # Teardown is safe from any thread; it needs no loop, and must work when the
        # loop itself is stuck.
        return self.kill()

    async def restart(self) -> float:
        """Restart the whole JAX world: every process is replaced and re-initialised.

        Returns
        -------
        float
            Seconds from the request until the new world is ready.
        """
        async with self._one_operation():
            return await self._restart()

    async def _restart(self) -> float:
        self._require_ready()
        t0 = time.perf_counter()
        old_uuids = bringup.engine_uuids(self.world)
        self.state = "restarting"
        for p in self.processes:
            p.state = "restarting"
        world = self.world
        try:
            await teardown.kill_world(world)
            # A spare world already joined is only swapped in; otherwise as without one.
            if not await world.spare_world.swap_in(world, bringup.make_view):
                spares = await world.standby.take(world, world.ranks, self._report)
                await self._launch_engines(skip=set(spares))
                deadline = time.monotonic() + self.register_timeout
                await bringup.bring_up_engines(world, deadline, exclude=old_uuids, spares=spares)
        except BaseException:
            self.kill()
            raise
        self.state = "ready"
        self.ready_seconds = time.perf_counter() - t0
        self._refill_standby()
        self._refill_spare_world()
        return self.ready_seconds

    async def restart_process(self, rank: int) -> float:
        """Replace one dead (or live) process and let it rejoin the running JAX world.

        Needs a recoverable cluster (the default) and the local launcher. Process 0 hosts
        JAX's coordination service, which ends with it, so it cannot rejoin: restart the world.
        After a rejoin, collectives must use a device set that was never used before
        (on CPU, gloo keeps communicators of the old incarnation for the old sets).

        Returns
        -------
        float
            Seconds until the new process had joined.
        """
        async with self._one_operation():
            return await self._restart_process(rank)

    async def _restart_process(self, rank: int) -> float:
        self._check_rank_restart(rank)
        t0 = time.perf_counter()
        p = self.processes[rank]
        await asyncio.to_thread(self._launcher.kill_rank, rank, p)
        p.state = "restarting"
        world = self.world
        await teardown.unregister(world, {p.engine_id})
        self._launcher.forget_rank(rank)
        world.rank_restarts[rank] = world.rank_restarts.get(rank, 0) + 1
        old_uuids = bringup.engine_uuids(world)
        spare = (await world.standby.take(world, [rank], self._report)).get(rank)
        if spare is None:
            set_id = f"p{rank}-i{world.incarnation}-r{world.rank_restarts[rank]}"
            await self._launcher.launch_rank(rank, set_id, world.engine_context())
        await bringup.bring_up_rank(world, rank, old_uuids, spare=spare)
        self._refill_standby()
        return time.perf_counter() - t0

    def kill(self) -> float:
        """Tear the cluster down at once: SIGKILL every process group, close the client.

        Engines ignore SIGTERM once JAX is initialised, so a polite stop only adds seconds.
        Safe to call from any thread, more than once, and from ``atexit``. While it runs,
        ``state`` is ``"stopping"``.

        Returns
        -------
        float
            Seconds the teardown took.
        """
        with self._kill_lock:
            self._stopped.clear()
            self.state = "stopping"
            try:
                self._rotation.stop()
                took = teardown.kill(self.world)
                if self.world.standby is not None:
                    # Its engines belonged to the controller and went with it.
                    self.world.standby.forget()
                if self.world.spare_world is not None:
                    self.world.spare_world.forget()
            finally:
                self.state = "stopped"
                self._stopped.set()
        # No process is left for the loop thread to keep alive (see loop.py).
        self._end_loop_when_idle()
        return took

    def wait_stopped(self, timeout: float) -> bool:
        """Wait until no teardown runs (``state`` is no longer ``"stopping"``).

        Parameters
        ----------
        timeout : float
            Seconds to wait at most.

        Returns
        -------
        bool
            Whether the teardown had ended within ``timeout``.
        """
        return self._stopped.wait(timeout)

    def __enter__(self) -> Cluster:
        return self.start_sync()

    def __exit__(self, *exc) -> None:
        self.stop_sync()

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- internals -------------------------------------------------------------------------

    def _require_ready(self) -> None:
        if self.state != "ready" or self.client is None:
            raise ClusterError("the cluster is not running; start it first")

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.nprocs:
            raise ClusterError(f"there is no process {rank}; this cluster has 0-{self.nprocs - 1}")

    def _check_rank_restart(self, rank: int) -> None:
        self._require_ready()
        self._check_rank(rank)
        if rank == 0:
            raise ClusterError(
                "process 0 hosts JAX's coordination service, which every other process is "
                "connected to and which ends with it on any platform, so it cannot rejoin: "
                "restart the whole world (%jaxsys restart)"
            )
        if not self.recoverable:
            raise ClusterError(
                "this cluster runs without recoverability, so a single process cannot rejoin: "
                "restart the whole world"
            )
        if not self._launcher.restarts_one_process:
            able = describe(names_where(lambda k: k.restarts_one_process))
            raise ClusterError(
                f"the {self.launcher} launcher cannot restart a single process (that needs "
                f"{able}): restart the whole world"
            )

    def _after_call(self) -> None:
        # A start that failed tore the cluster down on the loop itself, where the loop
        # could not end: it ends now that the start is over.
        if self.state == "stopped":
            self._end_loop_when_idle()

    def _loop_ended(self) -> None:
        # Made on the loop that ends: a later start makes its own on the next loop.
        self._ops = None

    def _one_operation(self) -> asyncio.Lock:
        """The lock that orders start and restarts: a restart clicked in the sidebar (on
        the control subshell) while the main thread restarts the world waits for it. Every
        operation runs on the cluster's own loop, so an asyncio lock made there suffices."""
        if self._ops is None:
            self._ops = asyncio.Lock()
        return self._ops

    async def _launch_engines(self, skip: set[int] = frozenset()) -> None:
        """Launch a new incarnation of every rank but those in ``skip`` (which standby
        engines take over)."""
        world = self.world
        world.incarnation += 1
        # A new world: its processes have not been restarted alone yet (the views' ↻N).
        world.rank_restarts.clear()
        # Local engines learn the coordinator at launch and join while they register;
        # remote ones learn it afterwards, from rank 0's host.
        world.early_coordinator = self._launcher.early_coordinator()
        if not skip:
            await self._launcher.launch(world.engine_context(), self._report)
            return
        for rank in (r for r in world.ranks if r not in skip):
            await self._launcher.launch_rank(
                rank, f"p{rank}-i{world.incarnation}", world.engine_context()
            )

    # -- the standby ------------------------------------------------------------------------

    def _refill_standby(self) -> None:
        """Top the standby up in the background (called on the cluster's loop)."""
        # Those that went with the last world (its pods were made anew) are made again.
        self.world.standby.drop_dead(self.world)
        if self.world.standby.decide_size(self.world) and self.world.standby.wanted():
            # Kept, so that the task is not collected while it runs.
            self._refill_task = asyncio.get_running_loop().create_task(self._fill_standby())

    async def _fill_standby(self) -> None:
        try:
            # Ordered with restarts: a refill never launches while a world is replaced.
            async with self._one_operation():
                if self.state == "ready":
                    await self.world.standby.fill(self.world)
        except Exception as e:  # noqa: BLE001 - a standby is an extra; the cluster runs on
            self.world.standby.note = f"the standby could not be refilled: {e}"
            log.warning("%s", self.world.standby.note)

    def _refill_spare_world(self) -> None:
        """Make the spare world again in the background (called on the cluster's loop)."""
        self.world.spare_world.start_refill(
            self.world, self._one_operation(), lambda: self.state == "ready"
        )

    def standby_status(self) -> dict:
        """The standby: ``size``, ``ready``, ``booting`` and a ``note`` (why it is smaller)."""
        if self.world.standby is None:
            return {"size": 0, "ready": 0, "booting": 0, "taken": 0, "note": None}
        return self.world.standby.describe(self.world)
