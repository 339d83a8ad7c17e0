"""A profiled cell on a real 2-process cluster: traces fetched, clocks aligned, one merged
Perfetto file with a track group per process, kept after the cluster is gone, each process's
own trace removed, and the timeline view's summary."""

from __future__ import annotations

import glob
import gzip
import json
import os
import tempfile
from pathlib import Path

from jaxsys_kernel import Cluster
from jaxsys_kernel import cells as executor
from jaxsys_kernel.cells import timeline
from jaxsys_kernel.widgets.timeline import TimelineView, timeline_svg

CELL = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("x")), np.ones((64, 64), np.float32))
@jax.jit
def profiled_step(v):
    return jnp.sum(v @ v.T)
for _ in range(3):
    profiled_step(x).block_until_ready()
"""


class Quiet(executor.Sink):
    def __init__(self):
        super().__init__()
        self.err: list[str] = []

    def stdout(self, text):
        pass

    def stderr(self, text):
        self.err.append(text)


def own_traces() -> set[str]:
    """The per-process trace directories in the temporary directory."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "jaxsys-trace-p*")))


def test_a_profiled_cell_merges_into_one_kept_trace_with_a_group_per_process(tmp_path, monkeypatch):
    # The kernel's working directory is the notebook's: the trace goes next to it.
    monkeypatch.chdir(tmp_path)
    before = own_traces()
    cluster = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    cluster.start_sync()
    try:
        sink = Quiet()
        run = executor.execute(cluster, CELL, sink=sink, hooks={"profile": {}}, timeout=120)
        assert not run.failed(), (run.results, sink.err)
        profile_dir = Path(cluster.connection_file).parents[1]
        assert list(profile_dir.glob("jaxsys-trace-p*")), "each process traces in the cluster's dir"
        got = timeline.collect(cluster, cluster.ranks, "cell")
        # Each process's own trace is gone once the kernel has it.
        assert not list(profile_dir.glob("jaxsys-trace-p*"))
    finally:
        cluster.kill()
    assert own_traces() - before == set()
    sizes = got["sizes"]
    offsets = {r: (o.seconds * 1e3, o.error * 1e3) for r, o in got["offsets"].items()}
    print(f"sizes {sizes} transfer {got['transfer_s']:.2f} s merge {got['merge_s']:.2f} s")
    print(f"clock offsets (ms, error ms) {offsets}")
    assert set(sizes) == {0, 1} and all(n > 1000 for n in sizes.values())
    assert all(o.error < 0.05 for o in got["offsets"].values())
    assert got["refused"] == {}
    path = Path(got["path"])
    assert path.parent == tmp_path / "jaxsys-traces" and path.name.startswith("cell-"), path
    # Kept after the cluster is gone.
    with gzip.open(path, "rt") as f:
        merged = json.load(f)
    groups = [e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"]
    assert [g.split()[0] for g in groups] == ["p0", "p1"]
    ran = {e["pid"] for e in merged["traceEvents"] if "profiled_step" in str(e.get("name"))}
    assert ran == {1, 2}, ran
    summary = got["summary"]
    for proc in summary["processes"]:
        names = {s["name"] for s in proc["spans"] if s["kind"] == "executable"}
        assert "profiled_step" in names, (proc["rank"], names)
    # The processes ran the same steps at about the same time on the kernel's clock.
    firsts = [
        min(s["start"] for s in p["spans"] if s["name"] == "profiled_step")
        for p in summary["processes"]
    ]
    assert max(firsts) - min(firsts) < 2e6, firsts
    data, _ = TimelineView(summary)._repr_mimebundle_()
    assert "image/png" in data and len(data["text/plain"].splitlines()) == 2
    # Every process's row has the step (the SVG names each span in its tooltip).
    assert timeline_svg(summary).count("profiled_step") >= 2
