"""The stand-in a launcher runs for an engine forked by the fork server.

Run by path with ``python -S`` (this file imports only the standard library, so it starts in
a few milliseconds)::

    python -S forked.py SOCKET SERVER_PID WAIT_S ENGINE_ARGS...
    python -S forked.py --plain ENGINE_ARGS...

Its first act is to arm its parent-death signal (``PR_SET_PDEATHSIG``, kept across the
``exec`` into a plain engine): a process still booting when the kernel dies goes with it,
whatever the profile's config (which arms the same signal, but only once ipengine has
imported itself and read its profile, which the controller may be removing by then).
``--plain`` is for a cluster without a fork server: it only arms the signal and becomes
``python -m ipyparallel.engine ENGINE_ARGS...``.

It hands its standard streams, environment, working directory and ``ENGINE_ARGS`` to the
fork server at ``SOCKET`` (see :mod:`jaxsys_kernel.engine.forkserver`), then stays for the
engine's lifetime as the process the launcher knows: signals it receives go on to the
engine, it exits with the engine's exit status, and its own death ends the engine (they
share a socket pair). When the server is not there (gone, or not ready within ``WAIT_S``
seconds) or refuses the request, it becomes a plain engine in place
(``python -m ipyparallel.engine ENGINE_ARGS...``), so a launch never depends on the server.
"""

import array
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time

HEADER = struct.Struct("!I")
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# How long the engine's exit status may trail the end of its lifeline, and how long the
# engine may outlive a server that vanished (its parent-death signal ends it at once).
EXIT_GRACE_S = 10.0
POLL_S = 0.02
PLAIN = "--plain"
# The names of jaxsys_kernel.contract.PARENT_PID and NO_PDEATHSIG, copied: this file imports
# nothing of the package.
PARENT_PID = "JAXSYS_PARENT_PID"
NO_PDEATHSIG = "JAXSYS_NO_PDEATHSIG"
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """End this process (SIGKILL) when the process that launched it dies; end it now if that
    happened already (``$JAXSYS_PARENT_PID`` is no longer the parent)."""
    if not sys.platform.startswith("linux") or os.environ.get(NO_PDEATHSIG):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = os.environ.get(PARENT_PID, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os._exit(1)


def plain_engine(args, why):
    """Become ``python -m ipyparallel.engine`` (never returns)."""
    if why:
        print(f"jaxsys: engine started without the fork server ({why})", file=sys.stderr)
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ipyparallel.engine", *args])


def alive(pid):
    # A copy of jaxsys_kernel.cluster.pids.pid_alive's first look, on purpose: this file runs
    # by path under ``python -S`` and imports nothing of the package. A zombie server counts
    # as alive here, and every wait on it is bounded by WAIT_S.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connect(path, server_pid, wait_s):
    """The connection to the server once its socket is served, or the reason there is none."""
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if not alive(server_pid):
            return None, "the fork server exited"
        if time.monotonic() > deadline:
            return None, f"the fork server was not ready within {wait_s:g} s"
        time.sleep(POLL_S)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:
        conn.close()
        return None, f"the fork server did not answer: {e}"
    return conn, None


def read_line(conn, timeout):
    """One JSON line from the server, or None when it closes or ``timeout`` passes."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([conn], [], [], left)[0]:
            return None
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data.split(b"\n", 1)[0])


def request_fork(conn, args):
    """Send the request with this process's streams; returns (engine pid, lifeline) or
    (None, the server's reason)."""
    mine, theirs = socket.socketpair()
    body = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    fds = array.array("i", [0, 1, 2, theirs.fileno()])
    try:
        conn.sendmsg([HEADER.pack(len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        conn.sendall(body)
    except OSError:
        pass  # refused before it was read (its answer says why), or the server is gone
    finally:
        theirs.close()
    try:
        reply = read_line(conn, EXIT_GRACE_S * 3)
    except (OSError, ValueError) as e:
        reply = {"refused": f"the fork server did not answer ({e})"}
    if not isinstance(reply, dict):
        reply = None
    if not reply or "pid" not in reply:
        mine.close()
        return None, (reply or {}).get("refused", "no answer")
    return reply["pid"], mine


def forward_signals(pid):
    def relay(sig, _frame):
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, relay)


def end_like(code):
    """Exit as the engine did: with its status, or killed by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code is not None and code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            # Ours relays it; the default ends this process as it ended the engine.
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(1 if code is None else code)


def wait_for_engine(conn, lifeline):
    """The engine's exit code, once it ended (None: unknown)."""
    watching = [conn, lifeline]
    lifeline_gone_at = None
    while True:
        timeout = None if lifeline_gone_at is None else EXIT_GRACE_S
        ready = select.select(watching, [], [], timeout)[0]
        if not ready:
            return None
        if conn in ready:
            reply = read_line(conn, EXIT_GRACE_S)
            if reply and "exit" in reply:
                return reply["exit"]
            # The server is gone: the engine goes with it (parent-death signal).
            watching.remove(conn)
            if lifeline not in watching:
                return None
            lifeline_gone_at = lifeline_gone_at or time.monotonic()
        if lifeline in ready:
            try:
                if lifeline.recv(1):
                    continue
            except OSError:
                pass
            watching.remove(lifeline)
            if conn not in watching:
                return None
            lifeline_gone_at = time.monotonic()


def main(argv):
    if argv[:1] == [PLAIN]:
        die_with_parent()
        plain_engine(argv[1:], None)
    if len(argv) < 3:
        print(
            "usage: python -S forked.py SOCKET SERVER_PID WAIT_S ENGINE_ARGS...\n"
            "       python -S forked.py --plain ENGINE_ARGS...",
            file=sys.stderr,
        )
        return 2
    path, server_pid, wait_s, args = argv[0], int(argv[1]), float(argv[2]), argv[3:]
    die_with_parent()
    conn, why = connect(path, server_pid, wait_s)
    if conn is None:
        plain_engine(args, why)
    pid, lifeline = request_fork(conn, args)
    if pid is None:
        conn.close()
        plain_engine(args, lifeline)
    forward_signals(pid)
    end_like(wait_for_engine(conn, lifeline))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
