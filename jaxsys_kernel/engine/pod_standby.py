"""A pod's standby engine: booted beside the world's engine, taken over at a world restart.

The kernel keeps one standby engine per pod (by default; ``--standby 0`` keeps none) by
writing an entry for it into the world's Secret (:func:`entry_name`): its environment (its
rank's, with no coordinator) and its arguments (the engine id it asks for), beside the
engine file and config every standby engine starts with (:data:`ENGINE_COPY`,
:data:`CONFIG_COPY`). The pod's runner (:mod:`.pod`) starts it as it starts the world's engines,
forked from the pod's fork server, so it registers with the controller, imports JAX and
waits. A world restart then ends the world's engines and hands the standby engines the new
world (``bootstrap.take_over``): nothing boots while the user waits.

A standby engine taken over serves the world from then on, though it is no generation's
engine. So the runner ends a standby engine only when the Secret no longer names it *and*
the generation has changed since it last did: a refill names the next standby under the
same generation (the taken one runs on), the next restart or keep writes a new one (it
ends).

It imports only the standard library: it runs before any engine.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: How a standby engine's entry is named in the Secret: ``standby-<rank>.json``.
STANDBY_PREFIX = "standby-"


#: The controller's engine file and the engines' config that standby engines start with,
#: once for every pod (a generation without an engine has neither).
ENGINE_COPY = f"{STANDBY_PREFIX}engine.json"
CONFIG_COPY = f"{STANDBY_PREFIX}config.py"


def entry_name(rank: int) -> str:
    """The Secret's key for the standby engine of the pod of process ``rank``."""
    return f"{STANDBY_PREFIX}{rank}.json"


def read_entry(folder: Path, rank: int) -> dict | None:
    """The standby entry for ``rank`` in the Secret's current set ``folder``, or None when
    there is none (or it cannot be read as one)."""
    try:
        entry = json.loads((folder / entry_name(rank)).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(entry, dict) and isinstance(entry.get("token"), str)
    return entry if ok else None


def with_copies(folder: Path, entry: dict) -> dict | None:
    """``entry`` with the engine file and config it starts with (``engine_file``,
    ``config``), read from ``folder``; None while they are not there. Read only to start an
    engine, not at every look."""
    try:
        files = {"engine_file": (folder / ENGINE_COPY).read_text()}
        files["config"] = (folder / CONFIG_COPY).read_text()
    except OSError:
        return None
    return {**entry, **files}


@dataclass
class _Running:
    proc: subprocess.Popen
    stop: Callable[[], None]
    # The generation under which the Secret last named this engine.
    named_under: str | None


class StandbySlot:
    """The standby engines of one pod, started and ended as the Secret says.

    Parameters
    ----------
    rank : int
        The process this pod runs.
    start : callable
        ``start(entry) -> (proc, stop)``: starts the engine of an entry; ``stop()`` kills
        it with its process group and removes what it was started with.
    say : callable
        Writes a line to the pod's log.
    """

    def __init__(self, rank: int, start, say: Callable[[str], None]):
        self.rank = rank
        self._start = start
        self._say = say
        self._running: dict[str, _Running] = {}
        # Tokens started once: an engine that ended (its kernel died) is not started again.
        self._started: set[str] = set()

    def poll(self, folder: Path, generation: str | None) -> None:
        """Look at the Secret's current set ``folder`` (whose generation is
        ``generation``): end what it no longer wants, start what it names anew."""
        entry = read_entry(folder, self.rank)
        token = entry["token"] if entry else None
        for t, run in list(self._running.items()):
            if run.proc.poll() is not None:
                self._say(f"standby engine {t} ended with exit code {run.proc.returncode}")
                self._end(t)
            elif t == token:
                run.named_under = generation
            elif generation != run.named_under:
                self._say(f"standby engine {t} ends: its world or its kernel is gone")
                self._end(t)
        if token is not None and token not in self._started:
            entry = with_copies(folder, entry)
            if entry is None:
                return  # the next look finds them
            self._started.add(token)
            try:
                proc, stop = self._start(entry)
            except (OSError, ValueError, KeyError, TypeError) as e:
                self._say(f"cannot start standby engine {token}: {e!r}")
                return
            self._running[token] = _Running(proc, stop, generation)
            self._say(f"standby engine {token} starts")

    def busy(self) -> bool:
        """Whether a standby engine runs (a taken one serves a world: the pod is in use)."""
        return any(run.proc.poll() is None for run in self._running.values())

    def _end(self, token: str) -> None:
        self._running.pop(token).stop()

    def close(self) -> None:
        """End every standby engine."""
        for token in list(self._running):
            self._end(token)


__all__ = [
    "CONFIG_COPY",
    "ENGINE_COPY",
    "STANDBY_PREFIX",
    "StandbySlot",
    "entry_name",
    "read_entry",
    "with_copies",
]
