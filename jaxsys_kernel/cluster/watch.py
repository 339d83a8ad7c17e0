"""Read-only watchers of a named cluster that another process owns.

``jaxsys cluster start --name NAME`` publishes the cluster it owns in a state file (its
server's pid, each process's pid, host and devices, the connection file) and its options
beside it. A watcher reads those two files and ``/proc``, and nothing else: it sends no
message to the cluster, connects to none of its sockets, takes no lease and starts no
process, so any number of watchers leave the owner's cells as fast as they were. What
only the processes' telemetry carries (live cache hits and misses) and the step records
only the owner may ask for (step times, stragglers) reach a watcher through the small
snapshot the owner writes every few seconds (:mod:`.watch_snapshot`), read as untrusted
input like the state file.

This module imports only the standard library and jaxsys's own small helpers.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..telemetry.memory import local_rss
from .allocation import check_name, state_dir
from .teardown import pid_alive
from .watch_snapshot import Live, describe, snapshot_path
from .watch_snapshot import read as read_snapshot

#: At most this many files of a cache directory are looked at (a huge cache must not
#: make a watcher's status slow); the count then says "at least".
MAX_CACHE_FILES = 20_000
#: A state file larger than this is not one ``jaxsys cluster start`` wrote: refused.
MAX_STATE_BYTES = 1 << 20


@dataclass(frozen=True)
class CacheSummary:
    """What a cluster's compilation cache directory holds, as a watcher sees it."""

    path: str
    entries: int
    size: int
    complete: bool


class Watched:
    """A named cluster, seen read-only through the files its owner publishes.

    Parameters
    ----------
    name : str
        The cluster's name, as ``jaxsys cluster start --name NAME`` gave it.
    directory : path-like, optional
        Where the owner publishes (default: :func:`~.allocation.state_dir`).

    Raises
    ------
    ConfigError
        For a name that cannot name a cluster, or no running cluster of that name.
    """

    def __init__(self, name: str, directory: str | os.PathLike | None = None):
        try:
            check_name(name)
        except ConfigError as e:
            raise ConfigError(f"%jaxsys watch: {e}") from None
        self.name = name
        self.directory = Path(directory) if directory is not None else state_dir()
        self.state = self.read()
        if self.state.get("state") != "ready" or not self.owner_alive():
            raise ConfigError(self._not_running())

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.json"

    def read(self) -> dict:
        """The owner's published state, or {} while there is none (or half of one)."""
        try:
            with open(self.path, "rb") as f:
                state = json.loads(f.read(MAX_STATE_BYTES + 1)[: MAX_STATE_BYTES + 1])
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _not_running(self) -> str:
        running = sorted(p.stem for p in self.directory.glob("*.json") if "." not in p.stem)
        known = f" (running here: {', '.join(running)})" if running else ""
        return (
            f"no cluster named {self.name!r} is running{known}: start one with "
            f"`jaxsys cluster start --name {self.name}`, or watch another by its name"
        )

    @property
    def owner_pid(self) -> int | None:
        pid = self.state.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None

    def owner_alive(self) -> bool:
        """Whether the owning server still runs."""
        return pid_alive(self.owner_pid)

    def owner(self) -> str:
        """The owner in words, for refusals: ``jaxsys cluster start --name big (pid 12)``."""
        return f"`jaxsys cluster start --name {self.name}` (pid {self.owner_pid})"

    def rows(self) -> list[dict]:
        """The processes as the owner published them, each state and memory read again
        from ``/proc`` (a process gone since reads ``dead``; the owner gone, every one)."""
        self.state = self.read() or self.state
        owner = self.owner_alive()
        rows = []
        for p in self.state.get("processes") or []:
            if not isinstance(p, dict):
                continue
            pid = p.get("pid") if isinstance(p.get("pid"), int) else None
            host = str(p.get("host") or "")
            alive = owner and pid_alive(pid) if host == socket.gethostname() else owner
            rows.append(
                {
                    "rank": int(p.get("rank", len(rows))),
                    "engine_id": p.get("engine_id"),
                    "pid": pid,
                    "host": host,
                    "devices": list(p.get("devices") or []),
                    "state": str(p.get("state", "?")) if alive else "dead",
                    "rss": local_rss(host, pid) if alive else None,
                }
            )
        return rows

    def headline(self) -> str:
        """One line: what is watched, its owner, and whether the owner still runs."""
        rows = self.rows()
        live = sum(r["state"] != "dead" for r in rows)
        owner = "running" if self.owner_alive() else "gone: the cluster has stopped"
        return (
            f"watching cluster {self.name!r} (read-only): {live} of {len(rows)} processes "
            f"live; owner {self.owner()} {owner}"
        )

    def live(self) -> Live | None:
        """The owner's live numbers (cache hits, steps), checked; None when it writes none."""
        return read_snapshot(snapshot_path(self.directory, self.name))

    def live_lines(self) -> list[str]:
        """The owner's live numbers in words: cache hits and misses per process, the last
        steps and the straggler named, and whether the numbers are stale."""
        return describe(self.live(), self.owner_alive())

    def cache(self) -> CacheSummary | None:
        """The compilation cache directory the owner's options name, and what it holds
        (read from the disk; None when the cluster runs without one)."""
        options = self.directory / f"{self.name}.options.json"
        try:
            path = json.loads(options.read_text()).get("cache_dir")
        except (OSError, ValueError, AttributeError):
            return None
        if not isinstance(path, str) or not path:
            return None
        entries = size = 0
        complete = True
        for root, _dirs, files in os.walk(path):
            for f in files:
                if entries >= MAX_CACHE_FILES:
                    complete = False
                    break
                try:
                    size += os.stat(os.path.join(root, f)).st_size
                except OSError:
                    continue
                entries += 1
            if not complete:
                break
        return CacheSummary(path, entries, size, complete)

    def refusal(self, what: str) -> str:
        """Why a watcher may not do ``what``, naming the owner and the way out."""
        return (
            f"{what} is refused: this kernel only watches cluster {self.name!r}, owned by "
            f"{self.owner()}; a watcher cannot run cells on its processes, stop or restart "
            "it. %jaxsys unwatch stops watching (then %jaxsys start starts a cluster of "
            f"this kernel's own); `jaxsys cluster stop --name {self.name}` stops the "
            "cluster where it runs"
        )
