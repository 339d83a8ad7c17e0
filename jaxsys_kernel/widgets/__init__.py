"""Notebook widgets of the kernel: mesh, sharding, cache and liveness views, artifact cards.

They draw plain summary dicts (computed on the engines, see
:mod:`jaxsys_kernel.engine.summaries`) and never import JAX.
"""

from .artifact import ArtifactView
from .dataplan import DataPlanView
from .stragglers import StragglersDashboard, StragglersView
from .views import (
    CacheView,
    Dashboard,
    LiveDevicesView,
    MeshView,
    ShardingView,
    view_for,
)

__all__ = [
    "ArtifactView",
    "CacheView",
    "Dashboard",
    "DataPlanView",
    "LiveDevicesView",
    "MeshView",
    "ShardingView",
    "StragglersDashboard",
    "StragglersView",
    "view_for",
]
