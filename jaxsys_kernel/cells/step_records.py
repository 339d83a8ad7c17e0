"""The step records an engine sends for the straggler view, checked and bounded.

One record per dispatch of an executable that spans processes (see
:mod:`jaxsys_kernel.engine.arrivals`). It comes from an engine, so the kernel reads it as
untrusted input: every field must be a finite number within its bound, and only the fields
the analysis reads are kept. A record that fails is refused with a reason in words
(:class:`BadStep`).

Fields (seconds; ``start``, ``dispatch`` and ``end`` on the process's own wall clock):

- ``step``: the dispatch's number in the cell, from 0;
- ``start``: when the process began the work leading to this dispatch: the previous call
  returned (or the cell began), or the previous step ended on the devices if that was later
  (a loop that dispatches ahead queues its steps behind each other);
- ``input``: of that, time spent in the input pipeline;
- ``compile``: time compiling the executable before it ran (0 when cached);
- ``compute``: device time this process needed before it could enter the collective
  (0 when not measured);
- ``dispatch``: when the call was made, or ``start`` if later; ``end``: when the arrays
  the call left computing were ready.
"""

from __future__ import annotations

import math

from ..errors import ProtocolError

# Steps kept per process in one cell; later ones are counted, not kept.
MAX_STEPS = 100_000
# Longest duration a record may carry: a day. Longer is a broken clock, not a step.
MAX_SECONDS = 86_400.0
DURATIONS = ("input", "compile", "compute")
STAMPS = ("start", "dispatch", "end")


class BadStep(ProtocolError):
    """A step record is malformed or over a bound; the message says which field."""


def _number(record: dict, key: str, default: float | None = None) -> float:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadStep(f"{key} is {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise BadStep(f"{key} is {value}, not a finite number")
    return float(value)


def checked(record) -> dict:
    """The fields of a ``step`` record the analysis reads, or :class:`BadStep`."""
    if not isinstance(record, dict):
        raise BadStep(f"the record is {type(record).__name__}, not an object")
    if record.get("kind") != "step":
        raise BadStep(f"kind is {str(record.get('kind'))[:40]!r}, not 'step'")
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 62:
        raise BadStep(f"step is {str(step)[:40]!r}, not a step number")
    out: dict = {"step": step}
    for key in DURATIONS:
        value = _number(record, key, 0.0)
        if not 0.0 <= value <= MAX_SECONDS:
            raise BadStep(f"{key} is {value} s, not between 0 and {MAX_SECONDS:.0f} s")
        out[key] = value
    for key in STAMPS:
        out[key] = _number(record, key)
    if not out["start"] <= out["dispatch"] <= out["end"]:
        raise BadStep("start, dispatch and end are out of order")
    if out["end"] - out["start"] > MAX_SECONDS:
        raise BadStep(f"the step spans more than {MAX_SECONDS:.0f} s")
    before = out["dispatch"] - out["start"]
    if out["input"] > before + 1e-6:
        raise BadStep("input is longer than the time before the dispatch")
    out["host"] = max(0.0, before - out["input"])
    return out


__all__ = ["DURATIONS", "MAX_SECONDS", "MAX_STEPS", "STAMPS", "BadStep", "checked"]
