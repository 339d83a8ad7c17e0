"""Bringing engines up: wait for them to register, learn which rank each serves, and
initialise JAX everywhere, each with a deadline, explaining per process what went wrong.

Each function changes only the :class:`~jaxsys_kernel.cluster.world.World` it is given.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Sequence

from .. import _compat, _ranges
from ..engine.registry import engine_module
from ..telemetry.hub import TelemetryHub
from . import security
from .first_answers import answers
from .profile import controller_file, engine_file, kept_logs, make_profile
from .records import ClusterStartError, ProcessInfo
from .teardown import controller_ended, sub_launchers

# Seconds to collect the other processes' errors once one has failed to initialise.
ERROR_GATHER_S = 1.0
# Seconds every engine gets to describe itself after registering.
IDENTIFY_TIMEOUT_S = 30.0
# Seconds the registered engines get to say which rank they serve when others are missing.
MISSING_ASK_S = 5.0
# Missing processes whose output a registration timeout shows.
MISSING_SHOWN = 3
_POLL_S = 0.05
# Seconds each round of asking the processes whether they are ready waits for answers.
READY_ASK_S = 2.0
# Not-ready processes named in the progress line.
NOT_READY_SHOWN = 3
# Seconds of waiting before the progress line names the processes not ready, and between
# two changes of those names (each change is a new line under the cell).
READY_NAME_S = 2.0

bootstrap = engine_module("bootstrap")
readiness = engine_module("readiness")


def _tail(text: str, lines: int = 15) -> str:
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def output_tail(launcher) -> str:
    """The last lines of what a launcher's process printed ("" if it cannot be read)."""
    try:
        return _tail(launcher.get_output() or "")
    except Exception:  # noqa: BLE001 - the output is a hint; its absence is no error
        return ""


def _short_error(exc: BaseException) -> str:
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return f"{ename}: {evalue}"


# -- what went wrong ----------------------------------------------------------------------


def launcher_failure(world, rank: int) -> str | None:
    """Why the launcher of ``rank`` is no longer running, or None if it is."""
    es = world.launcher.engine_set(rank)
    if es is None:
        return None
    for sub in sub_launchers(es):
        if getattr(sub, "state", "running") == "after":
            code = (getattr(sub, "stop_data", None) or {}).get("exit_code")
            return (
                f"exited with code {code}{_signal_named(code)} before it was ready; "
                f"its output ends with:\n{output_tail(sub)}"
            )
    return None


def _signal_named(code) -> str:
    """`` (killed by SIGKILL)`` for an exit status that says a signal ended the process."""
    if not isinstance(code, int) or code >= 0:
        return ""
    known = -code in signal.valid_signals()
    return f" (killed by {signal.Signals(-code).name if known else f'signal {-code}'})"


def controller_failure(world) -> str | None:
    """Why the ipyparallel controller is no longer running, or None if it is."""
    if not controller_ended(world):
        return None
    ctl = world.ipp.controller
    code = (getattr(ctl, "stop_data", None) or {}).get("exit_code")
    who = f"the ipyparallel controller (pid {getattr(ctl, 'pid', '?')})"
    join = "no engine can join without it: start a new cluster with %jaxsys start"
    if getattr(ctl, "state", "") != "after":
        # Its pid is gone and the launcher has not yet heard how it ended.
        return f"{who} has ended; {join}"
    if isinstance(code, int) and code < 0:
        # Killed from outside: its log is ordinary traffic and says nothing of why.
        try:
            how = signal.Signals(-code).name
        except ValueError:
            how = f"signal {-code}"
        return f"{who} was killed by {how}; {join}"
    return f"{who} exited (code {code}); its output ends with:\n{output_tail(ctl)}"


# -- the controller and its companions ---------------------------------------------------------


async def start_services(world) -> None:
    """The profile, ipyparallel's cluster, certificates, telemetry and the controller."""
    world.profile = make_profile()
    # ipyparallel's engine gives up when the controller has not answered its registration
    # request within 5 s, which a controller busy with dozens of booting engines on a few
    # cores misses (measured at 32 processes on 2 cores): the engine waits as long as we do.
    with (world.profile / "ipengine_config.py").open("a") as f:
        f.write(f"c.IPEngine.timeout = {float(world.config.register_timeout)!r}\n")
    launcher = world.launcher
    ipp = launcher.make_ipp_cluster(world.profile, world.config.secure)
    if world.config.secure:
        world.pki = security.make_pki(
            world.profile,
            ipp.cluster_id,
            world.config.nprocs,
            launcher.certificate_hosts(),
            world.config.ca_file,
            world.config.cert_dir,
        )
    if world.config.telemetry:
        bind, advertise = launcher.telemetry_addresses()
        world.telemetry = TelemetryHub(
            world.config.nprocs, bind=bind, curve=world.config.secure, advertise=advertise
        )
    await ipp.start_controller()


