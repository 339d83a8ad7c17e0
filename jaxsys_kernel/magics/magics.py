"""IPython magics: ``%jaxsys``, ``%%multihost`` / ``%multihost``, ``%%local``, ``%pull``."""

from __future__ import annotations

import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .._ranges import format_procs
from .session import MultihostSession

JAXSYS_ACTIONS = (
    "start",
    "stop",
    "restart",
    "kill",
    "status",
    "dashboard",
    "security",
    "rotate-certs",
    "inspect",
)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise UsageError(f"expected a positive number of seconds, got {text!r}")
    return value


def _env_pairs(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def _rank(text: str) -> int:
    try:
        return int(text.removeprefix("p"))
    except ValueError:
        raise UsageError(f"expected a process number such as 2, got {text!r}") from None


def format_status(rows: list[dict]) -> str:
    """Render ``Cluster.status()`` rows as an aligned text table."""
    header = ["process", "engine", "pid", "host", "devices", "state"]
    body = [
        [
            str(r["rank"]),
            "-" if r["engine_id"] is None else str(r["engine_id"]),
            "-" if r["pid"] is None else str(r["pid"]),
            r["host"] or "-",
            ",".join(map(str, r["devices"])) or "-",
            r["state"],
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=False)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *body]
    ]
    return "\n".join(lines)


