"""``%jaxsys logs``: what native code wrote on a process, kept out of the cells."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs, parse_procs
from ..engine.registry import engine_module
from . import deaths
from .actions_args import count, rank

__all__ = ["LOGS_NEEDS", "LOGS_TIMEOUT", "logs", "process_log"]

LOGS_NEEDS = "%jaxsys logs needs a process, e.g. %jaxsys logs 0"

# Seconds a process may take to send its log before %jaxsys logs gives up on it (it may be
# stuck in an earlier cell, and the kernel must not wait for it forever).
LOGS_TIMEOUT = 10.0

output = engine_module("output")


@magic_arguments("jaxsys logs")
@argument("process", nargs="?", metavar="P", help="the process whose log to show, e.g. 2 or p2")
@argument(
    "--procs", default=None, help="the processes whose logs to show, e.g. 2 or 1,3-4 (instead of P)"
)
@argument("--tail", type=count, default=40, metavar="N", help="how many of the last lines to show")
def logs(session, args: argparse.Namespace) -> None:
    """Show the end of a process's native log.

    Native code (gloo, XLA, gRPC, absl) writes chatter, such as gloo's connection
    messages and gRPC's INFO records, that is kept out of cell output; each process keeps
    it in a log of its own, and this shows its last lines. ``--procs`` names the processes
    as the other actions do; with several, each log follows its process's name.

    Examples
    --------
    ::

        %jaxsys logs 0
        %jaxsys logs 2 --tail 200
        %jaxsys logs --procs 1,3
    """
    if args.process is None and args.procs is None:
        raise UsageError(LOGS_NEEDS)
    if args.procs is None:
        _print_log(args.process, process_log(session, args.process, args.tail))
        return
    if args.process is not None:
        raise UsageError("%jaxsys logs: name the processes as P or with --procs, not both")
    ranks = _selection(session, args.procs)
    # Every log is read before any is shown: a process that cannot answer fails the line.
    texts = {r: process_log(session, str(r), args.tail) for r in ranks}
    for r, text in texts.items():
        if len(ranks) > 1:
            print(f"[{format_procs([r])}]")
        _print_log(str(r), text)


def _selection(session, procs: str) -> list[int]:
    nprocs = session.require_cluster().nprocs
    try:
        return parse_procs(procs, nprocs)
    except ValueError as e:
        raise UsageError(f"%jaxsys logs --procs: {e}") from None


def _print_log(process: str, text: str) -> None:
    if not text:
        print(f"jaxsys: process {rank(process)} has no native log lines yet")
    else:
        print(text, end="" if text.endswith("\n") else "\n")


def process_log(session, process: str, tail: int, timeout: float = LOGS_TIMEOUT) -> str:
    """The last ``tail`` lines of the native log of ``process`` (``"2"`` or ``"p2"``).

    Raises
    ------
    UsageError
        If the cluster has no such process, it is not running, or it does not answer
        within ``timeout`` seconds.
    """
    cluster = session.require_cluster()
    processes = format_procs(cluster.ranks)
    try:
        r = rank(process)
    except UsageError:
        raise UsageError(
            f"expected a process number such as 0, got {process!r}; this cluster's processes "
            f"are {processes}"
        ) from None
    if not 0 <= r < cluster.nprocs:
        raise UsageError(f"there is no process {r}; this cluster's processes are {processes}")
    cluster.refresh_states()
    info = cluster.processes[r]
    if info.state == "dead" and (kept := deaths.dead_log(cluster, r, tail)) is not None:
        # Its log stays until the cluster stops: the death is often explained there.
        how = f" ({info.died})" if info.died else ""
        return f"jaxsys: process {r} is dead{how}; the log it left:\n{kept}"
    if info.state != "ready" or info.engine_id is None:
        raise UsageError(
            f"process {r} is {info.state}; its log can only be read while it runs "
            f"(%jaxsys restart {r} brings it back)"
        )
    calls = cluster.call([r], output.log_tail, tail, timeout=timeout)
    if calls.missing:
        raise UsageError(
            f"process {r} did not send its log within {timeout:g} s (it may still be busy "
            "with an earlier cell)"
        )
    return calls.values()[r]