# -- registration ------------------------------------------------------------------------


async def publish_engine_file(world, deadline: float) -> None:
    """Copy the controller's engine connection file once it is complete.

    The controller creates that file empty and fills it afterwards, so an engine that only
    waits for it to exist can read nothing. Engines wait for this copy instead, which
    appears atomically.
    """
    ipp = world.ipp
    src = controller_file(ipp.profile_dir, ipp.cluster_id, "engine")
    dst = engine_file(world.profile)
    while True:
        try:
            text = src.read_text()
            json.loads(text)
            break
        except (OSError, ValueError):
            problem = controller_failure(world)
            if problem:
                raise ClusterStartError(problem) from None
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"the controller did not write {src} within {world.config.register_timeout:g} s"
                ) from None
            await asyncio.sleep(0.02)
    tmp = dst.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, dst)


def engine_uuids(world) -> set[str]:
    """The uuids of every engine the hub knows now."""
    return set(_compat.engine_uuids(world.client).values())


def _registration_problem(world) -> str | None:
    problem = controller_failure(world)
    if problem:
        return problem
    failed = {r: msg for r in world.ranks if (msg := launcher_failure(world, r))}
    if failed:
        return "\n".join(f"process {r} {msg}" for r, msg in sorted(failed.items()))
    return None


async def wait_registered(
    world, deadline: float, exclude: set[str], n: int | None = None
) -> list[int]:
    """Wait for ``n`` (all) engines whose uuids are not in ``exclude``; return their ids."""
    n = world.config.nprocs if n is None else n
    last = -1
    while True:
        # A restarted rank may get its old engine id back; only the uuid is new. Standby
        # engines registering meanwhile are not for this launch.
        reserved = world.reserved_ids()
        new = sorted(
            eid
            for eid, uuid in _compat.engine_uuids(world.client).items()
            if uuid not in exclude and eid not in reserved
        )
        k = len(new)
        if k != last:
            world.report("engines registered", min(k, n), n)
            last = k
        if k >= n:
            return new[:n]
        problem = _registration_problem(world)
        if problem:
            raise ClusterStartError(problem)
        if time.monotonic() > deadline:
            raise ClusterStartError(await _registration_timeout(world, new, n))
        await asyncio.sleep(_POLL_S)


async def _missing_ranks(world, engine_ids: list[int]) -> list[int]:
    """The ranks no registered engine serves, asking the engines (their ids as a fallback)."""
    served: set[int] = set()
    if engine_ids:
        try:
            ar = world.client[engine_ids].apply_async(bootstrap.describe_process)
            infos = await asyncio.wait_for(asyncio.wrap_future(ar), timeout=MISSING_ASK_S)
            served = {info["rank"] for info in infos}
        except Exception:  # noqa: BLE001 - an engine id is rank's stand-in when they cannot say
            # Engines ask the hub for engine id == rank, which it grants on a first start.
            served = set(engine_ids)
    return [r for r in world.ranks if r not in served]


async def _registration_timeout(world, engine_ids: list[int], n: int) -> str:
    """The message for a registration deadline that passed: who is missing, and their output."""
    head = (
        f"only {len(engine_ids)} of {n} engines registered within "
        f"{world.config.register_timeout:g} s"
    )
    world.keep_logs = True  # the teardown that follows keeps them where this says
    if n != world.config.nprocs:
        return f"{head}; the engine logs are kept in {kept_logs(world.profile)}"
    missing = await _missing_ranks(world, engine_ids)
    lines = [f"{head}; missing: process {_ranges.format_procs(missing, prefix='')}"]
    for r in missing[:MISSING_SHOWN]:
        es = world.launcher.engine_set(r)
        tail = "".join(output_tail(sub) for sub in sub_launchers(es)) if es is not None else ""
        if tail:
            lines.append(f"process {r}'s output ends with:\n{tail}")
    lines.append(
        f"The engine logs are kept in {kept_logs(world.profile)}. On a loaded machine give "
        "more time (register_timeout) or fewer processes."
    )
    return "\n".join(lines)


