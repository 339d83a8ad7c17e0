"""The bound on what the kernel's ipyparallel client takes from the engines.

Every result an engine returns (``%pull``, ``Cluster.call``, a cell's reply) reaches the
kernel on the client's DEALER sockets, and everything it prints or displays on the output
channel (IOPub, a SUB socket). ZeroMQ holds a whole message in the kernel's memory before
ipyparallel unpickles it: one huge (or hostile) message could exhaust that memory and take
the cluster down with the kernel. So those sockets carry ZeroMQ's ``MAXMSGSIZE``: a message
part over :func:`limit` bytes is refused from its header, before its body is read.

ZeroMQ refuses it by ending the connection for good, and what was on it is lost, the reply
ipyparallel waits for included: a wait that would never end. So each socket is watched (a
ZeroMQ socket monitor); when one of them loses its connection while the controller still
runs, every reply still awaited ends at once with :class:`ReplyTooLarge`, in words naming
the limit and how to raise it, as ipyparallel ends those of an engine that died, and the
socket connects again. A loss on the output channel ends only the outputs awaited
(:class:`OutputTooLarge`): the replies still come, and a cell says which processes' output
was cut. The processes and the cluster stay up; the next cell works.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import _compat
from ..errors import ClusterError, ConfigError

#: The largest message part (bytes) the kernel takes from an engine, by default: 1 GiB, far
#: above any result a notebook shows, and below what would end a kernel on a small machine.
MAX_REPLY_BYTES = 2**30
#: The environment variable that sets another bound (bytes), read when a cluster connects.
ENV = "JAXSYS_MAX_REPLY_BYTES"
# The client's sockets that carry what engines send (replies, results, output).
_WATCHED = (
    "_mux_socket",
    "_task_socket",
    "_broadcast_socket",
    "_control_socket",
    "_iopub_socket",
)
_POLL_MS = 200
_SETUP_WAIT_S = 10.0
log = logging.getLogger("jaxsys.cluster")


class ReplyTooLarge(ClusterError):
    """A message from an engine was over the kernel's bound, and what was awaited is lost."""


class OutputTooLarge(ReplyTooLarge):
    """Output from an engine was over the kernel's bound: the output awaited is cut short."""


def limit() -> int:
    """The bound in bytes: ``$JAXSYS_MAX_REPLY_BYTES``, else :data:`MAX_REPLY_BYTES`.

    Raises
    ------
    ConfigError
        When the variable is not a whole number of bytes of at least 1024.
    """
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return MAX_REPLY_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1024:
        raise ConfigError(
            f"${ENV}={raw!r} is not a number of bytes of 1024 or more; set it to e.g. "
            f"{2 * MAX_REPLY_BYTES} (2 GiB), or unset it for the default ({_size(MAX_REPLY_BYTES)})"
        )
    return value


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def explain(bound: int) -> str:
    """What :class:`ReplyTooLarge` says: the bound, what was lost, and what to do."""
    return (
        f"an engine sent the kernel a reply over its limit of {_size(bound)} ({bound} bytes, "
        f"${ENV}); ZeroMQ refused it and closed the connection, so the replies still awaited "
        "were lost (the processes and the cluster are fine). Return less (write a large "
        "result to a file on the process), or raise the limit: set "
        f"os.environ[{ENV!r}] to more bytes, then %jaxsys stop and %jaxsys start"
    )


def explain_output(bound: int) -> str:
    """What :class:`OutputTooLarge` says: the bound, what was cut, and what to do."""
    return (
        f"output over the kernel's limit of {_size(bound)} ({bound} bytes, ${ENV}) was "
        "refused: this process's output is cut short here (the processes and the cluster "
        "are fine). Print or display less (write a large result "
        f"to a file on the process), or raise the limit: set os.environ[{ENV!r}] to more "
        "bytes, then %jaxsys stop and %jaxsys start"
    )


