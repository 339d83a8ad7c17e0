"""Mesh and sharding summaries: pure layouts, real JAX (in a subprocess), and scale.

Real JAX runs in a child process with 8 host devices, so this pytest process never gets a JAX
backend; the child prints JSON that is compared with the pure-Python ``block_layout``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxsys_kernel.engine.summaries import (
    FakeNamedSharding,
    block_layout,
    fake_devices,
    fake_mesh,
    sharding_info,
)

# (spec as JSON-able entries, shape): P('x', None), P(None, 'y'), ... on a (4, 2) mesh.
SPECS = [
    (["x", None], [8, 6]),
    ([None, "y"], [8, 6]),
    (["x", "y"], [8, 6]),
    ([], [8, 6]),  # P(): fully replicated
    ([["x", "y"]], [8, 6]),  # P(('x', 'y'),): dim 0 over all 8 devices
    ([["y", "x"]], [16, 2]),  # the tuple's first axis varies slowest
    (["y"], [8, 6]),  # partially replicated: split over y, copied over x
    ([None, "x"], [6, 8]),
    (["y", None, "x"], [4, 3, 8]),  # 3-D
]

CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxsys_kernel.engine.summaries import mesh_info, sharding_info

    specs = json.loads(sys.argv[1])
    out = {}
    for name, order in (("natural", list(range(8))), ("permuted", [5, 2, 7, 0, 3, 6, 1, 4])):
        devs = {d.id: d for d in jax.devices()}
        mesh = Mesh(np.array([devs[i] for i in order]).reshape(4, 2), ("x", "y"))
        cases = []
        for spec, shape in specs:
            entries = [tuple(e) if isinstance(e, list) else e for e in spec]
            s = NamedSharding(mesh, P(*entries))
            x = jax.device_put(np.zeros(shape, np.float32), s)
            dmap = s.devices_indices_map(tuple(shape))
            cases.append({
                "map": [[d.id, [list(sl.indices(n)[:2]) for sl, n in zip(idx, shape)]]
                        for d, idx in dmap.items()],
                "replica": {str(sh.device.id): sh.replica_id for sh in x.addressable_shards},
                "info": sharding_info(x),
            })
        out[name] = {"order": order, "mesh": mesh_info(mesh), "cases": cases}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def real():
    """Layouts JAX itself computes, from a child process with 8 CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(SPECS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def process_of(device: int) -> int:
    return device // 2


@pytest.mark.parametrize("mesh_name", ["natural", "permuted"])
@pytest.mark.parametrize("case", range(len(SPECS)), ids=[str(s) for s in SPECS])
def test_block_layout_matches_jax(real, mesh_name, case):
    spec, shape = SPECS[case]
    got = real[mesh_name]["cases"][case]
    order = real[mesh_name]["order"]
    layout = block_layout(shape, spec, (4, 2), ("x", "y"), order, process_of)
    # Same devices in the same (mesh) order, with exactly the same index ranges.
    assert [[e["device"], e["index"]] for e in layout] == got["map"]
    assert [e["process"] for e in layout] == [process_of(d) for d in order]


@pytest.mark.parametrize("mesh_name", ["natural", "permuted"])
@pytest.mark.parametrize("case", range(len(SPECS)), ids=[str(s) for s in SPECS])
def test_sharding_info_matches_fake(real, mesh_name, case):
    spec, shape = SPECS[case]
    got = real[mesh_name]["cases"][case]
    order = real[mesh_name]["order"]
    devs = {d.id: d for d in fake_devices(8, 1)}  # one process per device, like the child's ids
    mesh = fake_mesh([devs[i] for i in order], (4, 2), ("x", "y"))
    fake = sharding_info((FakeNamedSharding(mesh, spec), shape), dtype="float32")
    info = got["info"]
    for key in ("shape", "dtype", "spec", "spec_repr", "mesh", "edges", "grid", "tiles"):
        assert fake[key] == info[key], key
    for key in ("shard_shape", "replicas", "num_blocks", "num_devices"):
        assert fake[key] == info[key], key
    strip = [{k: b[k] for k in ("index", "cell", "n_holders", "replicas")} for b in info["blocks"]]
    assert strip == [
        {k: b[k] for k in ("index", "cell", "n_holders", "replicas")} for b in fake["blocks"]
    ]
    assert [[d for d, _ in b["holders"]] for b in info["blocks"]] == [
        [d for d, _ in b["holders"]] for b in fake["blocks"]
    ]
    # Replica ids agree with the ones JAX gives its shards.
    shards = info["shards"]
    assert {str(d): r for d, r in zip(shards["device"], shards["replica"], strict=True)} == got[
        "replica"
    ]
    assert shards == fake["shards"] | {"process": shards["process"]}


def test_mesh_info_real(real):
    m = real["permuted"]["mesh"]
    assert m["kind"] == "mesh" and m["v"] == 1
    assert m["axis_names"] == ["x", "y"] and m["shape"] == [4, 2]
    assert m["devices"] == real["permuted"]["order"]
    assert m["process"] == [0] * 8 and m["processes"] == [0]
    assert m["coords"] is None and m["slice_index"] is None
    assert m["platform"] == "cpu"


def test_summaries_never_import_jax():
    code = (
        "import sys\n"
        "from jaxsys_kernel.engine import summaries as S\n"
        "m = S.fake_mesh(S.fake_devices(8, 2), (4, 2), ('x', 'y'))\n"
        "S.mesh_info(m); S.sharding_info((S.FakeNamedSharding(m, ('x',)), (8, 2)))\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

