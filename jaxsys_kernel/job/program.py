"""A notebook as a multi-controller program: the cells that run on the processes, in order.

:func:`from_notebook` reads the notebook's ``%%multihost`` cells (and, between
``%multihost on`` and ``%multihost off``, the plain cells that then run on every process),
its ``%jaxsys start`` line (the cluster's size), and which cells are expected to fail
(tagged ``raises-exception``). Cells that run in the kernel only (``%%local``, ``%pull``,
plain cells, other magics) are left out, with a comment saying so. :func:`render` writes
the program: every process runs the same file, takes its rank from what its launcher set,
joins the JAX world, and runs the cells in one namespace, marking where each begins so
that the outputs can be collated per cell afterwards.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._ranges import parse_procs
from ..cluster.config import DEFAULT_DEVICES_PER_HOST, DEFAULT_HOSTS, ClusterConfig
from ..cluster.launchers.registry import rank_variables, size_variables
from ..cluster.options import merge_layers
from ..errors import ConfigError
from . import preempt

# What the program prints (alone on a line) where a cell begins, where one failed, and
# where a process stops because another one failed or died (its cell, then why).
CELL_MARK = "\x1ejaxsys-cell "
ERROR_MARK = "\x1ejaxsys-error "
STOP_MARK = "\x1ejaxsys-stop "
# Where a runner of jaxsys_kernel.job writes each process's exit code (a signal as its
# negative number; null if unknown) and which process failed first.
EXIT_CODES = "exit-codes.json"
# The variables of a process's mTLS files: a path relative to the job's folder is taken
# from the program's own folder, so that the folder can be moved or copied as it is.
PATH_VARIABLES = ("JAX_MTLS_CERT_FILE", "JAX_MTLS_KEY_FILE", "JAX_MTLS_CA_FILE")


@dataclass
class Cell:
    """One cell of the program.

    Attributes
    ----------
    index : int
        The cell's position in the notebook (0-based, counting every cell).
    source : str
        The Python it runs, without its magic line.
    procs : list of int or None
        The processes it runs on (``%%multihost --procs``); None for all.
    expect_error : bool
        Tagged ``raises-exception``: its failure is expected, not a job failure.
    """

    index: int
    source: str
    procs: list[int] | None = None
    expect_error: bool = False


@dataclass
class Program:
    """What a notebook becomes: its cells, those left out, and its cluster's options.

    ``options`` are the cluster options resolved in layers (the ``JAXSYS_*`` variables,
    the notebook's ``%jaxsys start`` line, the override given to ``jaxsys job``), by
    ``ClusterConfig``'s names; ``hosts`` and ``devices_per_host`` are read from them.
    """

    cells: list[Cell] = field(default_factory=list)
    left_out: list[tuple[int, str]] = field(default_factory=list)
    hosts: int = DEFAULT_HOSTS
    devices_per_host: int = DEFAULT_DEVICES_PER_HOST
    options: dict[str, Any] = field(default_factory=dict)
    #: JAX options the notebook's ``%jaxsys transfer-guard`` lines set, each with the index
    #: of its cell: they apply to the cells after it.
    settings: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    #: The notebook's ``%jaxsys start`` line has ``--thread-guard``: every cell runs under
    #: ``jax.thread_guard``.
    thread_guard: bool = False

    def resolve(self, *layers: Mapping[str, Any] | None) -> None:
        """Take the options of ``layers`` (lowest first), and the sizes they give."""
        self.options = merge_layers(self.options, *layers)
        hosts = self.options.get("hosts", self.hosts)
        self.hosts = hosts if isinstance(hosts, int) else len(hosts)
        self.devices_per_host = self.options.get("devices_per_host", self.devices_per_host)


@dataclass
class JobSetup:
    """What every process of a job is given before JAX starts: what a notebook's cluster
    gives its engines (see :func:`~jaxsys_kernel.job.prepare.job_setup`).

    Attributes
    ----------
    env : dict
        Variables for every process: the compilation cache, recoverability, ``--env``.
    process_env : dict
        Variables by rank: each process's mTLS files.
    init_timeout : float
        Seconds allowed for ``jax.distributed.initialize``.
    heartbeat : float or None
        Seconds without heartbeats before JAX declares a process dead; None for JAX's own.
    cert_dir : str or None
        Where the processes' certificates are; None without mTLS (``--insecure``).
    preemption : str
        What SIGTERM does (:data:`~jaxsys_kernel.job.preempt.MODES`): ``"jax"``, a
        preemption notice; ``"kill"``, the end of the process.
    preemption_grace : float
        Seconds a process has after a preemption notice, before it ends itself.
    """

    env: dict[str, str] = field(default_factory=dict)
    process_env: dict[int, dict[str, str]] = field(default_factory=dict)
    init_timeout: float = 60.0
    heartbeat: float | None = 10.0
    cert_dir: str | None = None
    preemption: str = preempt.MODES[0]
    preemption_grace: float = preempt.DEFAULT_GRACE_S


class _LineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit the process
        raise ConfigError(message)


def start_line_options(line: str) -> dict[str, Any]:
    """The cluster options a ``%jaxsys start`` line gives, read with the flags that
    ``%jaxsys start`` itself takes (``ClusterConfig``'s); its other flags are ignored.

    Raises
    ------
    ConfigError
        For a value a flag cannot take, e.g. ``--hosts two``.
    """
    parser = _LineParser(prog="%jaxsys start", add_help=False)
    ClusterConfig.add_arguments(parser)
    args, _ = parser.parse_known_args(shlex.split(line)[2:])
    return ClusterConfig.given(args)


def transfer_guard_options(line: str) -> dict[str, str]:
    """The JAX options a ``%jaxsys transfer-guard`` line sets (none when it only shows the
    guard), read with the magic's own parser.

    Raises
    ------
    ConfigError
        For a line the magic would refuse, e.g. an unknown level.
    """
    # Deferred: the magic's parser comes with IPython, which only notebooks with a
    # transfer-guard line need.
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import parse_argstring

    # Deferred: the magics import IPython too.
    from ..magics.actions_guard import SHORT, guard_settings, transfer_guard

    words = line.split(None, 2)  # "%jaxsys", "transfer-guard", and its arguments
    try:
        args = parse_argstring(transfer_guard, words[2] if len(words) > 2 else "")
    except UsageError as e:
        raise ConfigError(str(e)) from None
    levels = guard_settings(args.level, args.h2d, args.d2h, args.d2d)
    # JAX's option of a direction is named after it: jax_transfer_guard_host_to_device.
    return {
        "jax_transfer_guard_" + SHORT[short].replace("-", "_"): level
        for short, level in levels.items()
    }


def _multihost_procs(first_line: str, nprocs: int) -> list[int] | None:
    words = shlex.split(first_line)[1:]
    for i, w in enumerate(words):
        if w == "--procs" and i + 1 < len(words):
            return parse_procs(words[i + 1], nprocs)
        if w.startswith("--procs="):
            return parse_procs(w.split("=", 1)[1], nprocs)
    return None


def from_notebook(
    path: str | Path,
    hosts: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    kernelspec: Mapping[str, Any] | None = None,
) -> Program:
    """The program a notebook's cells make (see the module's docstring).

    Parameters
    ----------
    path : path-like
        The notebook.
    hosts : int, optional
        Processes to run, instead of the notebook's first ``%jaxsys start --hosts``.
    overrides : mapping, optional
        Cluster options that win over the notebook's ``%jaxsys start`` line.
    kernelspec : mapping, optional
        Cluster options under the line's (what the kernelspec's variables give).

    Raises
    ------
    ConfigError
        When the notebook's ``%jaxsys start`` line has a value its flag cannot take.
    """
    nb = json.loads(Path(path).read_text())
    top = merge_layers(overrides, {"hosts": hosts})
    prog = Program()
    # Cells before any %jaxsys start run on the cluster the kernelspec (and the override) make.
    prog.resolve(kernelspec, top)
    started = False
    spmd = False
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", ""))
        first = src.split("\n", 1)[0].strip()
        expect = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        if first.startswith("%jaxsys start") and not started:
            started = True
            try:
                prog.resolve(start_line_options(first), top)
            except ConfigError as e:
                raise ConfigError(f"cell {index}'s %jaxsys start line: {e}") from None
            prog.thread_guard = "--thread-guard" in shlex.split(first)
            prog.left_out.append((index, "cluster start (the job's own set-up does it)"))
        elif first.startswith("%jaxsys transfer-guard") and _guard_cell(prog, index, first):
            pass
        elif first.startswith("%%multihost"):
            body = src.split("\n", 1)[1] if "\n" in src else ""
            procs = _multihost_procs(first, prog.hosts)
            prog.cells.append(Cell(index, body, procs, expect))
        elif first in ("%multihost on", "%multihost off"):
            spmd = first.endswith("on")
            prog.left_out.append((index, f"{first} (the program runs as it says)"))
        elif spmd and not first.startswith("%"):
            prog.cells.append(Cell(index, src, None, expect))
        else:
            kind = first.split()[0] if first.startswith("%") else "a kernel cell"
            prog.left_out.append((index, f"{kind} runs in the kernel only"))
    return prog


def _guard_cell(prog: Program, index: int, first: str) -> bool:
    """Keep the JAX options of a ``%jaxsys transfer-guard`` line that sets some."""
    try:
        options = transfer_guard_options(first)
    except ConfigError as e:
        raise ConfigError(f"cell {index}'s %jaxsys transfer-guard line: {e}") from None
    if not options:
        return False
    prog.settings.append((index, options))
    prog.left_out.append((index, "%jaxsys transfer-guard: the program sets its JAX options"))
    return True


_HEADER = '''\
"""Generated by `jaxsys job` from {notebook}: run it on every process, as one job."""

import ast
import os
import signal
import sys
import time
import traceback

RANK_VARIABLES = {rank_variables!r}
SIZE_VARIABLES = {size_variables!r}
DEVICES_PER_HOST = {devices}
# What a notebook's cluster gives each of its processes: for every process (the compilation
# cache, recoverability, --env), and by rank (its mTLS certificate and key).
ENV = {env!r}
PROCESS_ENV = {process_env!r}
# JAX options the notebook's %jaxsys transfer-guard lines set, by the cell that set them,
# and whether its %jaxsys start line has --thread-guard.
SETTINGS = {settings!r}
THREAD_GUARD = {thread_guard!r}
# What SIGTERM does (jaxsys_kernel/job/preempt.py), and the seconds a process has after a
# preemption notice.
PREEMPTION = {preemption!r}
PREEMPTION_GRACE_S = {preemption_grace!r}


def _first(names):
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return None


RANK, SIZE = _first(RANK_VARIABLES), _first(SIZE_VARIABLES)
if PROCESS_ENV and RANK not in PROCESS_ENV:
    sys.exit(f"no certificate for process {{RANK}}: run this program with its launcher's command")
# Before JAX is imported: it reads its JAX_* options from the environment then. The job's
# files are named relative to this program's folder, wherever it has been moved.
HERE = os.path.dirname(os.path.abspath(__file__))
PATH_VARIABLES = {path_variables!r}
os.environ.update(ENV)
for _name, _value in PROCESS_ENV.get(RANK, {{}}).items():
    os.environ[_name] = os.path.join(HERE, _value) if _name in PATH_VARIABLES else _value
# Each process simulates its CPU devices (ignored where accelerators decide).
os.environ.setdefault("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={{DEVICES_PER_HOST}}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
kwargs = dict(
{initialize})
if os.environ.get("JAXSYS_COORDINATOR"):
    kwargs.update(
        coordinator_address=os.environ["JAXSYS_COORDINATOR"], num_processes=SIZE, process_id=RANK
    )
# Without a coordinator given, JAX finds it itself under Slurm and Open MPI.
jax.distributed.initialize(**kwargs)
if PREEMPTION == "kill":
    # JAX catches SIGTERM (for preemption notices): end at once instead.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
RANK, SIZE = jax.process_index(), jax.process_count()
# Before the first cell's mark, so in this process's output but not in the job's log.
print(
    f"jaxsys job: process {{RANK}} of {{SIZE}}: "
    f"jax_mtls_cert_file={{jax.config.jax_mtls_cert_file or None}} "
    f"jax_distributed_verify_secure_credentials="
    f"{{jax.config.jax_distributed_verify_secure_credentials}} "
    f"jax_compilation_cache_dir={{jax.config.jax_compilation_cache_dir or None}} "
    f"jax_enable_recoverability={{jax.config.jax_enable_recoverability}}",
    flush=True,
)
if THREAD_GUARD:
    # As %jaxsys start --thread-guard runs every cell: multi-process operations from any
    # other thread than this one fail.
    jax.thread_guard(True).__enter__()

'''

_CELLS = """\
CELLS = [
"""

_FOOTER = """\
]

