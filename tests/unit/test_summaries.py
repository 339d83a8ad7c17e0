"""Mesh and sharding summaries: pure layouts, real JAX (in a subprocess), and scale.

Real JAX runs in a child process with 8 host devices, so this pytest process never gets a JAX
backend; the child prints JSON that is compared with the pure-Python ``block_layout``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from jaxsys_kernel.engine.summaries import (
    MAX_HOLDERS,
    FakeNamedSharding,
    block_layout,
    fake_devices,
    fake_mesh,
    mesh_info,
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


def test_known_layout_two_processes():
    devs = fake_devices(8, 4)  # devices 0-3 on process 0, 4-7 on process 1
    mesh = fake_mesh(devs, (4, 2), ("x", "y"))
    info = sharding_info((FakeNamedSharding(mesh, ("x", None)), (8, 6)), dtype="float32")
    assert info["kind"] == "sharding" and info["spec"] == ["x", None]
    assert info["spec_repr"] == "P('x', None)"
    assert info["mesh"] == {"axis_names": ["x", "y"], "shape": [4, 2]}
    assert info["processes"] == [0, 1] and info["num_devices"] == 8
    assert not info["aggregated"] and info["num_blocks"] == 4 and info["replicas"] == 2
    assert info["edges"] == [[0, 2, 4, 6, 8], [0, 6]] and info["grid"] == [4, 1]
    assert info["shard_shape"] == [2, 6]
    blocks = info["blocks"]
    assert [b["index"] for b in blocks] == [[[r, r + 2], [0, 6]] for r in (0, 2, 4, 6)]
    assert [b["holders"] for b in blocks] == [
        [[0, 0], [1, 0]],
        [[2, 0], [3, 0]],
        [[4, 1], [5, 1]],
        [[6, 1], [7, 1]],
    ]
    assert [b["addressable_by"] for b in blocks] == [[0], [0], [1], [1]]
    assert all(b["replicas"] == 2 and b["n_holders"] == 2 for b in blocks)
    assert info["shards"] == {
        "device": list(range(8)),
        "process": [0, 0, 0, 0, 1, 1, 1, 1],
        "block": [0, 0, 1, 1, 2, 2, 3, 3],
        "replica": [0, 1] * 4,
    }
    json.dumps(info)  # plain data all the way down


def test_hybrid_mesh_info():
    devs = fake_devices(16, 4, devices_per_slice=8, coords_shape=(2, 2, 2))
    info = mesh_info(fake_mesh(devs, (2, 2, 4), ("dcn", "x", "y")))
    assert info["shape"] == [2, 2, 4] and info["devices"] == list(range(16))
    assert info["slice_index"] == [0] * 8 + [1] * 8
    assert info["coords"][0] == [0, 0, 0] and info["coords"][7] == [1, 1, 1]
    assert info["coords"][8] == [0, 0, 0]
    assert info["process"] == [d // 4 for d in range(16)]
    assert info["processes"] == [0, 1, 2, 3]


def test_mesh_info_rejects_wrong_size():
    mesh = SimpleNamespace(axis_names=("a", "b"), shape={"a": 2, "b": 2}, devices=[[0]])
    with pytest.raises(ValueError, match="needs 4 devices"):
        mesh_info(mesh)


@pytest.mark.parametrize(
    "spec,shape,fragment",
    [
        (["x"], [7], "does not split evenly"),
        (["z"], [8], "no axis 'z'"),
        ([("x", "x")], [16], "used twice"),
        (["x", None, None], [8, 8], "3 entries for a 2-d"),
    ],
)
def test_block_layout_errors(spec, shape, fragment):
    with pytest.raises(ValueError, match=fragment):
        block_layout(shape, spec, (4, 2), ("x", "y"), range(8), lambda d: 0)


def test_process_of_mapping_or_sequence():
    by_list = block_layout([8], ["x"], (4, 2), ("x", "y"), range(8), [0, 0, 0, 0, 1, 1, 1, 1])
    by_dict = block_layout([8], ["x"], (4, 2), ("x", "y"), range(8), {d: d // 4 for d in range(8)})
    assert by_list == by_dict
    assert [e["process"] for e in by_list] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_sharding_info_rejects_other_values():
    with pytest.raises(TypeError, match=r"\(sharding, shape\) pair"):
        sharding_info([1, 2, 3])


def big_mesh():
    devs = fake_devices(4096, 4)  # 1024 processes
    return fake_mesh(devs, (64, 64), ("x", "y"))


def test_4096_devices_unaggregated_is_linear():
    info = sharding_info((FakeNamedSharding(big_mesh(), ("x", "y")), (1024, 1024)))
    assert not info["aggregated"] and len(info["blocks"]) == 4096
    assert info["grid"] == [64, 64] and info["shard_shape"] == [16, 16]
    assert len(info["processes"]) == 1024
    # O(devices): a few hundred bytes per device at most.
    assert len(json.dumps(info)) < 4096 * 250


def test_4096_devices_aggregated_is_bounded():
    info = sharding_info((FakeNamedSharding(big_mesh(), ("x", "y")), (1024, 1024)), max_blocks=256)
    assert info["aggregated"] and info["factor"] == [4, 4]
    assert info["num_blocks"] == 4096 and info["tiles"] == [64, 64]
    assert len(info["blocks"]) <= 256 and info["grid"] == [16, 16]
    assert info["shards"] is None
    assert all(len(b["holders"]) <= MAX_HOLDERS for b in info["blocks"])
    assert sum(b["n_holders"] for b in info["blocks"]) == 4096
    assert sum(b["merged"] for b in info["blocks"]) == 4096
    # The merged blocks tile the array exactly, on the reported edges.
    area = sum(math.prod(b - a for a, b in blk["index"]) for blk in info["blocks"])
    assert area == 1024 * 1024
    for blk in info["blocks"]:
        for d, (a, b) in enumerate(blk["index"]):
            e = info["edges"][d]
            assert a == e[blk["cell"][d]] and b == e[blk["cell"][d] + 1]
    # A 4x4 group of 16x16 shards spans 4 mesh rows of 64 devices: processes of those rows.
    first = info["blocks"][0]
    assert first["index"] == [[0, 64], [0, 64]]
    assert first["addressable_by"] == sorted(
        {(r * 64 + c) // 4 for r in range(4) for c in range(4)}
    )
    assert len(json.dumps(info)) < 256 * 600


def test_aggregation_uneven_factor():
    devs = fake_devices(4096, 8)
    mesh = fake_mesh(devs, (4096,), ("d",))
    info = sharding_info((FakeNamedSharding(mesh, ("d",)), (4096 * 3,)), max_blocks=100)
    assert info["aggregated"] and info["factor"] == [64] and len(info["blocks"]) == 64
    assert info["edges"][0][0] == 0 and info["edges"][0][-1] == 4096 * 3
    assert [b["cell"] for b in info["blocks"]] == [[i] for i in range(64)]


def test_replicated_over_4096_devices():
    info = sharding_info((FakeNamedSharding(big_mesh(), ()), (32, 32)))
    assert not info["aggregated"] and info["num_blocks"] == 1 and info["replicas"] == 4096
    (blk,) = info["blocks"]
    assert blk["n_holders"] == 4096 and len(blk["addressable_by"]) == 1024
    assert info["shards"]["replica"] == list(range(4096))


def test_summaries_never_import_jax():
    code = (
        "import sys\n"
        "from jaxsys_kernel.engine import summaries as S\n"
        "m = S.fake_mesh(S.fake_devices(8, 2), (4, 2), ('x', 'y'))\n"
        "S.mesh_info(m); S.sharding_info((S.FakeNamedSharding(m, ('x',)), (8, 2)))\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
