"""Every request to engines goes through ``Cluster.call`` (or ``submit``) or the cell path.

A direct ``client[...].apply_async(...)`` skips what the primitive does for every caller: the
check that each chosen process is running before anything is sent, one deadline for all
the answers, and results and errors gathered by rank. The scan below finds such calls on
an ipyparallel view anywhere in the package outside the places that are the primitive
itself, the cell path, or listed here with the reason they cannot use it.
"""

from __future__ import annotations

import ast

from .package_source import ROOT, source_files, text, tree

# ipyparallel's names for sending a function: apply_async and apply_sync are its own, so
# they count on any receiver; plain apply only on something that is a view.
VIEW_ONLY = {"apply"}
ALWAYS = {"apply_async", "apply_sync"}
VIEW_FACTORIES = {"direct_view", "load_balanced_view", "broadcast_view"}

# Where talking to engines directly is the design, each with its reason.
ALLOWED = {
    "jaxsys_kernel/cluster/calls.py": "Cluster.call and Cluster.submit: the primitive itself",
    "jaxsys_kernel/cells/*": "the cell path: execute requests, streamed and judged per cell",
    "jaxsys_kernel/cluster/bringup.py": (
        "bring-up talks to engines before the world exists: there are no ranks yet to call"
    ),
    "jaxsys_kernel/cluster/standby.py": (
        "standby engines belong to no world yet: they have an engine id and no rank"
    ),
    "jaxsys_kernel/cluster/spare_world.py": (
        "a spare world's engines belong to a world the kernel does not talk to yet"
    ),
}


def _named_client(expr: ast.expr) -> bool:
    name = expr.id if isinstance(expr, ast.Name) else getattr(expr, "attr", "")
    return name == "client" or name.endswith("_client")


def _is_view(expr: ast.expr, views: set[str]) -> bool:
    """Whether ``expr`` is, by its shape, an ipyparallel view."""
    if isinstance(expr, ast.Subscript):
        return _named_client(expr.value)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        return expr.func.attr in VIEW_FACTORIES
    if isinstance(expr, ast.Attribute):
        return expr.attr == "view" or expr.attr.endswith("_view")
    if isinstance(expr, ast.Name):
        return expr.id in views or expr.id == "view" or expr.id.endswith("_view")
    return False


def direct_requests(source: str, parsed: ast.Module | None = None) -> list[int]:
    """Line numbers of the calls in ``source`` that send a function to engines directly
    (``parsed``: the tree of ``source``, when it is parsed already)."""
    module = parsed or ast.parse(source)
    # Names bound to a view (``v = client[0]``) count as views wherever they are used.
    views: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and _is_view(node.value, views):
            views |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(module):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr, receiver = node.func.attr, node.func.value
        if attr in ALWAYS or (attr in VIEW_ONLY and _is_view(receiver, views)):
            found.append(node.lineno)
    return sorted(found)


def _allowed(rel: str) -> bool:
    return any(
        rel == pattern or (pattern.endswith("/*") and rel.startswith(pattern[:-1]))
        for pattern in ALLOWED
    )


def test_engines_are_asked_only_through_the_primitive_or_the_cell_path():
    strays = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        if _allowed(rel):
            continue
        for line in direct_requests(text(path), tree(path)):
            strays.append(f"{rel}:{line} {text(path).splitlines()[line - 1].strip()}")
    assert not strays, (
        "requests sent to engines directly: use cluster.call(ranks, fn, *args, timeout=...) "
        f"(or cluster.submit), or add the file to ALLOWED with the reason: {strays}"
    )


def test_every_allowed_entry_names_files_that_exist():
    files = [p.relative_to(ROOT).as_posix() for p in source_files()]
    for pattern in ALLOWED:
        assert any(
            f == pattern or (pattern.endswith("/*") and f.startswith(pattern[:-1])) for f in files
        ), f"no file matches {pattern}"


def test_the_scan_finds_each_shape_of_a_direct_request():
    source = """
def ask(cluster, client, hub):
    cluster.client[0].apply_async(f)
    client[[0, 1]].apply(f)
    cluster.view.apply(f)
    v = cluster.client[2]
    v.apply(f, 1)
    client.direct_view().apply(f)
    anything.apply_sync(f)
    hub.cache[0].apply(event)
    rows.apply(event)
    cluster.call([0], f, timeout=1.0)
"""
    assert direct_requests(source) == [3, 4, 5, 7, 8, 9]
