"""The divergence records an engine sends, checked and bounded before the check reads them.

A record comes from an engine (:mod:`jaxsys_kernel.engine.divergence`), so the kernel reads
it as untrusted input: every field must have its type and stay within :data:`MAX_TEXT`
characters or :data:`MAX_ITEMS` items, and only the fields the check uses are kept. A
record that fails is refused with a reason in words (:class:`BadRecord`); the check leaves
that process out for the rest of the cell and goes on with the others.
"""

from __future__ import annotations

from ..errors import ProtocolError

# Characters in one name, argument type, sharding or fingerprint. A real one is tens of
# characters; a nested sharding's text some hundreds.
MAX_TEXT = 2000
# Arguments, shardings or processes in one record: the arguments of one jitted call and
# the processes of one cluster.
MAX_ITEMS = 4096
# Dispatch records kept per process in one cell. Records come only from calls that miss
# JAX's C++ cache (every compile), so a real cell sends a few hundred at most.
MAX_ENTRIES = 100_000


class BadRecord(ProtocolError):
    """A divergence record is malformed or over a bound; the message says which field."""


def _text(record: dict, key: str, default: str | None = None) -> str:
    value = record.get(key, default)
    if not isinstance(value, str):
        raise BadRecord(f"{key} is {type(value).__name__}, not text")
    if len(value) > MAX_TEXT:
        raise BadRecord(f"{key} is {len(value):,} characters, more than {MAX_TEXT:,}")
    return value


def _texts(record: dict, key: str) -> list[str]:
    value = record.get(key, [])
    if not isinstance(value, list | tuple):
        raise BadRecord(f"{key} is {type(value).__name__}, not a list")
    if len(value) > MAX_ITEMS:
        raise BadRecord(f"{key} has {len(value):,} items, more than {MAX_ITEMS:,}")
    for item in value:
        if not isinstance(item, str) or len(item) > MAX_TEXT:
            what = type(item).__name__ if not isinstance(item, str) else "over-long text"
            raise BadRecord(f"{key} holds {what}, not text of at most {MAX_TEXT:,} characters")
    return list(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _line(record: dict) -> int | None:
    line = record.get("line")
    if line is not None and not (_whole(line) and 0 <= line < 1 << 31):
        raise BadRecord(f"line is {str(line)[:40]!r}, not a line number")
    return line


def _procs(record: dict) -> list[int]:
    procs = record.get("procs")
    if not isinstance(procs, list | tuple):
        raise BadRecord(f"procs is {type(procs).__name__}, not a list of processes")
    if len(procs) > MAX_ITEMS:
        raise BadRecord(f"procs has {len(procs):,} items, more than {MAX_ITEMS:,}")
    if not all(_whole(r) and r >= 0 for r in procs):
        raise BadRecord("procs holds something that is not a process number")
    return list(procs)


def checked(record) -> dict:
    """The fields of a ``dispatch`` or ``where`` record the check reads, or :class:`BadRecord`.

    Records of another kind are returned as ``{"kind": kind}`` (ignored by the check).
    """
    if not isinstance(record, dict):
        raise BadRecord(f"the record is {type(record).__name__}, not an object")
    kind = record.get("kind")
    if kind == "where":
        flags = {k: record.get(k, False) for k in ("idle", "in_jax")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise BadRecord("idle and in_jax must be true or false")
        return {"kind": "where", "line": _line(record), **flags}
    if kind != "dispatch":
        return {"kind": kind if isinstance(kind, str) and len(kind) <= 40 else "?"}
    return {
        "kind": "dispatch",
        "name": _text(record, "name"),
        "args": _texts(record, "args"),
        "shardings": _texts(record, "shardings"),
        "fingerprint": _text(record, "fingerprint", ""),
        "procs": _procs(record),
        "line": _line(record),
    }


__all__ = ["MAX_ENTRIES", "MAX_ITEMS", "MAX_TEXT", "BadRecord", "checked"]
