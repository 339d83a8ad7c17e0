"""The divergence check and the profiler through the magics of a real jaxsys kernel.

One kernel and one 3-process cluster for the module. The diverging cell is the silent one of
the divergence tests (one process builds its array with more rows, every process finishes),
so each run ends by itself whether or not the check names it. Each cell defines its function
under a name of its own: the session leaves out dispatches it saw in earlier cells.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from ..harness import kernel_with_cluster

START = "%jaxsys start --hosts 3 --devices-per-host 1"

SETUP = """\
%%multihost
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x"))
def global_rows(n):
    local = np.ones((n * jax.local_device_count(), 4), np.float32)
    return jax.make_array_from_process_local_data(rows, local)
"""


def diverging(name: str, options: str = "") -> str:
    """A cell where p1 traces ``name`` on 9 rows and p0, p2 on 6; nothing waits."""
    return (
        f"%%multihost --timeout 60 {options}\n"
        f"def {name}(v):\n"
        "    return jnp.sum(v)\n"
        "x = global_rows(3 if me == 1 else 2)\n"
        f"print('total', float(jax.jit({name})(x)))\n"
    )


def named(stderr: str) -> list[str]:
    """The divergence check's sentences in a cell's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("jaxsys: ") and " ran " in line]


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, START) as kernel:
        kernel.ok(SETUP, timeout=120)
        yield kernel


def test_the_check_is_on_by_default_and_names_the_diverging_process(k):
    out = k.ok(diverging("by_default"))
    found = named(out.stderr)
    assert len(found) == 1, out.stderr
    assert "p1 ran by_default(f32[9,4])" in found[0] and "p0,2 ran by_default(f32[6,4])" in found[0]
    assert "total" in out.stdout, out.stdout


def test_divergence_off_and_on_through_the_magic(k):
    said = k.ok("%jaxsys divergence off").stdout
    assert "the divergence check is off" in said, said
    try:
        off = k.ok(diverging("while_off"))
        # The cell ran to its (wrong) end, and nobody said why.
        assert "total" in off.stdout and named(off.stderr) == [], off.stderr
        assert "the divergence check is off" in k.ok("%jaxsys divergence").stdout
    finally:
        said = k.ok("%jaxsys divergence on").stdout
    assert "the divergence check is on" in said, said
    on = k.ok(diverging("on_again"))
    found = named(on.stderr)
    assert len(found) == 1 and "p1 ran on_again(f32[9,4])" in found[0], on.stderr


def test_no_check_skips_one_cell_only(k):
    skipped = k.ok(diverging("unchecked", "--no-check"))
    assert "total" in skipped.stdout and named(skipped.stderr) == [], skipped.stderr
    after = k.ok(diverging("checked_after"))
    found = named(after.stderr)
    assert len(found) == 1 and "p1 ran checked_after(f32[9,4])" in found[0], after.stderr


PROFILED = """\
%%multihost
@jax.jit
def between_start_and_stop(v):
    return jnp.sum(v @ v.T)
for _ in range(3):
    between_start_and_stop(global_rows(2)).block_until_ready()
"""


def test_profile_start_and_stop_merge_one_trace_with_a_group_per_process(k, tmp_path):
    started = k.ok("%jaxsys profile start")
    assert "profiling processes [0, 1, 2]" in started.stdout, started.stdout
    k.ok(PROFILED)
    stopped = k.ok(f"%jaxsys profile stop --dir {tmp_path}", timeout=180)
    m = re.search(r"merged trace: (\S+\.trace\.json\.gz) ", stopped.stdout)
    assert m, stopped.stdout
    path = Path(m.group(1))
    assert path.parent == tmp_path and path.name.startswith("profile-"), path
    assert re.search(r"clocks aligned to the kernel's within [0-9.]+ ms", stopped.stdout)
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(g.split()[0] for g in groups.values()) == ["p0", "p1", "p2"], groups
    # Every process's track group holds the cell's executable.
    ran = {e["pid"] for e in events if "between_start_and_stop" in str(e.get("name", ""))}
    assert ran == set(groups), (ran, groups)
    # The timeline view: a picture for where widgets do not run, a line per process.
    (view,) = [d for d in stopped.displays if "image/png" in d]
    lines = view["text/plain"].splitlines()
    assert [line.split(":")[0] for line in lines] == ["p0", "p1", "p2"], lines


def test_profile_stop_without_start_says_what_to_do(k):
    out = k.execute("%jaxsys profile stop", timeout=60)
    assert out.status == "error", out.stdout
    assert "%jaxsys profile start first" in f"{out.error} {out.stderr}", (out.error, out.stderr)


def test_a_profiled_cell_saves_its_trace_where_asked_and_shows_its_value(k, tmp_path):
    out = k.ok(
        f"%%multihost --profile-dir {tmp_path}\n"
        "@jax.jit\n"
        "def profiled_here(v):\n"
        "    return jnp.sum(v)\n"
        "float(profiled_here(global_rows(2)))\n",
        timeout=180,
    )
    m = re.search(r"merged trace: (\S+\.trace\.json\.gz) ", out.stdout)
    assert m and Path(m.group(1)).parent == tmp_path, out.stdout
    assert Path(m.group(1)).name.startswith("cell-"), m.group(1)
    assert any("6.0" in str(r) or "24.0" in str(r) for r in out.results), out.results
