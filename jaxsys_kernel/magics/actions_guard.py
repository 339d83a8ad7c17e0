"""``%jaxsys transfer-guard`` and ``%jaxsys barrier``: guards and barriers across the cluster.

The transfer guard is set on every process through :mod:`jaxsys_kernel.engine.guards`;
the barrier is JAX's coordination-service barrier, with jaxsys's own key-value entries
naming who has arrived (:mod:`jaxsys_kernel.engine.barrier`).
"""

from __future__ import annotations

import argparse
import time
import uuid

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs
from ..engine.registry import engine_module
from ..telemetry.schema import transfer_counts_text
from .actions_args import seconds
from .actions_cache import ask

LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
SHORT = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device"}

guards = engine_module("guards")
engine_barrier = engine_module("barrier")


def _level(text: str) -> str:
    if text not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r}; choose one of {', '.join(LEVELS)}"
        )
    return text


def guard_settings(level: str | None, h2d: str | None, d2h: str | None, d2d: str | None) -> dict:
    """The per-direction levels a command line asks for: ``LEVEL`` first, then each ``--X``."""
    out = dict.fromkeys(SHORT, level) if level is not None else {}
    for short, value in (("h2d", h2d), ("d2h", d2h), ("d2d", d2d)):
        if value is not None:
            out[short] = value
    return out


def format_guard(answers: dict[int, dict]) -> str:
    """One line per group of processes with the same levels and transfer counts."""
    groups: dict[tuple, list[int]] = {}
    for r, a in sorted(answers.items()):
        levels = " ".join(f"{s}={a['levels'][s]}" for s in SHORT)
        counted = transfer_counts_text(a["counts"])
        groups.setdefault((levels, counted), []).append(r)
    return "\n".join(
        f"[{format_procs(ranks)}] transfer guard {levels}; logged transfers: {counted}"
        for (levels, counted), ranks in groups.items()
    )


def transfer_notice(told: dict[int, dict], now: dict[int, dict]) -> list[str]:
    """Dashboard log lines for transfer counts that changed since ``told`` (updated in place).

    One line per change: the time, then per process the transfers its guard logged so far,
    by direction.
    """
    changed = {r: c for r, c in now.items() if told.get(r) != c}
    if not changed:
        return []
    told.update(changed)
    groups: dict[str, list[int]] = {}
    for r, c in sorted(now.items()):
        text = transfer_counts_text(c)
        groups.setdefault(text, []).append(r)
    body = "; ".join(f"[{format_procs(ranks)}] {text}" for text, ranks in groups.items())
    return [f"{time.strftime('%H:%M:%S')} transfers logged: {body}"]


@magic_arguments("jaxsys transfer-guard")
@argument(
    "level",
    nargs="?",
    type=_level,
    metavar="LEVEL",
    help=f"one of {', '.join(LEVELS)}, for every direction",
)
@argument("--h2d", type=_level, metavar="L", help="level for host-to-device transfers")
@argument("--d2h", type=_level, metavar="L", help="level for device-to-host transfers")
@argument("--d2d", type=_level, metavar="L", help="level for device-to-device transfers")
@argument("--reset-counts", action="store_true", help="set the logged-transfer counts to 0")
def transfer_guard(session, args: argparse.Namespace) -> None:
    """Set JAX's transfer guard on every process, or show it with the transfers logged.

    ``allow`` lets every transfer happen; ``log`` lets it happen and logs it; ``disallow``
    refuses implicit transfers (a NumPy array passed to a jitted function, a sharded array
    read into NumPy); the ``_explicit`` levels treat ``jax.device_put`` and
    ``jax.device_get`` the same way. A refused transfer fails the cell on each process with
    an error naming the kind, shape, dtype and devices. In ``log`` mode JAX writes one native
    stderr line per transfer: they show under the cell per process, and jaxsys counts them
    by kind and process (shown here and in the dashboard). On CPU, a device-to-host read of
    an array on one device needs no copy, so JAX never guards it.

    Examples
    --------
    ::

        %jaxsys transfer-guard disallow
        %jaxsys transfer-guard log --d2h allow
        %jaxsys transfer-guard --h2d disallow_explicit
        %jaxsys transfer-guard
    """
    cluster = session.require_cluster()
    settings = guard_settings(args.level, args.h2d, args.d2h, args.d2d)
    if settings:
        ask(cluster, cluster.ranks, guards.set_transfer_guard, settings)
    answers = ask(cluster, cluster.ranks, guards.state, bool(args.reset_counts))
    print(format_guard(answers))


