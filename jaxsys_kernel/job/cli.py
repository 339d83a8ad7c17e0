"""``jaxsys job NOTEBOOK``: the command line of :mod:`jaxsys_kernel.job`."""

from __future__ import annotations

import argparse
import getpass
import os
import re
import secrets
import shlex
import sys
from pathlib import Path

from .._ranges import format_procs
from ..cluster.config import ClusterConfig
from ..cluster.launchers import DEFAULT, launcher_class
from ..cluster.options import kernelspec_layer
from ..errors import ConfigError
from .preempt import DEFAULT_GRACE_S, MODES
from .prepare import job_id, job_setup
from .program import from_notebook, render
from .retry import check_retries, run_with_retries
from .run import run_job


def add_parser(sub) -> None:
    """Add ``job`` to the ``jaxsys`` command's subparsers."""
    job = sub.add_parser(
        "job",
        help="turn a notebook into a multi-controller program, and run it as one job",
    )
    job.add_argument("notebook")
    job.add_argument("--out", default=None, help="directory for the job (default NOTEBOOK-job/)")
    job.add_argument("--submit", action="store_true", help="run it, and collate its output")
    job.add_argument("--timeout", type=float, default=1800.0, help="seconds the job may take")
    job.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="with --submit: run a failed job again, up to N times (the program resumes from "
        "its own checkpoint, kept in the job's folder)",
    )
    job.add_argument(
        "--preemption",
        choices=MODES,
        default=MODES[0],
        help="what SIGTERM to a process does: 'jax' (default), a preemption notice: every "
        "process's multihost_utils.reached_preemption_sync_point(step) returns True at the "
        "same step, where the program saves and returns (Slurm's --signal=TERM@N, scancel "
        "--signal=TERM, or SIGTERM to any one process); 'kill', the process ends at once",
    )
    job.add_argument(
        "--preemption-grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="with --preemption jax: seconds every process has after a notice to reach the "
        f"sync point, save and end, before it ends itself (default {DEFAULT_GRACE_S:g})",
    )
    ClusterConfig.add_arguments(
        job.add_argument_group("cluster options, over the notebook's own %jaxsys start line")
    )


def cmd_job(args: argparse.Namespace) -> int:
    """Write the program (and the launcher's job files); with ``--submit``, run it."""
    nb = Path(args.notebook)
    if not nb.is_file():
        print(f"jaxsys job: no such notebook: {nb}", file=sys.stderr)
        return 2
    try:
        prog = from_notebook(
            nb, overrides=ClusterConfig.given(args), kernelspec=kernelspec_layer(os.environ)
        )
        launcher = launcher_class(prog.options.get("launcher", DEFAULT))
    except ConfigError as e:
        print(f"jaxsys job: {e}", file=sys.stderr)
        return 2
    if prog.hosts < 1:
        print("jaxsys job: --hosts must be at least 1", file=sys.stderr)
        return 2
    out = Path(args.out or nb.with_name(nb.stem + "-job")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        check_retries(args.retries)
        setup = job_setup(prog, out)
        setup.preemption, setup.preemption_grace = args.preemption, _grace(args)
    except ConfigError as e:
        print(f"jaxsys job: {e}", file=sys.stderr)
        return 2
    program = out / "program.py"
    program.write_text(render(prog, nb.name, setup))
    options = {"sbatch_args": [], **prog.options.get("launcher_options", {})}
    named = prog.options.get("hosts")
    if isinstance(named, list | tuple):
        # Launchers that run a process per named host (ssh) need the names.
        options["host_names"] = list(named)
    try:
        check_options(options)
        cancel = _name_batch_job(options, out)
        # Named from the job's folder, where the command runs: no path of this machine is
        # written into the job's files, which may name it only in quotes.
        files, command = launcher.batch_job(Path(program.name), prog.hosts, Path("."), options)
    except (ConfigError, NotImplementedError) as e:
        print(f"jaxsys job: {e}", file=sys.stderr)
        return 2
    if command[:1] != ["sbatch"]:
        cancel = None  # no scheduler's job outlives the command
    for name, text in files.items():
        (out / name).write_text(text)
    print(f"jaxsys job: {program} ({len(prog.cells)} cells, {len(prog.left_out)} left out)")
    if setup.cert_dir:
        print(f"jaxsys job: each process joins with mTLS, its certificate in {setup.cert_dir}")
    print(f"run with: (cd {shlex.quote(str(out))} && {shlex.join(command)})")
    if not args.submit:
        return 0
    result = run_with_retries(
        lambda: run_job(prog, command, out, args.timeout, cancel), out, args.retries
    )
    return _report(result, out)


def _grace(args: argparse.Namespace) -> float:
    if not args.preemption_grace > 0:  # also NaN
        raise ConfigError(
            f"--preemption-grace must be a positive number of seconds, not "
            f"{args.preemption_grace:g}"
        )
    return args.preemption_grace


def _report(result, out: Path) -> int:
    """Print the job's collated log and why it failed, if it did; returns its exit code."""
    print(result.log, end="")
    print(f"jaxsys job: the collated output is in {out / 'job.log'}")
    for index, ranks in result.failures.items():
        print(f"jaxsys job: cell {index} failed on {format_procs(ranks)}", file=sys.stderr)
    if result.exit_code and not result.failures:
        print(f"jaxsys job: {result.ending} (exit code {result.exit_code})", file=sys.stderr)
    return result.exit_code


# The flags of the launcher options that end up in a script or a remote command line.
_FLAGS = {
    "partition": "--partition",
    "time": "--time",
    "account": "--account",
    "qos": "--qos",
    "sbatch_args": "--sbatch-arg",
    "srun_args": "srun_args",
    "ssh_args": "--ssh-arg",
    "hostfile": "--hostfile",
}


def check_options(options: dict) -> None:
    """Refuse a launcher option with a line break or another control character: in a batch
    script it would start a line of its own, which the shell runs.

    Raises
    ------
    ConfigError
        Naming the option and the character.
    """
    for key, value in options.items():
        for text in value if isinstance(value, list | tuple) else [value]:
            bad = re.search(r"[\x00-\x1f\x7f]", text) if isinstance(text, str) else None
            if bad:
                raise ConfigError(
                    f"{_FLAGS.get(key, key)} {text!r} holds the control character "
                    f"{bad.group()!r} (a line break would add a line to the job's script): "
                    "give each option on one line"
                )


def _name_batch_job(options: dict, out: Path) -> list[str]:
    """Give a batch job a name of its own, made of characters that need no quoting (the
    launchers that submit one with sbatch take ``sbatch_args``, and a later ``#SBATCH``
    line wins over an earlier one; the others ignore them); the command that cancels it."""
    name = f"jaxsys-{job_id(out)}-{secrets.token_hex(4)}"
    options["sbatch_args"] = [*options.get("sbatch_args", []), f"--job-name={name}"]
    return ["scancel", f"--name={name}", f"--user={getpass.getuser()}"]
