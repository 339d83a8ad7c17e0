"""What each pod of a notebook's Kubernetes world runs: one engine after another.

A pod spec cannot change, and every kernel has its own controller, keys and certificates.
So that a kept world (``%jaxsys stop --keep-allocation``) can serve the next kernel, a pod
does not run its engine directly: it runs this, which reads from the world's Secret
(mounted at ``--credentials``) which *generation* of engine to run. A generation's files
are the controller's engine connection file, the engines' config, the certificates, and
:data:`ENV_FILE`, the engine's environment. A kernel that takes the world writes a
generation of its own into the Secret (and annotates the pods: the kubelet then projects
the Secret again at once, not at its next sync a minute later). This runner:

- starts an engine for each new generation that holds an engine file, in a profile of its
  own in the pod's temporary directory and in a session of its own;
- ends that engine, and what its cells started (its process group), once the generation
  changes: a keep or a world restart writes a generation without an engine file, a new
  kernel (or the restarted world) one of its own;
- after an engine ended (its kernel died, or the world was kept), waits :data:`WAIT_FILE`
  seconds for the next generation (the kernel's lease TTL), then exits 0: the pod
  succeeds, its Job finishes, and the cluster deletes the world. That wait is the world's
  lease.

Engines are forked from a fork server (:mod:`.forkserver`) that this runner starts when the
pod starts: it imports Python's, ipyparallel's and JAX's modules once, while the pod waits
for its first generation, and each engine after it (a world restart in the living pods)
starts without importing anything. The engine is run as the fork server's stand-in
(:mod:`.forked`), which starts a plain engine when the server is not there or refuses.
When an engine ends, its process group (what its cells started) is killed with it: the
stand-in's here, and a forked engine's by the engine itself when its stand-in goes.

It imports only the standard library and jaxsys's errors: it runs before any engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import JaxsysError
from .pod_standby import StandbySlot

#: The files of a generation in the world's Secret.
GENERATION = "generation"
ENGINE_FILE = "ipcontroller-engine.json"
ENGINE_CONFIG = "ipengine_config.py"
ENV_FILE = "engine-env.json"
WAIT_FILE = "wait-s"
#: How a world restart's generation without an engine is named: the next world follows.
RESTART_PREFIX = "restart-"
# The variable naming the process an engine dies with (contract.PARENT_PID, copied: this
# module imports only the standard library).
PARENT_PID = "JAXSYS_PARENT_PID"
# The variable a JobSet's pods get their process id in (contract.PROCESS_ID, copied).
PROCESS_ID = "JAXSYS_PROCESS_ID"
# Seconds a stand-in waits for the fork server's socket before it starts a plain engine.
FORK_WAIT_S = 30.0
# The longest Unix socket path (the kernel's limit is 107 bytes).
MAX_SOCKET_PATH = 100
#: Where the Secret is mounted unless ``--credentials`` says otherwise.
DEFAULT_CREDENTIALS = "/var/run/jaxsys"
# Seconds between looks at the generation: a read of one small file, so twenty a second
# cost nothing measurable, and a world restart waits at most this long to be seen.
POLL_S = 0.05
# Seconds a new set of the Secret's files may lack the names of its new keys (a kubelet
# makes them just after it swaps the set in) before it is read as it is.
LINKS_WAIT_S = 5.0
#: The link a kubelet swaps to a Secret volume's new set of files.
DATA_LINK = "..data"
# Seconds an engine has to end after SIGTERM when the pod is deleted.
TERM_WAIT_S = 5.0


class Stopped(JaxsysError):
    """SIGTERM or SIGINT arrived: the pod is being deleted."""


def _say(text: str) -> None:
    print(f"jaxsys pod: {text}", file=sys.stderr, flush=True)


def current(creds: Path) -> Path:
    """Where the Secret's files are as one set: ``..data``, the folder a kubelet swaps in
    whole, where there is one, else ``creds`` itself (a plain folder)."""
    data = creds / DATA_LINK
    return data if data.is_dir() else creds


def generation(creds: Path) -> str | None:
    """The generation the Secret holds now, or None while it has none."""
    try:
        return (current(creds) / GENERATION).read_text().strip() or None
    except OSError:
        return None


def links_made(creds: Path) -> bool:
    """Whether every file of the Secret's current set can be read under its own name.

    A kubelet swaps a Secret's new set in first and only then makes the names of keys the
    last set did not have: a generation read in between would seem to have no engine, or
    an engine whose certificates are not there yet."""
    data = creds / DATA_LINK
    try:
        return not data.is_dir() or all((creds / e.name).exists() for e in data.iterdir())
    except OSError:
        return False  # swapped again while being read: look again


def wait_s(creds: Path, default: float) -> float:
    """Seconds to wait for the next generation: what the last kernel wrote, else
    ``default``."""
    try:
        return float((creds / WAIT_FILE).read_text())
    except (OSError, ValueError):
        return default


def reap() -> None:
    """Collect the exit status of orphans: in a container this process is PID 1."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def next_engine(
    creds: Path,
    seen: str | None,
    default_wait: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    slot: StandbySlot | None = None,
) -> str | None:
    """Wait for a generation other than ``seen`` that holds an engine file; None when
    none comes within the wait. A generation without one (a keep) starts the wait anew,
    and so does every look while a standby engine (``slot``) runs."""
    deadline = clock() + wait_s(creds, default_wait)
    busy = False
    while True:
        gen = generation(creds)
        if gen is not None and gen != seen and not links_made(creds):
            links_deadline = min(deadline, clock() + LINKS_WAIT_S)
            while not links_made(creds) and clock() < links_deadline:
                sleep(POLL_S)
            gen = generation(creds)
        if gen is not None and gen != seen:
            if (current(creds) / ENGINE_FILE).exists():
                return gen
            seen, wait = gen, wait_s(creds, default_wait)
            deadline = clock() + wait
            if gen.startswith(RESTART_PREFIX):
                _say(f"world restart ({gen}): waiting {wait:g} s for the next engine")
            else:
                _say(f"kept ({gen}): waiting {wait:g} s for the next kernel")
        if slot is not None:
            slot.poll(current(creds), gen)
            was_busy, busy = busy, slot.busy()
            if was_busy and not busy:
                # A standby engine that took over served the world until now: the wait for
                # the next kernel starts when it ended.
                deadline = max(deadline, clock() + wait_s(creds, default_wait))
        if clock() >= deadline and not busy:
            return None
        reap()
        sleep(POLL_S)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ForkServer:
    """The pod's fork server (:mod:`.forkserver`), started when the pod starts.

    Parameters
    ----------
    python : str
        The engines' interpreter.
    """

    def __init__(self, python: str):
        self.dir = tempfile.mkdtemp(prefix="jaxsys-fork-")
        if len(self.dir) + 2 > MAX_SOCKET_PATH:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = tempfile.mkdtemp(prefix="jaxsys-fork-", dir="/tmp")
        self.socket = os.path.join(self.dir, "s")
        self.proc = subprocess.Popen(
            [python, "-m", "jaxsys_kernel.engine.forkserver", self.socket],
            stdin=subprocess.PIPE,
            env={**os.environ, PARENT_PID: str(os.getpid())},
            start_new_session=True,
        )

    def engine_cmd(self, python: str) -> list[str]:
        """What runs in place of ``python -m ipyparallel.engine``: the stand-in."""
        stand_in = str(Path(__file__).with_name("forked.py"))
        return [python, "-S", stand_in, self.socket, str(self.proc.pid), f"{FORK_WAIT_S:g}"]

    def close(self) -> None:
        """Stop the server and remove its socket."""
        _killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def launch_engine(
    env: Mapping[str, str],
    config: str,
    url_file: Path | None,
    python: str,
    args: Sequence[str],
    server: ForkServer | None = None,
    url_text: str | None = None,
) -> tuple[subprocess.Popen, Path]:
    """Start an engine with ``env`` added to the pod's environment, in a profile of its
    own holding ``config``; it reads the controller's engine file at ``url_file``, or a
    copy of ``url_text`` in its profile. Returns the process and its profile."""
    env = {**os.environ, **env}
    # The engine (or its stand-in) dies with this runner, as the fork server does.
    env[PARENT_PID] = str(os.getpid())
    profile = Path(tempfile.mkdtemp(prefix="jaxsys-engine-"))
    (profile / ENGINE_CONFIG).write_text(config)
    if url_text is not None:
        url_file = profile / ENGINE_FILE
        url_file.write_text(url_text)
    start = server.engine_cmd(python) if server else [python, "-m", "ipyparallel.engine"]
    argv = [*start, f"--profile-dir={profile}", f"--IPEngine.url_file={url_file}", *args]
    return subprocess.Popen(argv, env=env, start_new_session=True), profile


