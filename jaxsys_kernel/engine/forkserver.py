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

What it serves
--------------
Only the kernel and the processes it started (the stand-ins) may connect; every request is
read without blocking, within a deadline, and checked (:mod:`.forkrequests`). Whatever is
wrong with one (its peer, its bytes, a failed ``fork()``) gets a refusal in words, its
descriptors are closed, the refusal goes to the server's log, and the server goes on: a
refused stand-in starts a plain engine.

Usage: ``python -m jaxsys_kernel.engine.forkserver SOCKET_PATH``. The socket appears, by
rename, only once the imports are done.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
import types

from .. import _compat, contract
from . import nanny_stub
from .forkrequests import (
    REQUEST_TIMEOUT_S,
    BadRequest,
    Pending,
    import_state,
    jax_changes,
    peer_refusal,
    refusal,
)
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
#: Connections whose requests are being read at once; more are refused in words.
MAX_PENDING = 32
ACCEPT_BACKOFF_S = 0.1
#: How a refusal after a failed fork begins (the kernel counts these in the server's log).
FORK_FAILED = "the fork failed"
_PR_SET_PDEATHSIG = 1


def _apply_jax_settings(env: dict[str, str], imported: dict[str, str]) -> None:
    # Deferred: imported at start-up (PRELOAD).
    import jax

    for name, value in jax_changes(env, imported).items():
        _compat.set_jax_option_from_env(jax.config, name, value)


# -- the child ------------------------------------------------------------------------------


def _become_engine(
    request: dict,
    fds: list[int],
    closing: list,
    close_fds: list[int],
    imported: dict,
    server_pid: int,
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
        # which itself dies with the kernel. Its pid as known before the fork: had the
        # server died since, getppid() would name whoever adopted this child, and the
        # check would pass.
        env[contract.PARENT_PID] = str(server_pid)
        os.environ.clear()
        os.environ.update(env)
        cwd = request.get("cwd") or os.getcwd()
        os.chdir(cwd)
        sys.path[0] = cwd
        _apply_jax_settings(env, imported)
        _reseed()
        if nanny_stub.wanted(request["argv"]):
            # Forked while this process has one thread, before the lifeline's.
            _compat.start_nanny_through(nanny_stub.fork())
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
    """End this engine, with what its cells started (its process group), when its stand-in
    goes (the launcher stopped or killed it): the launcher knows only the stand-in."""

    def watch():
        try:
            while lifeline.recv(1):
                pass
        except OSError:
            pass
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="jaxsys-lifeline", daemon=True).start()


# -- the server -----------------------------------------------------------------------------


