"""What this process's data loading read: bytes, slices, seconds; gathered from all processes.

Every :func:`~jaxsys_kernel.data.global_batch` call adds to one counter per process.
``stats(gather=True)`` is a collective (every process must call it) that returns the counters
of all processes, which is how a notebook shows that data-parallel loading reads exactly
``1/N`` of the bytes on each of ``N`` processes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import jax
import numpy as np
from jax.experimental import multihost_utils

from .draw import format_bytes

# Values cross processes as int32 digits of this base: JAX arrays are 32-bit by default,
# and a byte count over 2**31 must not wrap or lose precision on the way.
_BASE = 1 << 30
_DIGITS = 3


@dataclass(frozen=True)
class LoadStats:
    """One process's loading counters.

    Attributes
    ----------
    process : int
        The process index.
    bytes_read : int
        Bytes of source data read.
    slices_read : int
        Rectangular slices read (records, for a Grain source).
    seconds : float
        Time spent in ``global_batch`` (reading and assembling, without waiting for devices).
    batches : int
        ``global_batch`` calls.
    """

    process: int
    bytes_read: int = 0
    slices_read: int = 0
    seconds: float = 0.0
    batches: int = 0

    def __str__(self) -> str:
        return (
            f"p{self.process}: read {format_bytes(self.bytes_read)} ({self.bytes_read} bytes) "
            f"in {self.slices_read} slice{'' if self.slices_read == 1 else 's'}, "
            f"{self.batches} batch{'' if self.batches == 1 else 'es'}, "
            f"{self.seconds * 1e3:.1f} ms"
        )


class StatsTable(tuple):
    """Counters of every process (a tuple of :class:`LoadStats`), printed with shares."""

    @property
    def total_bytes(self) -> int:
        """Bytes read by all processes."""
        return sum(s.bytes_read for s in self)

    def shares(self) -> list[float]:
        """Each process's fraction of the bytes read."""
        total = self.total_bytes
        return [s.bytes_read / total if total else 0.0 for s in self]

    def __str__(self) -> str:
        lines = [f"{s}, share {share:.4f}" for s, share in zip(self, self.shares(), strict=True)]
        lines.append(f"total: {format_bytes(self.total_bytes)} ({self.total_bytes} bytes)")
        return "\n".join(lines)


class Counter:
    """Thread-safe loading counters of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = [0, 0, 0.0, 0]

    def add(self, nbytes: int, slices: int, seconds: float) -> None:
        """Count one ``global_batch`` call."""
        with self._lock:
            self._values[0] += int(nbytes)
            self._values[1] += int(slices)
            self._values[2] += float(seconds)
            self._values[3] += 1

    def snapshot(self, process: int, reset: bool = False) -> LoadStats:
        """The counters now (zeroed afterwards with ``reset``)."""
        with self._lock:
            b, s, t, n = self._values
            if reset:
                self._values = [0, 0, 0.0, 0]
        return LoadStats(process, b, s, t, n)


COUNTER = Counter()


def _encode(s: LoadStats) -> np.ndarray:
    values = [s.bytes_read, s.slices_read, round(s.seconds * 1e6), s.batches]
    digits = []
    for v in values:
        digits += [(v // _BASE**k) % _BASE for k in range(_DIGITS)]
    return np.array(digits, dtype=np.int32)


def _decode(process: int, row: np.ndarray) -> LoadStats:
    values = [sum(int(row[i * _DIGITS + k]) * _BASE**k for k in range(_DIGITS)) for i in range(4)]
    return LoadStats(process, values[0], values[1], values[2] / 1e6, values[3])


def stats(*, reset: bool = False, gather: bool = False) -> LoadStats | StatsTable:
    """This process's data-loading counters, or every process's.

    Parameters
    ----------
    reset : bool, optional
        Zero the counters after reading them.
    gather : bool, optional
        Return all processes' counters (a collective: call it on every process).

    Returns
    -------
    LoadStats or StatsTable

    Examples
    --------
    ::

        %%multihost
        from jaxsys_kernel import data
        data.stats(reset=True)
        batch = data.global_batch("train.npy", sharding, (256, 784))
        print(data.stats(gather=True))
    """
    mine = COUNTER.snapshot(jax.process_index(), reset=reset)
    if not gather:
        return mine
    if jax.process_count() == 1:
        return StatsTable([mine])
    rows = np.asarray(multihost_utils.process_allgather(_encode(mine)))
    rows = rows.reshape(jax.process_count(), -1)
    return StatsTable(_decode(p, rows[p]) for p in range(rows.shape[0]))


def reset_stats() -> None:
    """Zero this process's counters."""
    COUNTER.snapshot(0, reset=True)