async def identify(
    world, engine_ids: list[int], expected: Sequence[int] | None = None
) -> dict[int, dict]:
    """Ask the engines which rank each serves; returns their descriptions by rank."""
    ar = world.client[engine_ids].apply_async(bootstrap.describe_process)
    infos = await answers(world, ar, engine_ids, IDENTIFY_TIMEOUT_S)
    by_rank: dict[int, dict] = {}
    for eid, info in zip(engine_ids, infos, strict=True):
        info["engine_id"] = eid
        if info["rank"] in by_rank:
            raise ClusterStartError(
                f"two engines claim process {info['rank']}: engines "
                f"{by_rank[info['rank']]['engine_id']} and {eid}"
            )
        by_rank[info["rank"]] = info
    missing = sorted(set(world.ranks if expected is None else expected) - set(by_rank))
    if missing:
        raise ClusterStartError(f"no engine reported rank(s) {missing}")
    return by_rank


async def take_over(world, spares: dict) -> dict[int, dict]:
    """Hand standby engines the incarnation they join; returns their descriptions by rank.

    Each becomes the engine serving its rank (``launcher.engine_sets``), so that kills and
    teardown find it like any engine launched for the rank.
    """
    ctx = world.engine_context()
    ars = {
        r: world.client[s.engine_id].apply_async(
            bootstrap.take_over, world.launcher.takeover_settings(r, ctx)
        )
        for r, s in spares.items()
    }
    infos: dict[int, dict] = {}
    for r, ar in ars.items():
        info = await answers(world, ar, [spares[r].engine_id], IDENTIFY_TIMEOUT_S)
        if info["rank"] != r:
            raise ClusterStartError(
                f"the standby engine {spares[r].engine_id} kept for process {r} reports "
                f"process {info['rank']}"
            )
        info["engine_id"] = spares[r].engine_id
        world.launcher.engine_sets[r] = spares[r].set_id
        infos[r] = info
    return infos


# -- readiness -----------------------------------------------------------------------------


def _not_ready_text(doing: dict[int, str]) -> str:
    shown = [f"p{r} ({what})" for r, what in sorted(doing.items())[:NOT_READY_SHOWN]]
    more = len(doing) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


async def _ask_ready(world, ranks: Sequence[int]) -> dict[int, str]:
    """What each process not yet ready is doing (``not answering`` when it did not say)."""
    ars = {
        r: world.client[world.processes[r].engine_id].apply_async(readiness.state) for r in ranks
    }
    end = time.monotonic() + READY_ASK_S
    while time.monotonic() < end:
        pending = [r for r, ar in ars.items() if not ar.done()]
        # A dead process never answers: stop asking at once, not at the round's end.
        if not pending or any(launcher_failure(world, r) for r in pending):
            break
        await asyncio.sleep(_POLL_S)
    doing = {}
    for r, ar in ars.items():
        told = ar.get() if ar.done() and ar.exception() is None else None
        if not isinstance(told, dict) or told.get("ready") is not True:
            what = told.get("doing") if isinstance(told, dict) else None
            doing[r] = str(what)[:40] if what else "not answering"
    return doing


async def wait_ready(world, deadline: float, ranks: Sequence[int] | None = None) -> None:
    """Wait until every process has done its start-up imports, before any joins JAX.

    JAX's initialisation timeout starts when a process joins; a process still importing
    (a slow file system) would make the others' joins time out. While some are not
    ready, the progress names them and what they are doing.
    """
    ranks = world.ranks if ranks is None else list(ranks)
    waiting, stage = list(ranks), "processes ready"
    named_at = time.monotonic()
    while waiting:
        doing = await _ask_ready(world, waiting)
        waiting = sorted(doing)
        if not doing:
            stage = "processes ready"
        elif time.monotonic() - named_at > READY_NAME_S:
            stage = f"processes ready; waiting for {_not_ready_text(doing)}"
            named_at = time.monotonic()
        world.report(stage, len(ranks) - len(waiting), len(ranks))
        dead = {r: why for r in waiting if (why := launcher_failure(world, r))}
        if dead:
            r, why = next(iter(dead.items()))
            raise ClusterStartError(f"process {r} {why}")
        if waiting and time.monotonic() > deadline:
            raise ClusterStartError(
                f"processes not ready before the start's deadline: {_not_ready_text(doing)}"
            )
        if waiting:
            await asyncio.sleep(_POLL_S * 4)


# -- JAX initialisation ---------------------------------------------------------------------


def _coordinator(world, ranks: Sequence[int]) -> str | None:
    """Set ``world.coordinator_address``; return where process 0 binds it (None: it runs)."""
    if world.early_coordinator:
        world.coordinator_address = world.early_coordinator
        return world.early_coordinator
    if 0 not in ranks and world.coordinator_address:
        # A process rejoining the running world: same coordinator, nothing to bind.
        return None
    p0 = world.processes[0]
    port = world.client[p0.engine_id].apply_sync(bootstrap.free_port)
    host0 = world.launcher.coordinator_host(p0.address)
    world.coordinator_address = f"{host0}:{port}"
    return f"[::]:{port}"


