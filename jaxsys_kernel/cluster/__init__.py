"""Cluster lifecycle: launch, JAX bootstrap, restart and teardown."""

from .cluster import Cluster, ClusterError, ClusterStartError, ProcessInfo, ProgressEvent

__all__ = ["Cluster", "ClusterError", "ClusterStartError", "ProcessInfo", "ProgressEvent"]
