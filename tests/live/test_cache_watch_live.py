"""Compilation-cache accounting: per-process numbers, entry records, the text of %jaxsys cache.

The numbers are checked event by event here; a real JAX process (a child, one per module)
checks what the engine's watch makes of JAX's own events and log records: a hit's saving is
the entry's original compile time, an entry below the threshold is not written and says why,
and an entry made by another jaxlib shows up as the reason for a miss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jaxsys_kernel.telemetry import schema

# -- the watch in a real JAX process ------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    from jaxsys_kernel.engine import cache, cache_dir

    from jaxsys_kernel.telemetry import schema

    events = []
    class Agent:  # sends what the real agent sends, decoded as the kernel decodes it
        rank = 0
        @staticmethod
        def send(kind, **kw):
            raw = json.dumps(schema.event(kind, 0, 0, 0.0, **kw)).encode()
            events.append(schema.decode(raw))
    watch = cache.install(Agent)
    mode = sys.argv[2]

    def step(x):
        for _ in range(30):
            x = jnp.tanh(x @ x.T @ x + 1.0)
        return x

    x = jnp.ones((8, 8))
    if mode == "record-other-jaxlib":
        # Pretend an older jaxlib wrote this module's entry under its own key.
        cache_dir.write_record(sys.argv[1], "jit_step-0ld", {"jaxlib": "0.0.1", "written": 0})
    if mode == "other-jaxlib-next-door":
        # As in the default layout, one directory per version: the old one beside this one.
        import pathlib
        old = pathlib.Path(sys.argv[1]).parent / "jaxlib-0.0.2"
        cache_dir.write_record(old, "jit_step-0ld", {"jaxlib": "0.0.2", "written": 0})
    if mode == "high-threshold":
        cache.set_thresholds(min_compile_secs=600)
    jax.jit(step)(x).block_until_ready()
    print(json.dumps({"events": events, "describe": cache.describe(), "entries": cache.list_entries()}))
    """
)


def run_child(directory, mode):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(directory))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # JAX's cache records must not reach the process's output while jaxsys explains them.
    assert "PERSISTENT COMPILATION CACHE MISS" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_accounting_never_failed(runs):
    for name, out in runs.items():
        assert out["describe"]["errors"] == 0, (name, out["describe"]["last_error"])


def compiles(out):
    """The compile requests of ``step`` (jnp.ones compiles a program of its own)."""
    return [
        e for e in out["events"] if e["kind"] == schema.CACHE_COMPILE and e["module"] == "jit_step"
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Cold, warm, below the threshold, and after another jaxlib's entry, in fresh processes."""
    warm_dir = tmp_path_factory.mktemp("cache")
    cold = run_child(warm_dir, "plain")
    warm = run_child(warm_dir, "plain")
    high = run_child(tmp_path_factory.mktemp("cache"), "high-threshold")
    other = run_child(tmp_path_factory.mktemp("cache"), "record-other-jaxlib")
    versions = tmp_path_factory.mktemp("versions")
    next_door = run_child(versions / "jaxlib-0.12", "other-jaxlib-next-door")
    return {"cold": cold, "warm": warm, "high": high, "other": other, "next_door": next_door}


def test_a_hit_saves_the_original_compile_time(runs):
    (cold,) = compiles(runs["cold"])
    (warm,) = compiles(runs["warm"])
    assert cold["outcome"] == "compiled" and cold["written"] and cold["compile_secs"] > 0
    assert cold["reason"].startswith("no entry for jit_step yet; written to the cache")
    assert warm["outcome"] == "hit" and warm["measured"]
    assert warm["saved"] == pytest.approx(cold["compile_secs"])  # float, not whole seconds
    assert warm["key"] == cold["key"]
    (entry,) = [e for e in runs["warm"]["entries"]["entries"] if e["module"] == "jit_step"]
    assert entry["compile_secs"] == pytest.approx(cold["compile_secs"]) and entry["jaxlib"]
    assert runs["warm"]["describe"]["outcomes"]["compiled"] == 0


def test_an_entry_below_the_minimum_compile_time_is_not_written(runs):
    (c,) = compiles(runs["high"])
    assert c["outcome"] == "compiled" and not c["written"]
    assert (
        "not written: its compile took" in c["reason"] and "below the 600 s minimum" in c["reason"]
    )
    assert not [e for e in runs["high"]["entries"]["entries"] if e["module"] == "jit_step"]
    config = [e for e in runs["high"]["events"] if e["kind"] == schema.CACHE_CONFIG]
    assert config[-1]["min_compile_secs"] == 600.0


def test_another_jaxlibs_entry_is_the_reason_for_a_miss(runs):
    (c,) = compiles(runs["other"])
    assert c["reason"].startswith(
        "entries for jit_step were made by jaxlib 0.0.1; this process runs"
    )
    (c,) = compiles(runs["next_door"])
    assert c["reason"].startswith("entries for jit_step were made by jaxlib 0.0.2")
    misses = runs["other"]["describe"]["misses"]
    assert misses and misses[-1]["cache"] == "persistent" and "0.0.1" in misses[-1]["reason"]