def _init_failure(world, ars: dict, ranks: Sequence[int], deadline_s: float, since):
    """The error naming what each process did when initialisation failed or timed out."""
    errors = {r: ar.exception() for r, ar in ars.items() if ar.done() and ar.exception()}
    lines = []
    for r in ranks:
        if r in errors:
            lines.append(f"process {r} raised {_short_error(errors[r])}")
        elif ars[r].done():
            lines.append(f"process {r} initialised")
        else:
            why = launcher_failure(world, r)
            lines.append(f"process {r} {why}" if why else f"process {r} did not finish joining")
    head = (
        "jax.distributed.initialize failed"
        if errors
        else f"jax.distributed.initialize did not complete within {deadline_s:g} s"
    )
    lines.extend(security.refusals_since(world.refusal_records(), since))
    return ClusterStartError(head + ":\n" + "\n".join(lines))


async def init_jax(world, deadline_s: float, ranks: Sequence[int] | None = None):
    """Run ``jax.distributed.initialize`` on ``ranks`` (all) and wait, at most
    ``deadline_s``, for every one of them; record their devices."""
    ranks = world.ranks if ranks is None else list(ranks)
    bind = _coordinator(world, ranks)
    ars = {
        p.rank: world.client[p.engine_id].apply_async(
            bootstrap.initialize,
            world.coordinator_address,
            world.config.nprocs,
            p.rank,
            bind_address=bind,
            timeout=world.config.init_timeout,
            heartbeat_timeout=world.config.heartbeat_timeout,
        )
        for p in (world.processes[r] for r in ranks)
    }
    deadline = time.monotonic() + deadline_s
    started_at = time.time()
    last = -1
    first_error_at = None
    while True:
        done = [r for r, ar in ars.items() if ar.done()]
        failed = any(ars[r].exception() is not None for r in done)
        ok = [r for r in done if ars[r].exception() is None]
        if len(ok) != last:
            world.report("processes initialised", len(ok), len(ranks))
            last = len(ok)
        if len(ok) == len(ranks):
            break
        if first_error_at is None and (
            failed or any(launcher_failure(world, r) for r in ranks if r not in done)
        ):
            first_error_at = time.monotonic()
        # Once one process has failed the others can only wait for it: give their own
        # errors a moment to arrive, then report everything at once.
        now = time.monotonic()
        if (first_error_at is not None and now - first_error_at > ERROR_GATHER_S) or (
            now > deadline
        ):
            raise _init_failure(world, ars, ranks, deadline_s, started_at)
        await asyncio.sleep(_POLL_S)
    for r in ranks:
        result = ars[r].get()
        p = world.processes[r]
        p.devices = result["local_devices"]
        p.platform = result["platform"]
        p.init_call = result.get("call", {})
        p.init_settings = result.get("settings", [])
        p.state = "ready"


# -- all together ----------------------------------------------------------------------------


async def bring_up_engines(
    world, deadline: float, exclude: set[str], spares: dict | None = None
) -> None:
    """Wait for the launched engines, identify them, initialise JAX, and make the view.

    ``spares`` (by rank) are standby engines taking over their ranks; the other ranks'
    engines were launched for this incarnation.
    """
    spares = spares or {}
    launched = [r for r in world.ranks if r not in spares]
    infos: dict[int, dict] = {}
    if launched:
        # On a restart the hub may still list the killed engines for a moment.
        engine_ids = await wait_registered(world, deadline, exclude, n=len(launched))
        infos = await identify(world, engine_ids, expected=launched)
    if spares:
        infos.update(await take_over(world, spares))
    world.processes = [ProcessInfo.from_description(r, infos[r]) for r in world.ranks]
    await wait_ready(world, deadline)
    await init_jax(world, world.config.init_timeout + 5)
    make_view(world)


async def bring_up_rank(world, rank: int, exclude: set[str], spare=None) -> None:
    """Wait for one relaunched rank to register (or hand its standby engine over),
    identify it, and let it join the world."""
    if spare is not None:
        info = (await take_over(world, {rank: spare}))[rank]
    else:
        (eid,) = await wait_registered(
            world, time.monotonic() + world.config.register_timeout, exclude, n=1
        )
        info = (await identify(world, [eid], expected=[rank]))[rank]
    world.processes[rank] = ProcessInfo.from_description(rank, info)
    await init_jax(world, world.config.init_timeout + 5, ranks=[rank])
    make_view(world)


def make_view(world) -> None:
    """A blocking view over every rank's engine, in rank order."""
    world.view = world.client[[p.engine_id for p in world.processes]]
    world.view.block = True
