"""The straggler rule on busy machines: noise names no one, a real 200 ms delay is named.

On a machine with fewer cores than processes, a collective releases every process at once
but they wake one after another; each starts its next step when it wakes, so the last to
wake arrives last at the next collective, by tens of milliseconds, without losing any time
of its own. :func:`released` plays that (each process's step starts when it woke from the
previous one, as the engine's recorder stamps it); ``tests/data/arrivals-8-processes.json``
holds records of real 8-process runs on 2 busy cores, three of them undisturbed runs where
the last arrivals were late by 20 to 60 ms, each time at the start.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from jaxsys_kernel.cells.stragglers import Stragglers

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parent.parent / "data" / "arrivals-8-processes.json"
TRIALS = json.loads(RECORDED.read_text())["trials"]
DEVICE = 0.05  # seconds of device work per step after the last arrival


def released(nprocs, steps, seed, slow=None, where="host", delay=0.2, wake=0.06):
    """Records of ``steps`` steps where every process wakes up to ``wake`` s after the
    collective released it (and after the cell began), in a new random order each time;
    ``slow`` loses ``delay`` s before each dispatch, as ``%jaxsys slow --in where`` does,
    or with ``where="start"`` after each collective, as a slow tail of its step would."""
    rng = random.Random(seed)
    start = {r: 1000.0 + rng.uniform(0, wake) for r in range(nprocs)}
    out = []
    for s in range(steps):
        rows = {}
        for r in range(nprocs):
            late = delay if r == slow else 0.0
            inp = 0.005 + (late if where == "input" else 0.0)
            before = inp + 0.002 + (late if where == "host" else 0.0)
            compute = late if where == "compute" else 0.0
            rows[r] = (start[r] + before, inp, compute)
        released_at = max(d + c for d, _, c in rows.values()) + DEVICE
        for r, (dispatch, inp, compute) in rows.items():
            end = (
                released_at + rng.uniform(0, wake) + (delay if (r, where) == (slow, "start") else 0)
            )
            rec = {"kind": "step", "step": s, "start": start[r], "dispatch": dispatch}
            rec.update(end=end, input=inp, compile=0.0, compute=compute)
            out.append((r, rec))
            start[r] = end
    return out


def view_of(nprocs, records, offsets=None, errors=None):
    view = Stragglers(range(nprocs), offsets, errors)
    for r, rec in records:
        view.add(r, rec)
    return view


@pytest.mark.parametrize("nprocs", [2, 8, 32])
def test_processes_waking_in_turn_name_no_one(nprocs):
    named = [view_of(nprocs, released(nprocs, 5, seed)).named() for seed in range(200)]
    assert named.count(None) == 200, [n for n in named if n]


def test_waking_in_turn_is_no_step_of_its_own():
    # Every step's last arrival is late against the others' median, yet none is named.
    view = view_of(8, released(8, 50, seed=7))
    assert max(f.late for f in view.findings) > 0.03
    assert not any(f.named for f in view.findings)


@pytest.mark.parametrize("where", ["host", "input", "compute"])
@pytest.mark.parametrize("nprocs", [2, 8, 32])
def test_a_200_ms_delay_among_the_noise_is_named_within_5_steps(nprocs, where):
    for seed in range(50):
        slow = seed % nprocs
        view = view_of(nprocs, released(nprocs, 5, seed, slow=slow, where=where))
        assert view.named(5) == (slow, where), (seed, [(f.last, f.category) for f in view.findings])


def test_a_process_that_ends_each_step_200_ms_after_the_others_is_named_in_start():
    # Later than every other process's wake-up by far: that late start is its own.
    assert view_of(4, released(4, 6, seed=3, slow=2, where="start")).named() == (2, "start")


@pytest.mark.parametrize(
    "t",
    TRIALS,
    ids=[f"p{t['slow']}-{t['where']}" if t["slow"] is not None else "undisturbed" for t in TRIALS],
)
def test_recorded_runs_on_2_cores(t):
    offsets = {int(r): o for r, (o, _) in t["offsets"].items()}
    errors = {int(r): e for r, (_, e) in t["offsets"].items()}
    records = [(int(r), rec) for r, steps in t["records"].items() for rec in steps]
    view = view_of(len(offsets), records, offsets, errors)
    want = None if t["slow"] is None else (t["slow"], t["where"])
    assert view.named(5) == want, [(f.last, f.category, round(f.late, 3)) for f in view.findings]
