"""The fork server: one process that imports what every engine imports, then forks engines.

On one machine an engine's start-up is CPU-bound on imports (Python, IPython, ipykernel,
ipyparallel, JAX: about 1.3 s of CPU each here), and N engines on a few cores pay that N
times over. A local cluster starts this server alongside its controller; it imports those
modules once and listens on a Unix socket. Each engine's launcher runs the stand-in
:mod:`jaxsys_kernel.engine.forked` instead of ``python -m ipyparallel.engine``; the stand-in
hands over its standard streams, its environment and its arguments, and the server forks a
child that becomes that engine. The child shares the imported pages with its siblings and
skips every import.

What a forked engine keeps from a started one
---------------------------------------------
* Its own session and process group (teardown kills groups), its own pid, its own
  environment (``os.environ`` is replaced before the engine starts), working directory and
  standard streams (the stand-in's, so the launcher's log gets the output).
* JAX reads ``JAX_*`` variables when it is imported; a request whose ``JAX_*`` variables
  differ from the server's is refused, and the stand-in starts a plain engine instead.
  ``XLA_FLAGS`` and gRPC's variables are read when the backend starts, after the fork.
* Random state: Python's ``random`` reseeds itself in a fork child; NumPy's global
  generator does not, so the child reseeds it.
* Death: the server dies with the kernel (parent-death signal, and end of file on its
  standard input); a child dies with the server (the engine's own parent-death signal, set
  by the profile's config against the server's pid) and with its stand-in (end of file on
  the socket pair they share).

Usage: ``python -m jaxsys_kernel.engine.forkserver SOCKET_PATH``. The socket appears, by
rename, only once the imports are done.
"""

from __future__ import annotations

import array
import atexit
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
import types

from .. import _compat, contract
from .state import STATE

# What every engine imports before its first cell (its sys.modules, less the server's).
PRELOAD = (
    "jax",
    "jax.numpy",
    "jax.experimental.multihost_utils",
    "ipyparallel.engine.app",
    "ipyparallel.engine.kernel",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    # The kernel's debugger class (debugpy: a fifth of an engine's start-up after a fork).
    "ipykernel.debugger",
    "IPython.core.completerlib",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "tornado.gen",
    "tornado.locks",
    "tornado.platform.asyncio",
    "tornado.queues",
    "sqlite3",
    "xmlrpc.client",
    "pydoc",
    "code",
    "runpy",
    "encodings.idna",
    "jaxsys_kernel.engine.bootstrap",
    "jaxsys_kernel.engine.agent",
    "jaxsys_kernel.engine.cache",
    "jaxsys_kernel.engine.cache_dir",
    "jaxsys_kernel.engine.display",
    "jaxsys_kernel.engine.output",
    "jaxsys_kernel.engine.registry",
    "jaxsys_kernel.engine.transfers",
)
#: The header of a request: its JSON length, then the JSON; four descriptors ride along.
HEADER = struct.Struct("!I")
#: Descriptors a request carries: stdin, stdout, stderr and the stand-in's lifeline.
NFDS = 4
MAX_REQUEST = 4 * 1024 * 1024
_PR_SET_PDEATHSIG = 1


def import_state() -> dict[str, str]:
    """The variables read at import time whose values a forked engine inherits."""
    return {k: v for k, v in os.environ.items() if k.startswith("JAX_")}


def jax_changes(env: dict[str, str], imported: dict[str, str]) -> dict[str, str]:
    """The ``JAX_*`` variables of ``env`` that differ from those JAX was imported with."""
    return {k: v for k, v in env.items() if k.startswith("JAX_") and imported.get(k) != v}


def refusal(request: dict, imported: dict[str, str]) -> str | None:
    """Why ``request`` cannot be served by a fork of this server (None: it can).

    A ``JAX_*`` variable that differs is fine when it names one of JAX's options (the
    child sets it, before JAX starts its backend); one the request drops, or that JAX reads
    some other way, is not.
    """
    env = request.get("env")
    if not isinstance(env, dict) or not isinstance(request.get("argv"), list):
        return "the request names no environment or arguments"
    dropped = sorted(k for k in imported if k not in env)
    if dropped:
        return "JAX settings read at import are unset: " + ", ".join(dropped)
    # Deferred: imported at start-up (PRELOAD); named here, where options are checked.
    import jax

    unknown = sorted(
        k for k in jax_changes(env, imported) if _compat.jax_option(jax.config, k) is None
    )
    if unknown:
        return "JAX settings read at import differ: " + ", ".join(unknown)
    if env.get("PYTHONPATH", "") != os.environ.get("PYTHONPATH", ""):
        return "PYTHONPATH differs"
    if env.get(contract.PARENT_PID) != os.environ.get(contract.PARENT_PID):
        # Its parent-death check is for another process than this server's parent.
        return f"${contract.PARENT_PID} names another parent"
    return None


def _apply_jax_settings(env: dict[str, str], imported: dict[str, str]) -> None:
    # Deferred: imported at start-up (PRELOAD).
    import jax

    for name, value in jax_changes(env, imported).items():
        _compat.set_jax_option_from_env(jax.config, name, value)


