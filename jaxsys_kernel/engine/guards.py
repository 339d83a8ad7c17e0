"""JAX's transfer guard and thread guard on one process, with errors a person can read.

Runs in each JAX process. The transfer guard is set with JAX's own config options, for the
whole process (every thread). In ``log`` mode JAX writes each transfer through absl to the
native stderr, not to Python's logging: :func:`count_line` sees every whole fd 2 line
(:mod:`jaxsys_kernel.engine.output` calls it) and counts the transfer lines by kind; the
lines themselves still go to the cell.

A disallowed transfer raises ``JaxRuntimeError`` with JAX's internal names
(``aval=ShapedArray(float32[3]), dst_sharding=...``). While a guard is set, the cell's error
is replaced by :class:`TransferGuardError`, which names the kind, shape, dtype and devices
and says how to lift the guard. The thread guard's error (a multi-process operation from a
thread other than the cell's) becomes :class:`ThreadGuardError`, naming both threads, also
when it happened in a thread the cell started and never re-raised.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from IPython import get_ipython

from ..errors import EngineError
from ..telemetry import schema
from . import agent, hooks
from .state import STATE

LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
# Short direction names, JAX's names for them in its messages, and its config options.
DIRECTIONS = {
    "h2d": ("host-to-device", "jax_transfer_guard_host_to_device"),
    "d2h": ("device-to-host", "jax_transfer_guard_device_to_host"),
    "d2d": ("device-to-device", "jax_transfer_guard_device_to_device"),
}
KINDS = tuple(kind for kind, _ in DIRECTIONS.values())

# absl's line for one logged transfer, e.g.
# "W1201 01:52:01.770184   22369 guard_lib.cc:154] host-to-device transfer: aval=..."
_LOG_LINE = re.compile(
    rb"guard_lib\.cc:\d+\] (host-to-device|device-to-host|device-to-device) transfer:"
)
_DISALLOWED = re.compile(
    r"Disallowed (host-to-device|device-to-host|device-to-device) transfer: (.*)"
)
_AVAL = re.compile(r"aval=ShapedArray\((\w+)\[([^\]]*)\]")
_SHAPE_DTYPE = re.compile(r"shape=\(([^)]*)\), dtype=(\w+)")
_DEVICE = re.compile(r"(\w+)Device\(id=(\d+)\)|device=(\w+:\d+)")
_MESH = re.compile(
    r"NamedSharding\(mesh=Mesh\(([^)]*?)(?:, axis_types=\([^)]*\))?\), spec=(P\([^)]*\))"
)
_THREADS = re.compile(r"called from thread (\d+).*thread guard was set in thread (\d+)", re.DOTALL)

WHY_THREADS = (
    "In multi-controller JAX every process runs the same program and must issue its "
    "multi-process operations (collectives, cross-process transfers) in the same order; "
    "operations issued from two threads can be enqueued in different orders on different "
    "processes, and then the processes wait on each other forever or exchange the wrong data. "
    "Issue them from the cell's thread, or hand results back to it (a queue, future.result())."
)


class TransferGuardError(EngineError):
    """A transfer the transfer guard disallows, named by kind, shape, dtype and devices."""


class ThreadGuardError(EngineError):
    """A multi-process JAX operation from a thread other than the one that set the guard."""


_counts_lock = threading.Lock()
# Seconds between two telemetry events with the counts.
PUBLISH_GAP = 0.5


def count_line(line: bytes) -> None:
    """Count ``line`` if it is one of JAX's logged transfers (a whole fd 2 line)."""
    m = _LOG_LINE.search(line)
    if m is None:
        return
    with _counts_lock:
        STATE.guards.counts[m.group(1).decode()] += 1
        snapshot = dict(STATE.guards.counts)
    publish_counts()
    if STATE.guards.on_count is not None:
        try:
            STATE.guards.on_count(snapshot)
        except Exception:  # noqa: BLE001 - counting must never stop native output
            pass


def publish_counts(force: bool = False) -> bool:
    """Send the counts to the kernel's telemetry (for the dashboard) if they changed.

    At most one event per :data:`PUBLISH_GAP` seconds unless ``force``: a loop of logged
    transfers must not flood the link. The end of each cell sends the last counts.
    """
    now = time.monotonic()
    snapshot = counts()
    if snapshot == STATE.guards.published or (
        not force and now - STATE.guards.last_publish < PUBLISH_GAP
    ):
        return False
    try:
        agent.publish(schema.TRANSFERS, counts=snapshot)
    except Exception:  # noqa: BLE001 - telemetry is best effort; the counts stay here
        return False
    STATE.guards.published.clear()
    STATE.guards.published.update(snapshot)
    STATE.guards.last_publish = now
    return True


