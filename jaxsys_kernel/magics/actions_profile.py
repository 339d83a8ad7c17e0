"""``%jaxsys profile start|stop``: ``jax.profiler`` on every process, merged into one timeline."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells import timeline
from ..engine.registry import engine_module

__all__ = ["profile"]

profiling = engine_module("profiling")


@magic_arguments("jaxsys profile")
@argument("mode", choices=("start", "stop"), metavar="start|stop", help="start or stop profiling")
@argument(
    "--dir",
    default=None,
    metavar="PATH",
    help="with stop: save the merged trace in PATH "
    "(default: jaxsys-traces in the notebook's directory)",
)
def profile(session, args: argparse.Namespace) -> None:
    """Profile every process from ``start`` to ``stop``, then show one merged timeline.

    Each process runs ``jax.profiler`` on its own; ``stop`` brings the traces to the kernel
    over the cluster's own channels, aligns their clocks with the kernel's, merges them
    into one Perfetto trace (a track group per process) and shows a timeline view.
    ``%%multihost --profile`` does the same for one cell.

    The merged trace is saved in ``jaxsys-traces/`` in the kernel's working directory (the
    notebook's, under Jupyter), or in ``--dir PATH``, and is kept after ``%jaxsys stop``;
    the line under the cell names the file. Each process's own trace is removed once the
    kernel has it. A trace over the kernel's limits (size, decompressed size, events) is
    left out, and the line says which process and which limit.

    Examples
    --------
    ::

        %jaxsys profile start
        %jaxsys profile stop
        %jaxsys profile stop --dir ~/traces
    """
    cluster = session.require_cluster()
    ranks = cluster.ranks
    if args.mode == "start":
        calls = cluster.call(ranks, profiling.start, {}, timeout=30.0)
        if calls.errors or calls.missing:
            bad = {
                **{r: repr(e) for r, e in calls.errors.items()},
                **dict.fromkeys(calls.missing, "no answer"),
            }
            raise UsageError(f"jax.profiler did not start on every process: {bad}")
        print(f"jaxsys: profiling processes {ranks}; %jaxsys profile stop merges the traces")
        return
    calls = cluster.call(ranks, profiling.stop, timeout=60.0)
    if calls.errors or calls.missing or not all(calls.results.values()):
        raise UsageError(
            "no profile to stop on every process (%jaxsys profile start first); "
            f"answers: {calls.results}, errors: {calls.errors}"
        )
    timeline.after_cell(cluster, ranks, args.dir or True, name="profile")
