"""The ``jaxsys`` command: lab, run NOTEBOOK, job NOTEBOOK, cluster start|stop|status, install-kernel."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_core.paths import jupyter_runtime_dir
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from traitlets.config import Config

from . import saved
from ._version import __version__
from .cluster import Cluster
from .cluster.allocation import state_dir
from .cluster.config import ClusterConfig
from .cluster.options import OVERRIDES_VARIABLE, checked, jsonable, kernelspec_layer, merge_layers
from .cluster.teardown import pid_alive, start_time, still_ours
from .errors import ConfigError
from .job.cli import add_parser as add_job_parser
from .job.cli import cmd_job
from .lab import lab_command, lab_environment, run_lab

# The same directory a kernel keeps a Slurm job in for %jaxsys attach (cluster/allocation.py).
STATE_DIR = state_dir()


def _state_file(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


# -- install-kernel ------------------------------------------------------------------------------


def cmd_install_kernel(args: argparse.Namespace) -> int:
    """Install the jaxsys kernelspec."""
    # Deferred: the kernel package brings ipykernel and ipyparallel, which only installing
    # or checking the kernelspec needs, not `jaxsys cluster status`.
    from .kernel.spec import install_kernel_spec

    path = install_kernel_spec(
        prefix=args.prefix, user=args.user, hosts=args.hosts, devices_per_host=args.devices_per_host
    )
    print(f"installed the jaxsys kernelspec in {path}")
    return 0


def _ensure_kernelspec() -> None:
    # Deferred: as in cmd_install_kernel, the kernel package is for the commands that use it.
    from .kernel.spec import KERNEL_NAME, install_kernel_spec

    try:
        KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        path = install_kernel_spec(prefix=sys.prefix)
        print(f"installed the jaxsys kernelspec in {path}", file=sys.stderr)


# -- lab -----------------------------------------------------------------------------------------


def cmd_lab(args: argparse.Namespace, extra: list[str]) -> int:
    """Open JupyterLab on the notebooks with the jaxsys kernel installed."""
    _ensure_kernelspec()
    root = Path(args.notebook_dir) if args.notebook_dir else None
    if root is None:
        root = Path("notebooks") if Path("notebooks").is_dir() else Path.cwd()
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    cmd, notes = lab_command(root, extra, is_root=is_root)
    for note in notes:
        print(f"jaxsys: {note}", file=sys.stderr)
    print("jaxsys: " + " ".join(cmd), file=sys.stderr)
    return run_lab(cmd, lab_environment())


# -- run NOTEBOOK --------------------------------------------------------------------------------


def _ipc_prefix() -> str:
    """A fresh, absolute path prefix for a kernel's sockets, in Jupyter's runtime folder."""
    folder = Path(jupyter_runtime_dir())
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"jaxsys-run-{uuid.uuid4().hex[:12]}")


def run_notebook(
    path: str | os.PathLike,
    output: str | None = None,
    timeout: float = 600.0,
    overrides: dict | None = None,
):
    """Execute a notebook headless with the jaxsys kernel.

    Parameters
    ----------
    path : path-like
        The notebook to run.
    output : str, optional
        Where to save the executed notebook.
    timeout : float
        Seconds allowed per cell.
    overrides : dict, optional
        Cluster options (as ``ClusterConfig`` names them) that win over the notebook's own
        ``%jaxsys start`` line, e.g. ``{"hosts": 8}``: the notebook runs at another size
        without being edited.

    Returns
    -------
    nbformat.NotebookNode
        The executed notebook.

    Raises
    ------
    nbclient.exceptions.CellExecutionError
        When a cell fails; the notebook is still saved to ``output`` first.
    """
    _ensure_kernelspec()
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        # The kernel and this process share the machine: Unix sockets, not plain TCP,
        # carry the notebook's code and outputs between them. Their path is absolute: the
        # kernel runs in the notebook's folder, this process wherever it was started.
        config=Config({"KernelManager": {"transport": "ipc", "ip": _ipc_prefix()}}),
        kernel_name="jaxsys",
        timeout=timeout,
        resources={"metadata": {"path": str(Path(path).resolve().parent)}},
    )
    env = dict(os.environ)
    if overrides:
        # Checked by name and type only: they are one layer, checked whole with the others.
        layer = checked(ClusterConfig, overrides, "jaxsys run")
        env[OVERRIDES_VARIABLE] = json.dumps(jsonable(layer))
    try:
        client.execute(env=env)
    finally:
        if output:
            # Saved as Lab saves (no widget state): readers then show the views' pictures.
            nbformat.write(saved.for_readers(nb, saved.kernelspec_of("jaxsys")), output)
    return nb


def cmd_run(args: argparse.Namespace) -> int:
    """Run a notebook; exit code 1 and the failing cell on error."""
    if not Path(args.notebook).is_file():
        print(f"jaxsys run: no such notebook: {args.notebook}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        nb = run_notebook(
            args.notebook, output=args.output, timeout=args.timeout, overrides=_flags(args)
        )
    except ConfigError as e:
        print(f"jaxsys run: {e}", file=sys.stderr)
        return 2
    except (CellExecutionError, CellTimeoutError) as e:
        print(f"jaxsys run: {args.notebook} failed:\n{e}", file=sys.stderr)
        return 1
    n = sum(1 for c in nb.cells if c.cell_type == "code")
    print(f"jaxsys run: {args.notebook}: {n} code cells ran in {time.perf_counter() - t0:.1f} s")
    return 0


# -- cluster start|stop|status -------------------------------------------------------------------


def _serve_cluster(args: argparse.Namespace) -> int:
    """Own a cluster in this process until SIGTERM or SIGINT, publishing its state."""
    # Deferred: only the cluster's server writes live numbers for watchers.
    from .cells.owner_snapshot import OwnerSnapshot
    from .cluster.watch_snapshot import snapshot_path

    state_file = _state_file(args.name)
    state_file.parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(config=cluster_config(args))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # With its start time: a later stop signals the pid only while it still names this.
    state = {"name": args.name, "pid": os.getpid(), "started": start_time(os.getpid())}
    state["state"] = "starting"
    state_file.write_text(json.dumps(state))
    live = None
    try:
        cluster.start_sync()
        # Watchers read the owner's live numbers from this file (written before "ready").
        live = OwnerSnapshot(cluster, snapshot_path(state_file.parent, args.name))
        live.tick()
        state.update(
            state="ready",
            coordinator=cluster.coordinator_address,
            connection_file=str(cluster.connection_file),
            processes=cluster.status(),
            ready_seconds=cluster.ready_seconds,
        )
        state_file.write_text(json.dumps(state))
        while not stop.wait(0.5):
            live.tick()
    except BaseException as e:  # noqa: BLE001 - record why, then re-raise
        state.update(state="failed", error=str(e))
        state_file.write_text(json.dumps(state))
        raise
    finally:
        cluster.kill()
        if live is not None:
            live.remove()
        if state.get("state") != "failed":
            state_file.unlink(missing_ok=True)
    return 0


def _flags(args: argparse.Namespace) -> dict:
    """The cluster options a command line gave with their flags."""
    return ClusterConfig.given(args)


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The options of ``jaxsys cluster start``, in layers: the ``JAXSYS_*`` variables, then
    the file ``--config`` names, then the flags.

    Raises
    ------
    ConfigError
        For an option that cannot work, or a file that cannot be used (naming it).
    """
    saved = ClusterConfig.from_file(args.config).to_dict() if args.config else {}
    layers = kernelspec_layer(os.environ), saved, _flags(args)
    return ClusterConfig.from_dict(merge_layers(*layers), where="jaxsys cluster start")


