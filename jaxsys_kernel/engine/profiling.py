"""The ``profile`` cell hook: ``jax.profiler`` around a cell, and its trace sent back in pieces.

Each process writes its own trace into a directory of its own (``jax.profiler`` keeps one
per process; a shared folder would mix hosts' runs). The kernel fetches the Perfetto JSON
through the cluster's own request channel, in pieces of at most :data:`CHUNK` bytes
(:func:`trace_info`, :func:`read_trace`), so no shared filesystem is needed and nothing
goes over the telemetry socket.

The trace's timestamps count from the start of the capture, with no wall-clock origin, so
the hook marks the start with an annotation whose wall time it records
(``time.time()`` taken as the annotation opens): the kernel puts every process on its own
clock with that mark and the offset it measures (:func:`clock`).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time

import jax

from . import hooks
from .state import STATE

# Largest piece of a trace sent in one reply.
CHUNK = 8 << 20
MARK = hooks.PROFILE_MARK


def clock() -> float:
    """This process's wall clock (the kernel compares it with its own)."""
    return time.time()


def _trace_root() -> str | None:
    """The cluster's own directory where this host has it, so that stopping the cluster
    removes a trace the kernel never fetched; else the system's temporary directory."""
    base = os.environ.get("IPP_PROFILE_DIR", "")
    return base if base and os.path.isdir(base) and os.access(base, os.W_OK) else None


def start(options: dict) -> dict:
    """Start ``jax.profiler`` for this process (the hook's ``before``)."""
    if STATE.profile_running is not None:
        raise RuntimeError("a profile is already running on this process; stop it first")
    base = tempfile.mkdtemp(prefix=f"jaxsys-trace-p{jax.process_index()}-", dir=_trace_root())
    jax.profiler.start_trace(base, create_perfetto_trace=True)
    wall = time.time()
    with jax.profiler.TraceAnnotation(MARK):
        pass
    STATE.profile_running = {"dir": base, "mark_wall": wall, "label": options.get("label", "")}
    return STATE.profile_running


def stop(state: dict | None = None, _exc: BaseException | None = None) -> dict | None:
    """Stop the profiler and remember where the trace is (the hook's ``after``)."""
    if STATE.profile_running is None:
        return None
    state, STATE.profile_running = STATE.profile_running, None
    jax.profiler.stop_trace()
    found = glob.glob(os.path.join(state["dir"], "**", "perfetto_trace.json.gz"), recursive=True)
    discard()
    if not found:
        print(f"jaxsys: jax.profiler wrote no Perfetto trace in {state['dir']}", file=sys.stderr)
        shutil.rmtree(state["dir"], ignore_errors=True)
        return None
    STATE.profile_last = {**state, "path": found[0], "size": os.path.getsize(found[0])}
    return STATE.profile_last


def trace_info() -> dict | None:
    """The last trace of this process: path, size, the start mark's wall time, process."""
    if STATE.profile_last is None:
        return None
    return {**STATE.profile_last, "rank": jax.process_index(), "chunk": CHUNK}


def read_trace(offset: int, size: int = CHUNK) -> bytes:
    """``size`` bytes (at most :data:`CHUNK`) of the last trace from ``offset``."""
    if STATE.profile_last is None:
        raise FileNotFoundError("this process has no trace; profile a cell first")
    with open(STATE.profile_last["path"], "rb") as f:
        f.seek(offset)
        return f.read(min(size, CHUNK))


def discard() -> bool:
    """Remove the last trace's directory (the kernel has fetched it); True if there was one."""
    if STATE.profile_last is None:
        return False
    shutil.rmtree(STATE.profile_last["dir"], ignore_errors=True)
    STATE.profile_last = None
    return True


hooks.register(hooks.Hook("profile", start, stop, stop))

__all__ = ["CHUNK", "MARK", "clock", "discard", "read_trace", "start", "stop", "trace_info"]
