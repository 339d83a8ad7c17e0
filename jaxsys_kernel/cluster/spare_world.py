"""A spare world: a whole next world of processes, already joined to JAX, swapped in at a restart.

The warm standby (:mod:`~jaxsys_kernel.cluster.standby`) keeps engines booted but not
joined: a world restart still waits for every one of them to join JAX. A spare world goes
one step further. Its processes are launched for every rank with the next incarnation's
environment and a coordinator of their own (a fresh port), and the kernel has them call
``jax.distributed.initialize`` among themselves as soon as they have registered. Being
fresh processes with a fresh coordination service, they share no gloo state with the
world in use, so no device set needs to be avoided. Then they run nothing.

A world restart kills the world in use and, when the spare world is ready, only swaps
which engines the kernel talks to (ranks, telemetry, view); the spare is refilled in the
background. When it is not ready (still joining, memory short, a process of it gone) the
restart takes today's path and the spare world is made again afterwards.

Its processes are launched without the telemetry hub's address, so that their heartbeats
do not mix with the world in use under the same ranks; they get it when swapped in. They
belong to the cluster's controller, so a teardown kills them with everything else, and
they carry the parent-death watch of every engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import psutil

from ..engine.ports import hold_port
from ..engine.registry import engine_module
from ..errors import ConfigError
from .launchers import EngineContext
from .launchers.registry import describe, names_where
from .records import ProcessInfo
from .standby import MEMORY_RESERVE_BYTES, Spare, per_engine_bytes
from .teardown import pid_alive, sub_launchers, unregister

log = logging.getLogger("jaxsys.cluster")

bootstrap = engine_module("bootstrap")
readiness = engine_module("readiness")
spare = engine_module("spare")

# Seconds the swapped-in processes get to take their settings and describe themselves.
SWAP_ASK_S = 10.0
# Seconds a spare process gets to finish its start-up imports once registered.
BOOT_WAIT_S = 120.0
_POLL_S = 0.05
# Where the spare world's engine ids start, relative to the standby's first id: clear of it.
_ID_OFFSET = 5


def for_launcher(config, launcher) -> SpareWorld:
    """The spare world a cluster keeps: on only when asked for (``config.spare_world``).

    Raises
    ------
    ConfigError
        When asked for on a launcher whose processes do not run on this machine one by one.
    """
    wanted = bool(getattr(config, "spare_world", False))
    if wanted and not (launcher.restarts_one_process and launcher.engine_pids_here):
        able = describe(names_where(lambda k: k.restarts_one_process and k.engine_pids_here))
        raise ConfigError(
            f"the {launcher.name} launcher cannot keep a spare world (it needs processes "
            f"started one by one on this machine: {able}); leave --spare-world off"
        )
    return SpareWorld(wanted)


class SpareWorld:
    """The next world of one cluster: its engines by rank, its coordinator and its state.

    ``state`` is ``off`` (not asked for, memory short, or the last attempt failed: see
    ``note``), ``filling`` (launched, joining) or ``ready``.

    Parameters
    ----------
    enabled : bool
        Whether the cluster keeps one.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.state = "off"
        self.note: str | None = None if enabled else "not asked for"
        self.engines: dict[int, Spare] = {}
        self.infos: dict[int, dict] = {}
        self.coordinator: str | None = None
        # Every id ever given to a spare engine (never taken for a rank's own engine).
        self.reserved: set[int] = set()
        # Whether the last world restart swapped the spare world in.
        self.last_swapped = False
        self._hold = None
        self._next_id: int | None = None
        # Bumped by every discard: a fill still joining notices it was dropped.
        self._generation = 0
        self._task: asyncio.Task | None = None

    # -- filling ---------------------------------------------------------------------------

    def wanted(self, world) -> bool:
        """Whether a refill would launch anything."""
        return self.enabled and not self.engines and world.ipp is not None

    def start_refill(self, world, lock: asyncio.Lock, ready: Callable[[], bool]) -> None:
        """Make the spare world again in the background (called on the cluster's loop);
        ``ready()`` says whether the cluster still runs when the refill gets the lock."""
        if self.wanted(world):
            self._task = asyncio.get_running_loop().create_task(self._refill(world, lock, ready))

    async def _refill(self, world, lock, ready) -> None:
        generation = self._generation
        try:
            # Ordered with restarts: launched only while no world is being replaced.
            async with lock:
                if not ready() or not self.wanted(world) or not self._memory_allows(world):
                    return
                await self._launch(world)
            await self._join(world, generation)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the spare world is an extra; the cluster runs on
            # Dropped meanwhile, or the cluster torn down (from another thread): nothing to say.
            if generation == self._generation and world.client is not None:
                await self.discard(world, note=f"the last one could not be made: {e}")
                log.warning("spare world: %s", self.note)

    def _memory_allows(self, world) -> bool:
        """Whether a whole world more fits in memory as the standby's size is judged."""
        nprocs = world.config.nprocs
        per = per_engine_bytes(world.launcher.local_engines(world.processes))
        available = psutil.virtual_memory().available
        if available - MEMORY_RESERVE_BYTES >= nprocs * per:
            return True
        self.state = "off"
        self.note = (
            f"memory is short: {available / 2**30:.1f} GB free, {nprocs} processes of about "
            f"{per / 2**20:.0f} MB each and {MEMORY_RESERVE_BYTES / 2**30:.0f} GB left for "
            "everything else do not fit; tried again at the next restart"
        )
        return False

    def _coordinator(self, world) -> str:
        """A fresh port for the spare world's coordinator, held until process 0 binds it."""
        self._release_port()
        host = world.config.addresses[0]
        try:
            self._hold = hold_port(host)
        except OSError:
            # An address of another network namespace (as for the launcher's own coordinator).
            self._hold = hold_port("127.0.0.1")
        return f"{host}:{self._hold.getsockname()[1]}"

    def _release_port(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.close()

    def _new_engine(self, world, rank: int) -> Spare:
        if self._next_id is None:
            self._next_id = _ID_OFFSET * 10 ** max(3, len(str(world.config.nprocs)))
        taken = set(world.client.ids) if world.client is not None else set()
        taken |= world.reserved_ids()
        while self._next_id in taken:
            self._next_id += 1
        eid = self._next_id
        self._next_id += 1
        self.reserved.add(eid)
        return Spare(rank=rank, engine_id=eid, set_id=f"spare-p{rank}-e{eid}")

    async def _launch(self, world) -> None:
        """Launch one engine per rank for the next incarnation, with their own coordinator."""
        self.state, self.note, self.infos = "filling", None, {}
        self.coordinator = self._coordinator(world)
        ctx = EngineContext(
            incarnation=world.incarnation + 1,
            coordinator=self.coordinator,
            profile=world.profile,
            pki=world.pki,
            telemetry=None,
        )
        ipp = world.ipp
        for rank in world.ranks:
            engine = self._new_engine(world, rank)
            await world.launcher.launch_rank(rank, engine.set_id, ctx, engine_id=engine.engine_id)
            self.engines[rank] = engine
            if world.ipp is not ipp:
                raise RuntimeError("the cluster was torn down while it was launched")

    async def _join(self, world, generation: int) -> None:
        """Wait for the spare engines to register and boot, then join them to their JAX world."""
        deadline = time.monotonic() + world.config.register_timeout
        ids = {e.engine_id for e in self.engines.values()}
        while not ids <= set(world.client.ids):
            self._check(world, generation, deadline, "register")
            await asyncio.sleep(_POLL_S)
        by_rank = {r: e.engine_id for r, e in self.engines.items()}
        # Joining starts JAX's initialisation timeout: first every process has its imports.
        deadline = time.monotonic() + BOOT_WAIT_S
        while True:
            told = await self._ask_all(world, by_rank, readiness.state, timeout=BOOT_WAIT_S)
            if all(isinstance(t, dict) and t.get("ready") is True for t in told.values()):
                break
            self._check(world, generation, deadline, "finish its imports")
            await asyncio.sleep(_POLL_S * 4)
        infos = await self._ask_all(world, by_rank, bootstrap.describe_process, timeout=30.0)
        for r, info in infos.items():
            if info.get("rank") != r:
                raise RuntimeError(f"the spare engine kept for process {r} reports {info!r:.80}")
        cfg = world.config
        joined = await asyncio.wait_for(
            asyncio.gather(
                *(
                    asyncio.wrap_future(
                        world.client[eid].apply_async(
                            bootstrap.initialize,
                            self.coordinator,
                            cfg.nprocs,
                            r,
                            bind_address=self.coordinator,
                            timeout=cfg.init_timeout,
                            heartbeat_timeout=cfg.heartbeat_timeout,
                        )
                    )
                    for r, eid in by_rank.items()
                )
            ),
            timeout=cfg.init_timeout + 5,
        )
        self._check(world, generation, None, "join")
        for (r, eid), result in zip(by_rank.items(), joined, strict=True):
            self.infos[r] = {**infos[r], "engine_id": eid, "joined": result}
        # Process 0 has bound the coordinator's port: the hold has done its work.
        self._release_port()
        self.state = "ready"

    def _check(self, world, generation: int, deadline: float | None, doing: str) -> None:
        if generation != self._generation or world.client is None:
            raise asyncio.CancelledError
        gone = sorted(r for r, e in self.engines.items() if _exited(world, e))
        if gone:
            raise RuntimeError(f"spare process {gone[0]} exited before it could {doing}")
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError(f"the spare processes did not {doing} within the deadline")

    @staticmethod
    async def _ask_all(world, by_rank: dict[int, int], fn, *args, timeout: float) -> dict:
        """Call ``fn(*args)`` on each engine of ``by_rank``; the answers by rank."""
        ars = {r: world.client[eid].apply_async(fn, *args) for r, eid in by_rank.items()}
        got = await asyncio.wait_for(
            asyncio.gather(*(asyncio.wrap_future(ar) for ar in ars.values())), timeout=timeout
        )
        return dict(zip(ars, got, strict=True))

    # -- swapping ----------------------------------------------------------------------------

    async def swap_in(self, world, make_view) -> bool:
        """Make the spare world the one the kernel talks to, if it is ready (after the world
        in use was killed). False (and the spare world dropped) when it is not: the caller
        then restarts the world as it would without one."""
        self.last_swapped = False
        if self.state != "ready" or not self._alive(world):
            if self.enabled:
                await self.discard(world, note=self._why_not_ready())
            return False
        incarnation = world.incarnation + 1
        ctx = EngineContext(
            incarnation=incarnation,
            coordinator=self.coordinator,
            profile=world.profile,
            pki=world.pki,
            telemetry=world.telemetry,
        )
        ars = {
            r: world.client[e.engine_id].apply_async(spare.swap_in, _swap_settings(world, r, ctx))
            for r, e in self.engines.items()
        }
        try:
            await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(ar) for ar in ars.values())), SWAP_ASK_S
            )
        except Exception as e:  # noqa: BLE001 - any failure means: restart without it
            await self.discard(world, note=f"the last swap failed: {e}")
            return False
        self._commit(world, incarnation)
        make_view(world)
        self.last_swapped = True
        return True

    def _why_not_ready(self) -> str | None:
        if self.state == "ready":
            return "a process of it was gone at the last restart"
        if self.state == "filling":
            return "it was still joining at the last restart"
        return self.note

    def _alive(self, world) -> bool:
        ids = set(world.client.ids) if world.client is not None else set()
        return bool(self.engines) and all(
            e.engine_id in ids and pid_alive(self.infos.get(r, {}).get("pid"))
            for r, e in self.engines.items()
        )

    def _commit(self, world, incarnation: int) -> None:
        """The world's records now describe the spare world's processes."""
        world.incarnation = incarnation
        # A new world: its processes have not been restarted alone yet (the views' ↻N).
        world.rank_restarts.clear()
        # A process restarted alone later rejoins this coordinator.
        world.early_coordinator = world.coordinator_address = self.coordinator
        processes = []
        for r in world.ranks:
            info, joined = self.infos[r], self.infos[r]["joined"]
            p = ProcessInfo.from_description(r, info)
            p.devices = joined["local_devices"]
            p.platform = joined["platform"]
            p.init_call = joined.get("call", {})
            p.init_settings = joined.get("settings", [])
            p.state = "ready"
            processes.append(p)
            world.launcher.engine_sets[r] = self.engines[r].set_id
        world.processes = processes
        if world.standby is not None:
            world.standby.last_taken = 0
        self.engines, self.infos = {}, {}
        self.state, self.note = "off", None

    # -- dropping ----------------------------------------------------------------------------

    async def discard(self, world, note: str | None = None) -> None:
        """Kill the spare world's processes (a stale or broken one) and forget them."""
        self._generation += 1
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        engines, self.engines, self.infos = self.engines, {}, {}
        self._release_port()
        self.state, self.note = "off", note
        ipp = world.ipp
        if not engines or ipp is None:
            return
        sets = [ipp.engines.get(e.set_id) for e in engines.values()]
        await asyncio.to_thread(world.launcher.kill_engines, [s for s in sets if s is not None])
        for e in engines.values():
            ipp.engines.pop(e.set_id, None)
        if world.client is not None:
            await unregister(world, {e.engine_id for e in engines.values()})

    def forget(self) -> None:
        """After a teardown (which killed its processes with the rest): keep nothing."""
        self._generation += 1
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(RuntimeError):
                # The loop may be another thread's: a teardown runs from any thread.
                task.get_loop().call_soon_threadsafe(task.cancel)
        self.engines, self.infos = {}, {}
        self._release_port()
        self.state = "off"

    # -- what the user sees ------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The pids of the spare world's joined processes."""
        return sorted(i["pid"] for i in self.infos.values() if isinstance(i.get("pid"), int))

    def line(self) -> str:
        """``%jaxsys status``'s line on the spare world."""
        if not self.enabled:
            return "spare world: off (%jaxsys start --spare-world keeps one joined for restarts)"
        if self.state == "ready":
            pids = self.pids()
            return f"spare world: ready, {len(pids)} processes joined (pids {_pid_list(pids)})"
        if self.state == "filling":
            return f"spare world: refilling, {len(self.engines)} processes launched, joining"
        return "spare world: off" + (f"; {self.note}" if self.note else "")


