"""Every use of private ipyparallel and ipykernel API, in one place.

jaxsys reaches past the public API of ipyparallel 9.2 and ipykernel 7.4 where their public
API cannot do what it needs (a hook before a request leaves, engine uuids, ssh launcher
internals, kernel subshells). Each reach is a small function here, so an upgrade that moves
one breaks in this package, and :func:`check_versions` refuses versions it was not written for
with a clear error instead of an ``AttributeError`` deep inside a cell.

Imports of ipyparallel and ipykernel are inside the functions: the ``jaxsys`` command
imports this module (through the cluster package) and never needs either, and ipyparallel
alone takes most of a second to import; the engine's own application module is only
loaded in engines. JAX is never
imported here, not even inside a function (the kernel side imports this module and must not
import JAX; import-linter reads imports in functions too): its functions take JAX's version
or objects from their callers on the engines.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Sequence
from datetime import datetime
from functools import partial

from ..errors import JaxsysError

# Callers reach each shortcut through an engine's kernel as _compat.<name>.
from .engine_kernel import (  # noqa: F401
    memo_run_cell_signature,
    quick_empty_flush,
    quiet_engine_iopub,
    quiet_engine_log,
)

# The releases this module was written and tested against (major, minor).
IPYPARALLEL = (9, 2)
IPYKERNEL = (7,)


class IncompatibleVersion(JaxsysError, RuntimeError):
    """An installed dependency is not a version jaxsys supports."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def check_versions(ipyparallel_version: str | None = None, ipykernel_version: str | None = None):
    """Raise :class:`IncompatibleVersion` unless ipyparallel 9.2 and ipykernel 7 are installed.

    Parameters
    ----------
    ipyparallel_version, ipykernel_version : str, optional
        Versions to check instead of the installed ones (for tests).
    """
    if ipyparallel_version is None:
        # Deferred: ipyparallel and ipykernel take most of a second to import, and the
        # `jaxsys` command imports this module without needing them (module docstring).
        import ipyparallel

        ipyparallel_version = ipyparallel.__version__
    if ipykernel_version is None:
        import ipykernel  # Deferred: as ipyparallel above.

        ipykernel_version = ipykernel.__version__
    problems = []
    if _version_tuple(ipyparallel_version)[:2] != IPYPARALLEL:
        problems.append(f"ipyparallel {ipyparallel_version} (jaxsys needs 9.2.x)")
    if _version_tuple(ipykernel_version)[:1] != IPYKERNEL:
        problems.append(f"ipykernel {ipykernel_version} (jaxsys needs 7.x)")
    if problems:
        raise IncompatibleVersion(
            "jaxsys relies on internals of specific releases and found "
            + " and ".join(problems)
            + "; install the supported ones: pip install 'ipyparallel>=9.2,<9.3' 'ipykernel>=7,<8'"
        )


# -- ipyparallel: the client -----------------------------------------------------------------


def engine_uuids(client) -> dict[int, str]:
    """Engine id -> uuid of every engine the client knows (a restarted rank may reuse an id;
    only its uuid is new)."""
    return dict(client._engines)


class _OneWake:
    """The client's IO loop while a cell's requests are made: their sends go as one callback."""

    def __init__(self, loop):
        self.loop = loop
        self.calls: list = []
        self._lock = threading.Lock()
        self._closed = False

    def add_callback(self, callback, *args, **kwargs) -> None:
        # Another thread (a control request beside the cell) may still hold this stand-in.
        with self._lock:
            if not self._closed:
                self.calls.append(partial(callback, *args, **kwargs))
                return
        self.loop.add_callback(callback, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.loop, name)

    def close(self) -> None:
        """Take no more callbacks (each goes straight to the loop); schedule those kept."""
        with self._lock:
            self._closed = True
        if self.calls:
            self.loop.add_callback(self.run)

    def run(self) -> None:
        for call in self.calls:
            try:
                call()
            except Exception:  # noqa: BLE001 - as the loop itself would: logged, the rest go on
                logging.getLogger("tornado.application").exception("Exception in callback")