def arm_thread_guard(cluster, ranks: list[int]) -> None:
    """Run the next cell of each process in ``ranks`` under ``jax.thread_guard``."""
    ask(cluster, ranks, guards.arm_thread_guard)


# -- the barrier -------------------------------------------------------------------------------

# Seconds past the barrier's own timeout the kernel waits for the processes' answers.
BARRIER_SLACK = 10.0


@magic_arguments("jaxsys barrier")
@argument("name", metavar="NAME", help="the barrier's name, for messages")
@argument(
    "--timeout",
    type=seconds,
    default=60.0,
    metavar="S",
    help="seconds to wait for every process (default 60)",
)
def barrier(session, args: argparse.Namespace) -> None:
    """Wait until every process reaches a barrier of the coordination service.

    Each process writes its arrival to the coordination service's key-value store and
    waits for the others, then all pass JAX's barrier together. While they wait, the
    processes still missing are named (a process busy with an earlier request has not
    arrived); when ``--timeout`` passes first, the action fails naming them, and their
    queued arrival is withdrawn.

    Examples
    --------
    ::

        %jaxsys barrier after-load
        %jaxsys barrier checkpoint --timeout 5
    """
    cluster = session.require_cluster()
    outcome = run_barrier(cluster, args.name, args.timeout)
    if outcome["missing"]:
        raise UsageError(barrier_failure(args.name, args.timeout, outcome))
    waited = max(outcome["waited"].values(), default=0.0)
    print(
        f"jaxsys: barrier {args.name!r} passed by {format_procs(cluster.ranks)}; "
        f"the longest wait was {waited:.2f} s"
    )


def barrier_failure(name: str, timeout: float, outcome: dict) -> str:
    """The message of a barrier that timed out: who never arrived, who did."""
    missing, arrived = outcome["missing"], outcome["arrived"]
    text = (
        f"barrier {name!r} timed out after {timeout:g} s: {format_procs(missing)} never arrived"
        f" (arrived: {format_procs(arrived) if arrived else 'none'})"
    )
    busy = outcome.get("busy", [])
    if busy:
        text += (
            f"; {format_procs(busy)} was still busy with an earlier request, whose "
            "arrival was withdrawn"
        )
    return text


def run_barrier(cluster, name: str, timeout: float, on_progress=print) -> dict:
    """Run the barrier on every process; print progress lines as they change.

    Returns
    -------
    dict
        ``arrived`` and ``missing`` (ranks), ``busy`` (ranks that never started waiting),
        ``waited`` (seconds per rank that passed), ``errors`` (rank: text).
    """
    barrier_id = f"{name}.{uuid.uuid4().hex[:12]}"
    deadline = time.time() + timeout
    pending = cluster.submit(
        cluster.ranks, engine_barrier.wait, barrier_id, name, timeout, deadline
    )
    shown: dict[int, int] = {}
    until = time.monotonic() + timeout + BARRIER_SLACK
    while time.monotonic() < until and not all(ar.ready() for ar in pending.values()):
        waiting = [ar for ar in pending.values() if not ar.ready()]
        if time.time() > deadline + 1.0 and not any(ar.stdout for ar in waiting):
            # The rest never started waiting (each says so at once when it does): they
            # are busy with earlier requests and past the deadline.
            break
        for r, ar in pending.items():
            text = ar.stdout or ""
            lines = text.splitlines()
            for line in lines[shown.get(r, 0) :]:
                on_progress(f"[p{r}] {line}")
            shown[r] = len(lines)
        waiting[0].wait(0.1)
    return _barrier_outcome(pending)


def _barrier_outcome(pending: dict) -> dict:
    out: dict = {"arrived": [], "missing": [], "busy": [], "waited": {}, "errors": {}}
    for r, ar in pending.items():
        if not ar.ready():
            if not ar.stdout:
                # Still queued behind an earlier request: withdraw it.
                ar.abort()
                out["busy"].append(r)
            out["missing"].append(r)
            continue
        try:
            got = ar.get(0)
        except Exception as e:  # noqa: BLE001 - a remote error names what went wrong
            ename = getattr(e, "ename", type(e).__name__)
            out["errors"][r] = f"{ename}: {getattr(e, 'evalue', e)}"
            (out["arrived"] if ename == "BarrierTimeout" else out["missing"]).append(r)
            continue
        if got["late"]:
            out["missing"].append(r)
            out["busy"].append(r)
        else:
            out["arrived"].append(r)
            out["waited"][r] = got["waited"]
    return out
