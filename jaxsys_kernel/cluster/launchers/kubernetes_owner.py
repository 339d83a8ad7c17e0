"""Who owns a Kubernetes world as it passes between kernels.

A kernel that runs in a pod of the world's namespace owns the worlds it makes (the
ownerReference on their Job or JobSet): deleting its pod deletes them. A kept world must
outlive that pod, so a keep lets the owner go (the pods' wait, the lease's TTL, still ends
it when nobody attaches), and a kernel that attaches from a pod takes it over.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from . import kubernetes_api as api


def disown(client, top: Mapping[str, Any], name: str) -> None:
    """Leave the kept world ``name`` (its Job or JobSet ``top``) without an owner; said on
    stderr when the API refuses."""
    from kubernetes.client.rest import ApiException  # Deferred: as in kubernetes_api

    try:
        api.set_owner(client, top, None)
    except (ApiException, OSError) as e:
        print(
            f"jaxsys: the Kubernetes world {name} is still owned by the kernel's pod "
            f"({api.failure(e)}): deleting that pod deletes the world",
            file=sys.stderr,
        )


def adopt(client, top: Mapping[str, Any], owner: Mapping[str, Any], note: str) -> str:
    """Make the attaching kernel's pod ``owner`` the owner of the world ``top``; returns
    ``note`` (what owning means), or why the API refused."""
    from kubernetes.client.rest import ApiException  # Deferred: as in kubernetes_api

    try:
        api.set_owner(client, top, owner)
    except (ApiException, OSError) as e:
        return f"not owned by the kernel's pod {owner['name']} ({api.failure(e)})"
    return note


__all__ = ["adopt", "disown"]