def send_execute(client, view, engine_ids: Sequence[int], code: str, hook) -> None:
    """Send ``code`` to each engine with ``hook(rank_index, future)`` called before it leaves.

    ipyparallel's own streaming attaches its callbacks after sending, so output that comes
    back at once can slip past; ``message_future_hook`` runs first.

    ipyparallel's client hands each request to its IO thread with a callback (a wake) of its
    own; a cell's requests go together, in order: one wake (at 8 processes the kernel's CPU
    to send a cell went from 0.82 to 0.68 ms).
    """
    idents, _ = client._build_targets(list(engine_ids))
    loop = client._io_loop
    batch = _OneWake(loop)
    client._io_loop = batch
    try:
        for i, ident in enumerate(idents):
            client.send_execute_request(
                view._socket,
                code,
                silent=False,
                ident=ident,
                message_future_hook=lambda fut, i=i: hook(i, fut),
            )
    finally:
        client._io_loop = loop
        # What was made goes, also when a later request failed, with any other thread's.
        batch.close()


def fast_reply_dates() -> None:
    """Make ipyparallel's client read the ``started`` stamp of each reply with
    :meth:`datetime.fromisoformat` instead of ``dateutil`` (0.34 ms of the kernel's CPU per
    reply, profiled at 8 processes).

    The engines write the stamp in ISO 8601 with a time zone, which ``fromisoformat`` reads
    exactly as ``dateutil`` does; anything else still goes to ipyparallel's own parser.
    """
    # Deferred: as in check_versions.
    from ipyparallel import util

    if getattr(util._parse_date, "_jaxsys_fast", False):
        return
    slow = util._parse_date

    def parse_date(s):
        # Only what ipyparallel's own pattern takes for a stamp; the rest as it reads it.
        if not isinstance(s, str) or not util.ISO8601_PAT.match(s):
            return slow(s)
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            return slow(s)
        return dt if dt.tzinfo is not None else slow(s)

    parse_date._jaxsys_fast = True
    util._parse_date = parse_date


def broadcast_execute(client, engine_ids: Sequence[int], code: str, hook) -> None:
    """Send ``code`` to every engine in one message, through the controller's broadcast
    scheduler, with ``hook(rank_index, future)`` called for each engine before it leaves.

    The scheduler hands engine ``uuid`` its copy as ``<request id>_<uuid>``, and the reply
    and output come back under that id, so each engine gets a future of its own, made as
    ipyparallel's ``BroadcastView`` makes them but before the request leaves (see
    :func:`send_execute`), and counted as outstanding on its engine so that the engine's
    death resolves it. The request's own future never resolves: it is dropped at once.
    """
    # Deferred: as in check_versions.
    from ipyparallel.client.futures import multi_future

    idents, ids = client._build_targets(list(engine_ids))
    uuids = [ident.decode("utf8") for ident in idents]
    targets = list(zip(uuids, ids, strict=True))
    metadata = {"targets": targets, "is_broadcast": True, "is_coalescing": False}

    def fan_out(request) -> None:
        for i, uuid in enumerate(uuids):
            msg_id = f"{request.msg_id}_{uuid}"
            futures = client.create_message_futures(msg_id, request.header, async_result=True)
            client.outstanding.add(msg_id)
            client._outstanding_dict[uuid].add(msg_id)
            multi_future(futures).add_done_callback(partial(_forget, client, msg_id))
            hook(i, futures[0])
        _forget(client, request.msg_id)

    client.send_execute_request(
        client._broadcast_stream,
        code,
        silent=False,
        metadata=metadata,
        message_future_hook=fan_out,
    )


def _forget(client, msg_id: str, _future=None) -> None:
    """Drop the client's records of a request (as ipyparallel does once one resolves)."""
    client.outstanding.discard(msg_id)
    for table in (client.results, client._futures, client._output_futures, client.metadata):
        table.pop(msg_id, None)


