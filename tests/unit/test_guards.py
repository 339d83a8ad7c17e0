"""Transfer/thread guard logic without a cluster: messages, counting, the action's parsing."""

from __future__ import annotations

import argparse

import pytest

from jaxsys_kernel.engine import guards
from jaxsys_kernel.magics import actions_guard

H2D = (
    "INVALID_ARGUMENT: Disallowed host-to-device transfer: aval=ShapedArray(float32[3]), "
    "dst_sharding=SingleDeviceSharding(device=CpuDevice(id=2048), memory_kind=device)"
)
D2D = (
    "INVALID_ARGUMENT: Disallowed device-to-device transfer: aval=ShapedArray(float32[8]), "
    "sharding=SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device), "
    "dst_sharding=SingleDeviceSharding(device=CpuDevice(id=1), memory_kind=device)"
)
D2H = "INVALID_ARGUMENT: Disallowed device-to-host transfer: shape=(8), dtype=F32, device=cpu:0"
MESH = (
    "INVALID_ARGUMENT: Disallowed host-to-device transfer: aval=ShapedArray(int32[4,2]), "
    "dst_sharding=NamedSharding(mesh=Mesh('x': 2, axis_types=(Auto,)), spec=P('x',), "
    "memory_kind=device)"
)


def test_each_kind_is_named_with_shape_dtype_and_devices():
    h2d = guards.describe_transfer(H2D, 1)
    assert h2d.startswith("host-to-device transfer of shape (3), dtype float32, from host")
    assert "to device cpu:2048 disallowed on process 1" in h2d
    d2d = guards.describe_transfer(D2D, 0)
    assert "shape (8), dtype float32, from device cpu:0 to device cpu:1" in d2d
    d2h = guards.describe_transfer(D2H)
    assert "shape (8), dtype float32, from device cpu:0 to host memory" in d2h
    assert guards._numpy_dtype("PRED") == "bool" and guards._numpy_dtype("U8") == "uint8"
    mesh = guards.describe_transfer(MESH)
    assert "shape (4,2), dtype int32" in mesh and "Mesh('x': 2) with P('x',)" in mesh
    assert guards.describe_transfer("ValueError: something else") is None


def test_thread_error_names_both_threads_and_why():
    msg = (
        "FAILED_PRECONDITION: A multi-process JAX operation was called from thread 11. "
        "This is not allowed because the thread guard was set in thread 22."
    )
    text = guards.describe_thread_error(msg, 1, thread="'worker' (id 11)")
    assert "process 1 in thread 'worker' (id 11)" in text
    assert "thread a thread that has ended (id 22)" in text
    assert "different orders" in text
    assert guards.describe_thread_error("no threads here") is None


def test_only_transfer_lines_are_counted():
    guards.counts(reset=True)
    seen = []
    guards.on_count(seen.append)
    try:
        guards.count_line(
            b"W1201 01:52:01.770184   22369 guard_lib.cc:154] host-to-device transfer: aval=x\n"
        )
        guards.count_line(b"W1201 01:52:01.7 1 guard_lib.cc:184] device-to-host transfer: s\n")
        guards.count_line(b"host-to-device transfer: printed by a user\n")
    finally:
        guards.on_count(None)
    assert guards.counts(reset=True) == {
        "host-to-device": 1,
        "device-to-host": 1,
        "device-to-device": 0,
    }
    assert seen[-1] == {"host-to-device": 1, "device-to-host": 1}
    assert guards.counts()["host-to-device"] == 0


def test_settings_level_then_directions():
    assert actions_guard.guard_settings("log", None, "allow", None) == {
        "h2d": "log",
        "d2h": "allow",
        "d2d": "log",
    }
    assert actions_guard.guard_settings(None, "disallow", None, None) == {"h2d": "disallow"}
    with pytest.raises(argparse.ArgumentTypeError, match="choose one of allow, log"):
        actions_guard._level("deny")


def test_bad_level_is_a_usage_error():
    from IPython.core.error import UsageError

    from jaxsys_kernel.magics import actions

    act = actions.lookup("transfer-guard")
    with pytest.raises(UsageError, match="invalid level 'deny'"):
        act.parse(["deny"])


def test_format_groups_processes():
    a = {
        "levels": {"h2d": "log", "d2h": "log", "d2d": "allow"},
        "counts": dict.fromkeys(guards.KINDS, 0),
    }
    b = {**a, "counts": {**a["counts"], "host-to-device": 2}}
    text = actions_guard.format_guard({0: a, 1: a, 2: b})
    assert text.splitlines() == [
        "[p0-1] transfer guard h2d=log d2h=log d2d=allow; logged transfers: 0 h2d, 0 d2h, 0 d2d",
        "[p2] transfer guard h2d=log d2h=log d2d=allow; logged transfers: 2 h2d, 0 d2h, 0 d2d",
    ]


def test_barrier_failure_names_who_never_arrived():
    outcome = {"arrived": [0, 2], "missing": [1, 3], "busy": [3], "waited": {}, "errors": {}}
    text = actions_guard.barrier_failure("ckpt", 5.0, outcome)
    assert text == (
        "barrier 'ckpt' timed out after 5 s: p1,3 never arrived (arrived: p0,2); p3 was still "
        "busy with an earlier request, whose arrival was withdrawn"
    )


def test_barrier_needs_a_name_and_a_positive_timeout():
    from IPython.core.error import UsageError

    from jaxsys_kernel.magics import actions

    act = actions.lookup("barrier")
    with pytest.raises(UsageError, match="timeout"):
        act.parse(["b", "--timeout", "0"])
    assert act.parse(["b", "--timeout", "2.5"]).timeout == 2.5


def test_transfer_counts_travel_as_a_checked_telemetry_event():
    import json

    from jaxsys_kernel.telemetry import schema

    ev = schema.event(schema.TRANSFERS, 1, 0, 1.0, counts={"host-to-device": 6})
    assert schema.decode(json.dumps(ev).encode())["counts"] == {"host-to-device": 6}
    for bad in ({"upload": 1}, {"host-to-device": -1}, {"host-to-device": True}, [1]):
        ev = schema.event(schema.TRANSFERS, 1, 0, 1.0, counts=bad)
        with pytest.raises(schema.Malformed):
            schema.decode(json.dumps(ev).encode())


def test_dashboard_line_only_when_counts_change():
    told: dict = {}
    now = {0: {"host-to-device": 6}, 1: {"host-to-device": 6, "device-to-host": 1}}
    (line,) = actions_guard.transfer_notice(told, now)
    assert line.endswith("transfers logged: [p0] 6 h2d, 0 d2h, 0 d2d; [p1] 6 h2d, 1 d2h, 0 d2d"), (
        line
    )
    assert actions_guard.transfer_notice(told, now) == []
    now[0] = {"host-to-device": 6, "device-to-host": 1}
    (line,) = actions_guard.transfer_notice(told, now)
    assert line.endswith("transfers logged: [p0-1] 6 h2d, 1 d2h, 0 d2d"), line
