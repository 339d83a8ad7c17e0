"""A pid that no process holds, for tests of what a gone process looks like."""

from __future__ import annotations

import psutil
import pytest


def free_pid() -> int:
    """The highest pid below the system's limit that no process holds now (the test is
    skipped when none of the top 10,000 is free)."""
    with open("/proc/sys/kernel/pid_max") as f:
        top = int(f.read())
    for pid in range(top - 1, max(1, top - 10_000), -1):
        if not psutil.pid_exists(pid):
            return pid
    pytest.skip("no free pid near pid_max")