# -- ipyparallel: launchers --------------------------------------------------------------------


def attach_engine_set(ipp_cluster, set_id: str, engine_set) -> None:
    """Tell an ipyparallel Cluster about an engine set it did not start itself."""
    ipp_cluster.engines[set_id] = engine_set
    engine_set.on_stop(partial(ipp_cluster._engines_stopped, set_id))


def forget_launcher_output(launcher) -> None:
    """Make a launcher skip fetching its process's log when it stops (nobody reads it, and
    the host or the file may be gone by then)."""
    launcher._output = ""


def release_ssh_waiter(launcher, timeout: float) -> None:
    """End the thread an ssh launcher keeps to wait for its remote process."""
    stop = getattr(launcher, "_stop_waiting", None)
    if stop is not None:
        stop.set()
    waiter = getattr(launcher, "_wait_thread", None)
    if waiter is not None:
        waiter.join(max(0.0, timeout))


def ssh_kill(launcher, pid: int, sig: int) -> None:
    """Send a signal to ``pid`` on the launcher's host, over its ssh connection."""
    launcher.ssh_sender.cmd_kill(pid, sig)


# -- ipyparallel: the engine (runs in the engines) ----------------------------------------------


def nanny_pid() -> int | None:
    """The pid of this engine's nanny, or None without one (or outside an engine)."""
    try:
        # Deferred: only engines run the engine application; the kernel and the `jaxsys`
        # command import this module too and would load it for nothing.
        from ipyparallel.engine.app import IPEngine

        if IPEngine.initialized():
            pipe = getattr(IPEngine.instance(), "nanny_pipe", None)
            return getattr(pipe, "pid", None)
    except Exception:  # noqa: BLE001 - the nanny pid is only a cleanup aid
        return None
    return None


def start_nanny_through(stub) -> None:
    """Have this engine start its nanny through ``stub`` (engine/nanny_stub.py), with
    ipyparallel's own start as the fallback; nothing when ``stub`` is None."""
    if stub is None:
        return
    from ipyparallel.engine import app  # Deferred: as in nanny_pid.

    # IPEngine.start_nanny calls the module's name, bound when ipyparallel 9 imported it.
    app.start_nanny = partial(stub.start, app.start_nanny)


def engine_heartbeat_monitor_port() -> int | None:
    """The port of this engine's heartbeat monitor (a SUB socket on loopback), or None."""
    try:
        from ipyparallel.engine.app import IPEngine  # Deferred: as in nanny_pid.

        if IPEngine.initialized():
            listener = getattr(IPEngine.instance(), "_hb_listener", None)
            if listener is not None:
                endpoint = listener.socket.LAST_ENDPOINT.decode()
                return int(endpoint.rsplit(":", 1)[1])
    except Exception:  # noqa: BLE001 - the audit names the port differently without it
        return None
    return None


# -- ipykernel: the kernel's own sockets -------------------------------------------------------


def kernel_pipe_port(kernel) -> int | None:
    """The port of ipykernel's IOPub pipe (output of forked subprocesses), or None."""
    thread = getattr(kernel, "iopub_thread", None)
    if thread is None or not getattr(thread, "_pipe_flag", False):
        return None
    return getattr(thread, "_pipe_port", None)


# -- ipykernel: subshells ----------------------------------------------------------------------


def supports_subshells(kernel) -> bool:
    """Whether this kernel can create subshells (ipykernel 7 with subshells on)."""
    return bool(getattr(kernel, "_supports_kernel_subshells", False)) and (
        getattr(kernel, "shell_channel_thread", None) is not None
    )


def create_subshell(kernel) -> str:
    """Create a subshell; must run on the shell-channel thread."""
    return kernel.shell_channel_thread.manager._create_subshell()


def route_comm_to_subshell(comm, subshell_id: str) -> None:
    """Serve a comm's incoming messages on a subshell, whatever thread sends its updates."""
    comm._reply_subshell_for = lambda data, default: subshell_id


