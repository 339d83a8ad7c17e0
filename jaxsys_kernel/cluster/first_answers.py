"""The engines' first answers at bring-up, and the error that names the engines that gave none.

An engine that registered but never answers (stuck before its first request, or starved on a
loaded machine) would otherwise end the start with a bare ``TimeoutError``, naming nobody.

Silence has a second cause that the engines cannot help: the kernel's own client, whose I/O
thread sends every request, may itself be stuck, and then no question ever left the kernel.
So before the engines are blamed, the client's I/O loop is asked to run one callback; when it
does not, the error says so, and the kernel's log gets where each of its threads was. A third
cause is the controller's: one of the processes it runs for its queues can end at start (its
port taken), and the controller runs on without it. Its log says so, and so does the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import threading
import time
import traceback
from pathlib import Path

from .profile import kept_logs
from .records import ClusterStartError

# Seconds between looks at the controller's log while answers are awaited.
CHECK_S = 1.0
# Seconds the client's I/O loop has to run a callback once the engines were silent.
LOOP_PROBE_S = 2.0
# Innermost frames of each kernel thread logged when that loop did not run.
THREAD_FRAMES = 12
# The end of the controller's log read for the errors that ended its processes.
CONTROLLER_LOG_TAIL = 64 * 1024
# A process of the controller that ended with an exception, as multiprocessing prints it:
# "Process <name>:", its traceback (indented lines), then the exception's line. A traceback
# the controller only logs (a request it could not handle) does not end a process.
_ENDED = re.compile(
    r"^Process ([^\n]+):\nTraceback \(most recent call last\):\n(?:[ \t][^\n]*\n)*(\S[^\n]*)$",
    re.M,
)
log = logging.getLogger("jaxsys.cluster")


async def answers(world, ar, engine_ids: list[int], timeout: float) -> list:
    """The replies to ``ar``, sent to ``engine_ids`` in that order.

    While they are awaited, the controller's log is looked at every :data:`CHECK_S` seconds:
    a process of the controller that ended at start ends the wait there, not at ``timeout``.

    Raises
    ------
    ClusterStartError
        Naming the engines that had not answered within ``timeout`` seconds, and where their
        logs are kept; or saying that the kernel's own client was stuck, or that the
        controller lost one of its processes, if so.
    """
    replies = asyncio.wrap_future(ar)
    deadline = time.monotonic() + timeout
    lost: list[str] = []
    while not lost:
        left = deadline - time.monotonic()
        try:
            # Shielded: a look that ends without the replies must not cancel them.
            return await asyncio.wait_for(asyncio.shield(replies), max(0.0, min(CHECK_S, left)))
        except TimeoutError:
            if left <= CHECK_S:
                break
            lost = controller_errors(world.profile)
    outstanding = world.client.outstanding
    silent = [e for e, m in zip(engine_ids, ar.msg_ids, strict=False) if m in outstanding]
    # The teardown that follows keeps the logs where the message says.
    world.keep_logs = True
    names = ", ".join(str(e) for e in (silent or engine_ids))
    kept = kept_logs(world.profile)
    if not lost and not await loop_runs(world.client, LOOP_PROBE_S):
        log.warning("the kernel's threads when its client was found stuck:\n%s", threads())
        raise ClusterStartError(
            f"engine(s) {names} registered, but the kernel's own client did not run for "
            f"{LOOP_PROBE_S:g} s after {timeout:g} s without answers: the question may never "
            "have left the kernel (where its threads were is in the kernel's log). Start "
            f"again; the engine logs are kept in {kept}."
        )
    lost = lost or controller_errors(world.profile)
    if lost:
        raise ClusterStartError(
            f"engine(s) {names} registered but cannot be reached: a process of the controller "
            f"ended at start ({'; '.join(lost)}), so requests may not reach the engines. Start "
            f"again; the logs are kept in {kept}."
        )
    raise ClusterStartError(
        f"engine(s) {names} registered but did not answer within {timeout:g} s (busy or "
        f"stuck before their first request); the engine logs are kept in {kept}. On a "
        "loaded machine, start again with fewer processes."
    )


async def loop_runs(client, timeout: float) -> bool:
    """Whether ``client``'s I/O loop (the thread that sends its requests) runs a callback
    within ``timeout`` seconds."""
    here = asyncio.get_running_loop()
    ran = here.create_future()

    def say_ran() -> None:  # on the client's loop: hands the answer back to this one
        with contextlib.suppress(RuntimeError):  # asked too late: that loop has ended
            here.call_soon_threadsafe(lambda: ran.done() or ran.set_result(True))

    try:
        client._io_loop.add_callback(say_ran)
        await asyncio.wait_for(ran, timeout)
    except Exception:  # noqa: BLE001 - no run within the time, or no loop to run on
        return False
    return True


def controller_errors(profile, limit: int = 3) -> list[str]:
    """The errors that ended processes of the controller, from the end of its log in
    ``profile`` (at most ``limit``, each at most 200 characters)."""
    found: list[str] = []
    for path in sorted(Path(profile).glob("log/ipcontroller-*.log")):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - CONTROLLER_LOG_TAIL))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for name, error in _ENDED.findall(text):
            line = f"{name}: {error}"[:200]
            if line not in found:
                found.append(line)
    return found[:limit]


def threads(frames: int = THREAD_FRAMES) -> str:
    """Where each thread of this process is: its name and its innermost ``frames`` frames."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame)[-frames:])
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)
