"""Memory of the processes that run on this machine, for ``%jaxsys status``.

Only local processes are measured: a pid on another host means nothing here.
"""

from __future__ import annotations

import socket

import psutil


def local_rss(host: str, pid: int | None) -> int | None:
    """Resident memory in bytes of ``pid`` when it runs on this machine, else None.

    Parameters
    ----------
    host : str
        The host the process reported (``socket.gethostname()`` on its side).
    pid : int or None
        Its pid there.
    """
    if pid is None or host != socket.gethostname():
        return None
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def format_bytes(n: int | None) -> str:
    """``n`` bytes as ``251 MB`` or ``1.2 GB`` ("-" for None)."""
    if n is None:
        return "-"
    if n >= 10**9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB"


def memory_line(values: list[int | None]) -> str:
    """One line summing the measured processes' memory ("" when none was measured)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    return (
        f"memory: {format_bytes(sum(known) // len(known))} per process on average, "
        f"{format_bytes(sum(known))} for the {len(known)} processes on this machine"
    )
