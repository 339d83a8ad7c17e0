"""Each fact declared once: the liveness probe of a local process, each cluster option's
help, the default shape of a cluster (hosts x devices per host) and the telemetry kinds.

A second declaration is how a changed default stops reaching one surface; these tests fail
as soon as a copy appears, and name it.
"""

from __future__ import annotations

import ast
import os
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
