"""Bounds on the profile traces the engines send the kernel.

A trace comes from an engine, so it is untrusted input: a process could send a huge file,
a gzip bomb (gigabytes of zeros in a few megabytes), text that is not JSON, or millions of
tiny events. The kernel merges every process's trace in its own memory, and a kernel that
runs out of memory takes the cluster with it, so each trace is read under
:class:`Limits`:

- its gzipped size, checked against what the process announces and while it arrives;
- its decompressed size: the gzip stream is inflated in pieces and reading stops at the
  limit, so a bomb costs the limit, never its full size;
- the number of JSON objects and of all JSON values in it, counted on the raw text before
  parsing (a pass over the bytes; characters inside strings only make the counts larger),
  since parsing turns each value into a Python object of some tens of bytes (an object,
  some hundreds) whatever its text size;
- the number of events, per trace and in the merged file together;
- the number of traces merged at once.

A trace over a limit raises :class:`TraceRefused`, whose message names the process, the
limit and what to do; the caller leaves that process out and merges the others.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from ..errors import ProtocolError

MiB = 1 << 20
# Inflated per step: small enough that one step never overshoots a limit by much.
_STEP = 4 * MiB


@dataclass(frozen=True)
class Limits:
    """What the kernel accepts from each process's trace, and from all of them together.

    The defaults fit a profiled cell of some thousands of steps: a real Perfetto trace
    from ``jax.profiler`` is about 180 bytes of JSON per event and gzips about eight to
    ten times, and its parsed events take about four times their text in the kernel's
    memory, so one trace at the limits costs about a gigabyte while it is parsed, and the
    merged file at most a few.
    """

    #: Gzipped bytes per trace.
    compressed: int = 64 * MiB
    #: Decompressed bytes per trace.
    decompressed: int = 256 * MiB
    #: JSON objects per trace, counted before parsing: a real event is one, with its
    #: ``args`` two, so twice the events limit; a parsed object takes some 200 bytes.
    objects: int = 4_000_000
    #: JSON values (objects, arrays, numbers, strings) per trace, counted before parsing:
    #: a real event holds about twelve.
    values: int = 20_000_000
    #: Events in the merged trace, all processes together.
    events: int = 2_000_000
    #: Traces merged at once.
    files: int = 256


LIMITS = Limits()


class TraceRefused(ProtocolError):
    """A process's trace is over a limit or malformed; the message names which and why."""


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


def inflate(data: bytes, rank: int, limits: Limits = LIMITS) -> bytes:
    """The decompressed text of a (possibly gzipped) trace, refused past the limit.

    Raises
    ------
    TraceRefused
        The trace is larger than ``limits.decompressed`` once inflated, or its gzip stream
        is broken.
    """
    if len(data) > limits.compressed:
        raise compressed_refusal(rank, len(data), limits)
    if data[:2] != b"\x1f\x8b":
        if len(data) > limits.decompressed:
            raise _too_big(rank, limits)
        return data
    try:
        return _gunzip(data, rank, limits)
    except zlib.error as e:
        raise TraceRefused(f"process {rank}'s trace is not a readable gzip file ({e})") from e


def _gunzip(data: bytes, rank: int, limits: Limits) -> bytes:
    out = bytearray()
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pos, tail = 0, b""
    while True:
        if z.eof:
            # A file may hold several gzip members one after the other (as gzip reads).
            rest = z.unused_data + data[pos:]
            if not rest:
                return bytes(out)
            z, data, pos, tail = zlib.decompressobj(16 + zlib.MAX_WBITS), rest, 0, b""
        if not tail and pos < len(data):
            tail, pos = data[pos : pos + _STEP], pos + _STEP
        room = limits.decompressed - len(out)
        piece = z.decompress(tail, min(_STEP, room + 1))
        out += piece
        if len(out) > limits.decompressed:
            raise _too_big(rank, limits)
        tail = z.unconsumed_tail
        if not piece and not tail and pos >= len(data) and not z.eof:
            raise TraceRefused(f"process {rank}'s trace is a truncated gzip stream")


def _too_big(rank: int, limits: Limits) -> TraceRefused:
    return TraceRefused(
        f"process {rank}'s trace is larger than {_size(limits.decompressed)} decompressed "
        "(the limit for one process's trace): profile fewer steps"
    )


def compressed_refusal(rank: int, size: int, limits: Limits = LIMITS) -> TraceRefused:
    """The refusal of a trace of ``size`` gzipped bytes, over ``limits.compressed``."""
    return TraceRefused(
        f"process {rank}'s trace is {_size(size)} gzipped, more than the limit of "
        f"{_size(limits.compressed)} for one process's trace: profile fewer steps"
    )


def events(data: bytes, rank: int, room: int, limits: Limits = LIMITS) -> list[dict]:
    """The trace's events, parsed once the text passed the bounds.

    ``room`` is how many events the merged file may still take.

    Raises
    ------
    TraceRefused
        Over a limit, not JSON, or not a Perfetto trace (an object with a
        ``traceEvents`` list, or a list of events).
    """
    raw = inflate(data, rank, limits)
    # Every JSON value but the first of its container follows a comma; containers open
    # with a bracket. Counted on the bytes, a bound on the objects parsing would make.
    objects = raw.count(b"{")
    if objects > limits.objects:
        raise TraceRefused(
            f"process {rank}'s trace holds about {objects:,} JSON objects, more than the limit "
            f"of {limits.objects:,} for one process's trace: profile fewer steps"
        )
    values = raw.count(b",") + objects + raw.count(b"[") + 1
    if values > limits.values:
        raise TraceRefused(
            f"process {rank}'s trace holds about {values:,} JSON values, more than the limit "
            f"of {limits.values:,} for one process's trace: profile fewer steps"
        )
    try:
        loaded = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise TraceRefused(f"process {rank}'s trace is not JSON ({str(e)[:200]})") from e
    del raw
    found = loaded.get("traceEvents") if isinstance(loaded, dict) else loaded
    if not isinstance(found, list):
        raise TraceRefused(f"process {rank}'s trace has no list of events ('traceEvents')")
    if len(found) > room:
        raise TraceRefused(
            f"process {rank}'s trace has {len(found):,} events, more than the "
            f"{room:,} left of the limit of {limits.events:,} events in one merged trace: "
            "profile fewer steps or fewer processes (--procs)"
        )
    return [e for e in found if isinstance(e, dict)]


def check_files(count: int, limits: Limits = LIMITS) -> None:
    """Refuse to merge more than ``limits.files`` traces at once."""
    if count > limits.files:
        raise TraceRefused(
            f"{count} traces are more than the limit of {limits.files} merged at once: "
            "profile a subset of the processes with --procs"
        )


__all__ = [
    "LIMITS",
    "Limits",
    "TraceRefused",
    "check_files",
    "compressed_refusal",
    "events",
    "inflate",
]