class _BoundedContext(zmq.Context):
    """A context whose new DEALER and SUB sockets (the client's reply and output channels)
    refuse message parts over :attr:`bound` bytes."""

    # Declared on the class: pyzmq takes any other attribute set on a context for an option.
    bound = MAX_REPLY_BYTES

    def __init__(self, bound: int = MAX_REPLY_BYTES):
        super().__init__()
        self.bound = bound
        # Every socket made here drops what it could not deliver when it closes. ZeroMQ's
        # default keeps it, and ending the context then waits for its delivery: with a
        # queue of the controller gone, for ever (measured: the whole CONTEXT_END_S, where
        # it ends at once with this).
        self.linger = 0

    def socket(self, socket_type, *args, **kwargs):
        sock = super().socket(socket_type, *args, **kwargs)
        if socket_type in (zmq.DEALER, zmq.SUB):
            sock.setsockopt(zmq.MAXMSGSIZE, self.bound)
        return sock


def bounded_context(bound: int) -> zmq.Context:
    """A new ZeroMQ context for one client, whose new DEALER and SUB sockets refuse message
    parts over ``bound`` bytes.

    One per client, ended with it (:func:`close_client`): a context whose I/O thread is
    ever blocked (a send to a socket monitor nobody reads blocks it for good) takes down
    only that client, never every client the process makes later; ending the context
    unblocks the thread."""
    return _BoundedContext(bound)


# How long ending a closed client's context may take before it is left to itself.
CONTEXT_END_S = 5.0
# The same once the controller has ended: its client has nothing left to deliver, and a
# restart or stop then says so without waiting. Under load, about one ending in ten after
# the controller's SIGKILL during a cell took longer than this, some the whole 5 s.
CONTEXT_END_DEAD_S = 0.5


async def connect_client(ipp_cluster, controller_gone: Callable[[], bool], timeout: float = 10.0):
    """ipyparallel's client of ``ipp_cluster``, bounded and watched (see the module).

    ``timeout`` is how long the controller has to answer the client's first request.
    Close it with :func:`close_client`, never with its own ``close``: see there."""
    bound = limit()
    _compat.fast_reply_dates()
    ctx = bounded_context(bound)
    try:
        client = await ipp_cluster.connect_client(context=ctx, timeout=timeout)
    except BaseException:
        _end_context(ctx)
        raise
    client._jaxsys_context = ctx
    watch(client, bound, controller_gone)
    return client


def close_client(client, wait: float = CONTEXT_END_S) -> None:
    """Close a client made by :func:`connect_client`, and end its context (waiting at most
    ``wait`` s for it to end; past that it ends on its own thread, or never).

    A ZeroMQ socket monitor sends its events from the context's I/O thread, and a send to a
    monitor whose reading end was closed blocks that thread. So the monitors are stopped
    while their reading ends are open, and only then is anything closed; the context is
    ended last, which also frees its I/O thread if it was blocked all the same."""
    # The client's own thread owns its sockets: stopped first, so that they can be touched.
    client._stop_io_thread()
    watching = getattr(client, "_jaxsys_watch", None)
    if watching is not None:
        watching.stop()
    client.close(linger=0)
    ctx = getattr(client, "_jaxsys_context", None)
    if ctx is not None:
        _end_context(ctx, wait)


def _end_context(ctx: zmq.Context, wait: float = CONTEXT_END_S) -> None:
    # Ending a context waits for every socket made in it to close; those pyzmq tracks are
    # closed here, but a socket it does not track would make the wait endless, so it runs
    # on a thread of its own, waited for only so long.
    ender = threading.Thread(
        target=ctx.destroy, kwargs={"linger": 0}, name="jaxsys-context-end", daemon=True
    )
    ender.start()
    ender.join(wait)
    if ender.is_alive():
        log.warning("a closed client's ZeroMQ context did not end within %g s", wait)


class Watch:
    """The thread that reads the monitors of a client's sockets (see :func:`watch`)."""

    def __init__(self, client, bound: int, controller_gone: Callable[[], bool]):
        self.client = client
        self.monitors: dict[zmq.Socket, zmq.Socket] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=_watch_loop,
            args=(self, bound, controller_gone),
            name="jaxsys-reply-limit",
            daemon=True,
        )

    def stop(self) -> None:
        """Stop every monitor, then the thread, which closes the monitors' reading ends."""
        for sock in self.monitors.values():
            if not sock.closed:
                try:
                    sock.disable_monitor()
                except zmq.ZMQError:
                    pass  # not monitored any more
        self.stopping.set()
        self.thread.join(timeout=_POLL_MS / 1000 * 10)


