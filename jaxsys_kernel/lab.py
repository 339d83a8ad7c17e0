"""``jaxsys lab``: JupyterLab as a child that never outlives the command.

The server runs as a child process. Signals sent to ``jaxsys lab`` are passed on to it, and
the child is asked by the kernel (``PR_SET_PDEATHSIG``) to receive SIGTERM if ``jaxsys lab``
itself dies, so neither a SIGTERM nor a SIGKILL leaves a server holding its port.
ipyparallel's own cluster panel and server extension are turned off in this Lab: they start
clusters that have nothing to do with jaxsys's, beside its sidebar.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

# Jupyter's config folder this package ships: it turns off ipyparallel's panel and server
# extension (lab_config/). Put first on JUPYTER_CONFIG_PATH, it wins over the environment's.
CONFIG_DIR = Path(__file__).with_name("lab_config")

# How long the server gets to shut down after a passed-on signal before it is killed.
STOP_GRACE_S = 15.0

_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def lab_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``env`` (this process's by default) with jaxsys's config
    folder first on ``JUPYTER_CONFIG_PATH``."""
    env = dict(os.environ if env is None else env)
    rest = env.get("JUPYTER_CONFIG_PATH")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(CONFIG_DIR), *([rest] if rest else [])])
    return env


def lab_command(root: Path, extra: list[str], *, is_root: bool) -> tuple[list[str], list[str]]:
    """The JupyterLab command line and the notes to print about it.

    Parameters
    ----------
    root : Path
        The folder the Lab opens on.
    extra : list of str
        Arguments the user gave for JupyterLab, passed on unchanged.
    is_root : bool
        Whether this runs as root, which JupyterLab refuses unless told ``--allow-root``.
    """
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root.resolve()}", *extra]
    notes = []
    if is_root and "--allow-root" not in extra:
        cmd.append("--allow-root")
        notes.append(
            "running as root, so --allow-root is passed to JupyterLab "
            "(containers and CI machines often run as root)"
        )
    notes.append("ipyparallel's own cluster panel is off in this Lab: clusters come from jaxsys")
    return cmd, notes


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM to the server when jaxsys lab dies,
    # whatever way it dies (a SIGKILL cannot be passed on by a handler).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_lab(cmd: list[str], env: dict[str, str]) -> int:
    """Run JupyterLab until it exits, passing on SIGTERM, SIGINT and SIGHUP.

    Returns its exit status (128 + the signal's number when a signal ended it).
    """
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509 - only prctl, no locks
    received: list[int] = []

    def pass_on(signum, _frame):
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in _PASSED_ON}
    try:
        while True:
            try:
                code = proc.wait(timeout=STOP_GRACE_S if received else None)
                break
            except subprocess.TimeoutExpired:
                # A passed-on signal was not enough (JupyterLab asks to confirm a single
                # Ctrl-C on a terminal): end it.
                print("jaxsys: JupyterLab did not stop; killing it", file=sys.stderr)
                proc.kill()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    # Ended by a signal it was passed: say so in the status, as the shell would.
    return 128 + received[0] if received else code
