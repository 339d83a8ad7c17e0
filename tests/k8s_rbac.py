"""The Roles docs/clusters.md gives a user to apply, read from the page itself, and the
question the test API (tests/k8s_api.py) asks of them for every request: may this token
do this verb on this resource? The Kubernetes tests then run the kernel and the pods with
exactly the documented rights, so a right the code needs and the page forgets fails them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parent.parent / "docs" / "clusters.md"
#: The Role of the kernel's service account, and that of the world's pods.
KERNEL_ROLE, ENGINE_ROLE = "jaxsys-kernel", "jaxsys-engine"


def documented_roles(page: Path = DOCS) -> dict[str, list[dict[str, Any]]]:
    """Every Role in the page's ``yaml`` blocks, by name: its rules."""
    roles = {}
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "Role":
                roles[doc["metadata"]["name"]] = doc["rules"]
    return roles


def allows(rules: list[dict[str, Any]], verb: str, group: str, resource: str) -> bool:
    """Whether any rule grants ``verb`` on ``resource`` (``pods/log`` for a subresource)
    of API group ``group`` (``""``: the core group), as RBAC reads a Role."""
    return any(
        group in rule.get("apiGroups", ())
        and resource in rule.get("resources", ())
        and (verb in rule.get("verbs", ()) or "*" in rule.get("verbs", ()))
        for rule in rules
    )