def _swap_settings(world, rank: int, ctx: EngineContext) -> dict[str, str]:
    """What a spare process is told when swapped in: its incarnation's variables and where
    its telemetry goes."""
    settings = dict(world.launcher.takeover_settings(rank, ctx))
    if ctx.telemetry is not None:
        settings.update(ctx.telemetry.env())
    return settings


def _exited(world, engine: Spare) -> bool:
    ipp = world.ipp
    es = ipp.engines.get(engine.set_id) if ipp is not None else None
    return es is None or any(getattr(s, "state", "") == "after" for s in sub_launchers(es))


def _pid_list(pids: list[int], shown: int = 8) -> str:
    text = ", ".join(str(p) for p in pids[:shown])
    return text + (f" and {len(pids) - shown} more" if len(pids) > shown else "")


def status_line(cluster) -> str | None:
    """The spare world's line for ``%jaxsys status`` (None: the cluster has never started)."""
    spare_world = getattr(getattr(cluster, "world", None), "spare_world", None)
    return spare_world.line() if spare_world is not None else None


def restart_note(cluster) -> str:
    """What ``%jaxsys restart`` adds to its line when the spare world was swapped in."""
    spare_world = getattr(getattr(cluster, "world", None), "spare_world", None)
    return " (the spare world, swapped in)" if getattr(spare_world, "last_swapped", False) else ""
