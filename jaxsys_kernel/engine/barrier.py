"""A barrier on the coordination service that can say who has not arrived.

Runs in each JAX process. JAX's ``wait_at_barrier`` blocks until every process arrives or
its timeout passes, and cannot say who is missing while it waits. So each process first
writes a key of its own under the barrier's directory of the coordination service's
key-value store (``jaxsys/barrier/<id>/<rank>``), and waits, watching that directory, until
every process has written its key; it prints who is still missing whenever that changes.
Only then does it enter JAX's barrier, which every process has reached by then. When the
timeout passes first, it raises :class:`BarrierTimeout` naming the processes that never
arrived, and JAX's barrier is never entered (a barrier that timed out inside the
coordination service cannot be used again).
"""

from __future__ import annotations

import time

import jax
from jax._src import distributed

from ..errors import EngineError

KEY_PREFIX = "jaxsys/barrier"
# The longest a wait for one missing process's key lasts before the directory is read again
# (so arrivals of others are noticed too); not a sleep: the wait ends when the key appears.
WATCH_MS = 200


class BarrierTimeout(EngineError, TimeoutError):
    """Some processes did not reach the barrier in time; ``missing`` names them."""

    def __init__(self, message: str, arrived: list[int], missing: list[int]):
        super().__init__(message)
        self.arrived = arrived
        self.missing = missing


def _procs(ranks: list[int]) -> str:
    return ", ".join(f"p{r}" for r in ranks) or "none"


def arrived(client, barrier_id: str, nprocs: int) -> list[int]:
    """The processes whose arrival key is in the store, in order."""
    prefix = f"{KEY_PREFIX}/{barrier_id}/"
    found = set()
    for key, _value in client.key_value_dir_get(prefix):
        tail = key.rsplit("/", 1)[-1]
        if tail.isdigit() and int(tail) < nprocs:
            found.add(int(tail))
    return sorted(found)


def wait(barrier_id: str, name: str, timeout: float, deadline: float | None = None) -> dict:
    """Arrive at barrier ``barrier_id`` and wait for every process, at most ``timeout`` s.

    Parameters
    ----------
    barrier_id : str
        Unique per use of the barrier (the same on every process).
    name : str
        The name people gave the barrier, for messages.
    timeout : float
        Seconds to wait for the others.
    deadline : float, optional
        Wall-clock time (``time.time()``) after which arriving is pointless: a process that
        only starts waiting then (it was busy) says so and returns at once.

    Returns
    -------
    dict
        ``{"rank", "waited", "late"}``: seconds this process waited, and whether it came
        after ``deadline``.

    Raises
    ------
    BarrierTimeout
        Naming the processes that had not arrived when ``timeout`` passed.
    """
    client = coordination_client()
    rank, nprocs = jax.process_index(), jax.process_count()
    if deadline is not None and time.time() > deadline:
        return {"rank": rank, "waited": 0.0, "late": True}
    start = time.monotonic()
    client.key_value_set(f"{KEY_PREFIX}/{barrier_id}/{rank}", str(time.time()))
    _wait_for_all(client, barrier_id, name, rank, nprocs, timeout, start)
    left = max(1.0, timeout - (time.monotonic() - start))
    client.wait_at_barrier(f"jaxsys-{barrier_id}", int(left * 1000))
    return {"rank": rank, "waited": time.monotonic() - start, "late": False}


def coordination_client():
    """This process's client of JAX's coordination service.

    JAX 0.12 exposes it only as ``jax._src.distributed.global_state.client``: private, so
    reached in this one place.
    """
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised in this process")
    return client


def _wait_for_all(client, barrier_id, name, rank, nprocs, timeout, start) -> None:
    """Watch the barrier's keys until every process has arrived, saying who is missing
    whenever that changes; raise BarrierTimeout once ``timeout`` has passed."""
    last_missing: list[int] | None = None
    while True:
        here = arrived(client, barrier_id, nprocs)
        missing = [r for r in range(nprocs) if r not in here]
        if not missing:
            return
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            raise BarrierTimeout(
                f"barrier {name!r} timed out after {timeout:g} s on p{rank}: "
                f"{_procs(missing)} never arrived (arrived: {_procs(here)})",
                here,
                missing,
            )
        if missing != last_missing:
            print(
                f"waiting at barrier {name!r}: arrived {_procs(here)}; missing {_procs(missing)}",
                flush=True,
            )
            last_missing = missing
        try:
            client.blocking_key_value_get(
                f"{KEY_PREFIX}/{barrier_id}/{missing[0]}",
                int(min(left, WATCH_MS / 1000) * 1000) + 1,
            )
        except Exception:  # noqa: BLE001 - not there yet: read the directory again
            pass
