"""Notebook widgets of the kernel: mesh, sharding, cache and liveness views.

They draw plain summary dicts (computed on the engines, see
:mod:`jaxsys_kernel.engine.summaries`) and never import JAX.
"""

from .views import (
    CacheView,
    Dashboard,
    LiveDevicesView,
    MeshView,
    ShardingView,
    view_for,
)

__all__ = ["CacheView", "Dashboard", "LiveDevicesView", "MeshView", "ShardingView", "view_for"]