def end_engine(proc: subprocess.Popen, profile: Path) -> None:
    """Kill an engine's process group (the engine, its nanny and what its cells started;
    a forked engine has a group of its own, which it kills when its stand-in goes), and
    remove its profile."""
    _killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    shutil.rmtree(profile, ignore_errors=True)


def run_engine(
    creds: Path,
    gen: str,
    python: str,
    args: Sequence[str],
    server: ForkServer | None = None,
    slot: StandbySlot | None = None,
) -> int | None:
    """Run the engine of generation ``gen`` until it ends or the generation changes
    (looking after the pod's standby engine, ``slot``, meanwhile); its exit code (None
    when it was replaced)."""
    config = creds / ENGINE_CONFIG
    if not config.exists():
        raise FileNotFoundError(f"{config} is missing from the world's Secret")
    env = json.loads((creds / ENV_FILE).read_text())
    proc, profile = launch_engine(
        env, config.read_text(), creds / ENGINE_FILE, python, args, server
    )
    replaced = False
    try:
        while proc.poll() is None:
            now = generation(creds)
            if slot is not None:
                slot.poll(current(creds), now)
            if now != gen:
                replaced = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(POLL_S)
    except Stopped:
        _killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(TERM_WAIT_S)
        raise
    finally:
        end_engine(proc, profile)
    return None if replaced else proc.returncode


