"""Compilation-cache accounting: per-process numbers, entry records, the text of %jaxsys cache.

The numbers are checked event by event here; a real JAX process (a child, one per module)
checks what the engine's watch makes of JAX's own events and log records: a hit's saving is
the entry's original compile time, an entry below the threshold is not written and says why,
and an entry made by another jaxlib shows up as the reason for a miss.
"""

from __future__ import annotations

import json
import os
import re
import zlib

import pytest

from jaxsys_kernel.engine import cache_dir
from jaxsys_kernel.magics.actions_cache import (
    format_entries,
    format_process,
    format_thresholds,
    saved_text,
)
from jaxsys_kernel.telemetry import schema
from jaxsys_kernel.telemetry.schema import CacheStats

from ..fakes import NoClusterSession


def ev(kind, **fields):
    return schema.decode(json.dumps(schema.event(kind, 0, 0, 0.0, **fields)).encode())


def monitoring(name):
    return ev(schema.MONITORING, name=f"/jax/compilation_cache/{name}")


# -- the numbers, event by event ---------------------------------------------------------------


def test_every_outcome_is_counted_once_and_savings_are_never_negative():
    s = CacheStats(rank=0)
    for event in (
        monitoring("compile_requests_use_cache"),
        ev(
            schema.CACHE_COMPILE,
            fun="jit(f)",
            outcome="compiled",
            compile_secs=1.5,
            written=True,
            requested=True,
            reason="no entry for jit_f yet",
        ),
        monitoring("compile_requests_use_cache"),
        monitoring("cache_hits"),
        ev(
            schema.CACHE_COMPILE,
            fun="jit(f)",
            outcome="hit",
            saved=1.5,
            retrieval=0.02,
            measured=True,
        ),
        monitoring("compile_requests_use_cache"),
        monitoring("cache_hits"),
        # An entry jaxsys has no record of: JAX's whole seconds, a lower bound.
        ev(
            schema.CACHE_COMPILE,
            fun="jit(g)",
            outcome="hit",
            saved_at_least=2.0,
            retrieval=0.01,
            measured=False,
        ),
        monitoring("compile_requests_use_cache"),
        ev(schema.CACHE_COMPILE, fun="jit(h)", outcome="shared", seconds=0.7),
        # JAX's own "time saved" event is negative for sub-second entries: never used.
        ev(
            schema.MONITORING, name="/jax/compilation_cache/compile_time_saved_sec", duration=-0.005
        ),
        ev(schema.CACHE_COMPILE, fun="jit(k)", outcome="compiled", compile_secs=0.2),
    ):
        s.apply(event)
    assert (s.requests, s.hits, s.misses, s.shared, s.compiles) == (4, 2, 2, 1, 2)
    assert s.compile_time == pytest.approx(1.7)  # compiles only: no hit, no wait
    assert s.wait_time == pytest.approx(0.7)
    assert s.time_saved == pytest.approx(1.5) and s.time_saved_at_least == 2.0
    assert s.unmeasured_hits == 1 and s.written == 1
    assert s.retrieval_time == pytest.approx(0.03)
    assert s.last_misses == ["jit(f): no entry for jit_f yet"]
    assert s.last_functions[0] == "jit(k)"
    assert saved_text(s).startswith(">= 3.50 s (1 hit(s) on entries jaxsys has no record of)")


def test_config_and_tracing_misses():
    s = CacheStats(rank=1)
    s.apply(
        ev(
            schema.CACHE_CONFIG,
            dir="/c",
            min_compile_secs=0.0,
            min_entry_bytes=-1.0,
            served=False,
            why_not="not served by the cache: on CPU, ...",
            jaxlib="0.12",
        )
    )
    s.apply(ev(schema.CACHE_MISS, cache="tracing", fun="nb.py:3", reason="for f: shapes"))
    s.apply(ev(schema.CACHE_MISS, cache="persistent", fun="jit(f)", reason="counted elsewhere"))
    assert (s.cache_dir, s.min_compile_secs, s.min_entry_bytes, s.served) == ("/c", 0.0, -1, False)
    assert s.tracing_misses == 1 and s.last_misses == ["nb.py:3 (tracing): for f: shapes"]
    copy = s.copy()
    copy.last_misses.append("x")
    assert s.last_misses == ["nb.py:3 (tracing): for f: shapes"]
    assert "p1: not served by the cache: on CPU" in format_process(s)


def test_cache_events_with_bad_fields_are_refused():
    bad = schema.event(schema.CACHE_COMPILE, 0, 0, 0.0, outcome="hit", saved="lots")
    with pytest.raises(schema.Malformed, match="saved"):
        schema.decode(json.dumps(bad).encode())
    bad = schema.event(schema.CACHE_CONFIG, 0, 0, 0.0, served="yes")
    with pytest.raises(schema.Malformed, match="served"):
        schema.decode(json.dumps(bad).encode())
    # Unknown fields are dropped, text is bounded.
    got = ev(schema.CACHE_MISS, cache="tracing", reason="r" * 10_000, extra=1)
    assert "extra" not in got and len(got["reason"]) == schema.MAX_TEXT


def test_thresholds_are_shown_per_group_of_processes():
    a = CacheStats(rank=0, min_compile_secs=0.0, min_entry_bytes=-1)
    b = CacheStats(rank=1, min_compile_secs=0.0, min_entry_bytes=-1)
    c = CacheStats(rank=2, min_compile_secs=1.0, min_entry_bytes=4096)
    text = format_thresholds([a, b, c])
    assert (
        "[p0-1] an entry is written when its compile took at least 0 s and it has any size" in text
    )
    assert (
        "[p2] an entry is written when its compile took at least 1 s and it has at least 4096"
        in text
    )


