"""Bringing each process's trace to the kernel, in pieces, checked against the limits.

What a process says about its trace (its size, its start mark) and the pieces it sends
are untrusted: each is checked (:func:`checked_info`) and the transfer stops at the size
the process announced, which must be within :attr:`Limits.compressed`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..engine.registry import engine_module
from ..errors import CellError
from . import trace_limits
from .trace_limits import LIMITS, Limits, TraceRefused

profiling = engine_module("profiling")
# Largest piece of a trace asked for in one request (the engine sends at most its own).
CHUNK = 8 << 20


@dataclass
class Fetched:
    """One process's trace as fetched: the gzipped Perfetto JSON and its start mark."""

    rank: int
    data: bytes
    mark_wall: float
    seconds: float = 0.0
    pieces: int = 0
    extra: dict = field(default_factory=dict)


def checked_info(rank: int, info, limits: Limits) -> dict:
    """A process's ``trace_info`` answer, refused unless its fields are what they should be."""
    if isinstance(info, TraceRefused):
        raise info  # trace_infos's reason why there is none
    if not isinstance(info, dict):
        raise TraceRefused(f"process {rank} described its trace as {type(info).__name__}")
    size, mark = info.get("size"), info.get("mark_wall")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise TraceRefused(f"process {rank} gave its trace's size as {str(size)[:40]!r}")
    if size > limits.compressed:
        raise trace_limits.compressed_refusal(rank, size, limits)
    if not isinstance(mark, int | float) or not math.isfinite(mark):
        raise TraceRefused(f"process {rank} gave its trace's start as {str(mark)[:40]!r}")
    return info


def fetch_one(cluster, rank: int, info, timeout: float = 120.0, limits: Limits = LIMITS) -> Fetched:
    """Bring one process's last trace to the kernel, in pieces, no larger than announced.

    Raises
    ------
    TraceRefused
        The announced size or the pieces break :class:`Limits` or are not bytes.
    CellError
        The process did not send its trace within ``timeout`` seconds.
    """
    info = checked_info(rank, info, limits)
    t0, chunks, offset = time.perf_counter(), [], 0
    deadline = time.monotonic() + timeout
    while offset < info["size"]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CellError(f"process {rank} did not send its trace within {timeout:.0f} s")
        calls = cluster.call([rank], profiling.read_trace, offset, CHUNK, timeout=left)
        if rank not in calls.results:
            raise CellError(f"process {rank} did not send its trace ({calls.errors.get(rank)})")
        piece = calls.results[rank]
        if not isinstance(piece, bytes):
            raise TraceRefused(f"process {rank} sent a piece of its trace that is not bytes")
        if not piece:
            break
        if offset + len(piece) > info["size"]:
            raise TraceRefused(f"process {rank} sent more of its trace than the size it gave")
        chunks.append(piece)
        offset += len(piece)
    data = b"".join(chunks)
    return Fetched(rank, data, float(info["mark_wall"]), time.perf_counter() - t0, len(chunks))


def fetch(cluster, ranks: Sequence[int], timeout: float = 120.0) -> dict[int, Fetched]:
    """Bring every process's last trace to the kernel, in pieces over ``Cluster.call``.

    Raises
    ------
    CellError
        A process has no trace (the cell was not profiled there) or did not send it.
    """
    answers = trace_infos(cluster, ranks)
    return {r: fetch_one(cluster, r, answers[r], timeout) for r in ranks}


def trace_infos(cluster, ranks: Sequence[int], strict: bool = True) -> dict:
    """Each process's description of its last trace (:func:`checked_info` checks it).

    With ``strict`` a process without one raises :class:`CellError`; otherwise its answer
    is a :class:`TraceRefused` saying why.
    """
    infos = cluster.call(list(ranks), profiling.trace_info, timeout=30.0)
    out = {}
    for r in ranks:
        if infos.results.get(r) is None:
            why = infos.errors.get(r, "no trace: the cell was not profiled there")
            said = f"process {r} sent no trace ({str(why)[:300]})"
            if strict:
                raise CellError(said)
            out[r] = TraceRefused(said)
        else:
            out[r] = infos.results[r]
    return out


__all__ = ["CHUNK", "Fetched", "checked_info", "fetch", "fetch_one", "trace_infos"]
