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
from ..cluster.config import ClusterConfig
from ..cluster.options import merge_layers
from ..errors import ConfigError

# What the program prints (alone on a line) where a cell begins and where one failed.
CELL_MARK = "\x1ejaxsys-cell "
ERROR_MARK = "\x1ejaxsys-error "


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
    hosts: int = 4
    devices_per_host: int = 2
    options: dict[str, Any] = field(default_factory=dict)

    def resolve(self, *layers: Mapping[str, Any] | None) -> None:
        """Take the options of ``layers`` (lowest first), and the sizes they give."""
        self.options = merge_layers(self.options, *layers)
        hosts = self.options.get("hosts", self.hosts)
        self.hosts = hosts if isinstance(hosts, int) else len(hosts)
        self.devices_per_host = self.options.get("devices_per_host", self.devices_per_host)


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
            prog.left_out.append((index, "cluster start (the job's own set-up does it)"))
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


_HEADER = '''\
"""Generated by `jaxsys job` from {notebook}: run it on every process, as one job."""

import ast
import os
import signal
import sys
import traceback

RANK_VARIABLES = {rank_variables!r}
SIZE_VARIABLES = ("JAXSYS_NUM_PROCESSES", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
DEVICES_PER_HOST = {devices}


def _first(names):
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return None


RANK, SIZE = _first(RANK_VARIABLES), _first(SIZE_VARIABLES)
# Each process simulates its CPU devices (ignored where accelerators decide).
os.environ.setdefault("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={{DEVICES_PER_HOST}}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
kwargs = dict(
    heartbeat_timeout_seconds={heartbeat},
    initialization_timeout={init_timeout},
)
if os.environ.get("JAXSYS_COORDINATOR"):
    kwargs.update(
        coordinator_address=os.environ["JAXSYS_COORDINATOR"], num_processes=SIZE, process_id=RANK
    )
# Without a coordinator given, JAX finds it itself under Slurm and Open MPI.
jax.distributed.initialize(**kwargs)
# JAX catches SIGTERM (for preemption notices); a launcher stopping the job after another
# process failed sends SIGTERM first, and only its SIGKILL, up to Slurm's KillWait later,
# would end a process waiting in a collective. Leave at once instead.
signal.signal(signal.SIGTERM, signal.SIG_DFL)
RANK, SIZE = jax.process_index(), jax.process_count()

CELLS = [
'''

_FOOTER = """\
]

G = {{"__name__": "__main__"}}


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
    print({cell_mark!r} + str(index), flush=True)
    if procs is not None and RANK not in procs:
        continue
    try:
        run_cell(source, f"<cell {{index}}>")
    except BaseException as e:
        # The traceback as the notebook shows it: from the cell's own frames on.
        tb = e.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb, file=sys.stdout)
        print({error_mark!r} + str(index), flush=True)
        if not expect_error:
            sys.stdout.flush()
            # Other processes may wait for this one in a collective: leave at once, so the
            # launcher (srun --kill-on-bad-exit, mpiexec, jaxsys job) stops them too.
            os._exit(1)
    sys.stdout.flush()
"""


def render(prog: Program, notebook: str, init_timeout: float = 60.0, heartbeat: float = 10.0):
    """The program's text."""
    from ..contract import RANK_VARIABLES

    out = [
        _HEADER.format(
            notebook=notebook,
            rank_variables=tuple(RANK_VARIABLES),
            devices=prog.devices_per_host,
            heartbeat=int(heartbeat),
            init_timeout=int(init_timeout),
        )
    ]
    rows = [(index, f"    # cell {index} left out: {why}\n") for index, why in prog.left_out]
    rows += [
        (c.index, f"    ({c.index}, {c.procs!r}, {c.expect_error!r}, {c.source!r}),\n")
        for c in prog.cells
    ]
    out += [text for _, text in sorted(rows)]
    out.append(_FOOTER.format(cell_mark=CELL_MARK, error_mark=ERROR_MARK))
    return "".join(out)
