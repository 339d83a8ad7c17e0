"""Warm standby: engines booted ahead of need, swapped in when the world or one process restarts.

A standby engine is launched for one rank with that rank's environment (its certificate, its
placement, its device count) but no coordinator, so it starts Python, IPython and
ipyparallel, imports JAX, registers with the controller under an engine id of its own, and
then sits idle in ipyparallel's event loop. A restart tells it which incarnation it joins
(``bootstrap.take_over``) and initialises JAX on it like on any other engine: the
interpreter's start, the imports and the registration are already behind it.

The standby is refilled in the background after every restart. Its engines belong to the
cluster's controller, so a teardown kills them with everything else, and they carry the
same parent-death watch as the world's engines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from ..engine.registry import engine_module
from ..errors import ConfigError
from .bringup import controller_failure
from .launchers.registry import describe, names_where
from .teardown import pid_alive, sub_launchers


def standby_size(value: int | None, variable: str) -> int | None:
    """The standby size asked for: ``value``, else the environment's ``variable``, else None
    (the launcher's default); checked to be a whole number of 0 or more."""
    if value is None:
        raw = os.environ.get(variable, "").strip()
        if not raw:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(
                f"${variable}={raw!r} is not a whole number of processes; "
                "set it to e.g. 2, 0 for no standby, or unset it for the default"
            ) from None
        if value < 0:
            raise ConfigError(f"${variable}={raw!r} must be 0 or more processes")
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"standby must be a whole number of processes, got {value!r}")
    elif value < 0:
        raise ConfigError(f"standby must be 0 or more processes, got {value}")
    return value


log = logging.getLogger("jaxsys.cluster")

# What an idle engine with JAX imported holds here (measured: about 250 MB), used until the
# cluster's own processes can be measured.
PER_ENGINE_BYTES = 250 * 2**20
# Memory left to everything else (the kernel, Lab, the cells' own arrays) when sizing it.
MEMORY_RESERVE_BYTES = 2 * 2**30
# How long a restart waits for standby engines that are still booting before it boots the
# rest itself: they were started earlier than anything it could start now.
BOOTING_WAIT_S = 20.0
_POLL_S = 0.05
# How long one question "have your imports finished?" may wait on a standby engine.
BOOTED_ASK_S = 60.0

bootstrap = engine_module("bootstrap")


@dataclass(frozen=True)
class Spare:
    """One standby engine: the rank it was booted for, its engine id and its engine set."""

    rank: int
    engine_id: int
    set_id: str


