"""Each fact declared once: the liveness probe of a local process, each cluster option's
help, the default shape of a cluster (hosts x devices per host) and the telemetry kinds.

A second declaration is how a changed default stops reaching one surface; these tests fail
as soon as a copy appears, and name it.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

from jaxsys_kernel.cluster import pids

from .package_source import PACKAGE, source_files, tree

# -- the liveness probe -----------------------------------------------------------------


def _probes_with_signal_zero() -> set[str]:
    """``module:function`` for every function that sends signal 0 to look at a pid."""
    found = set()
    for path in source_files():
        for fn in ast.walk(tree(path)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(fn):
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func) == "os.kill"
                    and len(call.args) == 2
                    and ast.unparse(call.args[1]) == "0"
                ):
                    found.add(f"{path.relative_to(PACKAGE).as_posix()}:{fn.name}")
    return found


def test_one_liveness_probe_and_the_forked_stand_in_s_own():
    # The stand-in runs by path under `python -S` and imports nothing of the package, so it
    # keeps a copy; every other module asks cluster/pids.py.
    assert _probes_with_signal_zero() == {"cluster/pids.py:pid_alive", "engine/forked.py:alive"}


def test_the_forked_stand_in_imports_only_the_standard_library():
    imports = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree(PACKAGE / "engine" / "forked.py"))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imports <= set(sys.stdlib_module_names), imports


def test_pid_alive_and_the_same_process():
    me = os.getpid()
    assert pids.pid_alive(me) and pids.alive(me, pids.process_start(me))
    assert not pids.alive(me, pids.process_start(me) - 1), "same pid, another process"
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert not pids.pid_alive(gone) and not pids.alive(gone, None)
    assert not pids.pid_alive(None) and not pids.pid_alive(0)


# -- the default shape of a cluster -------------------------------------------------------


def _declared_shape() -> dict[str, int]:
    from jaxsys_kernel.cluster.config import DEFAULT_DEVICES_PER_HOST, DEFAULT_HOSTS

    return {
        "hosts": DEFAULT_HOSTS,
        "DEFAULT_HOSTS": DEFAULT_HOSTS,
        "devices_per_host": DEFAULT_DEVICES_PER_HOST,
        "DEFAULT_DEVICES_PER_HOST": DEFAULT_DEVICES_PER_HOST,
    }


def _size_literals() -> list[str]:
    """Where the default size is written as a number for a size's name: an assignment, a
    field, a keyword argument, ``.get("hosts", N)``, or ``option(N, ...)`` declaring one."""
    shape = _declared_shape()
    found = []

    def default_for(name, node) -> bool:
        return (
            name in shape
            and isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.value == shape[name]
        )

    for path in source_files():
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                if isinstance(value, ast.Call) and value.args:
                    value = value.args[0]  # option(N, ...)
                for target in targets:
                    if default_for(ast.unparse(target).split(".")[-1], value):
                        found.append(f"{where}:{node.lineno} {ast.unparse(target)}")
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if default_for(kw.arg, kw.value):
                    found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
            is_get = isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            if is_get and len(node.args) == 2 and isinstance(node.args[0], ast.Constant):
                if default_for(node.args[0].value, node.args[1]):
                    found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_default_cluster_size_is_written_once():
    assert _size_literals() == [
        f"cluster/config.py:{_line('DEFAULT_HOSTS')} DEFAULT_HOSTS",
        f"cluster/config.py:{_line('DEFAULT_DEVICES_PER_HOST')} DEFAULT_DEVICES_PER_HOST",
    ]


def _line(name: str) -> int:
    source = (PACKAGE / "cluster" / "config.py").read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if line.startswith(f"{name} = "))


def test_every_surface_reads_the_declared_default_size():
    from jaxsys_kernel.cluster.config import ClusterConfig
    from jaxsys_kernel.cluster.options import flag_arguments
    from jaxsys_kernel.job.program import Program
    from jaxsys_kernel.kernel.spec import kernel_spec

    hosts, devices = _declared_shape()["hosts"], _declared_shape()["devices_per_host"]
    config = ClusterConfig()
    assert (config.nprocs, config.devices_per_host) == (hosts, devices)
    assert (Program().hosts, Program().devices_per_host) == (hosts, devices)
    # share/'s kernel.json is this spec, written out (tests/unit/test_cli.py compares them).
    env = kernel_spec()["env"]
    assert (int(env["JAXSYS_HOSTS"]), int(env["JAXSYS_DEVICES_PER_HOST"])) == (hosts, devices)
    helps = dict((flag, kwargs["help"]) for flag, kwargs in flag_arguments(ClusterConfig))
    assert helps["--hosts"].endswith(f"else {hosts})")
    assert helps["--devices-per-host"].endswith(f"else {devices})")


# -- each option's help ------------------------------------------------------------------


def _strings(path) -> list[str]:
    """The module's string literals, f-strings with their fixed parts, whitespace folded."""
    out = []
    nodes = list(ast.walk(tree(path)))
    inside = {id(v) for n in nodes if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in nodes:
        if id(node) in inside:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(" ".join(node.value.split()))
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            out.append(" ".join("".join(parts).split()))
    return out


def _start_helps() -> dict[str, str]:
    """Every help text ``%jaxsys start`` shows, by where it belongs: each cluster option's
    meaning, each of its flags' line, and the magic's own flags."""
    from jaxsys_kernel.cluster.config import ClusterConfig
    from jaxsys_kernel.cluster.options import declared, flag_arguments
    from jaxsys_kernel.magics import actions

    helps = {f"option {f.name}": f.metadata["help"] for f in declared(ClusterConfig)}
    flags = {flag: kwargs["help"] for flag, kwargs in flag_arguments(ClusterConfig)}
    helps |= {f"flag {flag}": text for flag, text in flags.items()}
    for a in actions.ACTIONS["start"].parser._actions:
        if a.option_strings and a.option_strings[0] not in flags and a.help:
            helps[f"flag {a.option_strings[0]}"] = a.help
    return helps


def test_every_option_s_help_is_declared_exactly_once():
    strings = [s for path in source_files() for s in _strings(path)]
    counts = {}
    for what, text in _start_helps().items():
        # The opening words, up to the first value filled in ("default $JAXSYS_HOSTS, ...").
        opening = " ".join(text.split()[:6]).split("$")[0].split("{")[0]
        counts[what] = sum(s.lower().count(opening.lower()) for s in strings)
    assert len(counts) > 30
    assert {what: n for what, n in counts.items() if n != 1} == {}


def test_the_start_magic_describes_no_option_outside_its_list_of_options():
    # Its Parameters section is made from the declarations; prose naming a flag is a second
    # description that goes stale when the flag's help changes.
    from jaxsys_kernel.magics import actions

    start = actions.ACTIONS["start"]
    body = start.doc.partition("Examples\n--------")[0]
    named = [o for o in start.options() if o and o.startswith("--") and o in body]
    assert named == []


# -- telemetry kinds -----------------------------------------------------------------------


def test_each_telemetry_kind_is_declared_once_with_its_reader_and_handler():
    import inspect

    from jaxsys_kernel.telemetry import schema
    from jaxsys_kernel.telemetry.hub import TelemetryHub

    assert schema.KINDS == tuple(schema.KIND_TABLE)
    for kind, declared in schema.KIND_TABLE.items():
        handler = getattr(TelemetryHub, declared.handler, None)
        assert callable(handler), f"{kind}: the hub has no {declared.handler}"
        assert list(inspect.signature(handler).parameters) == ["self", "rank", "ev", "now"]
    # No second dispatch: the hub compares no event kind with a kind's name.
    names = {n for n, v in vars(schema).items() if isinstance(v, str) and v in schema.KIND_TABLE}
    compared = [
        f"hub.py:{node.lineno}"
        for node in ast.walk(tree(PACKAGE / "telemetry" / "hub.py"))
        if isinstance(node, ast.Compare)
        and any(ast.unparse(c).removeprefix("schema.") in names for c in node.comparators)
    ]
    assert compared == []


def test_a_kind_added_to_the_table_is_read_with_its_own_fields(monkeypatch):
    import json

    from jaxsys_kernel.telemetry import schema

    table = {**schema.KIND_TABLE, "probe": schema.Kind(lambda ev: {"n": ev["n"]}, "_on_probe")}
    monkeypatch.setattr(schema, "KIND_TABLE", table)
    monkeypatch.setattr(schema, "KINDS", tuple(table))
    raw = json.dumps(schema.event("probe", 0, 1, 1.0, n=3, extra="dropped")).encode()
    ev = schema.decode(raw)
    assert {k: ev[k] for k in ("kind", "n")} == {"kind": "probe", "n": 3} and "extra" not in ev


# -- the views' shared front-end code and kind check ------------------------------------------


def test_the_standalone_views_copy_shared_js_only_through_the_marked_regions():
    from jaxsys_kernel.widgets import esm

    copies = esm.copies()
    assert set(copies) >= {"artifact.js", "dataplan.js"}
    for name, names in copies.items():
        found = esm.COPY.search((esm.STATIC / name).read_text()).group(0)
        assert found == esm.copied_block(names), (
            f"static/{name}'s copy of shared.js is stale: run "
            "jaxsys_kernel.widgets.esm.write_copies()"
        )
    # Outside shared.js and those regions, no module declares what shared.js exports.
    declared = re.compile(r"^(?:export )?(?:function|const) (\w+)\b", re.MULTILINE)
    for path in esm.STATIC.glob("*.js"):
        if path.name == "shared.js":
            continue
        own = esm.COPY.sub("", path.read_text())
        assert not set(declared.findall(own)) & esm.shared_exports(), path.name


def test_one_kind_check_for_every_view():
    offenders = []
    for path in (PACKAGE / "widgets").glob("*.py"):
        if path.name == "kinds.py":
            continue
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Compare) and '.get("kind"' in ast.unparse(node).replace(
                "'", '"'
            ):
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.FunctionDef) and "kind" in node.name and "check" in node.name:
                offenders.append(f"{path.name}:{node.lineno} {node.name}")
    assert offenders == []
