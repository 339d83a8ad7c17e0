"""IPython magics: ``%jaxsys``, ``%%multihost`` / ``%multihost``, ``%%local``, ``%pull``.

Each magic is a thin parser: it bounds and splits its line and calls the session (or, for
``%jaxsys``, an action in :mod:`.actions`). The magics opt out of IPython's ``$var`` /
``{expr}`` expansion, which runs before any check and takes seconds on a long line;
``%jaxsys`` and ``%multihost`` expand the bounded line themselves, so options such as
``--cache-dir {cache_dir}`` keep working, and ``%pull`` and ``%%local`` take none.
"""

from __future__ import annotations

import re

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    cell_magic,
    line_cell_magic,
    line_magic,
    magics_class,
    no_var_expand,
)
from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs
from ..cells import MultihostError, MultihostInterrupt
from . import actions, retries
from .actions import JAXSYS_ACTIONS, format_status
from .actions_args import bounded, expand, parse, rank, seconds, split
from .actions_args import env_pairs as _env_pairs
from .session import MultihostSession

__all__ = [
    "JAXSYS_ACTIONS",
    "JaxSysMagics",
    "_env_pairs",
    "action_help_transformer",
    "format_status",
]

_ACTION_HELP = re.compile(r"^(\s*%jaxsys)\s+([\w-]+)\s*\?{1,2}\s*$")


def action_help_transformer(lines: list[str]) -> list[str]:
    """Turn ``%jaxsys ACTION?`` into ``%jaxsys help ACTION`` (an IPython input transformer).

    IPython would otherwise read the line as a help request for a Python name ``ACTION``.
    """
    out = []
    for line in lines:
        m = _ACTION_HELP.match(line)
        out.append(f"{m.group(1)} help {m.group(2)}\n" if m else line)
    return out


# Pure, so IPython may also run it when it checks whether a cell is complete.
action_help_transformer.has_side_effects = False


def cell_options(args) -> dict:
    """The ``run_cell`` keywords from a parsed ``%%multihost`` line."""
    return {
        "timeout": args.timeout,
        "collate": not args.no_collate,
        "all_displays": args.all_displays,
        "grace": args.grace,
        "on_hang": args.on_hang,
        "force": args.force,
        "thread_guard": True if args.thread_guard else None,
        "check": False if args.no_check else None,
        # A directory implies --profile; run_cell takes it in place of True.
        "profile": args.profile_dir or args.profile,
    }


