"""What the fork server accepts: who may connect, and what a request must look like.

Any process of the user can reach the server's socket (cell code on an engine included),
and a request that ends the server ends every engine forked from it. So each connection is
checked before a byte is read (:func:`peer_refusal`), read without blocking and with a
deadline (:class:`Pending`), and parsed into exactly the shape the stand-in sends
(:func:`parse`). Every problem is a :class:`BadRequest` whose text is the refusal the client
gets back; the descriptors that came with a request are closed on every path.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import time

from .. import _compat, contract
from ..errors import ProtocolError

#: The header of a request: its JSON length, then the JSON; four descriptors ride along.
HEADER = struct.Struct("!I")
#: Descriptors a request carries: stdin, stdout, stderr and the stand-in's lifeline.
NFDS = 4
#: A stand-in's request is its environment and arguments: tens of kilobytes at most.
MAX_REQUEST = 1024 * 1024
#: How long a connection may take to send its whole request (a stand-in sends it at once).
REQUEST_TIMEOUT_S = 10.0
_READ_SIZE = 65536
_CREDS = struct.Struct("3i")


class BadRequest(ProtocolError):
    """A request the server refuses; the message is the refusal, in words."""


def peer_credentials(conn: socket.socket) -> tuple[int, int] | None:
    """The connecting process's (pid, uid), or None where the system cannot say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    pid, uid, _gid = _CREDS.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    )
    return pid, uid


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None: it is gone, or this is not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses itself.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def peer_refusal(conn: socket.socket, kernel_pid: int) -> str | None:
    """Why the process at the other end may not ask for a fork (None: it may).

    Only the kernel and the processes it started itself (the launchers' stand-ins) are
    served: a process of another user, or one started by an engine (cell code), is not.
    """
    creds = peer_credentials(conn)
    if creds is None:
        return None
    pid, uid = creds
    if uid != os.getuid():
        return f"process {pid} belongs to user {uid}, not to the cluster's user {os.getuid()}"
    if pid == kernel_pid:
        return None
    parent = parent_of(pid)
    if parent != kernel_pid:
        return (
            f"process {pid} was not started by the kernel (pid {kernel_pid}) but by "
            f"{parent}: only the engine launchers' stand-ins may ask for a fork"
        )
    return None


def _strings(value, what: str) -> None:
    if not all(isinstance(v, str) for v in value):
        raise BadRequest(f"the request's {what} must all be strings")


def parse(body: bytes) -> dict:
    """The request in ``body``, checked: ``argv`` (strings), ``env`` (strings to strings)
    and an optional ``cwd`` (a string).

    Raises
    ------
    BadRequest
        Naming what is wrong with it.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request is not UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        request = json.loads(text)
    except RecursionError:
        raise BadRequest("the request's JSON is nested too deeply") from None
    except ValueError as e:
        raise BadRequest(f"the request is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise BadRequest(f"the request is a JSON {type(request).__name__}, not an object")
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not isinstance(argv, list) or not isinstance(env, dict):
        raise BadRequest("the request names no environment or arguments")
    _strings(argv, "arguments")
    _strings(env, "environment names")
    _strings(env.values(), "environment values")
    if cwd is not None and not isinstance(cwd, str):
        raise BadRequest("the request's working directory must be a string")
    return request


# -- what a fork of this server can serve ----------------------------------------------------


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


class Pending:
    """One connection whose request is still arriving.

    Parameters
    ----------
    conn : socket.socket
        The accepted connection (made non-blocking here).
    timeout : float
        Seconds it has to send its whole request.
    """

    def __init__(self, conn: socket.socket, timeout: float = REQUEST_TIMEOUT_S):
        conn.setblocking(False)
        self.conn = conn
        self.deadline = time.monotonic() + timeout
        self.data = bytearray()
        self.fds: list[int] = []

    def read(self) -> dict | None:
        """Read what has arrived; the request once it is whole, else None.

        Raises
        ------
        BadRequest
            When what arrived cannot become a request (the descriptors stay in
            :attr:`fds` until :meth:`close`).
        """
        try:
            msg, ancdata, flags, _addr = self.conn.recvmsg(
                _READ_SIZE, socket.CMSG_SPACE(NFDS * array.array("i").itemsize)
            )
        except (BlockingIOError, InterruptedError):
            return None
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
                self.fds.extend(fds)
        if flags & socket.MSG_CTRUNC or len(self.fds) > NFDS:
            raise BadRequest(f"a request carries {NFDS} descriptors, no more")
        if not msg:
            raise BadRequest(f"the request ended after {len(self.data)} bytes")
        self.data += msg
        if len(self.data) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self.data)
        if length > MAX_REQUEST:
            raise BadRequest(f"a request of {length} bytes (at most {MAX_REQUEST})")
        if len(self.data) < HEADER.size + length:
            return None
        if len(self.data) > HEADER.size + length:
            raise BadRequest("bytes follow the request")
        if len(self.fds) != NFDS:
            raise BadRequest(f"a request carries {NFDS} descriptors, not {len(self.fds)}")
        return parse(bytes(self.data[HEADER.size :]))

    def reply(self, message: dict) -> None:
        """Send one JSON line; a client that is gone or not reading loses it."""
        try:
            self.conn.setblocking(True)
            self.conn.settimeout(1.0)
            self.conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            # The stand-in is gone; its child (if any) follows through the lifeline.
            pass

    def close_fds(self) -> None:
        """Close the descriptors received (after a fork, or with a refusal)."""
        fds, self.fds = self.fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        """Close the descriptors received and the connection."""
        self.close_fds()
        try:
            # Unread bytes would turn the close into a reset that may beat the refusal.
            self.conn.setblocking(False)
            for _ in range(16):
                if not self.conn.recv(_READ_SIZE):
                    break
        except OSError:
            pass
        self.conn.close()
