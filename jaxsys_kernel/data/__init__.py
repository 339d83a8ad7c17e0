"""Distributed data loading: each process reads only the slices of a batch its devices need.

- :func:`plan` says, from a sharding alone, which slices every process reads, merged into
  as few reads as the layout allows, and which of them other processes read too.
- :func:`global_batch` reads this process's slices of an array, a memory-mapped ``.npy``
  file or a Grain dataset, and builds the global ``jax.Array``.
- :func:`stats` counts the bytes, slices and seconds each process spent.

``jaxsys_kernel.show(plan)`` draws a plan in a jaxsys notebook. Planning needs no JAX;
loading imports it inside the functions that need it.

Examples
--------
::

    %%multihost
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxsys_kernel import data

    sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("batch",)), P("batch"))
    print(data.plan((256, 784), sharding))
    x = data.global_batch("train.npy", sharding, (256, 784))
    print(data.stats(gather=True))
"""

import importlib

from .planner import STRATEGIES, Block, DataPlan, ProcessReads, Read, plan

# Loading runs in the JAX processes; the kernel, which draws plans, imports only the planning
# and drawing modules, so the loaders are imported on first use.
_LAZY = {
    "global_batch": "load",
    "open_npy": "sources",
    "close_files": "sources",
    "LoadStats": "counters",
    "StatsTable": "counters",
    "reset_stats": "counters",
    "stats": "counters",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STRATEGIES",
    "Block",
    "DataPlan",
    "LoadStats",
    "ProcessReads",
    "Read",
    "StatsTable",
    "close_files",
    "global_batch",
    "open_npy",
    "plan",
    "reset_stats",
    "stats",
]
