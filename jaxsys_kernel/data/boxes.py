"""Boxes of a global array: index ranges per dim, their sizes, and merging them into as few
rectangular slices as the layout allows. Pure: no JAX, no array data."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

Range = tuple[int, int]
Box = tuple[Range, ...]

# Merging tries every order of the dims up to this rank, then only last-dim-first.
_PERMUTE_UP_TO = 4


def box_of(index: Sequence[Any], shape: Sequence[int]) -> Box:
    """A device index (a tuple of slices, as JAX gives it) as ``((start, stop), ...)``.

    Raises
    ------
    ValueError
        For a strided slice, which no contiguous read can serve.
    """
    out = []
    for dim, n in enumerate(shape):
        s = index[dim] if dim < len(index) else slice(None)
        if isinstance(s, slice):
            start, stop, step = s.indices(int(n))
            if step != 1:
                raise ValueError(f"dim {dim}: strided device index {s} cannot be read as a slice")
        else:
            start, stop = int(s[0]), int(s[1])
        out.append((int(start), int(stop)))
    return tuple(out)


def box_size(box: Box) -> int:
    """Elements in a box."""
    return math.prod(max(b - a, 0) for a, b in box)


def runs_of(box: Box, shape: Sequence[int]) -> int:
    """How many contiguous byte runs a box is in a C-ordered array of ``shape``.

    The trailing dims the box covers fully join into one run; the first dim from the end
    that it covers partly is still contiguous, and every dim before it multiplies the runs.
    """
    if box_size(box) == 0:
        return 0
    k = len(box) - 1
    while k > 0 and box[k] == (0, int(shape[k])):
        k -= 1
    return math.prod(b - a for a, b in box[:k])


def contains(outer: Box, inner: Box) -> bool:
    """Whether ``inner`` lies inside ``outer``."""
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner, strict=True))


def _merge_along(boxes: list[Box], d: int) -> tuple[list[Box], bool]:
    """Join boxes that touch along dim ``d`` and agree on every other dim."""
    groups: dict[Box, list[Box]] = {}
    for b in boxes:
        groups.setdefault(b[:d] + b[d + 1 :], []).append(b)
    out, changed = [], False
    for group in groups.values():
        group.sort(key=lambda b: b[d])
        cur = group[0]
        for b in group[1:]:
            if b[d][0] == cur[d][1]:
                cur = cur[:d] + ((cur[d][0], b[d][1]),) + cur[d + 1 :]
                changed = True
            else:
                out.append(cur)
                cur = b
        out.append(cur)
    return out, changed


def merge_boxes(boxes: Iterable[Box], shape: Sequence[int]) -> list[Box]:
    """Merge disjoint boxes into as few rectangular boxes as possible, covering exactly them.

    Boxes are joined pairwise when they touch along one dim and agree on the others, until
    nothing changes. The result depends on the order in which dims are tried, so every
    order is tried (up to rank 4; last-dim-first beyond) and the one giving the fewest boxes,
    then the fewest contiguous runs, wins. For the grid layouts shardings produce this finds
    the fewest reads in the cases that matter: rows, columns, blocks and their unions.
    """
    start = sorted(set(boxes))
    if len(start) <= 1:
        return start
    ndim = len(start[0])
    dims = list(range(ndim - 1, -1, -1))
    orders = itertools.permutations(dims) if ndim <= _PERMUTE_UP_TO else [tuple(dims)]
    best: list[Box] | None = None
    best_key: tuple[int, int] | None = None
    for order in orders:
        cur, changed = list(start), True
        while changed:
            changed = False
            for d in order:
                cur, moved = _merge_along(cur, d)
                changed |= moved
        key = (len(cur), sum(runs_of(b, shape) for b in cur))
        if best_key is None or key < best_key:
            best, best_key = sorted(cur), key
    return best or []
