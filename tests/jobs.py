"""What the batch-job tests share: a job's printed results and its bounded end."""

from __future__ import annotations

import json
import re
import subprocess

# A line the example programs print per process: ``RESULT <rank> <json>``.
_RESULT = re.compile(r"RESULT (\d+) (\{.*\})")


def printed_results(log: str) -> dict[int, dict]:
    """Each process's ``RESULT`` line in a job's log, by rank."""
    return {int(m[1]): json.loads(m[2]) for m in _RESULT.finditer(log)}


def finish(job: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Wait up to ``timeout`` s for a ``jaxsys job`` command; kill it if it outstays.

    Returns its exit code and everything it printed.
    """
    try:
        out, err = job.communicate(timeout=timeout)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, out + err
