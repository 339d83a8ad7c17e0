"""A pid that no process holds, for tests of what a gone process looks like."""

from __future__ import annotations

import os

import pytest


def free_pid() -> int:
    """The highest pid below the system's limit that no process or thread holds now (the
    test is skipped when none of the top 10,000 is free)."""
    with open("/proc/sys/kernel/pid_max") as f:
        top = int(f.read())
    for pid in range(top - 1, max(1, top - 10_000), -1):
        # Not psutil.pid_exists: it says no for a thread's id, which a signal still reaches
        # (pid_alive then says yes, and the tests that took it failed now and then).
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue  # another user's process
    pytest.skip("no free pid near pid_max")
