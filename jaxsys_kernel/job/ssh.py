"""Run a generated program as one process per host over ssh, as a job launcher would.

``python -m jaxsys_kernel.job.ssh PROGRAM OUT_DIR HOST [HOST ...] [--ssh-arg ARG ...]``:
process ``i`` runs on host ``i``, and its output (carried back by ssh) goes to
``OUT_DIR/p{i}.out``. The hosts share this machine's filesystem, as a cluster's engines
started over ssh do by default: they read the program and the job's certificates at the
same paths. When one process fails, the others get a moment to print their own errors and are
then killed on their hosts, so that none waits forever in a collective for it; so are they
when this runner gets SIGTERM or SIGINT, or loses its parent. Each process's command line
carries a marker of this job's own (``jaxsys-job-<hex>``, letters and digits only), which
is what kills it on its host: a path would be read as a regular expression there.
"""

from __future__ import annotations

import argparse
import random
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from .local import Stopping, supervise, write_exit_codes

# Where the coordinator's port is picked, on process 0's host, which cannot be asked here.
PORTS = (20000, 40000)
# Seconds each ssh that kills a job's processes on one host may take.
KILL_TIMEOUT_S = 10.0


def host_of(destination: str) -> str:
    """``user@node7`` -> ``node7``: the address the other processes reach it at."""
    return destination.rpartition("@")[2]


def new_marker() -> str:
    """A word naming one run of a job on every host's command lines."""
    return f"jaxsys-job-{secrets.token_hex(8)}"


def kill_command(marker: str) -> str:
    """What ends a job's processes on their host (this user's only): ``marker`` has no
    character that a regular expression or the shell reads specially. Its first letter
    is written as a class, so that the pattern does not match the command line that
    carries it."""
    if not marker.replace("-", "").isalnum():
        raise ValueError(f"not a job marker: {marker!r}")
    return f"pkill -KILL -U \"$(id -u)\" -f '[{marker[0]}]{marker[1:]}'"


def remote_command(program: str, rank: int, n: int, coordinator: str, marker: str = "") -> str:
    """What host ``rank`` runs: the program as process ``rank`` of ``n``, in the job's folder,
    with ``marker`` as its argument (the program ignores it)."""
    env = {
        "JAXSYS_PROCESS_ID": str(rank),
        "JAXSYS_NUM_PROCESSES": str(n),
        "JAXSYS_COORDINATOR": coordinator,
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    folder = shlex.quote(str(Path(program).parent))
    run = shlex.join([sys.executable, program, *([marker] if marker else [])])
    return f"cd {folder} && exec env {assigned} {run}"


def run(program: str, hosts: list[str], out_dir: Path, ssh_args: list[str]) -> int:
    """Run the processes; the exit code is the first failing process's, or 0."""
    coordinator = f"{host_of(hosts[0])}:{random.randint(*PORTS)}"
    marker = new_marker()
    stopping = Stopping()
    procs = []
    for rank, host in enumerate(hosts):
        command = remote_command(program, rank, len(hosts), coordinator, marker)
        with open(out_dir / f"p{rank}.out", "wb") as out:
            procs.append(
                subprocess.Popen(
                    ["ssh", *ssh_args, host, command],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def kill(running: list[subprocess.Popen]) -> None:
        # Ending the ssh client does not end the process it started: kill that by this
        # run's marker, on every host.
        killers = [
            subprocess.Popen(
                ["ssh", *ssh_args, host, kill_command(marker)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for host in hosts
        ]
        for k in killers:
            try:
                k.wait(KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                k.kill()
        for p in running:
            if p.poll() is None:
                p.kill()

    code, first = supervise(procs, kill, stopping)
    write_exit_codes(out_dir, procs, first)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxsys_kernel.job.ssh")
    ap.add_argument("program")
    ap.add_argument("out_dir")
    ap.add_argument("hosts", nargs="+")
    ap.add_argument("--ssh-arg", action="append", default=[], dest="ssh_args")
    args = ap.parse_args(argv)
    return run(str(Path(args.program).resolve()), args.hosts, Path(args.out_dir), args.ssh_args)


if __name__ == "__main__":
    sys.exit(main())