@magics_class
class JaxSysMagics(Magics):
    """The magics of the jaxsys kernel; each parses its arguments and calls the session."""

    def __init__(self, shell, session: MultihostSession):
        super().__init__(shell)
        self.session = session

    @magic_arguments()
    @argument("action", choices=JAXSYS_ACTIONS, help="what to do with the cluster")
    @argument("name", nargs="?", help="kill/restart: the process; inspect: the name to look up")
    @argument("--signal", choices=("KILL", "TERM", "INT"), default="KILL", help="for kill")
    @argument(
        "--heartbeat",
        type=float,
        default=None,
        help="seconds without heartbeats before JAX declares a process dead (default 10)",
    )
    @argument(
        "--hosts", type=str, default=None, help="number of processes, or host1,host2,... for ssh"
    )
    @argument("--devices-per-host", type=int, default=None, help="CPU devices per process")
    @argument("--launcher", choices=("local", "ssh", "mpi", "slurm"), default=None)
    @argument("--cache-dir", default=None, help="persistent compilation cache directory")
    @argument(
        "--init-timeout",
        type=float,
        default=60.0,
        help="seconds allowed for jax.distributed.initialize",
    )
    @argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for every process (repeatable)",
    )
    @argument("--insecure", action="store_true", help="no mTLS, no CurveZMQ (not recommended)")
    @argument("--ca-file", default=None, help="your own CA certificate (PEM), with --cert-dir")
    @argument(
        "--cert-dir", default=None, help="directory with process-<i>.pem/.key signed by --ca-file"
    )
    @argument("--detail", type=int, default=0, help="for inspect: 1 shows the source, like ??")
    @line_magic
    def jaxsys(self, line: str = ""):
        """Start, stop, restart and describe the cluster of JAX processes.

        ``start`` launches one ipyparallel engine per host and initialises
        ``jax.distributed`` on all of them (process i is engine i). Options left out come
        from ``$JAXSYS_HOSTS`` and ``$JAXSYS_DEVICES_PER_HOST`` (defaults 4 and 2).
        Clusters are secure by default: mutual TLS on JAX's coordination service with
        certificates from a fresh per-cluster CA (or yours: ``--ca-file`` and
        ``--cert-dir``), and CurveZMQ on ipyparallel's control channel; ``--insecure``
        turns both off. ``security`` lists every network endpoint with what protects it,
        and every connection the coordination service refused (who, why, how often; a
        line after each cell also reports new ones), and ``rotate-certs`` issues new
        certificates in place. ``dashboard`` shows the
        live dashboard: the last mesh and sharding displayed, compilation-cache hits and the
        liveness of every process, updated while cells run.
        ``restart`` replaces every process and re-initialises JAX (the way to recover
        from a hang or a broken collective on CPU); ``restart P`` replaces only process P,
        which rejoins the running world. ``kill P [--signal KILL|TERM|INT]`` injects a
        fault. Clusters run with JAX's recoverability on and a heartbeat timeout of
        ``--heartbeat`` seconds (default 10), so the survivors of a death keep running.
        ``status`` lists process, engine, pid,
        host, devices and state. ``stop`` kills every process of the cluster.

        Examples
        --------
        ::

            %jaxsys start --hosts 4 --devices-per-host 2
            %jaxsys status
            %jaxsys dashboard
            %jaxsys security
            %jaxsys restart
            %jaxsys kill 2
            %jaxsys restart 2
            %jaxsys stop
        """
        args = parse_argstring(self.jaxsys, line)
        s = self.session
        if args.action == "start":
            hosts = None
            if args.hosts is not None:
                if args.hosts.isdigit():
                    hosts = int(args.hosts)
                else:
                    hosts = [h for h in args.hosts.split(",") if h]
            if args.devices_per_host is not None and args.devices_per_host < 1:
                raise UsageError("--devices-per-host must be at least 1")
            s.start(
                hosts=hosts,
                devices_per_host=args.devices_per_host,
                launcher=args.launcher,
                cache_dir=args.cache_dir,
                init_timeout=args.init_timeout,
                secure=not args.insecure,
                ca_file=args.ca_file,
                cert_dir=args.cert_dir,
                env=_env_pairs(args.env),
                **({"heartbeat_timeout": args.heartbeat} if args.heartbeat else {}),
            )
        elif args.action == "stop":
            took = s.stop()
            print(
                "jaxsys: no cluster was running"
                if took is None
                else f"jaxsys: cluster stopped in {took:.2f} s"
            )
        elif args.action == "restart" and args.name is not None:
            rank = _rank(args.name)
            took = s.restart_process(rank)
            print(f"jaxsys: process {rank} restarted and rejoined the JAX world in {took:.1f} s")
        elif args.action == "restart":
            took = s.restart()
            c = s.cluster
            print(
                f"jaxsys: restarted all {c.nprocs} processes; JAX world ready again in {took:.1f} s"
            )
        elif args.action == "kill":
            if args.name is None:
                raise UsageError("%jaxsys kill needs a process, e.g. %jaxsys kill 2")
            rank = _rank(args.name)
            took = s.kill_process(rank, args.signal)
            print(s.kill_message(rank, args.signal, took))
        elif args.action == "status":
            print(format_status(s.status_rows()))
            print(f"security: {s.cluster.security}")
            rotation = s.rotation_line()
            if rotation:
                print(rotation)
            refused = s.refusals()
            if refused:
                print(
                    f"refused: {sum(r.attempts for r in refused)} connection(s) from "
                    f"{len({r.host for r in refused})} address(es); see %jaxsys security"
                )
        elif args.action == "dashboard":
            return s.show_dashboard()
        elif args.action == "security":
            from ..cluster.audit import audit, format_audit, format_refusals

            print(f"security: {s.require_cluster().security}")
            print(format_audit(audit(s.cluster)))
            if s.cluster.pki is not None:
                print(format_refusals(s.refusals(), s.cluster.reports_refusals))
        elif args.action == "rotate-certs":
            serials = s.rotate_certs()
            print(
                "jaxsys: new certificates written for "
                + ", ".join(f"p{r} (serial {hex(x)[:12]})" for r, x in enumerate(serials))
                + ".\nJAX re-reads them about every 10 minutes; jaxsys says when the "
                "coordination service presents the new one (%jaxsys status shows where it stands)."
            )
        elif args.action == "inspect":
            if not args.name:
                raise UsageError("%jaxsys inspect needs a name, e.g. %jaxsys inspect jnp.sum")
            reply = s.remote_inspect(args.name, len(args.name), args.detail)
            if reply is None or not reply.get("found"):
                print(f"Object `{args.name}` not found on process 0.")
            else:
                from IPython.display import publish_display_data

                publish_display_data(reply["data"], reply.get("metadata", {}))

    @magic_arguments()
    @argument("--procs", default=None, help="processes to run on, e.g. 0,2-3 (default: all)")
    @argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="interrupt processes still running after this many seconds",
    )
    @argument(
        "--no-collate",
        action="store_true",
        help="label every line by process; do not merge identical lines",
    )
    @argument(
        "--all-displays",
        action="store_true",
        help="show rich output from every process, not only the first",
    )
    @argument(
        "--grace",
        type=_positive_float,
        default=None,
        help="once a process fails, seconds the others may run on before the cell counts as hung (default 10)",
    )
    @argument(
        "--on-hang",
        choices=("report", "interrupt", "restart"),
        default=None,
        help="what to do with a hung cell (default interrupt)",
    )
    @argument(
        "--force",
        action="store_true",
        help="run even though the JAX world is out of step (no collectives!)",
    )
    @argument("mode", nargs="?", choices=("on", "off"), help="line form only: SPMD mode on or off")
    @line_cell_magic
    def multihost(self, line: str = "", cell: str | None = None):
        """Run a cell on every JAX process (``%%multihost``), or switch SPMD mode (``%multihost on|off``).

        Output is streamed while the cell runs. A line printed identically by all selected
        processes appears once as ``[p0-3] line``; differing lines appear per process in
        process order. Rich output (plots, HTML) comes from the first selected process
        unless ``--all-displays``. If processes raise, the cell fails with one traceback per
        distinct error and the processes that raised it. The stop button interrupts the
        processes and names them. Starts a cluster with the defaults if none is running.

        Hangs are diagnosed, not endured: when the cell passes ``--timeout``, or when some
        processes failed and the others are still running ``--grace`` seconds later (they
        are most likely waiting for the failed one in a collective), the hang doctor prints
        what every process did and the Python stack of each running one, then acts per
        ``--on-hang``: ``interrupt`` (default), ``restart`` the JAX world, or ``report``
        and keep waiting. After processes were interrupted inside JAX, cells are refused
        until ``%jaxsys restart`` (``--force`` overrides), because on CPU the next
        collective would hang.

        With SPMD mode on, every cell runs on all processes; cells starting with ``%%local``
        (or a jaxsys magic such as ``%jaxsys`` or ``%pull``) run in the kernel.

        Examples
        --------
        ::

            %%multihost
            import jax
            print(jax.process_index(), jax.device_count())

            %%multihost --procs 0,2-3 --timeout 30
            train_step()

            %%multihost --grace 5 --on-hang restart
            step()

            %multihost on
        """
        args = parse_argstring(self.multihost, line)
        if cell is None:
            if args.mode is None:
                state = "on" if self.session.spmd else "off"
                print(f"SPMD mode is {state}; use %multihost on|off, or %%multihost for one cell")
                return None
            self.session.spmd = args.mode == "on"
            if self.session.spmd:
                print(
                    "SPMD mode on: cells run on every process; start a cell with %%local to run it here"
                )
            else:
                print(
                    "SPMD mode off: cells run in the kernel; use %%multihost to run one on every process"
                )
            return None
        if args.mode is not None:
            raise UsageError(
                "%%multihost takes options only; use %multihost on|off on a line of its own"
            )
        if not cell.strip():
            return None
        return self.session.run_cell(
            cell,
            args.procs,
            timeout=args.timeout,
            collate=not args.no_collate,
            all_displays=args.all_displays,
            grace=args.grace,
            on_hang=args.on_hang,
            force=args.force,
        )

    @cell_magic
    def local(self, line: str, cell: str):
        """Run this cell in the kernel process, not on the JAX processes.

        Useful in SPMD mode (``%multihost on``), where every other cell runs everywhere.
        The kernel never imports JAX; work here on values brought back with ``%pull``.

        Examples
        --------
        ::

            %%local
            import numpy as np
            print(np.asarray(x).sum())
        """
        if line.strip():
            raise UsageError(f"%%local takes no options, got {line.strip()!r}")
        result = self.shell.run_cell(cell, store_history=False)
        if result.error_in_exec is not None:
            raise result.error_in_exec

    @magic_arguments()
    @argument("name", help="the variable to bring into the kernel")
    @argument("--proc", type=int, default=0, help="the process to take the value from (default 0)")
    @line_magic
    def pull(self, line: str = ""):
        """Bring a variable from a JAX process into the kernel's namespace.

        A ``jax.Array`` that spans processes arrives as the full global numpy array, gathered
        from every process (a collective: all processes must hold the same array). Local
        jax arrays arrive as numpy arrays and other values as they are.

        Examples
        --------
        ::

            %pull x              # x from process 0, as numpy
            %pull losses --proc 2
        """
        args = parse_argstring(self.pull, line)
        value = self.session.pull(args.name, args.proc)
        self.shell.user_ns[args.name] = value
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        desc = type(value).__name__ + (f" {dtype} {tuple(shape)}" if shape is not None else "")
        print(f"{args.name} <- {format_procs([args.proc])}: {desc}", file=sys.stderr)