def start_standby(
    entry: dict, python: str, args: Sequence[str], server: ForkServer | None
) -> tuple[subprocess.Popen, Callable[[], None]]:
    """Start the standby engine of a Secret's entry (:mod:`.pod_standby`)."""
    proc, profile = launch_engine(
        entry["env"],
        entry["config"],
        None,
        python,
        [*args, *entry["args"]],
        server,
        url_text=entry["engine_file"],
    )
    return proc, lambda: end_engine(proc, profile)


def own_rank() -> int | None:
    """The process this pod runs (its JobSet's number, else its Job's index), or None."""
    for name in (PROCESS_ID, "JOB_COMPLETION_INDEX"):
        with contextlib.suppress(KeyError, ValueError):
            return int(os.environ[name])
    return None


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jaxsys_kernel.engine.pod",
        description="Run the engines of a Kubernetes world's pod, one generation after another.",
    )
    p.add_argument("--credentials", default=DEFAULT_CREDENTIALS, metavar="DIR")
    p.add_argument("--wait", type=float, default=45.0, metavar="S")
    p.add_argument("--python", default=sys.executable, help="the engines' interpreter")
    p.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start each engine on its own, importing everything (no fork server)",
    )
    p.add_argument("engine_args", nargs="*", help="after --: the engines' arguments")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    creds = Path(args.credentials)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, _stop)
    seen = None
    server = None if args.no_fork_server else ForkServer(args.python)
    rank = own_rank()
    slot = None
    if rank is not None:
        slot = StandbySlot(
            rank, lambda e: start_standby(e, args.python, args.engine_args, server), _say
        )
    try:
        while True:
            gen = next_engine(creds, seen, args.wait, slot=slot)
            if gen is None:
                _say("no kernel took this pod within its wait: it ends")
                return 0
            seen = gen
            _say(f"engine of generation {gen} starts")
            try:
                code = run_engine(creds, gen, args.python, args.engine_args, server, slot)
            except FileNotFoundError as e:
                _say(f"cannot start the engine: {e}")
                return 1
            ended = "replaced" if code is None else f"ended with exit code {code}"
            _say(f"engine of generation {gen} {ended}")
    except Stopped as e:
        _say(f"stopped by {e}")
        return 143
    finally:
        if slot is not None:
            slot.close()
        if server is not None:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
