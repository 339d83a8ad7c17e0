"""Taking a cluster down: the census of what it started, SIGKILL for all of it, the hub told
of engines that are gone, and a last sweep at interpreter exit.

A polite stop is pointless: after ``jax.distributed.initialize`` engines swallow SIGTERM,
and ipyparallel's own stop then waits 5 s, while jupyter_client kills a kernel 2.5 s after
``shutdown_request``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence

import psutil
import zmq

from .. import _compat
from . import reply_limit
from .pids import pid_alive as pid_alive  # the cluster's modules import it from here
from .profile import controller_file, keep_logs, remove_profile

# After a kill, how long teardown waits for the local processes to be gone.
KILL_WAIT_S = 3.0
# How long the hub gets to drop unregistered engines from its list.
UNREGISTER_WAIT_S = 5.0
# How long the old engines' nannies get to tell the hub of their engines' deaths (a second or
# two on a loaded machine) before the ids are freed without them.
NANNY_WAIT_S = 5.0


# -- processes on this machine -----------------------------------------------------------

# How far two readings of one process's start time may differ (psutil derives it from
# clock ticks since boot, so readings of one process agree to within a tick).
START_TIME_TOLERANCE_S = 0.05


def start_time(pid: int | None) -> float | None:
    """When a local process started (seconds since the epoch), or None if there is none."""
    if not pid:
        return None
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def still_ours(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` may be signalled as the process the cluster started.

    A pid that no process holds is safe: Linux does not hand out an id again while a
    process group or session still uses it, so its group, if one is left, is the
    original's. A pid that a process holds must be that process: the one that started at
    ``started`` (as it reported at registration), or, with no start time, a child of this
    process (the launchers' processes, the controller).
    """
    try:
        proc = psutil.Process(pid)
        if started is not None:
            return abs(proc.create_time() - started) < START_TIME_TOLERANCE_S
        return proc.ppid() == os.getpid()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        # Another user's process (access denied): not ours.
        return False


