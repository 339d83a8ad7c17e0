"""The processes run the packages the kernel's environment has, or the user is told.

Every process should import the same ``jax``, ``jaxlib`` and ``numpy`` as the kernel's
environment holds: the processes run the kernel's interpreter on this host, and on other
hosts whatever environment each host gives them. A process with another
version may fail to join, or compute differently. Right after a start, the versions each
process's environment holds are compared with the kernel's and every difference is named.
Versions are read from package metadata (``importlib.metadata``), so the kernel never
imports JAX.
"""

from __future__ import annotations

import importlib.metadata
import sys

from .._ranges import format_procs

PACKAGES = ("jax", "jaxlib", "numpy")
# Seconds the processes have to answer; they only read package metadata.
ASK_TIMEOUT = 10.0


def installed(name: str) -> str | None:
    """The version of ``name`` this interpreter's environment holds, None without it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def process_versions(cluster) -> dict[int, dict[str, str | None]]:
    """Each answering process's version of every package in :data:`PACKAGES`."""
    found: dict[int, dict[str, str | None]] = {}
    for name in PACKAGES:
        # importlib.metadata.version travels by reference: nothing of jaxsys is sent.
        calls = cluster.call(None, importlib.metadata.version, name, timeout=ASK_TIMEOUT)
        for rank, version in calls.results.items():
            found.setdefault(rank, {})[name] = str(version)[:64]
        for rank, error in calls.errors.items():
            missing = "PackageNotFoundError" in type(error).__name__ + repr(error)
            found.setdefault(rank, {})[name] = None if missing else "unknown"
    return found


def differences(kernel: dict[str, str | None], processes: dict[int, dict]) -> list[str]:
    """One line per package and version that differs from the kernel's, naming the processes.

    Examples
    --------
    >>> differences({"jax": "0.9"}, {0: {"jax": "0.9"}, 1: {"jax": "0.8"}, 2: {"jax": "0.8"}})
    ["p1-2 have jax 0.8, the kernel's environment has 0.9"]
    """
    lines = []
    for name, mine in kernel.items():
        by_version: dict[str | None, list[int]] = {}
        for rank, versions in sorted(processes.items()):
            theirs = versions.get(name, mine)
            if theirs != mine:
                by_version.setdefault(theirs, []).append(rank)
        for theirs, ranks in by_version.items():
            has = "have" if len(ranks) > 1 else "has"
            what = f"{name} {theirs}" if theirs else f"no {name}"
            lines.append(
                f"{format_procs(ranks)} {has} {what}, the kernel's environment has "
                f"{mine or f'no {name}'}"
            )
    return lines


def warn_differences(cluster) -> list[str]:
    """Print (on stderr) each process whose ``jax``, ``jaxlib`` or ``numpy`` differs from
    the kernel's environment, with what to do; returns the lines printed."""
    kernel = {name: installed(name) for name in PACKAGES}
    try:
        lines = differences(kernel, process_versions(cluster))
    except Exception as e:  # noqa: BLE001 - a check that cannot run must not fail the start
        print(f"jaxsys: could not compare the processes' package versions: {e!r}", file=sys.stderr)
        return []
    for line in lines:
        print(
            f"jaxsys: warning: {line}; give every host the kernel's environment "
            "(see README, Packages for the processes)",
            file=sys.stderr,
        )
    return lines


__all__ = ["PACKAGES", "differences", "installed", "process_versions", "warn_differences"]