# -- ipykernel: messages that answer no request -----------------------------------------------


@contextlib.contextmanager
def outside_any_request(kernel):
    """IOPub messages sent inside belong to no request (an empty parent header).

    Clients that collect what a cell sent by its request (nbclient, so nbconvert, papermill
    and ``jupyter execute``) then leave them out; a front end's widget manager takes a
    comm_open whatever its parent. Uses ipykernel's shell parent context variable; without
    it (another kernel, a future ipykernel), messages keep their parent.
    """
    var = getattr(kernel, "_shell_parent", None)
    if not isinstance(var, contextvars.ContextVar):
        yield
        return
    token = var.set({})
    try:
        yield
    finally:
        var.reset(token)


# -- JAX: the slow dispatch path (runs in the engines) -----------------------------------------

# The JAX release whose jax._src.pjit the divergence check reads (major, minor). Under the
# public ``jax_distributed_debug`` option, a call on the slow dispatch path logs a record,
# through this logger, whose message starts with this line, from this function, whose
# locals hold the call.
JAX = (0, 12)
JAX_DISPATCH_LOGGER = "jax._src.util"
_JAX_DISPATCH_BEGIN = "\nDISTRIBUTED_DEBUG_BEGIN"
_JAX_DISPATCH_FRAME = "_pjit_call_impl_python"


@functools.lru_cache(maxsize=8)
def jax_dispatch_unsupported(jax_version: str) -> str | None:
    """None when JAX ``jax_version``'s dispatch records can be read, else why not.

    Cached: every checked cell asks, with the version of the JAX its process runs."""
    if _version_tuple(jax_version)[:2] == JAX:
        return None
    return (
        f"the divergence check reads jax._src.pjit of JAX {JAX[0]}.{JAX[1]}.x; "
        f"this process runs JAX {jax_version}, so it is off"
    )


def is_jax_dispatch_record(record) -> bool:
    """Whether a ``logging.LogRecord`` is JAX's record of a dispatch."""
    return isinstance(record.msg, str) and record.msg.startswith(_JAX_DISPATCH_BEGIN)


def jax_dispatch_call(frame) -> dict | None:
    """The call JAX is logging, from the stack at or above ``frame`` (None if not there).

    Returns
    -------
    dict or None
        ``frame`` (JAX's logging frame), ``name``, ``args`` (the arrays passed),
        ``in_shardings``, ``out_shardings`` and ``fingerprint`` (None before compiling).
    """
    while frame is not None and frame.f_code.co_name != _JAX_DISPATCH_FRAME:
        frame = frame.f_back
    if frame is None:
        return None
    loc = frame.f_locals
    return {
        "frame": frame,
        "name": str(loc.get("name", "?")),
        "args": tuple(loc.get("args", ())),
        "in_shardings": tuple(loc.get("in_shardings", ())),
        "out_shardings": tuple(loc.get("out_shardings", ())),
        "fingerprint": loc.get("fingerprint"),
    }


def jax_option(config, variable: str):
    """The option JAX declares for the environment variable ``variable`` (``JAX_FOO``
    names ``jax_foo``), or None when JAX reads that variable some other way."""
    holders = getattr(config, "_value_holders", None)
    return holders.get(variable.lower()) if isinstance(holders, dict) else None


def set_jax_option_from_env(config, variable: str, value: str) -> None:
    """Give JAX's option for ``variable`` the value the variable would have given it at
    import (for a process whose environment changed after ``import jax``)."""
    holder = jax_option(config, variable)
    current = holder.value
    if isinstance(current, bool):
        parsed = value.strip().lower() in ("y", "yes", "t", "true", "on", "1")
    elif isinstance(current, int):
        parsed = int(value)
    elif isinstance(current, float):
        parsed = float(value)
    else:
        parsed = value
    config.update(variable.lower(), parsed)
