"""Where stack dumps come from: a local stack file, or telemetry relayed from another host.

Each engine arms ``faulthandler`` on SIGUSR1 at start-up (engine/bootstrap.py), writing to
a stack file of its own; fd 2 is captured by ipykernel and would land in the cell. Engines on
other hosts relay what lands in that file as ``stacks`` telemetry events. Both work while a
process waits inside a C++ collective with the GIL released, where no Python handler runs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# Every thread's stack in a faulthandler dump starts with a header saying this.
_DUMP_MARKERS = ("Current thread", "most recent call first")
# A dump whose file has not grown for this long is complete (it is written in microseconds).
DUMP_QUIET_S = 0.1
_POLL_S = 0.02
# Relayed dumps make a round trip through the engine's relay thread and the hub.
MIN_RELAY_TIMEOUT = 3.0
# Most bytes of one dump read from a stack file. faulthandler writes at most 100 threads
# of 100 frames, some tens of kilobytes; the file is the engine's, and cell code can write
# into it, so what is read of it is bounded as a relayed dump is.
MAX_DUMP_BYTES = 512 * 1024

Signal = Callable[[list[int], int], object]


def read_from(path: Path, offset: int, limit: int = MAX_DUMP_BYTES) -> str:
    """What a file holds from ``offset`` on, at most ``limit`` bytes (empty if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def local_stacks(files: Mapping[int, Path], send_signal: Signal, timeout: float) -> dict[int, str]:
    """Signal processes on this machine and read their dumps from their stack files.

    A dump is taken as complete once it has begun (faulthandler's header) and its file has
    not grown for :data:`DUMP_QUIET_S`: faulthandler writes it line by line from a signal
    handler, and which thread it writes last is not fixed.

    Parameters
    ----------
    files : mapping of int to Path
        Each rank's stack file; ranks whose file does not exist are skipped.
    send_signal : callable
        ``send_signal(ranks, signum)``: delivers SIGUSR1.
    timeout : float
        Seconds to wait for the dumps.

    Returns
    -------
    dict
        The dump text by rank; ranks whose dump did not arrive in time are missing.
    """
    logs = {r: p for r, p in files.items() if p.exists()}
    start = {r: p.stat().st_size for r, p in logs.items()}
    send_signal(list(logs), signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    seen: dict[int, tuple[int, float]] = {}  # rank -> (size, when it last grew)
    out: dict[int, str] = {}
    while logs and time.monotonic() < deadline:
        now = time.monotonic()
        for r, p in list(logs.items()):
            text = read_from(p, start[r])
            if not any(marker in text for marker in _DUMP_MARKERS):
                continue
            size, grew_at = seen.get(r, (-1, now))
            if len(text) != size:
                seen[r] = (len(text), now)
            elif now - grew_at >= DUMP_QUIET_S:
                out[r] = text
                del logs[r]
        time.sleep(_POLL_S)
    return out


def relayed_stacks(
    hub, ranks: Sequence[int], send_signal: Signal, timeout: float
) -> dict[int, str]:
    """Signal processes on other hosts and wait for their dumps to arrive as telemetry.

    Parameters
    ----------
    hub : jaxsys_kernel.telemetry.hub.TelemetryHub or None
        Where the dumps arrive; without it nothing can be collected.
    ranks : sequence of int
        Processes to ask.
    send_signal : callable
        ``send_signal(ranks, signum)``: delivers SIGUSR1 (through the nannies).
    timeout : float
        Seconds to wait, at least :data:`MIN_RELAY_TIMEOUT`.

    Returns
    -------
    dict
        The dump text by rank; ranks whose dump did not arrive in time are missing.
    """
    if hub is None:
        return {}
    ranks = list(ranks)
    before = {r: hub.stack_dump(r)[0] for r in ranks}
    send_signal(ranks, signal.SIGUSR1)
    deadline = time.monotonic() + max(timeout, MIN_RELAY_TIMEOUT)
    out: dict[int, str] = {}
    while len(out) < len(ranks) and time.monotonic() < deadline:
        for r in ranks:
            seq, text = hub.stack_dump(r)
            if r not in out and seq > before[r]:
                out[r] = text
        time.sleep(_POLL_S)
    return out