G = {{"__name__": "__main__"}}
# The coordination service's client (private in JAX 0.12, as in jaxsys_kernel/engine/
# barrier.py): its key-value store is where each process says how each cell ended for it.
from jax._src import distributed as _distributed  # noqa: E402

CLIENT = _distributed.global_state.client
# Milliseconds a wait for one missing process's status lasts before the others' are read
# again (not a sleep: the wait ends when the status arrives).
WATCH_MS = 200
# Seconds a failing process 0 waits for the others to read its status: it serves the
# coordination service, and when it leaves at once the others only learn that it is gone.
# Any other failing process leaves as soon as its status is in the store.
FAIL_WAIT_S = 2.0
{watch}


def stop(index, why):
    # Why this process ends at this cell, for the job's log; then leave at once.
    print({stop_mark!r} + f"{{index}} {{why}}", flush=True)
    os._exit(1)


def cell_barrier(index, failed):
    # A cell's end is a sync point, as in a notebook: say how the cell ended here, then wait
    # until every process has said so; stop when one failed. A process that died says
    # nothing: its launcher ends the others (jaxsys job's runners, srun, mpiexec), as does
    # the coordination service once its heartbeats stop. (Asking the service which
    # processes live would wait for every process to ask too.)
    if SIZE == 1:
        return
    prefix = f"jaxsys/job/cell/{{index}}/"
    until = time.monotonic() + FAIL_WAIT_S if failed else None
    try:
        CLIENT.key_value_set(prefix + str(RANK), "failed" if failed else "ok")
        while not failed or RANK == 0:
            pairs = CLIENT.key_value_dir_get(prefix)
            said = {{int(key.rsplit("/", 1)[1]): value for key, value in pairs}}
            bad = sorted(r for r, v in said.items() if v != "ok")
            if bad and not failed:
                stop(index, f"failed on {{_procs(bad)}}")
            missing = [r for r in range(SIZE) if r not in said]
            if not missing or (until is not None and time.monotonic() > until):
                return
            try:
                CLIENT.blocking_key_value_get(prefix + str(missing[0]), WATCH_MS)
            except Exception:  # not there yet: read them all again
                pass
    except Exception as e:  # the service is gone: process 0 ended
        if not failed:
            stop(index, f"the coordination service is gone ({{type(e).__name__}}): p0 ended")