_monitor_ids = itertools.count()


def watch(client, bound: int, controller_gone: Callable[[], bool]) -> Watch | None:
    """Mend ``client`` when one of its sockets loses its connection while the controller runs
    (a message over ``bound`` was refused): what it awaits ends with :class:`ReplyTooLarge`,
    and the socket connects again. Returns the running :class:`Watch` (None: not watched)."""
    watching = Watch(client, bound, controller_gone)
    made, given_up = threading.Event(), threading.Event()
    # Held while the monitors are made: the caller gives up either before any is made or
    # not at all. Monitors made after it gave up would have no reader once ``watching``
    # is collected, and their next event would block the context's I/O thread for good.
    making = threading.Lock()

    def make() -> None:
        # On the client's IO thread, which owns its sockets.
        with making:
            try:
                for name in () if given_up.is_set() else _WATCHED:
                    sock = getattr(client, name, None)
                    if sock is not None and not sock.closed:
                        # An address of its own: pyzmq's default is made from the socket's
                        # file descriptor, which a later client's socket may get again.
                        addr = f"inproc://jaxsys-reply-limit-{os.getpid()}-{next(_monitor_ids)}"
                        watching.monitors[sock.get_monitor_socket(_EVENTS, addr)] = sock
            finally:
                made.set()

    client._io_loop.add_callback(make)
    if not made.wait(_SETUP_WAIT_S):
        with making:
            if not made.is_set():
                given_up.set()
    if given_up.is_set():
        log.warning("the client's sockets could not be watched for refused messages")
        return None
    watching.thread.start()
    # What close_client stops before it closes anything.
    client._jaxsys_watch = watching
    return watching


# A refused message ends the connection for good (ZeroMQ reconnects after other losses, and
# says so with one of the connect events).
_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_DELAYED
    | zmq.EVENT_CONNECT_RETRIED
)
# How long a lost connection is left to come back on its own (ZeroMQ tries again after
# 0.1 s), or to be seen as the controller's death, before what was on it counts as lost.
SETTLE_S = 0.3
# How long before a lost reply connection is made again.
RECONNECT_WAIT_S = 1.0
# How long a remade output connection is given for its subscription to reach the controller:
# output published before that is not delivered.
SUBSCRIBED_S = 0.3
# How long a remade output connection may take to come up before the outputs awaited end
# without it.
OUTPUT_GIVE_UP_S = 5.0


@dataclasses.dataclass
class _Loss:
    """A watched socket's connection that ended."""

    when: float
    endpoint: str
    output: bool  # the output channel's (IOPub), not a reply channel's
    failed: bool = False  # what it awaited has been ended
    remade: bool = False  # connected again by the watch
    connected_at: float | None = None


def _watch_loop(watching: Watch, bound, controller_gone) -> None:
    client, monitors = watching.client, watching.monitors
    poller = zmq.Poller()
    for m in monitors:
        poller.register(m, zmq.POLLIN)
    lost: dict[zmq.Socket, _Loss] = {}
    # Read until told to stop: a monitor's events must always find their reader (see
    # close_client). A client closed some other way ends the thread but leaves the reading
    # ends open, for the same reason.
    while not watching.stopping.is_set() and not client._closed:
        try:
            for mon, _ in poller.poll(_POLL_MS):
                _take_event(mon, lost, monitors[mon] is getattr(client, "_iopub_socket", None))
            _settle(client, monitors, lost, bound, controller_gone)
        except Exception:  # noqa: BLE001 - a bug here must not leave the monitors unread
            log.exception("watching the client's sockets for refused messages")
            time.sleep(_POLL_MS / 1000)
    if watching.stopping.is_set():
        for m in monitors:
            m.close(linger=0)


