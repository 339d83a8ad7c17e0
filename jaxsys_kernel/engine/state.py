"""What one JAX process keeps while it runs, in one object.

The engine-side modules are functions over :data:`STATE`: start-up, the telemetry agent,
the native output, the guards, the cell hooks, the divergence recorder, the last export, the
profiler and the held ports each keep their part under a name of their own here, not in
module globals. What a process holds can so be read in one place, and checked to be empty
in a process forked by the fork server (:meth:`EngineState.fresh`): the server imports
every engine module and runs none of them, so its children start from nothing.

Locks stay beside the code they order; they hold no state of the process.
"""

from __future__ import annotations

import socket
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Events kept for an agent that does not exist yet (process 0 can refuse a handshake while
#: JAX is still starting): sent once it starts. Bounded, like the agent's own queue.
PENDING_EVENTS = 1000


@dataclass
class BootState:
    """Start-up: the JAX start-up begun at boot (``bootstrap._EarlyInit``), the stack file
    faulthandler writes to, and the port held for the coordinator until it binds it."""

    early: Any = None
    stack_fh: Any = None
    held_port: socket.socket | None = None


@dataclass
class GuardState:
    """The transfer guard's counts and levels, and the thread guard's hooks and errors."""

    counts: Counter = field(default_factory=Counter)
    levels: dict[str, str] = field(default_factory=dict)
    on_count: Callable[[dict], None] | None = None
    last_publish: float = 0.0
    published: dict[str, int] = field(default_factory=dict)
    thread_hooks: bool = False
    # The clear error that replaces a cell's thread-guard error, and threads' own errors.
    replacement: BaseException | None = None
    thread_errors: list[tuple[str, BaseException]] = field(default_factory=list)


@dataclass
class HookState:
    """The cell hooks switched on for this process, and what they keep between cells."""

    active: list[tuple[Any, Any]] = field(default_factory=list)
    pending: dict[str, dict] = field(default_factory=dict)
    installed: bool = False


@dataclass
class EngineState:
    """Everything one engine keeps between calls (see the module's docstring)."""

    boot: BootState = field(default_factory=BootState)
    #: The telemetry agent (``agent.Agent``), and events published before it existed.
    agent: Any = None
    agent_pending: deque[tuple[str, dict]] = field(
        default_factory=lambda: deque(maxlen=PENDING_EVENTS)
    )
    #: The compilation-cache watch (``cache.CacheWatch``).
    cache_watch: Any = None
    #: The native fd 1 / fd 2 reader (``output.NativeOutput``) and its log's path.
    output: Any = None
    native_log_path: str | None = None
    #: The divergence recorder (``divergence.Recorder``).
    recorder: Any = None
    #: The step recorder of the straggler view (``arrivals.Recorder``), while it is on.
    arrivals: Any = None
    #: The last export shown, and its card.
    last_export: tuple[Any, dict] | None = None
    #: The port held for cross-host transfers until JAX binds it.
    transfer_port: socket.socket | None = None
    #: The profiler's trace under way, and the last one stopped.
    profile_running: dict | None = None
    profile_last: dict | None = None
    guards: GuardState = field(default_factory=GuardState)
    hooks: HookState = field(default_factory=HookState)

    def fresh(self) -> bool:
        """Whether nothing has been kept yet (a process that has not started its engine)."""
        return self == EngineState()


#: This process's state.
STATE = EngineState()
