"""A program written for ``python`` runs unchanged on an engine.

Three things an engine would otherwise do differently from ``python script.py``:

- ``sys.argv`` holds ipengine's own flags, which a pasted ``argparse`` parser reads and
  refuses; :func:`install_shell` gives the process the ``sys.argv`` of ``python`` with no
  script (``['']``). ``%run script.py --flag v`` still gives the script its own argv and
  ``__name__ == "__main__"`` (IPython's ``%run`` does that).
- IPython's ``%run`` prints a script's traceback and returns normally, so a failing script
  would leave its cell ``ok`` on every process. :func:`install_shell` makes the engine's
  shell raise instead, so the cell fails with each process's traceback.
- A published program calls ``jax.distributed.initialize()`` and, at its end,
  ``jax.distributed.shutdown()``. jaxsys has already joined the process to its world, and
  shutting that world down from a cell breaks the next collective or kills a process.
  :func:`own_world` (run once jaxsys's own join succeeded) makes an initialize that agrees
  with the running world a no-op, refuses one that does not, and makes shutdown a no-op;
  each says so in one line, the same on every process so that the kernel shows it once.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ..errors import EngineError

# Marks the functions put in place here, so that installing twice wraps nothing twice.
_MARK = "__jaxsys_program__"

SHUTDOWN_NOTE = (
    "jaxsys: jax.distributed.shutdown() ignored: jaxsys owns this JAX world and keeps it "
    "running for the next cell; %jaxsys stop ends it"
)


def _marked(fn: Callable) -> Callable:
    setattr(fn, _MARK, True)
    return fn


def install_shell(shell: Any = None) -> bool:
    """Give this process a clean ``sys.argv`` and make ``%run`` raise what its script raised.

    Parameters
    ----------
    shell : InteractiveShell, optional
        The engine's shell; IPython's current one by default.

    Returns
    -------
    bool
        False outside an IPython shell (``sys.argv`` is left as it is then too).
    """
    if shell is None:
        # Deferred: IPython's shell exists only once the engine has started.
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        return False
    if getattr(shell.safe_execfile, _MARK, False):
        return True
    # What `python` with no script gives; ipengine parsed its own flags long ago.
    sys.argv = [""]
    shell.safe_execfile = _raising_execfile(shell.safe_execfile)
    shell.safe_run_module = _marked(_run_module)
    return True


def _raising_execfile(original: Callable) -> Callable:
    """``safe_execfile`` that lets the script's exception through (``%run -e`` still
    ignores a non-zero ``sys.exit``, as IPython documents it)."""

    @functools.wraps(original)
    def safe_execfile(fname, *where, exit_ignore=False, raise_exceptions=True, **kwargs):
        try:
            return original(fname, *where, exit_ignore=exit_ignore, raise_exceptions=True, **kwargs)
        except SystemExit:
            if exit_ignore:
                return None
            raise

    return _marked(safe_execfile)


def _run_module(mod_name: str, where: dict) -> None:
    """``%run -m``: the module runs as ``__main__``; what it raises fails the cell (a
    ``sys.exit`` with status 0 or None is a normal end, as it is for ``python -m``)."""
    # Deferred: only %run -m needs it.
    import runpy

    try:
        where.update(runpy.run_module(str(mod_name), run_name="__main__", alter_sys=True))
    except SystemExit as status:
        if status.code:
            raise


def own_world(jax: Any, call: dict) -> None:
    """Put jaxsys's own ``initialize`` and ``shutdown`` in ``jax.distributed``.

    Parameters
    ----------
    jax : module
        The ``jax`` module, already joined to the world by jaxsys.
    call : dict
        The arguments jaxsys's join gave ``jax.distributed.initialize``
        (``coordinator_address``, ``num_processes``, ``process_id``).
    """
    distributed = jax.distributed
    if getattr(distributed.initialize, _MARK, False):
        return
    world = {
        "coordinator_address": call.get("coordinator_address"),
        "num_processes": jax.process_count(),
        "process_id": jax.process_index(),
        "local_device_ids": sorted(d.id for d in jax.local_devices()),
    }

    @functools.wraps(distributed.initialize)
    def initialize(*args, **kwargs):
        given = _named(args, kwargs)
        wrong = disagreements(given, world)
        if wrong:
            raise EngineError(refusal(wrong, world))
        print(
            f"jaxsys: jax.distributed.initialize() ignored: jaxsys already joined every "
            f"process to this world of {world['num_processes']} processes",
            flush=True,
        )

    @functools.wraps(distributed.shutdown)
    def shutdown(*_args, **_kwargs):
        print(SHUTDOWN_NOTE, flush=True)

    distributed.initialize = _marked(initialize)
    distributed.shutdown = _marked(shutdown)


# The positional order of jax.distributed.initialize's arguments that describe the world.
_POSITIONAL = ("coordinator_address", "num_processes", "process_id", "local_device_ids")


def _named(args: tuple, kwargs: dict) -> dict:
    given = dict(zip(_POSITIONAL, args, strict=False))
    given.update(kwargs)
    return given


def disagreements(given: dict, world: dict) -> dict[str, tuple[Any, Any]]:
    """The arguments of an ``initialize`` call that contradict the running world.

    Parameters
    ----------
    given : dict
        The call's arguments by name; ``None`` (JAX's default) agrees with anything.
    world : dict
        ``coordinator_address``, ``num_processes``, ``process_id`` and ``local_device_ids``
        of this process in the running world.

    Returns
    -------
    dict
        ``{name: (given, running)}`` for each argument that differs; empty when it agrees.
        Arguments that only tune how a process joins (timeouts, credentials) never differ.
    """
    wrong = {}
    for name in _POSITIONAL:
        value = given.get(name)
        if value is None:
            continue
        running = world.get(name)
        if name == "local_device_ids":
            value = sorted([value] if isinstance(value, int) else value)
        if value != running:
            wrong[name] = (given[name], running)
    return wrong


def refusal(wrong: dict[str, tuple[Any, Any]], world: dict) -> str:
    """The message that refuses an ``initialize`` whose arguments contradict the world."""
    told = ", ".join(f"{k}={g!r} (the running world has {r!r})" for k, (g, r) in wrong.items())
    return (
        f"jax.distributed.initialize({told}) does not match the JAX world jaxsys runs "
        f"({world['num_processes']} processes). jaxsys owns the world: call initialize() "
        "with no arguments (or ones that agree), or start a world of that shape with "
        "%jaxsys stop then %jaxsys start --hosts N"
    )


__all__ = ["SHUTDOWN_NOTE", "disagreements", "install_shell", "own_world", "refusal"]
