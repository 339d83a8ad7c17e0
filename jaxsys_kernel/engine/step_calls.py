"""Which of a cell's calls are steps, and which arrays a step made: the step recorder's looks
at JAX (:mod:`.arrivals`), each bounded so that a model's hundreds of arrays cost no more
than a few.
"""

from __future__ import annotations

import dis
import functools
from collections.abc import Callable, Collection, Iterator
from types import CodeType, FrameType

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
    if isinstance(tree, _array_type()):
        return not _addressable(tree)  # a step's state as one array: no walk
    return any(not _addressable(a) for a in _leading_arrays(tree))


def _addressable(array) -> bool:
    """Whether ``array`` lives on this process's devices only, known once per sharding."""
    # A step's outputs share one sharding object from call to call, and the look through
    # it cost 15 us a step with the devices busy (measured, 2 cores), against 1 us idle.
    return _by_identity(_ADDRESSABLE, 64, array.sharding, lambda s: bool(s.is_fully_addressable))


def _by_identity(cache: dict, limit: int, key, compute: Callable):
    """``compute(key)``, kept in ``cache`` by the object's id (cleared past ``limit``).

    By id, not by hash: a code object's hash walks its constants at every look. The object
    is kept with its answer, so its id is not reused by another while the entry lasts.
    """
    known = cache.get(id(key))
    if known is not None and known[0] is key:
        return known[1]
    if len(cache) >= limit:
        cache.clear()
    answer = compute(key)
    cache[id(key)] = (key, answer)
    return answer


# Shardings looked at, and code objects read (_stores_after_calls), each with its answer.
_ADDRESSABLE: dict[int, tuple] = {}
_STORES_BY_CODE: dict[int, tuple] = {}


@functools.cache
def _array_type() -> type:
    # Looked up once: an import statement at every step is a lookup each time.
    import jax  # Deferred: only called on a jitted call's argument, JAX is loaded by then.

    return jax.Array


def _leading_arrays(tree) -> Iterator:
    """The first :data:`_LOOK_ARRAYS` arrays of ``tree``, walking down from the top."""
    array = _array_type()
    stack, arrays, nodes = [tree], 0, 0
    while stack and arrays < _LOOK_ARRAYS and nodes < _LOOK_NODES:
        x = stack.pop()
        nodes += 1
        if isinstance(x, array):
            arrays += 1
            yield x
            continue
        if isinstance(x, dict):
            children = list(x.values())
        elif isinstance(x, list | tuple):
            children = list(x)
        else:
            try:
                children = list(_flatten_one_level(x))
            except ValueError:
                continue  # a leaf that is not an array (a number, a string)
        stack.extend(reversed(children))


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


def _flatten_one_level(x) -> list:
    import jax  # Deferred: reached only for a pytree node that is not a dict, list or tuple.

    return jax.tree_util.flatten_one_level(x)[0]


_STORES = frozenset({"STORE_NAME", "STORE_FAST", "STORE_GLOBAL", "STORE_DEREF"})


def _stores_after_calls(code: CodeType) -> dict[int, tuple[tuple[bool, str], ...]]:
    """For each call in ``code`` whose result goes straight into plain names, those names
    (each with whether it is a global), by the call's offset."""
    return _by_identity(_STORES_BY_CODE, 256, code, _read_stores)


def _read_stores(code: CodeType) -> dict[int, tuple[tuple[bool, str], ...]]:
    found: dict[int, tuple[tuple[bool, str], ...]] = {}
    ins = list(dis.get_instructions(code))
    for i, call in enumerate(ins[:-1]):
        if not call.opname.startswith("CALL"):
            continue
        after, count = ins[i + 1], 1
        if after.opname == "UNPACK_SEQUENCE":  # state, loss = step(state, batch)
            count, i = after.arg, i + 1
        names = []
        for store in ins[i + 1 : i + 1 + count]:
            if store.opname not in _STORES:
                break
            names.append((store.opname == "STORE_GLOBAL", store.argval))
        if len(names) == count:
            found[call.offset] = tuple(names)
    return found


def stored_arrays(frame: FrameType, code: CodeType, offset: int) -> list | None:
    """The first few arrays of what the call at ``offset`` of ``code`` stored in ``frame``,
    read after it was stored; None when its result did not go into plain names, or holds
    no array.

    A jitted call's outputs come from one execution and are computed together, so these
    stand for all of them: a step's end is found without listing every live array (which
    grows with the model: 35 us a step at 1,000 arrays, measured).
    """
    names = _stores_after_calls(code).get(offset)
    if names is None:
        return None
    scope = frame.f_locals if not all(glob for glob, _ in names) else None
    values = [frame.f_globals.get(n) if glob else scope.get(n) for glob, n in names]
    if len(values) == 1 and isinstance(values[0], _array_type()):
        return values  # w = step(w, batch): the usual loop, without the walk
    return list(_leading_arrays(values)) or None


def newest_first() -> bool:
    """Whether ``jax.live_arrays()`` lists the newest array first (checked, not assumed)."""
    import jax  # Deferred: as in spans_processes.

    older = jax.device_put(0)
    newer = jax.device_put(1)
    first = next((a for a in jax.live_arrays() if a is older or a is newer), None)
    return first is newer


# Computed arrays in a row, newest first, after which unfinished stops looking.
_READY_RUN = 8


__all__ = [
    "is_wait",
    "newest_first",
    "spans_processes",
    "stored_arrays",
    "unfinished",
    "waits",
]
