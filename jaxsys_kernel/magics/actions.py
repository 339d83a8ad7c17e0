"""The actions of ``%jaxsys``: one small function per action, each with its own options.

``%jaxsys ACTION ...`` looks the action up in :data:`ACTIONS` and hands it only the words
after the action's name; its own parser (IPython's ``magic_arguments``) knows only its own
options, and its docstring is its help (``%jaxsys help ACTION``). Every action is a plain
function of the session and the parsed options, so tests call them without a kernel.
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import publish_display_data

from ..cluster import enclosing_job, spare_world, standby
from ..cluster.audit import audit, format_audit, format_refusals
from ..cluster.launchers import forks
from ..telemetry.memory import format_bytes, memory_line
from . import actions_help, commands
from .actions_args import cluster_arguments, did_you_mean, processes, split
from .actions_cache import cache
from .actions_divergence import divergence
from .actions_guard import barrier, transfer_guard
from .actions_help import Action
from .actions_jobs import attach, job_line, keep_allocation, line_options, stop_note
from .actions_logs import logs
from .actions_profile import profile
from .actions_watch import WATCHER_ACTIONS, LiveStatus, show_cache, unwatch, watch
from .actions_where import slow, where
from .boundary import usage_errors
from .explain import explain
from .health import health


def format_status(rows: list[dict]) -> str:
    """Render ``Cluster.status()`` rows as an aligned text table."""
    header = ["process", "engine", "pid", "host", "devices", "state", "memory"]
    body = [
        [
            str(r["rank"]),
            "-" if r["engine_id"] is None else str(r["engine_id"]),
            "-" if r["pid"] is None else str(r["pid"]),
            r["host"] or "-",
            ",".join(map(str, r["devices"])) or "-",
            r["state"],
            format_bytes(r.get("rss")),
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *body]
    ]
    summary = memory_line([r.get("rss") for r in rows])
    return "\n".join([*lines, summary] if summary else lines)


# -- the actions ------------------------------------------------------------------------------

KILL_NEEDS = "%jaxsys kill needs a process, e.g. %jaxsys kill 2"


@magic_arguments("jaxsys start")
@cluster_arguments
@argument(
    "--explain",
    action="store_true",
    help="print, per process, the jax.distributed.initialize call and JAX options it used",
)
@argument(
    "--transfer-ports",
    action="store_true",
    help="give every process a cross-host transfer socket, for jax.device_put across processes",
)
@argument(
    "--thread-guard",
    action="store_true",
    help="run every cell under jax.thread_guard (multi-process operations from one thread only)",
)
def start(session, args: argparse.Namespace) -> None:
    """Launch one process per host and join them into one JAX world.

    Each process is an ipyparallel engine (process i is engine i) that initialises
    ``jax.distributed``. Clusters are secure by default (mutual TLS on JAX's coordination
    service with certificates from a fresh per-cluster CA, and CurveZMQ on ipyparallel's
    control channel), and JAX's recoverability is on, so the survivors of a death keep
    running. Every cluster option (``ClusterConfig``) has its flag here, as in ``jaxsys
    cluster start``; each option is described once, in the list of options.

    Examples
    --------
    ::

        %jaxsys start --hosts 4 --devices-per-host 2
        %jaxsys start --hosts 2 --explain
        %jaxsys start --hosts 2 --no-recoverability
        %jaxsys start --hosts 2 --transfer-ports --thread-guard
        %jaxsys start --hosts 2 --cache-dir /tmp/jax-cache --env XLA_FLAGS=--xla_dump_to=/tmp/x
        %jaxsys start --launcher ssh --hosts node1,node2
        %jaxsys start --launcher slurm --hosts 4 --partition debug --time 30:00
        %jaxsys start --hosts 4 --standby 0
    """
    session.start(**line_options(args))
    session.thread_guard = args.thread_guard
    if args.explain:
        cluster = session.require_cluster()
        # The security line was printed by the start itself, just above; a blank line
        # sets the explanation's blocks apart from it.
        print(f"\n{explain(cluster.processes)}")


@magic_arguments("jaxsys stop")
@argument(
    "--keep-allocation",
    action="store_true",
    help="keep what the processes ran on, a Slurm job, the hosts or a Kubernetes world's pods "
    "(saved for %%jaxsys attach)",
)
@argument(
    "--name",
    default=None,
    metavar="NAME",
    help="with --keep-allocation: keep it under this name (%%jaxsys attach --name NAME)",
)
def stop(session, args: argparse.Namespace) -> None:
    """Kill every process of the cluster.

    Shutting down or restarting the kernel does the same. ``--keep-allocation`` keeps what
    the processes ran on when it outlives them (a Slurm job, not cancelled), saved with the
    cluster's options, so that ``%jaxsys attach`` starts engines in it again without
    queueing, in this kernel or the next. A cluster on this machine or on named hosts keeps
    those hosts and its options, on a lease that lapses a TTL after this kernel's end (its
    processes stop all the same). A Kubernetes cluster keeps its world's pods, whose
    engines end; they wait the lease's TTL for an attach. See ``%jaxsys attach?``.

    Examples
    --------
    ::

        %jaxsys stop
        %jaxsys stop --keep-allocation
        %jaxsys stop --keep-allocation --name big-run
    """
    if args.name is not None and not args.keep_allocation:
        raise UsageError("--name names what --keep-allocation keeps: give both, or neither")
    kept = keep_allocation(session, args.name) if args.keep_allocation else None
    cluster = session.cluster
    took = session.stop()
    print(
        "jaxsys: no cluster was running"
        if took is None
        else f"jaxsys: cluster stopped in {took:.2f} s"
    )
    note = kept or (stop_note(cluster) if took is not None else None)
    if note:
        print(note)


@magic_arguments("jaxsys restart")
@argument("process", nargs="?", metavar="P", help="restart only this process, e.g. 2 or p2")
@argument("--procs", default=None, help="restart only these processes, e.g. 1,3-4")
def restart(session, args: argparse.Namespace) -> None:
    """Replace every process and re-initialise JAX, or replace one process.

    Without ``P`` this is the way to recover from a hang or a broken collective on CPU;
    every name the cells defined on the processes is gone (re-run the cells that built
    them, or restore from a checkpoint). With ``P`` (or ``--procs``, for several) only that
    process is replaced and rejoins the running JAX world (process 0 cannot: it hosts the
    coordination service). The new process starts empty: the message lists the names the
    others hold that it lacks, to rebuild with ``%%multihost --procs P``. On CPU a
    collective after a rejoin needs a device order not used before it (for instance the
    mesh's devices reversed, as notebook 03 does), or a world restart.

    Examples
    --------
    ::

        %jaxsys restart
        %jaxsys restart 2
        %jaxsys restart --procs 1,3
    """
    ranks = processes(session, args.process, args.procs, "%jaxsys restart")
    if ranks is not None:
        for r in ranks:
            result = commands.call(session, "restart", r)
            spare = " (from the standby)" if session.cluster.standby_status()["taken"] else ""
            print(
                f"jaxsys: process {r} restarted and rejoined the JAX world in "
                f"{result.took:.1f} s{spare}"
            )
            for line in result.log:
                print(line)
        return
    result = commands.call(session, "restart")
    taken = session.cluster.standby_status()["taken"]
    print(
        f"jaxsys: restarted all {session.cluster.nprocs} processes; "
        f"JAX world ready again in {result.took:.1f} s"
        + (f" ({taken} from the standby)" if taken else "")
        + spare_world.restart_note(session.cluster)
        + ". "
        + " ".join(result.log)
    )


@magic_arguments("jaxsys kill")
@argument("process", nargs="?", metavar="P", help="the process to kill, e.g. 2 or p2")
@argument("--signal", choices=("KILL", "TERM", "INT"), default="KILL", help="the signal to send")
@argument("--procs", default=None, help="the processes to kill, e.g. 1,3-4 (instead of P)")
def kill(session, args: argparse.Namespace) -> None:
    """Inject a fault: send a signal to one process.

    The others keep running; JAX declares the process dead after the heartbeat timeout
    (``%jaxsys start --heartbeat``), and ``%jaxsys restart P`` brings it back, empty (see
    ``%jaxsys restart?``). Process 0 cannot come back alone: it hosts the coordination
    service, the others end with it, and only ``%jaxsys restart`` (the world) helps.

    Examples
    --------
    ::

        %jaxsys kill 2
        %jaxsys kill 2 --signal TERM
        %jaxsys kill --procs 1,3
    """
    ranks = processes(session, args.process, args.procs, "%jaxsys kill")
    if ranks is None:
        raise UsageError(KILL_NEEDS)
    for r in ranks:
        took = commands.call(session, "kill", r, options={"signal": args.signal}).took
        print(session.kill_message(r, args.signal, took))


@magic_arguments("jaxsys status")
def status(session, args: argparse.Namespace) -> None:
    """List every process: process, engine, pid, host, devices and state.

    A line on the cluster's security follows, then where a certificate rotation stands
    and how many connections the coordination service refused, if any.

    Examples
    --------
    ::

        %jaxsys status
    """
    rows = session.status_rows()
    broken = getattr(session, "broken", None)
    print(health(session.cluster, broken, {r["rank"]: r["state"] for r in rows}).line())
    print(format_status(rows))
    job = job_line(session.cluster)
    if job:
        print(job)
    if inside := enclosing_job.status_line(session.cluster):
        print(inside)
    print(standby.status_line(session.cluster.standby_status()))
    if spare := spare_world.status_line(session.cluster):
        print(spare)
    if fork := forks.status_line(session.cluster):
        print(fork)
    print(f"security: {session.cluster.security}")
    rotation = session.rotation_line()
    if rotation:
        print(rotation)
    refused = session.refusals()
    if refused:
        print(
            f"refused: {sum(r.attempts for r in refused)} connection(s) from "
            f"{len({r.host for r in refused})} address(es); see %jaxsys security"
        )


@magic_arguments("jaxsys dashboard")
def dashboard(session, args: argparse.Namespace) -> Any:
    """Show the live dashboard: mesh, sharding, cache hits and liveness of every process.

    It holds the last mesh and sharding displayed, compilation-cache hits and the liveness
    of every process, updated while cells run, with buttons that stop, dump stacks, kill
    or restart processes even while a cell blocks. Its log lists state changes and
    refused connections as they happen.

    Examples
    --------
    ::

        %jaxsys dashboard
    """
    return session.show_dashboard()


@magic_arguments("jaxsys security")
def security(session, args: argparse.Namespace) -> None:
    """List every network endpoint of the cluster with what protects it.

    The list comes from the operating system: every TCP port the controller and its
    scheduler processes, each JAX process and the kernel listen on, each named by its role
    (or as unknown). Below the table: every connection the coordination service refused (who,
    why, how often), then the health of the kernel's telemetry receiver (events taken,
    dropped by reason, refused handshakes, the last error).

    Examples
    --------
    ::

        %jaxsys security
    """
    print(f"security: {session.require_cluster().security}")
    print(format_audit(audit(session.cluster)))
    if shared := enclosing_job.shared_node_line():
        print(shared)
    if session.cluster.pki is not None:
        print(format_refusals(session.refusals(), session.cluster.reports_refusals))
    hub = session.cluster.telemetry
    if hub is not None:
        notice = hub.check()
        print(hub.health().line() + (f"\n{notice}" if notice else ""))


@magic_arguments("jaxsys rotate-certs")
def rotate_certs(session, args: argparse.Namespace) -> None:
    """Issue new certificates to every process, in place.

    The CA stays, so connections are accepted throughout the changeover. JAX re-reads the
    files about every 10 minutes; a line after a cell says when the coordination service
    presents the new certificate, and ``%jaxsys status`` shows where it stands.

    Examples
    --------
    ::

        %jaxsys rotate-certs
    """
    serials = session.rotate_certs()
    print(
        "jaxsys: new certificates written for "
        + ", ".join(f"p{r} (serial {hex(x)[:12]})" for r, x in enumerate(serials))
        + ".\nJAX re-reads them about every 10 minutes; jaxsys says when the "
        "coordination service presents the new one (%jaxsys status shows where it stands)."
    )


@magic_arguments("jaxsys inspect")
@argument("name", metavar="NAME", help="the name to look up on process 0")
@argument("--detail", type=int, default=0, help="1 shows the source, like ??")
def inspect_(session, args: argparse.Namespace) -> None:
    """Show help on a name in process 0's namespace, as ``NAME?`` does in the kernel.

    In SPMD mode a cell ``NAME?`` (or ``NAME??``) becomes this action.

    Examples
    --------
    ::

        %jaxsys inspect jnp.sum
        %jaxsys inspect train_step --detail 1
    """
    reply = session.remote_inspect(args.name, len(args.name), args.detail)
    if reply is None or not reply.get("found"):
        print(f"Object `{args.name}` not found on process 0.")
    else:
        publish_display_data(reply["data"], reply.get("metadata", {}))


# -- the table and the dispatcher ---------------------------------------------------------------

# restart and kill parse their options here and run through the command registry
# (commands.COMMANDS), which the buttons and the comm share; a unit test checks that every
# command the registry offers on %jaxsys has its action in this table. (start and stop take
# the cluster's options here and call the session's start and stop, as the registry's do.)

ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("start", start),
        Action("stop", stop),
        Action("restart", restart),
        Action("kill", kill, KILL_NEEDS),
        Action("status", status),
        Action("dashboard", dashboard),
        Action("security", security),
        Action("rotate-certs", rotate_certs),
        Action("inspect", inspect_, "%jaxsys inspect needs a name, e.g. %jaxsys inspect jnp.sum"),
        Action("logs", logs, "%jaxsys logs needs a process, e.g. %jaxsys logs 0"),
        Action("cache", cache),
        Action("transfer-guard", transfer_guard),
        Action("divergence", divergence),
        Action("profile", profile, "%jaxsys profile needs start or stop"),
        Action("where", where),
        Action("slow", slow, "%jaxsys slow needs a process, e.g. %jaxsys slow 1 --ms 200"),
        Action("attach", attach, "%jaxsys attach needs a Slurm job id, e.g. %jaxsys attach 1234"),
        Action("barrier", barrier, "%jaxsys barrier needs a name, e.g. %jaxsys barrier step-1"),
        Action("watch", watch, "%jaxsys watch needs a cluster's name, e.g. %jaxsys watch training"),
        Action("unwatch", unwatch),
    )
}

JAXSYS_ACTIONS = tuple(ACTIONS)

HELP_WORDS = ("-h", "--help", "?", "??")


def overview() -> str:
    """``%jaxsys?``: every action with its usage and one line, then examples."""
    return actions_help.overview(ACTIONS.values())


def lookup(name: str) -> Action:
    """The action called ``name``.

    Raises
    ------
    UsageError
        Listing the actions, if there is none by that name.
    """
    found = ACTIONS.get(name)
    if found is None:
        choices = ", ".join(repr(n) for n in (*JAXSYS_ACTIONS, "help"))
        hint = did_you_mean(name, (*JAXSYS_ACTIONS, "help"))
        raise UsageError(
            f"argument action: invalid choice: {name!r}{hint} (choose from {choices}); "
            "%jaxsys? lists them"
        )
    return found


@usage_errors
def dispatch(session, line: str) -> Any:
    """Carry out one ``%jaxsys`` line: look up its action, parse the rest, run it.

    Returns
    -------
    object
        What the action returns (the dashboard widget for ``dashboard``, else None).
    """
    words = split(line)
    if not words:
        raise UsageError(
            "the following arguments are required: action (%jaxsys? lists the actions)"
        )
    name, rest = words[0], words[1:]
    if name in ("help", *HELP_WORDS):
        if len(rest) > 1:
            raise UsageError("%jaxsys help takes one action, e.g. %jaxsys help start")
        print(lookup(rest[0]).help() if rest else overview())
        return None
    act = lookup(name)
    if any(w in HELP_WORDS for w in rest):
        print(act.help())
        return None
    if _watcher_view(session, name, rest):
        return None
    return act.run(session, act.parse(rest))


def _watcher_view(session, name: str, rest: list[str]) -> bool:
    """Carry out ``name`` as a watcher does when ``session`` only watches a cluster (True),
    refusing what a watcher may not do; False for a session that does not watch."""
    watched = getattr(session, "watching", None)
    if watched is None or name in ("watch", "unwatch"):
        return False
    if name not in WATCHER_ACTIONS or rest:
        raise UsageError(watched.refusal(" ".join(["%jaxsys", name, *rest])))
    if name == "status":
        # Redrawn every few seconds while this kernel watches (a dashboard's page stays current).
        # The processes as /proc shows them, then the owner's live numbers (cache, steps).
        LiveStatus(
            session,
            lambda: "\n".join(
                [watched.headline(), format_status(watched.rows()), *watched.live_lines()]
            ),
        ).start()
    else:
        show_cache(session)
    return True