def _take_event(mon: zmq.Socket, lost: dict, output: bool) -> None:
    try:
        event = recv_monitor_message(mon, zmq.NOBLOCK)
    except zmq.ZMQError:
        return
    loss = lost.get(mon)
    if event["event"] == zmq.EVENT_DISCONNECTED:
        # Unless it is the watch's own connection failing before it was up (ZeroMQ tries
        # again), a loss: also one of a remade connection (another refusal at once).
        if loss is None or not loss.remade or loss.connected_at is not None:
            lost[mon] = _Loss(time.monotonic(), event["endpoint"].decode(errors="replace"), output)
    elif loss is not None and loss.remade:
        # The output connection the watch made again: up once connected.
        if event["event"] == zmq.EVENT_CONNECTED:
            loss.connected_at = time.monotonic()
    elif loss is not None and not loss.failed:
        # Connecting again on its own (or its monitor stopped): not a refusal.
        del lost[mon]


def _settle(client, monitors, lost, bound, controller_gone) -> None:
    now = time.monotonic()
    for mon, loss in list(lost.items()):
        if now - loss.when < SETTLE_S:
            continue
        if controller_gone():
            # Not a refusal: the controller's death is reported on its own.
            del lost[mon]
        elif loss.output:
            _settle_output(client, monitors[mon], lost, mon, loss, bound, now)
        elif not loss.failed:
            loss.failed = True
            client._io_loop.add_callback(fail_awaited, client, ReplyTooLarge(explain(bound)))
        elif now - loss.when >= RECONNECT_WAIT_S:
            del lost[mon]
            client._io_loop.add_callback(_connect_again, monitors[mon], loss.endpoint)


def _settle_output(client, sock, lost, mon, loss: _Loss, bound: int, now: float) -> None:
    """Connect the output channel again at once, and end the outputs awaited only once it
    carries output again: an output (a status that says a request is over) sent while it was
    down never comes, and a request sent then must not wait for one."""
    error = OutputTooLarge(explain_output(bound))
    if not loss.remade:
        loss.remade = True
        client._io_loop.add_callback(_connect_again, sock, loss.endpoint)
    elif loss.connected_at is not None:
        if now - loss.connected_at >= SUBSCRIBED_S:
            del lost[mon]
            client._io_loop.add_callback(fail_outputs, client, error)
    elif now - loss.when >= OUTPUT_GIVE_UP_S:
        # Not up again: what is awaited ends now, and connecting is tried anew.
        client._io_loop.add_callback(fail_outputs, client, error)
        lost[mon] = _Loss(now, loss.endpoint, output=True)


def _connect_again(sock: zmq.Socket, endpoint: str) -> None:
    # On the IO thread. The refused connection's session has ended, so this is a new one.
    if not sock.closed:
        try:
            # The ended connection's endpoint is still the socket's: a connect alone is
            # ignored.
            sock.disconnect(endpoint)
        except zmq.ZMQError:
            pass
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as e:
            log.warning("could not connect the client to %s again: %s", endpoint, e)


def fail_awaited(client, error: Exception) -> int:
    """End every reply and output ``client`` still awaits with ``error``, as ipyparallel
    ends those of an engine that died (on its IO thread); returns how many replies."""
    # Deferred: ipyparallel's client machinery, as loaded by the client itself.
    from ipyparallel import error as ipp_error

    try:
        raise error
    except type(error):
        content = ipp_error.wrap_exception()
    # Where it was raised here says nothing to the user; the words say it all.
    content["traceback"] = []
    failed = 0
    for uuid, msg_ids in list(client._outstanding_dict.items()):
        for msg_id in list(msg_ids):
            if msg_id in client.results:
                continue
            msg = client.session.msg("apply_reply", content=content)
            msg["parent_header"]["msg_id"] = msg_id
            msg["metadata"]["engine"] = uuid
            client._handle_apply_reply(msg)
            failed += 1
    fail_outputs(client, error)
    if failed:
        log.warning("%s", error)
    return failed


def fail_outputs(client, error: Exception) -> int:
    """End every output ``client`` still awaits with ``error`` (on its IO thread): what was
    lost will not come, and the request's output is over; returns how many."""
    failed = 0
    for future in list(client._output_futures.values()):
        if not future.done():
            future.set_exception(error)
            failed += 1
    return failed
