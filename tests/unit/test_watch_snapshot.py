"""The owner's live numbers for watchers: written bounded and private, read as untrusted input
(whatever is wrong is said in words, never raised), and said stale when the owner stops."""

from __future__ import annotations

import json
import os
import stat
import time
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cells.owner_snapshot import OwnerSnapshot
from jaxsys_kernel.cluster import watch_snapshot as snap
from jaxsys_kernel.cluster.watch import Watched
from jaxsys_kernel.telemetry.schema import CacheStats

pytestmark = pytest.mark.unit

STEPS = {
    "steps_total": 5,
    "step_time": 0.25,
    "named": {"rank": 1, "category": "host"},
    "steps": [
        {"step": i, "last": 1, "late": 0.2, "category": "host", "named": True} for i in range(5)
    ],
}


def good(**changes) -> dict:
    doc = {
        "v": 1,
        "written": time.time(),
        "pid": 1,
        "cache": [
            {"rank": 0, "requests": 4, "hits": 3, "compiles": 1, "shared": 0},
            {"rank": 1, "requests": 4, "hits": 0, "compiles": 4, "shared": 0},
        ],
        "stragglers": STEPS,
        "note": "as of 12:00:00",
    }
    doc.update(changes)
    return doc


def lines(doc, owner_alive=True, now=None) -> str:
    live = snap.parse(json.dumps(doc).encode(), time.time() if now is None else now)
    return "\n".join(snap.describe(live, owner_alive))


def test_a_good_snapshot_shows_hits_misses_steps_and_the_straggler():
    text = lines(good())
    assert "cache (live, from the owner): 3 hits, 5 misses in all" in text
    assert "[p0] hits 3, misses 1, compiled 1" in text
    assert "[p1] hits 0, misses 4, compiled 4" in text
    assert "5 steps, 250.0 ms each on average; straggler: p1 (host)" in text
    assert "step 4: p1 last by 200.0 ms (host)" in text
    assert "stale" not in text


def test_processes_with_equal_numbers_are_shown_as_one_range():
    rows = [{"rank": r, "requests": 2, "hits": 2, "compiles": 0, "shared": 0} for r in range(4)]
    text = lines(good(cache=rows))
    assert "[p0-3] hits 2, misses 0" in text and text.count("hits 2, misses 0") == 1


def test_an_old_snapshot_is_said_stale_with_its_age():
    text = lines(good(written=time.time() - 60))
    assert "stale, written 60 s ago (the owner stopped writing them)" in text
    # What it held is still shown, as it was then.
    assert "3 hits" in text


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (b"{", "not JSON"),
        (b"[1, 2]", "not a version-1 snapshot"),
        (json.dumps(good(v=2)).encode(), "not a version-1 snapshot"),
        (json.dumps(good(written="now")).encode(), "written is not a number"),
        (json.dumps(good(written=float("nan"))).encode(), "written is not a number"),
        (json.dumps(good(cache={"rank": 0})).encode(), "cache is not a list"),
        (json.dumps(good(cache=[{"rank": -1}])).encode(), "rank is not a count"),
        (json.dumps(good(cache=[{"rank": 0, "requests": True}])).encode(), "requests is not"),
        (json.dumps(good(cache=[1] * 2000)).encode(), "at most 1024 processes"),
        (json.dumps(good(stragglers=[])).encode(), "stragglers is not an object"),
        (json.dumps(good(stragglers={**STEPS, "steps": [{}] * 50})).encode(), "at most 8"),
        (json.dumps(good(stragglers={**STEPS, "named": "p1"})).encode(), "named is not"),
        (json.dumps(good(note=7)).encode(), "text field is not text"),
    ],
)
def test_a_malformed_snapshot_is_said_in_words(doc, said):
    live = snap.parse(doc, time.time())
    assert said in live.problem, live.problem
    (line,) = snap.describe(live, True)
    assert line.startswith("live numbers: the owner's snapshot is") and line.endswith("not shown")


def test_an_oversized_file_is_refused_unread(tmp_path):
    path = tmp_path / "big.live"
    path.write_bytes(b" " * (snap.MAX_SNAPSHOT_BYTES + 10) + json.dumps(good()).encode())
    live = snap.read(path)
    assert "larger than" in live.problem and live.cache is None


def test_long_text_is_cut():
    live = snap.parse(json.dumps(good(note="x" * 10_000)).encode(), time.time())
    assert len(live.note) == snap.MAX_TEXT


def test_no_snapshot_says_so(tmp_path):
    assert snap.read(tmp_path / "none.live") is None
    assert snap.describe(None, True) == ["live numbers: none (it publishes none)"]


def test_written_atomically_private_and_bounded(tmp_path):
    path = snap.snapshot_path(tmp_path, "run")
    assert path.name == "run.live"  # never a state file's name (those end in .json)
    assert snap.write(path, good())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.live"]
    assert snap.read(path).cache[0]["hits"] == 3
    # Too large with its rows: written without them, and the watcher says why.
    huge = good(note="", stragglers=None)
    huge["cache"] = [{"rank": r, "x": "y" * 1000} for r in range(400)]
    assert snap.write(path, huge)
    assert os.path.getsize(path) <= snap.MAX_SNAPSHOT_BYTES
    live = snap.read(path)
    assert live.cache is None and live.note == "too large to show"


class FakeHub:
    def __init__(self, busy=False):
        self.busy = busy

    def cache_stats(self):
        return [CacheStats(rank=0, requests=3, hits=2), CacheStats(rank=1, requests=3)]

    def liveness(self):
        return [SimpleNamespace(busy=self.busy), SimpleNamespace(busy=False)]


class FakeCluster:
    """Answers arrivals.records as two processes that do not record steps."""

    ranks = [0, 1]

    def __init__(self, busy=False):
        self.telemetry = FakeHub(busy)
        self.asked = 0

    def call(self, ranks, fn, *args, timeout):
        self.asked += 1
        results = {r: {"on": False, "steps": [], "dropped": 0} for r in ranks}
        return SimpleNamespace(results=results, errors={}, missing=[])


def test_the_owner_writes_its_hub_numbers_every_period(tmp_path):
    path = snap.snapshot_path(tmp_path, "run")
    owner = OwnerSnapshot(FakeCluster(), path, period=2.0)
    owner.tick(now=100.0)
    live = snap.read(path)
    assert [r["hits"] for r in live.cache] == [2, 0]
    assert "not recorded" in "\n".join(snap.describe(live, True))
    before = os.stat(path).st_mtime_ns
    owner.tick(now=101.0)  # within the period: nothing written
    assert os.stat(path).st_mtime_ns == before
    owner.remove()
    assert list(tmp_path.iterdir()) == []


def test_the_owner_asks_busy_processes_nothing(tmp_path):
    cluster = FakeCluster(busy=True)
    OwnerSnapshot(cluster, tmp_path / "run.live").tick(now=100.0)
    assert cluster.asked == 0 and (tmp_path / "run.live").exists()


def test_a_watcher_shows_the_owner_snapshot(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"state": "ready", "pid": os.getpid()}))
    snap.write(snap.snapshot_path(tmp_path, "run"), good())
    text = "\n".join(Watched("run", tmp_path).live_lines())
    assert "3 hits, 5 misses" in text and "straggler: p1 (host)" in text
