"""Child processes that only sleep, for tests of signals and of telling whether a process
has ended; each is killed and reaped when its block ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def sleeping_children(n: int = 1, seconds: int = 60) -> Iterator[list[subprocess.Popen]]:
    """``n`` children that sleep ``seconds``; killed and reaped on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
            )
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()