class ForkServer:
    """The listening socket, the requests arriving on it, and the children forked.

    Parameters
    ----------
    path : str
        The socket's path.
    parent_fd : int or None
        A descriptor whose end of file means the kernel is gone (standard input).
    kernel_pid : int, optional
        The process allowed to connect, with the processes it started (see
        :func:`~jaxsys_kernel.engine.forkrequests.peer_refusal`); the parent by default.
    """

    def __init__(self, path: str, parent_fd: int | None = 0, kernel_pid: int | None = None):
        self.path = path
        self.parent_fd = parent_fd
        self.kernel_pid = os.getppid() if kernel_pid is None else kernel_pid
        self.imported = import_state()
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}
        self.pending: dict[socket.socket, Pending] = {}
        self.request_timeout = REQUEST_TIMEOUT_S
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._wake_r, self._wake_w = os.pipe()

    def listen(self) -> None:
        """Bind under a temporary name and rename, so the path appears when it is served."""
        tmp = f"{self.path}.{os.getpid()}"
        self.listener.bind(tmp)
        self.listener.listen(256)
        os.rename(tmp, self.path)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "child")
        if self.parent_fd is not None:
            self.sel.register(self.parent_fd, selectors.EVENT_READ, "parent")

    def close(self) -> None:
        """Stop listening: refuse what is arriving, close every socket, and give the
        signal handling back."""
        for pending in list(self.pending.values()):
            self._refuse(pending, "the fork server is closing")
        for conn in self.children.values():
            conn.close()
        self.sel.close()
        self.listener.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def serve(self) -> None:
        """Answer requests until the kernel's end of standard input closes."""
        while self.serve_once():
            pass

    def serve_once(self, timeout: float | None = None) -> bool:
        """Handle what is ready (waiting at most ``timeout`` seconds, or until the next
        request's deadline); False once the kernel is gone.

        Nothing one connection does ends the loop: an error while handling it is logged
        and refused, and the loop goes on.
        """
        wait = self._next_deadline()
        if timeout is not None:
            wait = timeout if wait is None else min(wait, timeout)
        for key, _ in self.sel.select(wait):
            try:
                if key.data == "parent" and not os.read(key.fd, 4096):
                    return False
                self._handle(key)
            except Exception as e:  # noqa: BLE001 - one request must not end every engine
                _log(f"error while serving ({type(e).__name__}: {e})")
                traceback.print_exc()
                if isinstance(key.data, Pending):
                    self._refuse(key.data, f"the fork server failed on it ({type(e).__name__})")
        self._expire()
        return True

    def _handle(self, key) -> None:
        if key.data == "accept":
            self._accept()
        elif key.data == "child":
            os.read(self._wake_r, 4096)
            self._reap()
        elif isinstance(key.data, Pending):
            try:
                request = key.data.read()
            except BadRequest as e:
                self._refuse(key.data, str(e))
                return
            if request is not None:
                self._done_reading(key.data)
                self._serve_request(key.data, request)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            # EMFILE and the like: say so, and try again a little later (the listener stays
            # readable, and the loop must not spin on it).
            _log(f"could not accept a connection ({e})")
            time.sleep(ACCEPT_BACKOFF_S)
            return
        pending = Pending(conn, self.request_timeout)
        why = peer_refusal(conn, self.kernel_pid)
        if why is None and len(self.pending) >= MAX_PENDING:
            why = f"{MAX_PENDING} requests are already arriving"
        if why:
            self._refuse(pending, why, registered=False)
            return
        self.pending[conn] = pending
        self.sel.register(conn, selectors.EVENT_READ, pending)

    def _done_reading(self, pending: Pending) -> None:
        self.pending.pop(pending.conn, None)
        self.sel.unregister(pending.conn)

    def _refuse(self, pending: Pending, why: str, registered: bool = True) -> None:
        if registered and pending.conn in self.pending:
            self._done_reading(pending)
        _log(f"refused a request: {why}")
        # Its descriptors are closed before it hears why: a client may count on it.
        pending.close_fds()
        pending.reply({"refused": why})
        pending.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self.pending.values() if p.deadline <= now]:
            self._refuse(pending, f"no whole request within {self.request_timeout:g} s")

    def _next_deadline(self) -> float | None:
        if not self.pending:
            return None
        return max(0.0, min(p.deadline for p in self.pending.values()) - time.monotonic())

    def _serve_request(self, pending: Pending, request: dict) -> None:
        why = refusal(request, self.imported)
        if why:
            self._refuse(pending, why, registered=False)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            # Out of processes or memory: the stand-in starts a plain engine instead.
            self._refuse(pending, f"{FORK_FAILED} ({e.strerror or e})", registered=False)
            return
        if pid == 0:
            _become_engine(
                request,
                pending.fds,
                [self.sel, self.listener, pending.conn, *self.children.values(), *self.pending],
                [self._wake_r, self._wake_w, *(fd for p in self.pending.values() for fd in p.fds)],
                self.imported,
                server_pid,
            )
        pending.close_fds()
        self.children[pid] = pending.conn
        pending.reply({"pid": pid})

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


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        # The stand-in is gone; its child (if any) follows through the lifeline.
        pass


def _log(message: str) -> None:
    print(f"jaxsys fork server: {message}", file=sys.stderr, flush=True)


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
    parent = os.environ.get(contract.PARENT_PID)
    server = ForkServer(args[0], kernel_pid=int(parent) if parent else None)
    server.listen()
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