def killpg_all(pids: Sequence[int], started: Mapping[int, float | None] | None = None) -> None:
    """SIGKILL each pid's process group, or the process alone if it leads none.

    ``started`` gives the start time of the pids that are not this process's children
    (engines); a pid that now belongs to another process is left alone (see
    :func:`still_ours`).
    """
    # Each launcher starts its process in a new session, so the pid is also the group id;
    # killing the group takes the controller's scheduler subprocesses with it, and an
    # engine's group takes what its cells started.
    started = started or {}
    for pid in pids:
        if not still_ours(pid, started.get(pid)):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            # Not a group leader (e.g. a pid reported by the engine itself).
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def wait_gone(pids: Sequence[int], timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, until none of ``pids`` runs (zombies count as gone)."""
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


# -- ipyparallel's launchers ---------------------------------------------------------------


def sub_launchers(es) -> list:
    """The per-process launchers of an engine set (or the launcher itself)."""
    subs = getattr(es, "launchers", None)
    return list(subs.values()) if subs else [es]


def launcher_pids(es) -> list[int]:
    """The pids an engine set's launchers report (-1 for a process that never started)."""
    pids = (getattr(sub, "pid", None) for sub in sub_launchers(es))
    return [pid for pid in pids if isinstance(pid, int) and pid > 1]


def disown_output(launchers: Iterable) -> None:
    """Make launchers leave their output files alone when their process stops.

    A launcher whose process exits reads its log file and then deletes it, on the loop
    thread, some time after the exit. At teardown the profile directory holding those files
    is removed at the same moment, so the launcher's own removal could fail and log an
    error. Nobody reads that output after a teardown, and the directory goes as a whole.
    """
    for launcher in launchers:
        _compat.forget_launcher_output(launcher)
        launcher.output_file = ""


def census(world) -> list[int]:
    """Every pid on this machine the cluster may have started: launchers, engines, nannies."""
    pids: set[int] = set()
    ipp, launcher = world.ipp, world.launcher
    if ipp is not None:
        ctl = ipp.controller
        if ctl is not None and getattr(ctl, "pid", None):
            pids.add(ctl.pid)
        if launcher.launcher_pids_here:
            for es in list(ipp.engines.values()):
                pids.update(launcher_pids(es))
    for p in launcher.local_engines(world.processes):
        pids.update(pid for pid in (p.pid, p.nanny_pid) if pid)
    # Launchers report -1 for a process that never started.
    return sorted(pid for pid in pids if isinstance(pid, int) and pid > 1)


def engine_start_times(processes: Iterable) -> dict[int, float | None]:
    """The start time each process reported with its pid (for :func:`still_ours`)."""
    return {p.pid: p.started for p in processes if p.pid}


# -- teardown ------------------------------------------------------------------------------


def kill(world) -> float:
    """Tear the world down at once (see :meth:`Cluster.kill`); returns the seconds taken."""
    t0 = time.perf_counter()
    ipp, launcher = world.ipp, world.launcher
    engine_sets = list(ipp.engines.values()) if ipp is not None else []
    if ipp is not None:
        subs = [sub for es in engine_sets for sub in sub_launchers(es)]
        disown_output([*subs, *([ipp.controller] if ipp.controller is not None else [])])
    pids = census(world)
    client, world.client, world.view = world.client, None, None
    if client is not None:
        try:
            reply_limit.close_client(client, client_end_wait(world))
        except Exception:  # noqa: BLE001 - the client may already be half-closed
            pass
    killpg_all(pids, engine_start_times(world.processes))
    if ipp is not None:
        launcher.kill_remote(engine_sets, world.processes)
        # Forget the launchers so ipyparallel does not try a slow stop later.
        ipp.engines = {}
        ipp.controller = None
        launcher.ipp = None
    wait_gone(pids, timeout=KILL_WAIT_S)
    # Ports held for processes, and a scheduler's job, go back.
    launcher.release()
    if world.profile is not None:
        if world.keep_logs:
            keep_logs(world.profile)
            world.keep_logs = False
        remove_profile(world.profile)
        world.profile = None
    for p in world.processes:
        p.mark_dead("the cluster was torn down")
    world.pki = None
    if world.telemetry is not None:
        world.telemetry.close()
        world.telemetry = None
    return time.perf_counter() - t0


async def kill_world(world) -> None:
    """For a world restart: kill every engine, keep the controller, and free the engine ids.

    The engines themselves are killed with their process groups, not only the processes
    that launched them: a forked engine would otherwise leave only when a thread of its
    own runs (never, while a cell holds the GIL), and what its cells started would stay.
    """
    launcher, ipp = world.launcher, world.ipp
    old_sets = set(launcher.engine_sets.values())
    old_launchers = [es for es in (launcher.engine_set(r) for r in world.ranks) if es]
    old_ids = {p.engine_id for p in world.processes}
    # ipyparallel's nanny of an engine (remote engines have one) runs in a session of its
    # own, outlives the kill, and then tells the hub that its engine's *id* is gone. Were
    # that id freed first and given to the new world's engine, the hub would unregister the
    # new engine under it: so theirs is waited for first.
    nannies = any(p.nanny_pid for p in world.processes)
    await asyncio.to_thread(launcher.kill_engines, old_launchers, world.processes)
    nannies = nannies and not launcher.nannies_gone()
    if world.telemetry is not None:
        world.telemetry.reset()
    for set_id in old_sets:
        ipp.engines.pop(set_id, None)
    if nannies:
        await wait_dropped(world, old_ids, NANNY_WAIT_S)
    # Without this the hub frees the ids only after missed heartbeats, seconds later.
    await unregister(world, old_ids)


def client_end_wait(world) -> float:
    """How long closing the world's client waits for its context to end: briefly once the
    controller has ended (nothing is left to deliver), else the usual bound."""
    return reply_limit.CONTEXT_END_DEAD_S if controller_ended(world) else reply_limit.CONTEXT_END_S


def controller_ended(world) -> bool:
    """Whether the cluster's controller has ended, as its launcher knows or, just after a
    kill, as its pid already shows."""
    ctl = getattr(world.ipp, "controller", None)
    if ctl is None:
        return False
    if getattr(ctl, "state", "") == "after":
        return True
    pid = getattr(ctl, "pid", None)
    return isinstance(pid, int) and pid > 1 and not pid_alive(pid)


async def wait_dropped(world, engine_ids: set[int], timeout: float) -> None:
    """Wait (bounded, with progress) until the hub has dropped these engines.

    A dead controller drops nothing: the wait then ends at once, and what comes next (the
    new world's registration) says that the controller died.
    """
    client, total, said = world.client, len(engine_ids), None
    deadline = time.monotonic() + timeout
    while (left := engine_ids & set(client.ids)) and time.monotonic() < deadline:
        if controller_ended(world):
            return
        if len(left) != said:  # said when it changes, not at every look
            said = len(left)
            world.report("old processes unregistered", total - said, total)
        await asyncio.sleep(0.05)


async def unregister(world, engine_ids: set[int]) -> None:
    """Tell the hub that these engines are gone, as a nanny would, and wait (bounded) until
    it has dropped them, so their ids are free for new processes."""
    client = world.client
    send_unregistration(world, set(engine_ids) & set(client.ids))
    await wait_dropped(world, set(engine_ids), UNREGISTER_WAIT_S)


def send_unregistration(world, engine_ids: set[int]) -> None:
    """Send the hub an ``unregistration_request`` for each engine, over its registration
    socket (with CurveZMQ when the controller uses it)."""
    # Deferred: importing ipyparallel takes most of a second, which the kernel's start-up
    # should not pay for a teardown that may never come.
    from ipyparallel import util

    ipp = world.ipp
    if not engine_ids or ipp is None:
        return
    try:
        info = json.loads(controller_file(ipp.profile_dir, ipp.cluster_id, "engine").read_text())
    except (OSError, ValueError):
        return
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 1000
    try:
        serverkey = info.get("curve_serverkey")
        util.connect(
            sock,
            # A controller listening on every interface ("tcp://*") is reached on this
            # machine's loopback.
            util.disambiguate_url(f"{info['interface']}:{info['registration']}"),
            curve_serverkey=serverkey.encode("ascii") if serverkey else None,
        )
        for eid in sorted(engine_ids):
            world.client.session.send(sock, "unregistration_request", content={"id": eid})
    finally:
        sock.close()


# -- clean-up at exit ----------------------------------------------------------------------

_live_clusters: weakref.WeakSet = weakref.WeakSet()


def track(cluster) -> None:
    """Kill ``cluster`` at interpreter exit if it is still up then."""
    _live_clusters.add(cluster)


@atexit.register
def _kill_all_at_exit() -> None:
    for cluster in list(_live_clusters):
        if cluster.state != "stopped":
            cluster.kill()
