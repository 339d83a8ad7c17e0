"""Cluster lifecycle: options, launchers, bring-up with the JAX bootstrap, restart, teardown
and security."""

from .cluster import (
    Cluster,
    ClusterConfig,
    ClusterError,
    ClusterStartError,
    ProcessInfo,
    ProgressEvent,
)

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ClusterStartError",
    "ProcessInfo",
    "ProgressEvent",
]
