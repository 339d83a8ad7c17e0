"""Mesh and sharding summaries: pure layouts, real JAX (in a subprocess), and scale.

Real JAX runs in a child process with 8 host devices, so this pytest process never gets a JAX
backend; the child prints JSON that is compared with the pure-Python ``block_layout``.
"""

from __future__ import annotations

import json
import math
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