def counts(reset: bool = False) -> dict[str, int]:
    """Transfers logged so far on this process, by kind (every kind present, 0 if none)."""
    with _counts_lock:
        out = {k: STATE.guards.counts.get(k, 0) for k in KINDS}
        if reset:
            STATE.guards.counts.clear()
    return out


def set_transfer_guard(levels: dict[str, str]) -> dict[str, str]:
    """Set the transfer guard of this process, per direction (``{"h2d": "disallow"}``).

    Returns
    -------
    dict
        The level of every direction afterwards (``"allow"`` where none was set).
    """
    # Deferred: output.py loads this module on the engine's boot path, before JAX is imported.
    import jax

    for short, level in levels.items():
        if short not in DIRECTIONS or level not in LEVELS:
            raise ValueError(f"unknown transfer guard setting {short}={level}")
        jax.config.update(DIRECTIONS[short][1], level)
        STATE.guards.levels[short] = level
    install()
    return transfer_guard_levels()


def state(reset_counts: bool = False) -> dict:
    """This process's transfer guard levels and logged-transfer counts."""
    out = {"levels": transfer_guard_levels(), "counts": counts(reset_counts)}
    if reset_counts:
        publish_counts(force=True)
    return out


def transfer_guard_levels() -> dict[str, str]:
    """The transfer guard level of every direction, as JAX's config holds it."""
    # Deferred: output.py loads this module on the engine's boot path, before JAX is imported.
    import jax

    return {s: getattr(jax.config, opt) or "allow" for s, (_, opt) in DIRECTIONS.items()}


def _device_names(text: str) -> list[str]:
    names = []
    for m in _DEVICE.finditer(text):
        name = m.group(3) or f"{m.group(1).lower()}:{m.group(2)}"
        if name not in names:
            names.append(name)
    return names


def describe_transfer(message: str, rank: int | None = None) -> str | None:
    """A readable account of JAX's "Disallowed ... transfer" message, or None if it is not one."""
    m = _DISALLOWED.search(message)
    if m is None:
        return None
    kind, detail = m.group(1), m.group(2)
    aval, sd = _AVAL.search(detail), _SHAPE_DTYPE.search(detail)
    if aval:
        dtype, shape = aval.group(1), f"({aval.group(2)})" if aval.group(2) else "() (a scalar)"
    elif sd:
        shape, dtype = f"({sd.group(1)})", _numpy_dtype(sd.group(2))
    else:
        shape = dtype = "?"
    if kind == "device-to-device" and "dst_sharding=" in detail:
        src, dst = detail.split("dst_sharding=", 1)
        where = f"from {_place(src)} to {_place(dst)}"
    elif kind == "device-to-host":
        where = f"from {_place(detail)} to host memory"
    else:
        where = f"from host memory to {_place(detail)}"
    direction = next(s for s, (k, _) in DIRECTIONS.items() if k == kind)
    level = STATE.guards.levels.get(direction, "disallow")
    proc = f" on process {rank}" if rank is not None else ""
    return (
        f"{kind} transfer of shape {shape}, dtype {dtype}, {where} disallowed{proc} "
        f"(transfer guard {direction}={level}). Move the data explicitly "
        f"(jax.device_put / jax.device_get) or lift the guard with %jaxsys transfer-guard allow. "
        f"JAX said: {m.group(0)}"
    )


def _numpy_dtype(xla: str) -> str:
    """NumPy's name for an XLA element type (``F32`` is float32, ``S8`` int8, ``PRED`` bool)."""
    special = {"PRED": "bool", "BF16": "bfloat16", "C64": "complex64", "C128": "complex128"}
    if xla.upper() in special:
        return special[xla.upper()]
    m = re.fullmatch(r"([FSU])(\d+)", xla.upper())
    if m is None:
        return xla.lower()
    return {"F": "float", "S": "int", "U": "uint"}[m.group(1)] + m.group(2)


def _place(text: str) -> str:
    devices = _device_names(text)
    if devices:
        return "device " + devices[0] if len(devices) == 1 else "devices " + ", ".join(devices)
    mesh = _MESH.search(text)
    if mesh:
        return f"the devices of Mesh({mesh.group(1)}) with {mesh.group(2)}"
    return "?"


def _thread_name(ident: int) -> str:
    for t in threading.enumerate():
        if ident in (t.ident, getattr(t, "native_id", None)):
            return f"{t.name!r} (id {ident})"
    return f"a thread that has ended (id {ident})"