def automatic_size(nprocs: int, available: int, per_engine: int) -> tuple[int, str | None]:
    """How many standby engines fit in ``available`` bytes, at most one world's worth.

    Returns
    -------
    tuple
        The size, and a sentence saying why it is less than ``nprocs`` (None when it is not).
    """
    fits = max(0, (available - MEMORY_RESERVE_BYTES) // max(1, per_engine))
    size = int(min(nprocs, fits))
    if size == nprocs:
        return size, None
    return size, (
        f"standby holds {size} of {nprocs} processes: {available / 2**30:.1f} GB of memory is "
        f"free and each idle process takes about {per_engine / 2**20:.0f} MB "
        f"({MEMORY_RESERVE_BYTES / 2**30:.0f} GB is left for everything else)"
    )


def check_requested(requested: int | None, launcher_name: str, able: bool, name_able: str) -> None:
    """Refuse a standby the launcher cannot keep.

    Raises
    ------
    ConfigError
        For a negative size, or any standby on a launcher that starts all ranks as one job.
    """
    if requested is None:
        return
    if requested < 0:
        raise ConfigError(f"standby must be 0 or more processes, got {requested}")
    if requested and not able:
        raise ConfigError(
            f"the {launcher_name} launcher starts every process as one job, so it cannot keep "
            f"standby processes (that needs {name_able}); leave --standby unset or 0"
        )


def for_launcher(config, launcher) -> Standby:
    """The standby a cluster keeps: as requested (``config.standby``), or by default one
    world's worth where the launcher starts processes one by one and keeps one by default.

    Raises
    ------
    ConfigError
        When a standby is requested from a launcher that cannot keep one.
    """
    requested = getattr(config, "standby", None)
    able = launcher.restarts_one_process or launcher.standby_whole_world
    check_requested(
        requested,
        launcher.name,
        able,
        describe(names_where(lambda k: k.restarts_one_process or k.standby_whole_world)),
    )
    return Standby(requested, by_default=able and launcher.standby_by_default)


def _first_id(nprocs: int) -> int:
    """The first engine id standby engines ask for: clear of every rank's own id."""
    return 10 ** max(3, len(str(nprocs)))


class Standby:
    """The standby engines of one cluster, by the rank each was booted for.

    Parameters
    ----------
    requested : int or None
        Processes to keep; None decides from the launcher and this machine's memory.
    by_default : bool
        Whether the launcher keeps a standby when none is requested (local clusters do).
    """

    def __init__(self, requested: int | None, by_default: bool):
        self.requested = requested
        self.by_default = by_default
        self.size: int | None = None
        self.note: str | None = None
        self.spares: dict[int, Spare] = {}
        # How many ranks the last restart took from the standby.
        self.last_taken = 0
        # Every id ever given to a standby engine: one that registers late is never taken
        # for an engine the cluster launched for a rank.
        self.reserved: set[int] = set()
        self._next_id: int | None = None
        # Per standby engine id, its answer to "have your imports finished?".
        self._booted: dict[int, object] = {}

    # -- size ------------------------------------------------------------------------------

    def decide_size(self, world) -> int:
        """Fix the size once, when the world first runs (its processes are then measurable)."""
        if self.size is not None:
            return self.size
        nprocs = world.config.nprocs
        whole = world.launcher.standby_whole_world
        if whole and (self.requested or (self.requested is None and self.by_default)):
            # Taken whole or not at all: fewer than the world would never be taken. Each
            # host holds its own, so this machine's memory does not size it.
            self.size = nprocs
            if self.requested and self.requested != nprocs:
                self.note = f"one standby process per pod: {nprocs}, not {self.requested}"
        elif self.requested is not None:
            self.size = min(self.requested, nprocs)
        elif not self.by_default:
            self.size = 0
        else:
            measured = world.processes if world.launcher.engine_pids_here else []
            self.size, self.note = automatic_size(
                nprocs, psutil.virtual_memory().available, per_engine_bytes(measured)
            )
        return self.size

    def wanted(self) -> bool:
        """Whether a refill would launch anything."""
        return bool(self.size) and len(self.spares) < self.size

    # -- filling ---------------------------------------------------------------------------

    async def fill(self, world) -> int:
        """Launch a standby engine for every rank (lowest first) that has none; returns how
        many were launched. Does not wait for them to boot."""
        size = self.decide_size(world)
        launched = 0
        for rank in world.ranks[:size]:
            ipp = world.ipp
            if rank in self.spares or ipp is None:
                continue
            spare = self._new_spare(world, rank)
            await world.launcher.launch_rank(
                rank, spare.set_id, world.standby_context(), engine_id=spare.engine_id
            )
            if world.ipp is not ipp:
                # Torn down while launching: this engine was not in the teardown's census.
                await asyncio.to_thread(_kill_sets, world.launcher, [ipp.engines.get(spare.set_id)])
                return launched
            self.spares[rank] = spare
            launched += 1
        if launched:
            await world.launcher.standby_launched()
        return launched

    def _new_spare(self, world, rank: int) -> Spare:
        if self._next_id is None:
            self._next_id = _first_id(world.config.nprocs)
        taken = set(world.client.ids) if world.client is not None else set()
        # Clear of the spare world's ids too (world.reserved_ids holds both).
        taken |= world.reserved_ids()
        while self._next_id in taken or self._next_id in self.reserved:
            self._next_id += 1
        eid = self._next_id
        self._next_id += 1
        self.reserved.add(eid)
        return Spare(rank=rank, engine_id=eid, set_id=f"standby-p{rank}-e{eid}")

    # -- taking ----------------------------------------------------------------------------

    def registered(self, world) -> set[int]:
        """Ranks whose standby engine is ready: registered with the controller, and done
        with its start-up imports (``import jax`` goes on after the registration)."""
        ids = set(world.client.ids) if world.client is not None else set()
        ready = set()
        for r, s in self.spares.items():
            if s.engine_id not in ids:
                continue
            answer = self._booted.get(s.engine_id)
            if answer is None:
                # Asked once; the engine answers when its imports are done.
                answer = world.client[s.engine_id].apply_async(bootstrap.wait_booted, BOOTED_ASK_S)
                self._booted[s.engine_id] = answer
            if not answer.done():
                continue
            if answer.exception() is None and answer.result():
                ready.add(r)
            else:
                # Not booted within the question's wait (or it failed): ask again later.
                del self._booted[s.engine_id]
        return ready

    def drop_dead(self, world) -> None:
        """Forget standby engines whose process has exited (killed from outside, or failed)."""
        ipp = world.ipp
        for rank, spare in list(self.spares.items()):
            if world.launcher.standby_gone(spare.set_id, rank):
                del self.spares[rank]
                self._booted.pop(spare.engine_id, None)
                if ipp is not None:
                    ipp.engines.pop(spare.set_id, None)

    async def take(
        self,
        world,
        ranks: Iterable[int],
        report: Callable[[str, int, int], None],
        wait_s: float = BOOTING_WAIT_S,
    ) -> dict[int, Spare]:
        """Hand over the standby engines of ``ranks`` that are registered, first waiting (at
        most ``wait_s``) for those still booting; they leave the standby."""
        ranks = list(ranks)
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            self.drop_dead(world)
            have = [r for r in ranks if r in self.spares]
            ready = self.registered(world) & set(have)
            # Without a controller a booting engine can never register: nothing to wait for.
            done = (
                len(ready) == len(have)
                or time.monotonic() > deadline
                or controller_failure(world) is not None
            )
            if waited or not done:
                # Shown only when there is something to wait for.
                report("standby processes ready", len(ready), len(have))
                waited = True
            if done and world.launcher.standby_whole_world and len(ready) < len(ranks):
                # Such a launcher starts the rest only as a whole world: all, or none of it.
                ready = set()
            if done:
                self.last_taken = len(ready)
                taken = {r: self.spares.pop(r) for r in sorted(ready)}
                for spare in taken.values():
                    self._booted.pop(spare.engine_id, None)
                return taken
            await asyncio.sleep(_POLL_S)

    def forget(self) -> None:
        """After a teardown (which killed them with the rest): keep nothing."""
        self.spares.clear()
        self._booted.clear()

    # -- what the user sees ----------------------------------------------------------------

    def describe(self, world) -> dict:
        """``size``, ``ready`` (registered), ``booting`` and ``note``, for ``%jaxsys status``."""
        ready = len(self.registered(world)) if self.spares else 0
        return {
            "size": self.size or 0,
            "ready": ready,
            "booting": len(self.spares) - ready,
            "taken": self.last_taken,
            "note": self.note,
        }

    def pids(self, world) -> list[int]:
        """The pids of the standby engines on this machine: as the ready ones report them
        (a forked engine is not its launcher's process), else their launchers' processes."""
        self.registered(world)
        ipp = world.ipp
        pids = []
        for spare in self.spares.values():
            answer = self._booted.get(spare.engine_id)
            if answer is not None and answer.done() and answer.exception() is None:
                if answer.result() and pid_alive(answer.result()):
                    pids.append(answer.result())
                    continue
            es = ipp.engines.get(spare.set_id) if ipp is not None else None
            for sub in sub_launchers(es) if es is not None else ():
                pid = getattr(sub, "pid", None)
                if isinstance(pid, int) and pid > 1 and pid_alive(pid):
                    pids.append(pid)
        return pids


def status_line(status: dict) -> str:
    """``%jaxsys status``'s line on the standby (from :meth:`Standby.describe`)."""
    size = status["size"]
    if not size:
        line = "standby: none (%jaxsys start --standby N keeps N processes booted for restarts)"
    elif status["booting"]:
        line = f"standby: {status['ready']} of {size} processes ready, {status['booting']} booting"
    else:
        line = f"standby: {status['ready']} of {size} processes ready for a restart"
    return line + (f"; {status['note']}" if status.get("note") else "")


def per_engine_bytes(processes) -> int:
    """The mean resident memory of the cluster's processes on this machine, or the
    measured figure for an idle engine when they cannot be read."""
    sizes = []
    for p in processes:
        if not p.pid:
            continue
        try:
            sizes.append(psutil.Process(p.pid).memory_info().rss)
        except (psutil.Error, OSError):
            pass
    return int(sum(sizes) / len(sizes)) if sizes else PER_ENGINE_BYTES


def _kill_sets(launcher, engine_sets) -> None:
    launcher.kill_engines([es for es in engine_sets if es is not None])
