"""Parsing and formatting of process sets such as ``0,2-3``."""

from __future__ import annotations

from collections.abc import Iterable


def parse_procs(text: str, nprocs: int) -> list[int]:
    """Parse a process selection into a sorted list of process indices.

    Parameters
    ----------
    text : str
        Comma-separated indices and inclusive ranges, e.g. ``"0,2-3"``;
        ``"all"`` selects every process.
    nprocs : int
        Number of processes in the cluster; every index must be below it.

    Returns
    -------
    list of int
        The selected process indices, sorted and without duplicates.

    Raises
    ------
    ValueError
        If the text is malformed or names a process outside ``0..nprocs-1``.

    Examples
    --------
    >>> parse_procs("0,2-3", 4)
    [0, 2, 3]
    """
    text = text.strip()
    if text == "all":
        return list(range(nprocs))
    if not text:
        raise ValueError("empty process selection; use e.g. 0,2-3 or all")
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise ValueError(
                f"bad process selection {part!r} in {text!r}; use indices and ranges like 0,2-3"
            ) from None
        if lo > hi:
            raise ValueError(f"bad process range {part!r}: start is after end")
        if lo < 0 or hi >= nprocs:
            raise ValueError(
                f"process selection {part!r} is outside this cluster's processes 0-{nprocs - 1}"
            )
        chosen.update(range(lo, hi + 1))
    return sorted(chosen)


def format_procs(procs: Iterable[int], prefix: str = "p") -> str:
    """Format process indices compactly, as ``p0-3`` or ``p0,2`` (or other ids, with another
    ``prefix``: ``d0,2048``).

    Parameters
    ----------
    procs : iterable of int
        Process indices, in any order.
    prefix : str
        What the label starts with.

    Returns
    -------
    str
        A label with runs of consecutive indices collapsed.

    Examples
    --------
    >>> format_procs([0, 1, 2, 3])
    'p0-3'
    >>> format_procs([0, 2, 3])
    'p0,2-3'
    """
    items = sorted(set(procs))
    runs: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        runs.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return prefix + ",".join(runs)
