"""Process bookkeeping shared by the benchmarks: every script reaps what it started."""

from __future__ import annotations

import signal

import psutil


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """Seconds of CPU (user and system, every thread) the processes have used; one that is
    gone counts nothing."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def running(p: psutil.Process) -> bool:
    """Whether ``p`` still runs (a zombie does not)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait for ``procs`` to exit; SIGKILL and return whichever outlived ``timeout``."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if running(p)]
    for p in alive:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    if alive:
        psutil.wait_procs(alive, timeout=5)
    return alive