def cmd_cluster(args: argparse.Namespace) -> int:
    """Start, stop or describe a background cluster for scripts."""
    state_file = _state_file(args.name)
    if args.action == "start":
        return _serve_cluster(args) if args.foreground else _start_background(args, state_file)
    if not state_file.exists():
        print(f"jaxsys: no cluster named {args.name!r} is running")
        return 0 if args.action == "stop" else 1
    state = json.loads(state_file.read_text())
    if args.action == "status":
        return _print_cluster_status(args.name, state)
    started = state.get("started")
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        started = None
    _stop_background(args.name, state.get("pid"), started)
    state_file.unlink(missing_ok=True)
    return 0


def _start_background(args: argparse.Namespace, state_file: Path) -> int:
    """Start ``jaxsys cluster start --foreground`` detached and wait until it is ready."""
    if state_file.exists():
        old = json.loads(state_file.read_text())
        if pid_alive(old.get("pid")) and old.get("state") != "failed":
            print(
                f"jaxsys: cluster {args.name!r} is already running (pid {old['pid']})",
                file=sys.stderr,
            )
            return 1
        state_file.unlink()
    try:
        config = cluster_config(args)
    except ConfigError as e:
        print(f"jaxsys cluster start: {e}", file=sys.stderr)
        return 2
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    log_path = STATE_DIR / f"{args.name}.log"
    # The options travel as a saved file, so that the server starts exactly this cluster.
    options_file = STATE_DIR / f"{args.name}.options.json"
    config.to_file(options_file)
    cmd = [sys.executable, "-m", "jaxsys_kernel.cli", "cluster", "start", "--foreground"]
    cmd += ["--name", args.name, "--config", str(options_file)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        state = _read_state(state_file)
        if state.get("state") == "ready":
            print(
                f"jaxsys: cluster {args.name!r} ready: {len(state['processes'])} processes "
                f"in {state['ready_seconds']:.1f} s (pid {proc.pid})"
            )
            print(f"connect with ipyparallel.Client({state['connection_file']!r})")
            return 0
        if proc.poll() is not None:
            print(
                f"jaxsys: cluster {args.name!r} failed to start:\n{log_path.read_text()[-3000:]}",
                file=sys.stderr,
            )
            state_file.unlink(missing_ok=True)
            return 1
        time.sleep(0.1)
    proc.kill()
    print(
        f"jaxsys: cluster {args.name!r} not ready within {args.timeout:g} s; see {log_path}",
        file=sys.stderr,
    )
    return 1


def _read_state(state_file: Path) -> dict:
    """The background cluster's state file, or {} while it is absent or half-written."""
    try:
        return json.loads(state_file.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _print_cluster_status(name: str, state: dict) -> int:
    pid = state.get("pid")
    alive = pid_alive(pid)
    print(f"cluster {name!r}: {state.get('state')} (pid {pid}, {'alive' if alive else 'gone'})")
    if state.get("error"):
        print(f"error: {state['error']}")
    if state.get("processes"):
        # Deferred: the magics bring ipykernel and ipyparallel, for a table only a state
        # file with processes in it needs.
        from .magics.magics import format_status

        rows = [
            dict(p, state=p["state"] if pid_alive(p.get("pid")) else "dead")
            for p in state["processes"]
        ]
        print(format_status(rows))
    return 0 if alive and state.get("state") == "ready" else 1


def _server_alive(pid: int | None, started: float | None) -> bool:
    """Whether the cluster's server still runs under ``pid`` (not another process that was
    given its pid since)."""
    return pid_alive(pid) and (started is None or still_ours(pid, started))


def _stop_background(name: str, pid: int | None, started: float | None = None) -> None:
    # The server tears its cluster down on SIGTERM; SIGKILL only if it does not within 10 s.
    if pid_alive(pid) and not _server_alive(pid, started):
        print(f"jaxsys: cluster {name!r} had already stopped (pid {pid} is another process now)")
        return
    if _server_alive(pid, started):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _server_alive(pid, started):
            os.kill(pid, signal.SIGKILL)
    print(f"jaxsys: cluster {name!r} stopped")


# -- entry point ---------------------------------------------------------------------------------


def _option_group(parser: argparse.ArgumentParser, title: str) -> None:
    """Every cluster option's flag, as ``ClusterConfig`` declares it."""
    ClusterConfig.add_arguments(parser.add_argument_group(title))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``jaxsys`` command."""
    p = argparse.ArgumentParser(prog="jaxsys", description="Multi-controller JAX in Jupyter.")
    p.add_argument("--version", action="version", version=f"jaxsys {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser(
        "lab", help="open JupyterLab with the jaxsys kernel (extra args go to JupyterLab)"
    )
    lab.add_argument("--notebook-dir", default=None, help="default: ./notebooks if present, else .")

    run = sub.add_parser("run", help="execute a notebook headless with the jaxsys kernel")
    run.add_argument("notebook")
    run.add_argument("--output", default=None, help="save the executed notebook here")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds per cell (default 600)")
    _option_group(run, "cluster options, over the notebook's own %jaxsys start line")

    cl = sub.add_parser("cluster", help="a background cluster for scripts")
    cl.add_argument("action", choices=("start", "stop", "status"))
    cl.add_argument("--name", default="default")
    cl.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for start")
    cl.add_argument(
        "--config", default=None, metavar="FILE", help="options saved by ClusterConfig.to_file"
    )
    _option_group(cl, "cluster options (over $JAXSYS_* and --config)")
    cl.add_argument("--foreground", action="store_true", help="own the cluster in this process")

    add_job_parser(sub)

    ik = sub.add_parser("install-kernel", help="install the jaxsys kernelspec")
    ik.add_argument("--user", action="store_true", help="install for this user")
    ik.add_argument(
        "--prefix", default=None, help="install under PREFIX (default: this environment)"
    )
    # Left out: the cluster options' declared defaults.
    ik.add_argument("--hosts", type=int, default=None)
    ik.add_argument("--devices-per-host", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``jaxsys`` command line."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "lab":
        return cmd_lab(args, extra)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "cluster":
        return cmd_cluster(args)
    if args.command == "job":
        return cmd_job(args)
    return cmd_install_kernel(args)


if __name__ == "__main__":
    sys.exit(main())
