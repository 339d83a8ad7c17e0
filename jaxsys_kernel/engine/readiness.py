"""Whether this process has done its start-up imports, for the kernel's readiness gate.

An engine imports JAX in a thread while it registers (``bootstrap.start_early_init``); it
joins JAX's distributed runtime only once the kernel says every process is ready, so that
JAX's initialisation timeout never has to cover another process's slow imports. The kernel
asks :func:`state` of each process meanwhile and names those not ready.
"""

from __future__ import annotations

import os

from .state import STATE

# Seconds an imported process waits for the kernel's word to join (every process ready).
GO_WAIT_S = 3600.0
# A delay before importing JAX, for some ranks (``"1:8,3:2"``: rank 1 8 s, rank 3 2 s): how
# the tests play a process whose imports are slow (a loaded file system).
IMPORT_DELAY = "JAXSYS_IMPORT_DELAY"
# The same, before joining JAX once every process is ready: how the tests hold a process
# out of the join for as long as they need, so that one killed there is killed there.
JOIN_DELAY = "JAXSYS_JOIN_DELAY"


def import_delay(rank: int) -> float:
    """Seconds :data:`IMPORT_DELAY` asks ``rank`` to wait before importing JAX (0 if none)."""
    return _delay(IMPORT_DELAY, rank)


def join_delay(rank: int) -> float:
    """Seconds :data:`JOIN_DELAY` asks ``rank`` to wait before joining JAX (0 if none)."""
    return _delay(JOIN_DELAY, rank)


def _delay(variable: str, rank: int) -> float:
    for item in os.environ.get(variable, "").split(","):
        who, _, seconds = item.partition(":")
        if who.strip() == str(rank):
            try:
                return min(max(float(seconds), 0.0), GO_WAIT_S)
            except ValueError:
                return 0.0
    return 0.0


def state() -> dict:
    """Whether this process is ready, and what it is doing: ``starting``, ``importing
    JAX``, ``ready`` (waiting for the word to join), ``joining`` or ``done``."""
    early = STATE.boot.early
    if early is None:
        return {"ready": True, "doing": "ready"}
    doing = "done" if early.done.is_set() else early.doing
    return {"ready": doing in ("ready", "joining", "done"), "doing": doing}


__all__ = ["GO_WAIT_S", "IMPORT_DELAY", "JOIN_DELAY", "import_delay", "join_delay", "state"]