def _procs(ranks):
    return "p" + ",".join(str(r) for r in ranks)


def run_cell(source, name):
    # As the notebook does: the value of a last bare expression is shown.
    tree = ast.parse(source, name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, "exec"), G)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), name, "eval"), G)
        if value is not None:
            print(repr(value))


for index, procs, expect_error, source in CELLS:
    while SETTINGS and SETTINGS[0][0] < index:
        for name, value in SETTINGS.pop(0)[1].items():
            jax.config.update(name, value)
    print({cell_mark!r} + str(index), flush=True)
    failed = False
    if procs is None or RANK in procs:
        try:
            run_cell(source, f"<cell {{index}}>")
        except BaseException as e:
            # The traceback as the notebook shows it: from the cell's own frames on.
            tb = e.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb, file=sys.stdout)
            print({error_mark!r} + str(index), flush=True)
            failed = not expect_error
    sys.stdout.flush()
    cell_barrier(index, failed)
    if failed:
        # Other processes may wait for this one in a collective: leave, so that the
        # launcher (srun --kill-on-bad-exit, mpiexec, jaxsys job) stops them too.
        os._exit(1)
{unwatch}
if jax.config.jax_enable_recoverability and SIZE > 1:
    # With recoverability JAX's shutdown waits for no process, and a process still shutting
    # down when process 0 (which serves the coordination service) has left ends with a
    # fatal error. So: all together at a barrier, the others shut down, process 0 last.
    client = CLIENT
    client.wait_at_barrier("jaxsys-job-end", {end_ms})
    if RANK:
        jax.distributed.shutdown()
    else:
        deadline = time.monotonic() + {end_ms} / 1000
        while len(client.get_live_nodes(list(range(SIZE)))) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