# -- the child ------------------------------------------------------------------------------


def _become_engine(
    request: dict, fds: list[int], closing: list, close_fds: list[int], imported: dict
) -> None:
    """In the forked child: take the stand-in's streams and environment, run the engine,
    and never return into the server's loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for obj in closing:
            obj.close()
        for fd in close_fds:
            os.close(fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        lifeline = socket.socket(fileno=fds[3])
        env = dict(request["env"])
        # The engine's parent-death check (profile config) now watches this server,
        # which itself dies with the kernel.
        env[contract.PARENT_PID] = str(os.getppid())
        os.environ.clear()
        os.environ.update(env)
        cwd = request.get("cwd") or os.getcwd()
        os.chdir(cwd)
        sys.path[0] = cwd
        _apply_jax_settings(env, imported)
        _reseed()
        _watch_lifeline(lifeline)
        sys.argv = ["ipengine", *request["argv"]]
        code = _run_engine()
    except BaseException:  # noqa: BLE001 - a child must end here, whatever happened
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_engine() -> int:
    # Deferred: imported by the server already; named here, where the engine starts.
    from ipyparallel.engine.app import main

    try:
        main()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _reseed() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Siblings would otherwise draw the same numbers from NumPy's global generator.
        numpy.random.seed()


def _watch_lifeline(lifeline: socket.socket) -> None:
    """End this engine when its stand-in goes (the launcher stopped or killed it)."""

    def watch():
        try:
            while lifeline.recv(1):
                pass
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, name="jaxsys-lifeline", daemon=True).start()


# -- the server -----------------------------------------------------------------------------


class ForkServer:
    """The listening socket, the stand-ins connected to it, and the children forked."""

    def __init__(self, path: str):
        self.path = path
        self.imported = import_state()
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._wake_r, self._wake_w = os.pipe()

    def listen(self) -> None:
        """Bind under a temporary name and rename, so the path appears when it is served."""
        tmp = f"{self.path}.{os.getpid()}"
        self.listener.bind(tmp)
        self.listener.listen(256)
        os.rename(tmp, self.path)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "child")
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")

    def serve(self) -> None:
        """Answer requests until the kernel's end of standard input closes."""
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self._serve_one(conn)
                elif key.data == "child":
                    os.read(self._wake_r, 4096)
                    self._reap()
                elif key.data == "parent" and not os.read(key.fd, 4096):
                    return

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as e:
            _reply(conn, {"refused": f"unreadable request: {e}"})
            conn.close()
            return
        why = refusal(request, self.imported)
        if why:
            _reply(conn, {"refused": why})
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_engine(
                request,
                fds,
                [self.sel, self.listener, conn, *self.children.values()],
                [self._wake_r, self._wake_w],
                self.imported,
            )
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        _reply(conn, {"pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                _reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    msg, ancdata, _flags, _addr = conn.recvmsg(HEADER.size, socket.CMSG_LEN(NFDS * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(msg) != HEADER.size or len(fds) != NFDS:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected a header and {NFDS} descriptors")
    (length,) = HEADER.unpack(msg)
    if length > MAX_REQUEST:
        raise ValueError(f"a request of {length} bytes")
    body = b""
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            raise ValueError("the request ended early")
        body += chunk
    return json.loads(body), list(fds)


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        # The stand-in is gone; its child (if any) follows through the lifeline.
        pass


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.environ.get(contract.PARENT_PID)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != int(parent):
        os._exit(1)


class _LazyPackage(types.ModuleType):
    """A package whose ``__init__`` runs only when a name it defines is asked for;
    its submodules import without it."""

    def __getattr__(self, attr: str):
        if not attr.startswith("__"):
            sub = f"{self.__name__}.{attr}"
            if sub in sys.modules or importlib.util.find_spec(sub) is not None:
                return importlib.import_module(sub)
        self.__class__ = types.ModuleType
        self.__spec__.loader.exec_module(self)
        return getattr(self, attr)


def lazy_package(name: str) -> None:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__`` yet.

    ipyparallel's ``__init__`` imports its client, cluster and launcher machinery (about a
    fifth of a second here), which an engine never uses; a cell that uses them (``import
    ipyparallel; ipyparallel.Client``) runs it then.
    """
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _LazyPackage
    sys.modules[name] = module


def main(argv: list[str] | None = None) -> int:
    """Import, listen on the socket path given, and serve until the kernel goes."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jaxsys_kernel.engine.forkserver SOCKET_PATH", file=sys.stderr)
        return 2
    _die_with_parent()
    # The kernel's interrupt is for its cells, not for this server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lazy_package("ipyparallel")
    for name in PRELOAD:
        __import__(name)
    if not STATE.fresh():
        # A child would inherit what an import kept; engines start on their own instead.
        print("jaxsys fork server: the engine state is not empty after imports", file=sys.stderr)
        return 1
    # Objects imported so far stay out of the collector's way: copied pages stay shared.
    gc.collect()
    gc.freeze()
    server = ForkServer(args[0])
    server.listen()
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