@magics_class
class JaxSysMagics(Magics):
    """The magics of the jaxsys kernel; each parses its arguments and calls the session."""

    def __init__(self, shell, session: MultihostSession):
        super().__init__(shell)
        self.session = session

    def _line(self, line: str, magic: str, *, expand_vars: bool = True) -> str:
        """Bound a magic line and expand its ``$var`` / ``{expr}`` if the magic takes them."""
        line = bounded(line, magic)
        if expand_vars:
            line = bounded(expand(line, self.shell.user_ns), magic)
        return line

    @no_var_expand
    @line_magic
    def jaxsys(self, line: str = ""):
        # The docstring (this magic's %jaxsys? page) is generated from the actions below.
        return actions.dispatch(self.session, self._line(line, "%jaxsys"))

    jaxsys.__doc__ = actions.overview()

    @magic_arguments()
    @argument("--procs", default=None, help="processes to run on, e.g. 0,2-3 (default: all)")
    @argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
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
        type=seconds,
        default=None,
        metavar="SECONDS",
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
    @argument(
        "--thread-guard",
        action="store_true",
        help="run the cell under jax.thread_guard: multi-process JAX operations from other threads fail",
    )
    @argument(
        "--profile",
        action="store_true",
        help="run jax.profiler on the processes and show one merged timeline of them",
    )
    @argument(
        "--profile-dir",
        default=None,
        metavar="PATH",
        help="profile (as --profile) and save the merged trace in PATH "
        "(default: jaxsys-traces in the notebook's directory)",
    )
    @argument(
        "--no-check",
        action="store_true",
        help="do not compare the processes' dispatches while the cell runs (%%jaxsys divergence)",
    )
    @argument(
        "--verbose",
        action="store_true",
        help="after a hang report, show the interrupted processes' tracebacks in full",
    )
    @argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="when a process dies or is named stuck, restart the JAX world and run the cell "
        "again, up to N times (the cell restores its own progress)",
    )
    @argument("mode", nargs="?", choices=("on", "off"), help="line form only: SPMD mode on or off")
    @no_var_expand
    @line_cell_magic
    def multihost(self, line: str = "", cell: str | None = None):
        """Run a cell on every JAX process (``%%multihost``), or switch SPMD mode (``%multihost on|off``).

        Output is streamed while the cell runs. A line printed identically by all selected processes
        appears once as ``[p0-3] line``; differing lines appear per process in process order. Rich
        output (plots, HTML) comes from the first selected process unless ``--all-displays``. If
        processes raise, the cell fails with one traceback per distinct error and the processes that
        raised it. The stop button interrupts the processes and names them. Starts a cluster with
        the defaults if none is running.

        Hangs are diagnosed, not endured: when the cell passes ``--timeout``, or when some processes
        failed and the others are still running ``--grace`` seconds later (they are most likely
        waiting for the failed one in a collective), the hang doctor prints what every process did
        and the Python stack of each running one, then acts per ``--on-hang``: ``interrupt``
        (default), ``restart`` the JAX world, or ``report`` and keep waiting. After processes were
        interrupted inside JAX, cells are refused until ``%jaxsys restart`` (``--force`` overrides),
        because on CPU the next collective would hang.

        ``--retries N``: after a death or a hang, restart the world and run the cell again, up to N
        times; the cell restores its own progress (see :mod:`.retries`).

        ``--thread-guard`` runs the cell under ``jax.thread_guard``: a multi-process JAX operation
        (a collective, a cross-process transfer) issued from any thread but the cell's fails on that
        process with an error naming both threads, because threads can enqueue such operations in
        different orders on different processes.

        ``%run script.py --flag v`` runs a script written for ``python`` unchanged on every process:
        it sees its own ``sys.argv`` and ``__name__ == "__main__"``, an agreeing
        ``jax.distributed.initialize()`` is accepted and ``shutdown()`` leaves the world running
        (each says so in one line), and its exception fails the cell with each process's traceback.
        The script must be at the same path on every host; a script pasted into a cell sees the
        ``sys.argv`` of ``python`` alone.

        With SPMD mode on, every cell runs on all processes; cells starting with ``%%local`` (or a
        jaxsys magic such as ``%jaxsys`` or ``%pull``) run in the kernel.

        Examples
        --------
        ::

            %%multihost
            import jax
            print(jax.process_index(), jax.device_count())

            %%multihost --procs 0,2-3 --timeout 30
            train_step()

            %%multihost --grace 5 --on-hang restart --retries 2
            step()

            %%multihost --thread-guard
            run_pipeline()

            %%multihost
            %run train.py --steps 3

            %multihost on
        """
        return self._multihost(line, cell)

    def _multihost(self, line: str, cell: str | None):
        """``%%multihost``'s work (the magic's body is its help): parse, then run or switch."""
        args = parse(self.multihost.parser, split(self._line(line, "%multihost")), "%%multihost")
        if cell is None:
            return self._switch_spmd(args.mode)
        if args.mode is not None:
            raise UsageError(
                "%%multihost takes options only; use %multihost on|off on a line of its own"
            )
        if not cell.strip():
            return None
        return self._run_cell(cell, args)

    def _run_cell(self, cell: str, args):
        """Run a ``%%multihost`` cell as its parsed line says (``--retries``, ``--verbose``)."""
        try:
            if args.retries:
                return retries.run_with_retries(
                    self.session, cell, args.procs, cell_options(args), args.retries
                )
            return self.session.run_cell(cell, args.procs, **cell_options(args))
        except (MultihostError, MultihostInterrupt) as e:
            e.verbose = args.verbose
            raise

    def _switch_spmd(self, mode: str | None) -> None:
        """``%multihost on|off``, or say which mode is on."""
        if mode is None:
            state = "on" if self.session.spmd else "off"
            print(f"SPMD mode is {state}; use %multihost on|off, or %%multihost for one cell")
            return
        self.session.spmd = mode == "on"
        if self.session.spmd:
            print(
                "SPMD mode on: cells run on every process; start a cell with %%local to run it here"
            )
        else:
            print(
                "SPMD mode off: cells run in the kernel; use %%multihost to run one on every process"
            )

    @no_var_expand
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
            raise UsageError(f"%%local takes no options, got {bounded(line, '%%local').strip()!r}")
        result = self.shell.run_cell(cell, store_history=False)
        if result.error_in_exec is not None:
            raise result.error_in_exec

    @magic_arguments()
    @argument("name", help="the variable to bring into the kernel")
    @argument(
        "--procs",
        "--proc",
        dest="proc",
        type=rank,
        default=0,
        metavar="P",
        help="the process to take the value from (default 0); --proc is the older name",
    )
    @no_var_expand
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
            %pull losses --procs 2
        """
        args = parse(self.pull.parser, split(self._line(line, "%pull", expand_vars=False)), "%pull")
        value = self.session.pull(args.name, args.proc)
        self.shell.user_ns[args.name] = value
        shape = getattr(value, "shape", None)
        dtype = getattr(value, "dtype", None)
        desc = type(value).__name__ + (f" {dtype} {tuple(shape)}" if shape is not None else "")
        print(f"{args.name} <- {format_procs([args.proc])}: {desc}")
