"""``%jaxsys where`` and ``%jaxsys slow``: whose arrival the others waited for, and a delay
to teach and test it with."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import publish_display_data

from ..cells import timeline
from ..cells.stragglers import Stragglers
from ..cells.stragglers_summary import summarize
from ..cells.stragglers_svg import where_svg
from ..cells.stragglers_view import STEPS, TOP, render
from ..engine.registry import engine_module
from .actions_args import count, rank

__all__ = ["slow", "where"]

arrivals = engine_module("arrivals")
# Steps fetched from each process: the latest ones (each record is some 200 bytes), and
# at most this many records from all processes together (some 40 MB).
FETCH_STEPS = 2000
FETCH_TOTAL = 200_000
_WHERE = ("host", "input", "compute")


def _answers(cluster, ranks, fn, *args, timeout=30.0) -> dict:
    calls = cluster.call(ranks, fn, *args, timeout=timeout)
    if calls.errors or calls.missing:
        bad = {**{r: repr(e) for r, e in calls.errors.items()}}
        bad.update(dict.fromkeys(calls.missing, "no answer"))
        raise UsageError(f"%jaxsys: not every process answered: {bad}")
    return calls.results


def collect(cluster, ranks, offsets=None, timeout: float = 30.0) -> Stragglers:
    """Every process's step records of the last cell, on the kernel's clock, analysed.

    ``offsets`` are the processes' clock offsets (:func:`timeline.measure_offsets`),
    measured here when not given.
    """
    offsets = offsets or timeline.measure_offsets(cluster, ranks)
    view = Stragglers(
        ranks,
        {r: o.seconds for r, o in offsets.items()},
        {r: o.error for r, o in offsets.items()},
    )
    each = max(5, min(FETCH_STEPS, FETCH_TOTAL // max(1, len(ranks))))
    for r, told in _answers(cluster, ranks, arrivals.records, each, timeout=timeout).items():
        steps = told.get("steps") if isinstance(told, dict) else None
        if not isinstance(steps, list) or len(steps) > each:
            view.refused[r] = f"its answer is not a list of at most {each} steps"
            continue
        for record in steps:
            view.add(r, record)
    return view


def recording(cluster, ranks, timeout: float = 30.0) -> bool:
    """Whether every process records its steps (asks for no records)."""
    told = _answers(cluster, ranks, arrivals.records, 0, timeout=timeout)
    return all(isinstance(t, dict) and t.get("on") is True for t in told.values())


def _dashboard_view(session):
    """The straggler view of the session's dashboard, if one is shown."""
    return getattr(session.dashboard, "stragglers", None)


@magic_arguments("jaxsys where")
@argument("mode", nargs="?", choices=("on", "off"), metavar="on|off", help="record or stop")
@argument("--steps", type=count, default=STEPS, metavar="N", help="how many latest steps to list")
@argument("--top", type=count, default=TOP, metavar="K", help="processes listed before a summary")
def where(session, args: argparse.Namespace) -> None:
    """Who the others waited for at each step of the last cell, and where each one's time went.

    With ``on``, every process records, for each call your cell makes to a jitted function
    on arrays that span processes, when it began the work leading to it, its time in the
    input pipeline, compiling, and when it arrived; it then waits for the result, so one
    step's wait is not counted in the next step's host time. Without an argument, after a
    cell: the kernel measures each process's clock against its own, puts the records on one
    clock, and says per step which process arrived last, by how much, and in what
    (``start``, ``input``, ``host``, ``compile``, ``compute``), then each process's time
    per step as a bar (input, host, compile, compute, waiting for the others), as text and
    as a picture kept in the saved notebook. At many processes it lists the ``--top`` that
    waited least and a histogram of the rest.

    Examples
    --------
    ::

        %jaxsys where on
        %jaxsys where
        %jaxsys where --steps 20 --top 5
        %jaxsys where off
    """
    cluster = session.require_cluster()
    ranks = cluster.ranks
    if args.mode is not None:
        fn = arrivals.enable if args.mode == "on" else arrivals.disable
        told = _answers(cluster, ranks, fn)
        refused = {r: t for r, t in told.items() if t not in ("on", "off")}
        if refused:
            raise UsageError(f"%jaxsys where {args.mode}: refused on {refused}")
        if (shown := _dashboard_view(session)) is not None:
            shown.update(recording=args.mode == "on")
        print(f"jaxsys: step arrivals are recorded {args.mode} on processes {ranks}")
        return
    view = collect(cluster, ranks)
    bundle = {"text/plain": render(view, args.steps, args.top)}
    if view.findings:
        bundle["image/svg+xml"] = where_svg(view, args.top)
    if (shown := _dashboard_view(session)) is not None:
        shown.update(summarize(view, args.steps, args.top))
    publish_display_data(bundle)


@magic_arguments("jaxsys slow")
@argument("process", metavar="P", type=rank, help="the process to delay, e.g. 1 or p1")
@argument("--ms", type=float, default=None, metavar="N", help="milliseconds before each step")
@argument("--in", dest="where", choices=_WHERE, default="host", help="where the delay is spent")
@argument("--off", action="store_true", help="remove the delay")
def slow(session, args: argparse.Namespace) -> None:
    """Delay one process before each step, to teach and test ``%jaxsys where``.

    Until ``--off``, process P sleeps ``--ms`` milliseconds before each call of a jitted
    function from a cell on arrays that span processes: in host code (``--in host``, the
    default), counted as its input pipeline (``--in input``), or as device time before the
    collective, as if its device were slow (``--in compute``). Turns the step records on.

    Examples
    --------
    ::

        %jaxsys slow 1 --ms 200
        %jaxsys slow p1 --ms 200 --in input
        %jaxsys slow 1 --off
    """
    cluster = session.require_cluster()
    if args.process not in cluster.ranks:
        raise UsageError(f"%jaxsys slow: no process {args.process} (processes {cluster.ranks})")
    if args.off == (args.ms is not None):
        raise UsageError("%jaxsys slow P needs --ms N or --off, e.g. %jaxsys slow 1 --ms 200")
    if not args.off:
        _answers(cluster, cluster.ranks, arrivals.enable)
    calls = cluster.call([args.process], arrivals.slow, args.ms, args.where, timeout=30.0)
    if args.process in calls.errors:
        raise UsageError(f"%jaxsys slow: {calls.errors[args.process]}")
    if args.process in calls.missing:
        raise UsageError(f"%jaxsys slow: process {args.process} did not answer within 30 s")
    if not args.off and (shown := _dashboard_view(session)) is not None:
        shown.update(recording=True)
    print(f"jaxsys: p{args.process}: {calls.results[args.process]}")
