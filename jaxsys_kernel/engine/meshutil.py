"""Small helpers shared by the summaries and the simulated meshes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def flatten(devices: Any) -> list:
    """Devices of a mesh in row-major order, from an ndarray or nested lists."""
    if hasattr(devices, "flat"):
        return list(devices.flat)
    if isinstance(devices, list | tuple):
        out: list = []
        for d in devices:
            out.extend(flatten(d))
        return out
    return [devices]


def format_spec(spec: Sequence[Any]) -> str:
    """A spec's entries as ``PartitionSpec`` prints them."""
    parts = [repr(tuple(e)) if isinstance(e, list | tuple) else repr(e) for e in spec]
    # Same text as PartitionSpec: a one-entry spec keeps its tuple comma, "P('x',)".
    return f"P({', '.join(parts)}{',' if len(parts) == 1 else ''})"