"""


def render(prog: Program, notebook: str, setup: JobSetup | None = None) -> str:
    """The program's text: every process runs it under ``setup`` (by default, the declared
    timeouts and nothing else)."""
    setup = setup or JobSetup()
    initialize = {"initialization_timeout": int(setup.init_timeout)}
    if setup.heartbeat is not None:
        initialize = {"heartbeat_timeout_seconds": int(setup.heartbeat), **initialize}
    out = [
        _HEADER.format(
            notebook=notebook,
            # Each launcher's variables: the program runs under whichever the job uses.
            rank_variables=rank_variables(),
            size_variables=size_variables(),
            devices=prog.devices_per_host,
            env=setup.env,
            process_env=setup.process_env,
            initialize="".join(f"    {k}={v!r},\n" for k, v in initialize.items()),
            settings=prog.settings,
            thread_guard=prog.thread_guard,
            preemption=setup.preemption,
            preemption_grace=setup.preemption_grace,
            path_variables=PATH_VARIABLES,
        ),
        _CELLS,
    ]
    rows = [(index, f"    # cell {index} left out: {why}\n") for index, why in prog.left_out]
    rows += [
        (c.index, f"    ({c.index}, {c.procs!r}, {c.expect_error!r}, {c.source!r}),\n")
        for c in prog.cells
    ]
    out += [text for _, text in sorted(rows)]
    out.append(
        _FOOTER.format(
            cell_mark=CELL_MARK,
            error_mark=ERROR_MARK,
            stop_mark=STOP_MARK,
            end_ms=int(setup.init_timeout * 1000),
            unwatch=preempt.UNWATCH,
            watch=preempt.watch_code(),
        )
    )
    return "".join(out)