# -- the directory --------------------------------------------------------------------------


def entry_bytes(seconds: int) -> bytes:
    return zlib.compress(seconds.to_bytes(4, "big") + b"executable" * 50)


def test_entries_records_and_clear(tmp_path):
    (tmp_path / "jit_step-aaa-cache").write_bytes(entry_bytes(3))
    (tmp_path / "jit_step-aaa-atime").write_bytes(b"12345678")
    (tmp_path / "jit_loss-bbb-cache").write_bytes(entry_bytes(0))
    (tmp_path / "unrelated.txt").write_text("not ours")
    cache_dir.write_record(
        tmp_path, "jit_step-aaa", {"compile_secs": 3.42, "jaxlib": "0.11.0", "written": 1}
    )
    found = {e["module"]: e for e in cache_dir.entries(tmp_path)}
    assert set(found) == {"jit_step", "jit_loss"}
    assert found["jit_step"]["compile_secs"] == 3.42 and found["jit_step"]["jaxlib"] == "0.11.0"
    assert found["jit_step"]["stored_secs"] == 3
    assert found["jit_loss"]["jaxlib"] is None and found["jit_loss"]["stored_secs"] == 0
    assert [r["key"] for r in cache_dir.records_for(tmp_path, "jit_step")] == ["jit_step-aaa"]
    assert cache_dir.records_for(tmp_path, "jit") == []  # a prefix of another module
    text = format_entries({"entries": list(found.values())}, "0.12.0")
    assert "0.11.0 (this is 0.12.0: never hit)" in text and "3.42 s" in text
    assert "unknown (not written by jaxsys)" in text and "< 1 s" in text
    removed, freed = cache_dir.clear(tmp_path)
    assert removed == 2 and freed > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        cache_dir.meta_dir(tmp_path).name,
        "unrelated.txt",
    ]
    assert cache_dir.entries(tmp_path) == [] and cache_dir.clear(tmp_path) == (0, 0)
    assert cache_dir.clear(tmp_path / "missing") == (0, 0)


# -- one cache per cluster --------------------------------------------------------------------


def test_every_cluster_gets_a_cache_directory_per_user_and_jaxlib(tmp_path, monkeypatch):
    from importlib.metadata import version

    from jaxsys_kernel.cluster import ClusterConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    cfg = ClusterConfig(hosts=2)
    assert cfg.cache_dir == str(
        tmp_path / "jaxsys" / "compilation-cache" / f"jaxlib-{version('jaxlib')}"
    )
    assert os.path.isdir(cfg.cache_dir)
    assert ClusterConfig(hosts=2, cache_dir="none").cache_dir is None
    assert ClusterConfig(hosts=2, cache_dir="~/c").cache_dir == os.path.expanduser("~/c")
    mine = ClusterConfig(hosts=2, env={"JAX_COMPILATION_CACHE_DIR": "/mine"})
    assert mine.cache_dir == "/mine"


@pytest.mark.parametrize(
    "where",
    [
        {"env": {"JAX_SHARE_BINARY_BETWEEN_HOSTS": "1"}},
        {"process_env": {1: {"JAX_SHARE_BINARY_BETWEEN_HOSTS": "true"}}},
    ],
)
def test_the_share_flag_is_refused_on_cpu_clusters(where, monkeypatch):
    from jaxsys_kernel.cluster import ClusterConfig

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    with pytest.raises(ValueError) as err:
        ClusterConfig(hosts=2, **where)
    message = str(err.value)
    assert message.startswith("jax_share_binary_between_hosts is refused on CPU clusters")
    assert "the first collective would hang" in message and "docs/compilation-cache.md" in message
    # Off is fine; so is a cluster whose platform JAX picks on hosts that may have GPUs.
    ClusterConfig(hosts=2, env={"JAX_SHARE_BINARY_BETWEEN_HOSTS": "0"})
    ClusterConfig(hosts=["a", "b"], launcher="ssh", **where)


def test_start_refuses_the_share_flag_with_a_usage_error(monkeypatch):
    from IPython.core.error import UsageError

    from jaxsys_kernel.magics.session import MultihostSession

    monkeypatch.setenv("JAX_SHARE_BINARY_BETWEEN_HOSTS", "1")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    with pytest.raises(UsageError, match="refused on CPU clusters"):
        MultihostSession().start(hosts=2)


# -- %jaxsys cache: bad input -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("cache --min-compile-secs -1", "expected 0 or more seconds, got '-1'"),
        ("cache --min-compile-secs soon", "expected a number of seconds, got 'soon'"),
        ("cache --min-entry-bytes -2", "expected -1 (no minimum) or more bytes, got '-2'"),
        ("cache --min-entry-bytes 1.5", "expected a whole number of bytes, got '1.5'"),
        ("cache empty", "invalid choice: 'empty'"),
        ("cache", "no cluster is running"),
    ],
)
def test_cache_action_refuses_bad_input_with_a_usage_error(line, message):
    from IPython.core.error import UsageError

    from jaxsys_kernel.magics import actions

    with pytest.raises(UsageError, match=re.escape(message)):
        actions.dispatch(NoClusterSession(), line)
