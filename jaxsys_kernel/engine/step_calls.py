"""Which of a cell's calls are steps, and which arrays a step made: the step recorder's looks
at JAX (:mod:`.arrivals`), each bounded so that a model's hundreds of arrays cost no more
than a few.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


def waits() -> tuple:
    """Calls into C that return once an array is computed: a step still running when the
    cell calls one of these is stamped when it returns (see :mod:`.arrivals`)."""
    import jax.numpy as jnp  # Deferred: asked once JAX has started, by arrivals.enable().

    return (float, int, print, np.asarray, type(jnp.zeros(())).block_until_ready)


def is_wait(fn, known: tuple) -> bool:
    """Whether ``fn`` is one of ``known`` (from :func:`waits`)."""
    return any(fn is w for w in known)


def spans_processes(tree) -> bool:
    """Whether the call's first argument lives on devices of more than this process.

    Only its first :data:`_LOOK_ARRAYS` arrays are looked at, walking down from the top:
    a model's state has hundreds, and flattening all of them at every step cost 40-170 us
    (measured, 256 arrays), while a step's state or batch spans processes throughout.
    """
    import jax  # Deferred: only called on a jitted call's argument, JAX is loaded by then.

    stack, arrays, nodes = [tree], 0, 0
    while stack and arrays < _LOOK_ARRAYS and nodes < _LOOK_NODES:
        x = stack.pop()
        nodes += 1
        if isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                return True
            arrays += 1
            continue
        if isinstance(x, dict):
            children = list(x.values())
        elif isinstance(x, list | tuple):
            children = list(x)
        else:
            try:
                children = list(jax.tree_util.flatten_one_level(x)[0])
            except ValueError:
                continue  # a leaf that is not an array (a number, a string)
        stack.extend(reversed(children))
    return False


# How far spans_processes looks into a call's first argument: arrays, and nodes visited.
_LOOK_ARRAYS = 8
_LOOK_NODES = 256


def unfinished(newest_first: bool = False, held: Collection[int] = ()) -> list:
    """The arrays this process is still computing, the call's result among them, but for
    those whose ids are in ``held`` (handed over with earlier steps).

    The monitoring event that ends a call hands over its first argument, not what it
    returned (and a jitted call returns before its devices finish), so the result is found
    among the process's live arrays: at that moment it is one of them.
    """
    import jax  # Deferred: as in spans_processes.

    live = jax.live_arrays()
    if not newest_first:
        return [a for a in live if id(a) not in held and not a.is_ready()]
    # The newest come first, and at the call's return they are its results: the look stops
    # after a few arrays already computed (a result may be ready at once), not at every array
    # of a large model (measured: 1,000 arrays cost 170 us a step to look at, 35 us to list);
    # and at the first array an earlier step holds: the older ones were looked at then. A loop
    # running ahead of its devices has every step in flight still running, and looking at all
    # of them again at each step cost it 0.17 ms of a 17 ms step (2 processes, 40 steps).
    out, ready = [], 0
    for a in live:
        if id(a) in held:
            break
        if not a.is_ready():
            out.append(a)
        elif (ready := ready + 1) == _READY_RUN:
            break
    return out


def newest_first() -> bool:
    """Whether ``jax.live_arrays()`` lists the newest array first (checked, not assumed)."""
    import jax  # Deferred: as in spans_processes.

    older = jax.device_put(0)
    newer = jax.device_put(1)
    first = next((a for a in jax.live_arrays() if a is older or a is newer), None)
    return first is newer


# Computed arrays in a row, newest first, after which unfinished stops looking.
_READY_RUN = 8


__all__ = ["is_wait", "newest_first", "spans_processes", "unfinished", "waits"]
