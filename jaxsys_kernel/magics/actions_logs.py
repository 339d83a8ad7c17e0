"""``%jaxsys logs``: what native code wrote on one process, kept out of the cells."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs
from ..engine.registry import engine_module
from .actions_args import count, rank

__all__ = ["LOGS_TIMEOUT", "logs", "process_log"]

# Seconds a process may take to send its log before %jaxsys logs gives up on it (it may be
# stuck in an earlier cell, and the kernel must not wait for it forever).
LOGS_TIMEOUT = 10.0

output = engine_module("output")


@magic_arguments("jaxsys logs")
@argument("process", metavar="P", help="the process whose log to show, e.g. 2 or p2")
@argument("--tail", type=count, default=40, metavar="N", help="how many of the last lines to show")
def logs(session, args: argparse.Namespace) -> None:
    """Show the end of one process's native log.

    Native code (gloo, XLA, gRPC, absl) writes chatter, such as gloo's connection
    messages and gRPC's INFO records, that is kept out of cell output; each process keeps
    it in a log of its own, and this shows its last lines.

    Examples
    --------
    ::

        %jaxsys logs 0
        %jaxsys logs 2 --tail 200
    """
    text = process_log(session, args.process, args.tail)
    if not text:
        print(f"jaxsys: process {rank(args.process)} has no native log lines yet")
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
