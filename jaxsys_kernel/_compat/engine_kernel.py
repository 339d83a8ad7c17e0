"""Shortcuts through an engine's ipykernel: work it does at every request that nobody needs.

Each function changes one running kernel (or ipykernel module) in place, once, and says
whether it could: a version without the internals it reaches for is left as it is.
"""

from __future__ import annotations


def quiet_engine_iopub(kernel) -> bool:
    """Stop an engine's kernel publishing ``status: busy`` and ``execute_input`` for the
    requests on its shell channel; True once it is so.

    Nobody reads them: ipyparallel's client and jaxsys's cell path read a request's output,
    its reply and its ``idle`` status (no output of the request follows that). Each is a
    message the engine signs and sends, the controller relays and the kernel's client
    unpacks: measured at 8 processes, 0.7 ms of CPU per process per trivial cell, of
    about 5 ms. The control channel (interrupts, aborts) still says ``busy``.
    """
    if kernel is None or not hasattr(kernel, "_publish_status"):
        return False
    if getattr(kernel, "_jaxsys_quiet", False):
        return True
    publish = kernel._publish_status

    def publish_status(status, channel, parent=None):
        if status == "busy" and channel == "shell":
            return
        publish(status, channel, parent)

    kernel._publish_status = publish_status
    kernel._publish_execute_input = lambda code, parent, execution_count: None
    kernel._jaxsys_quiet = True
    return True


def quick_empty_flush(stream) -> bool:
    """Let ``flush()`` of an ipykernel output stream return at once when it has nothing to
    send; True once it does.

    ``OutStream.flush`` waits for its IO thread even with nothing written: a round trip
    between threads, four per request in an engine (stdout and stderr, before and after the
    reply), each 38 us of CPU and 37-160 us of waiting at 8 processes on 2 cores. It is still
    made when anything was written since the last send, a send is scheduled, or one is under
    way (output off the buffer, not yet on the socket): output leaves before what follows.
    """
    if not all(hasattr(stream, a) for a in ("_flush", "_buffers", "_buffer_lock", "flush")):
        return False
    if getattr(stream, "_jaxsys_quick_flush", False):
        return True
    # Sends begun and ended. ipykernel sends on one thread at a time (its IO thread, or the
    # caller once that is gone), so these need no lock: a lock held at a fork would hang
    # every flush of the child.
    begun, ended = [0], [0]
    send, full_flush = stream._flush, stream.flush

    def counted_send():
        begun[0] += 1
        try:
            send()
        finally:
            ended[0] += 1

    def flush():
        with stream._buffer_lock:
            written = bool(stream._buffers)
        pending = getattr(stream, "_flush_pending", True)
        pending = pending or getattr(stream, "_subprocess_flush_pending", True)
        if written or pending or begun[0] != ended[0]:
            full_flush()

    # Instance attributes: ipykernel schedules ``self._flush``, so its IO thread finds ours.
    stream._flush = counted_send
    stream.flush = flush
    stream._jaxsys_quick_flush = True
    return True


# Functions whose answer is kept; a shell's run_cell is one, so this is never reached.
_MEMO_LIMIT = 64


def memo_run_cell_signature() -> bool:
    """Let ipykernel read the keywords its shell's ``run_cell_async`` takes once per
    function, not at every execute request; True once it does.

    ``IPythonKernel.do_execute`` asks ``inspect.signature`` of the bound method at every
    request. Measured with 2 processes: 0.15 ms of an engine's 1.33 ms of CPU per trivial
    cell. The answer depends only on the function (a shell whose method is replaced asks
    anew), so it is kept per function and names asked.
    """
    try:
        from ipykernel import ipkernel  # Deferred: see the package's docstring.
    except ImportError:
        return False
    accepts = getattr(ipkernel, "_accepts_parameters", None)
    if accepts is None:
        return False
    if getattr(accepts, "_jaxsys_memo", False):
        return True
    memo: dict[tuple, dict] = {}

    def remembered(meth, param_names):
        key = (getattr(meth, "__func__", meth), tuple(param_names))
        found = memo.get(key)
        if found is None:
            found = accepts(meth, param_names)
            if len(memo) < _MEMO_LIMIT:
                memo[key] = found
        return dict(found)  # the caller's own copy: ipykernel only reads it, but may not

    remembered._jaxsys_memo = True
    ipkernel._accepts_parameters = remembered
    return True


def quiet_engine_log(kernel) -> bool:
    """Have an engine's logger drop a message below every handler's level before making a
    record of it; True once it does.

    traitlets sets an application's logger to DEBUG and its handlers to the level asked
    for (``--IPEngine.log_level``), so each of ipykernel's five debug lines per request was
    made into a record that every handler then dropped. Measured with 2 processes: 0.07 ms
    of an engine's 1.3 ms of CPU per trivial cell. A handler added later with a lower level
    needs the logger's level lowered too, as anywhere in :mod:`logging`.
    """
    log = getattr(kernel, "log", None)
    handlers = getattr(log, "handlers", None)
    if not handlers or not hasattr(log, "setLevel"):
        return False
    lowest = min(h.level for h in handlers)
    if lowest > log.level:
        log.setLevel(lowest)
    return True


__all__ = ["memo_run_cell_signature", "quick_empty_flush", "quiet_engine_iopub", "quiet_engine_log"]