def describe_thread_error(
    message: str, rank: int | None = None, thread: str | None = None
) -> str | None:
    """A readable account of the thread guard's error, or None if ``message`` is not one."""
    m = _THREADS.search(message)
    if m is None:
        return None
    caller = thread or _thread_name(int(m.group(1)))
    owner = _thread_name(int(m.group(2)))
    proc = f"process {rank}" if rank is not None else "this process"
    return (
        f"a multi-process JAX operation ran on {proc} in thread {caller}, but the cell runs "
        f"under the thread guard set in thread {owner}. {WHY_THREADS}"
    )


# -- the cell's error ------------------------------------------------------------------------


def _rank() -> int | None:
    try:
        # Deferred: output.py loads this module on the engine's boot path, before JAX is imported.
        import jax

        return jax.process_index()
    except Exception:  # noqa: BLE001 - before JAX is up there is no rank to name
        return None


def clarify(exc: BaseException, thread: str | None = None) -> BaseException | None:
    """The readable error for ``exc`` (TransferGuardError / ThreadGuardError), or None."""
    text = str(exc)
    rank = _rank()
    described = describe_transfer(text, rank)
    if described is not None:
        return TransferGuardError(described)
    described = describe_thread_error(text, rank, thread)
    if described is not None:
        return ThreadGuardError(described)
    return None


def _custom_tb(shell, etype, value, tb, tb_offset=None):
    clear = clarify(value)
    if clear is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return []
    # JAX's own message is quoted in the new one; its chained traceback would repeat it.
    clear.__suppress_context__ = True
    STATE.guards.replacement = clear
    shell.showtraceback((type(clear), clear, tb), tb_offset=tb_offset)
    return []


def _thread_excepthook(args) -> None:
    clear = clarify(args.exc_value, thread=_describe(args.thread)) if args.exc_value else None
    if clear is not None:
        STATE.guards.thread_errors.append((getattr(args.thread, "name", "?"), clear))
        return
    _previous_excepthook(args)


def _describe(thread) -> str | None:
    if thread is None:
        return None
    return f"{thread.name!r} (id {thread.ident})"


_previous_excepthook = threading.excepthook


def _pre_run_cell(*_args) -> None:
    STATE.guards.replacement = None
    STATE.guards.thread_errors.clear()


def _post_run_cell(result) -> None:
    if STATE.guards.replacement is not None and result.error_in_exec is not None:
        result.error_in_exec = STATE.guards.replacement
    elif STATE.guards.thread_errors and result.error_in_exec is None:
        # The cell itself succeeded, but a thread it started broke the guard: the cell fails.
        clear = STATE.guards.thread_errors[0][1]
        result.error_in_exec = clear
        get_ipython().showtraceback((type(clear), clear, None))
    STATE.guards.replacement = None
    STATE.guards.thread_errors.clear()
    publish_counts(force=True)


def install() -> bool:
    """Make guard errors readable in this engine's cells; calling it again does nothing."""
    if STATE.guards.thread_hooks:
        return True
    shell = get_ipython()
    if shell is None:
        return False
    # Deferred: output.py loads this module on the engine's boot path, before JAX is imported.
    from jax.errors import JaxRuntimeError

    shell.set_custom_exc((JaxRuntimeError, ValueError), _custom_tb)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_run_cell", _post_run_cell)
    threading.excepthook = _thread_excepthook
    STATE.guards.thread_hooks = True
    return True


def _enter_thread_guard(_options: dict):
    """The ``thread_guard`` cell hook: the cell runs under ``jax.thread_guard(True)``."""
    # Deferred: output.py loads this module on the engine's boot path, before JAX is imported.
    import jax

    if not install():
        raise EngineError("the thread guard needs an IPython shell to follow the cell")
    guard = jax.thread_guard(True)
    guard.__enter__()
    return guard


def _leave_thread_guard(guard, _exc: BaseException | None = None) -> None:
    guard.__exit__(None, None, None)


hooks.register(
    hooks.Hook("thread_guard", _enter_thread_guard, _leave_thread_guard, _leave_thread_guard)
)


def arm_thread_guard() -> bool:
    """Run the next cell of this process under ``jax.thread_guard(True)``.

    For callers that send the cell themselves; the kernel's cells ask for the
    ``thread_guard`` hook in the code they send instead (:func:`.hooks.wrap`).
    """
    return install() and hooks.arm_next({"thread_guard": {}})


def on_count(callback: Callable[[dict], None] | None) -> None:
    """Call ``callback(counts)`` after each counted transfer line (the telemetry agent)."""
    STATE.guards.on_count = callback


__all__ = [
    "KINDS",
    "LEVELS",
    "ThreadGuardError",
    "TransferGuardError",
    "arm_thread_guard",
    "clarify",
    "count_line",
    "counts",
    "describe_thread_error",
    "describe_transfer",
    "install",
    "set_transfer_guard",
    "transfer_guard_levels",
]
