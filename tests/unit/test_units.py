"""Pure logic: process ranges, line collation, SPMD cell routing. No processes started."""

from __future__ import annotations

import pytest

from jaxsys_kernel._ranges import format_procs, parse_procs
from jaxsys_kernel.cells.collate import LineCollator
from jaxsys_kernel.magics.session import MultihostSession, is_local_cell, make_spmd_transformer


@pytest.mark.parametrize(
    "text,n,expected",
    [("0,2-3", 4, [0, 2, 3]), ("all", 3, [0, 1, 2]), ("1", 2, [1]), (" 3-3 , 0", 4, [0, 3])],
)
def test_parse_procs(text, n, expected):
    assert parse_procs(text, n) == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("4", "outside"),
        ("a", "bad process"),
        ("3-1", "start is after end"),
        ("", "empty"),
        ("0;1", "bad"),
    ],
)
def test_parse_procs_errors(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_procs(text, 4)


def test_format_procs():
    assert format_procs([3, 0, 1, 2]) == "p0-3"
    assert format_procs([0, 2, 3]) == "p0,2-3"
    assert format_procs([5]) == "p5"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(procs, **kw):
    out: list[str] = []
    clock = Clock()
    c = LineCollator(procs, out.append, clock=clock, window=0.1, **kw)
    return c, out, clock


def test_identical_lines_once():
    c, out, _ = make([0, 1, 2, 3])
    for p in range(4):
        c.feed(p, "hello\n")
    assert "".join(out) == "[p0-3] hello\n"


def test_differing_lines_in_process_order():
    c, out, _ = make([0, 1, 2])
    for p in (2, 0, 1):
        c.feed(p, f"rank {p}\n")
    assert "".join(out) == "[p0] rank 0\n[p1] rank 1\n[p2] rank 2\n"


def test_partial_groups_merge():
    c, out, _ = make([0, 1, 2, 3])
    for p in range(4):
        c.feed(p, "even\n" if p % 2 == 0 else "odd\n")
    assert "".join(out) == "[p0,2] even\n[p1,3] odd\n"


def test_line_waits_for_others_then_window_expires():
    c, out, clock = make([0, 1])
    c.feed(0, "only me\n")
    c.pump()
    assert out == []  # process 1 is still running and may print the same line
    clock.t = 0.2
    c.pump()
    assert "".join(out) == "[p0] only me\n"


def test_finished_process_does_not_hold_lines():
    c, out, _ = make([0, 1])
    c.finish(1)
    c.feed(0, "late\n")
    assert "".join(out) == "[p0] late\n"


def test_partial_line_completed_by_later_chunk():
    c, out, _ = make([0, 1])
    c.feed(0, "hel")
    c.feed(1, "hello\n")
    c.feed(0, "lo\n")
    assert "".join(out) == "[p0-1] hello\n"


def test_flush_emits_unterminated_lines():
    c, out, _ = make([0, 1])
    c.feed(0, "no newline")
    c.flush()
    assert "".join(out) == "[p0] no newline\n"


def test_no_collate_labels_every_line():
    c, out, _ = make([0, 1], collate=False)
    c.feed(1, "a\nb\n")
    c.feed(0, "a\n")
    assert "".join(out) == "[p1] a\n[p1] b\n[p0] a\n"


def test_many_lines_keep_order_per_process():
    c, out, _ = make([0, 1])
    c.feed(0, "".join(f"{i}\n" for i in range(5)))
    c.feed(1, "".join(f"{i}\n" for i in range(5)))
    assert "".join(out) == "".join(f"[p0-1] {i}\n" for i in range(5))


@pytest.mark.parametrize(
    "code,local",
    [
        ("%%local\nx = 1", True),
        ("%jaxsys status", True),
        ("# comment\n%pull x", True),
        ("%multihost off", True),
        ("x = 1", False),
        ("import jax\n%jaxsys status", False),
        ("", True),
    ],
)
def test_is_local_cell(code, local):
    assert is_local_cell(code) is local


def test_spmd_transformer_routes_cells():
    s = MultihostSession()
    t = make_spmd_transformer(s)
    assert t(["x = 1\n"]) == ["x = 1\n"]
    s.spmd = True
    assert t(["x = 1\n"]) == ["%%multihost\n", "x = 1\n"]
    assert t(["%%local\n", "y = 2\n"]) == ["y = 2\n"]
    assert t(["%jaxsys status\n"]) == ["%jaxsys status\n"]
    assert t(["jnp.sum??\n"]) == ["%jaxsys inspect jnp.sum --detail 1\n"]


def test_drop_pattern_discards_noise():
    import re

    out: list[str] = []
    c = LineCollator([0], out.append, drop=re.compile(r"\[Gloo\] Rank \d+\."))
    c.feed(0, "[Gloo] Rank 1.\nreal\n")
    assert "".join(out) == "[p0] real\n"


def test_interleaved_noise_leaves_no_empty_line():
    from jaxsys_kernel.cells import NATIVE_NOISE

    out: list[str] = []
    c = LineCollator([0], out.append, drop=NATIVE_NOISE)
    # Two gloo threads, each writing its message and then its newline.
    msg = (
        "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
    )
    c.feed(0, msg + msg + "\n")
    c.feed(0, "\nreal\n\nkept empty line above\n")
    # gloo writing into the middle of the cell's own line: the line survives, noise cut out.
    c.feed(
        0, msg + "total 6.0\n" + "1 peer ranks. Expected number of connected peer ranks is : 1\n"
    )
    c.flush()
    assert "".join(out) == "[p0] real\n[p0] \n[p0] kept empty line above\n[p0] total 6.0\n"


def test_gloo_chatter_is_dropped_even_when_split():
    from jaxsys_kernel.cells import NATIVE_NOISE

    assert NATIVE_NOISE.match(
        "[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"
    )
    assert NATIVE_NOISE.match("1 peer ranks. Expected number of connected peer ranks is : 1")
    assert not NATIVE_NOISE.match("loss 0.25")


def test_env_pairs():
    from IPython.core.error import UsageError

    from jaxsys_kernel.magics.magics import _env_pairs

    assert _env_pairs(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        _env_pairs(["novalue"])


def test_telemetry_listens_where_engines_can_reach_it():
    import socket

    from jaxsys_kernel.cluster.cluster import telemetry_addresses

    assert telemetry_addresses("local", None) == ("127.0.0.1", "127.0.0.1")
    assert telemetry_addresses("ssh", "10.0.0.1") == ("10.0.0.1", "10.0.0.1")
    # Bound everywhere, but never advertised as 0.0.0.0: to an engine that is its own host.
    assert telemetry_addresses("ssh", None) == ("0.0.0.0", socket.gethostname())
    assert telemetry_addresses("slurm", "*") == ("0.0.0.0", socket.gethostname())


def test_launcher_options_must_exist():
    from jaxsys_kernel import Cluster

    Cluster(hosts=["a", "b"], launcher="ssh", launcher_options={"ssh_args": ["-p", "2222"]})
    with pytest.raises(ValueError, match="ssh_arg is not a setting of ipyparallel's SSH.*ssh_args"):
        Cluster(hosts=["a", "b"], launcher="ssh", launcher_options={"ssh_arg": ["-p", "2222"]})
    with pytest.raises(ValueError, match="apply to the ssh, mpi, slurm and kubernetes launchers"):
        Cluster(hosts=2, launcher_options={"ssh_args": []})
