"""Train the example language model through faults; compare with an undisturbed run.

What is measured, in one run
----------------------------
A reference run trains ``--steps`` steps without a fault. Then, per trial and fault kind, the
same training starts from an empty checkpoint directory and, at a random step, one random
process gets:

* ``kill``: SIGKILL (the process dies; the others wait in a collective),
* ``term``: SIGTERM, a preemption notice (JAX's sync point makes every process save the same
  step and return),
* ``stop``: SIGSTOP (alive but stuck: JAX's heartbeat timeout, ``--heartbeat``, declares it
  dead, the others fail, and the hang policy names it stuck),
* ``kill0``: SIGKILL to process 0, which hosts the coordination service (every process ends).

jaxsys then restarts the world and the same call resumes from the latest checkpoint. Per fault
kind the script prints: **detected** (seconds from the signal to the cell being judged failed,
after ``--grace``, or to the preemption save, or to the cell's end when no process is left), **restart** (the world's restart, seconds),
**next good step** (seconds from detection to the first step the resumed run prints: the
restart, the imports, the restore and the first compiled step), **recomputed** (steps done before the fault that the resume does
again), whether the final parameters and optimizer state are **bitwise equal** to the
reference, **goodput** (the reference's seconds for the steps over the wall seconds from the
faulty run's start to the resumed run's end, restart included), and the load average. It also prints the steps per second of the reference.

Usage: ``python bench/recovery.py [--trials N] [--hosts H --devices D] [--steps S --every K]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel import cells as executor  # noqa: E402

SETUP = "import json, os, time, jax\nfrom jaxsys_kernel.examples import train\n"
# Process 0 leaves a mark after each step, so that the fault lands after a chosen step.
TRAIN = """def _mark(s):
    if jax.process_index() == 0:
        open(os.path.join({marks!r}, str(s)), "w").close()
r = train.train({steps}, {ckpt!r}, every={every}, log_every=1, after_step=_mark)
r = {{k: r[k] for k in ("step", "start", "preempted", "fingerprint")}}
print("RESULT", jax.process_index(), json.dumps(r))
"""
STEP = re.compile(r"step (\d+) loss")
SIGNALS = {
    "kill": signal.SIGKILL,
    "term": signal.SIGTERM,
    "stop": signal.SIGSTOP,
    "kill0": signal.SIGKILL,
}
WAIT_LIMIT = 120.0


class Timed(executor.Sink):
    """Keeps the output, and the time each step was first printed."""

    def __init__(self):
        super().__init__()
        self.text = ""
        self.steps: dict[int, float] = {}
        self.saved_at: float | None = None

    def stdout(self, text):
        now = time.monotonic()
        self.text += text
        for m in STEP.finditer(text):
            self.steps.setdefault(int(m[1]), now)
        if self.saved_at is None and "preempted: saved step" in text:
            self.saved_at = now

    stderr = stdout


def results(text: str) -> dict[int, dict]:
    return {int(m[1]): json.loads(m[2]) for m in re.finditer(r"RESULT (\d+) (\{.*\})", text)}


def train_cell(cluster, args, ckpt: str, marks: str, judged: list) -> tuple[Timed, object]:
    sink = Timed()
    code = TRAIN.format(steps=args.steps, ckpt=ckpt, every=args.every, marks=marks)

    def on_hang(_run):
        # Stop waiting: the trial restarts the world (a stopped process never answers).
        judged.append(time.monotonic())
        return "restart"

    run = executor.execute(
        cluster, code, sink=sink, timeout=WAIT_LIMIT, grace=args.grace, on_hang=on_hang
    )
    return sink, run


def fault_at(cluster, marks: str, step: int, rank: int, sig: int, sent: list) -> None:
    """Send ``sig`` to process ``rank`` once process 0 has finished ``step``."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not os.path.exists(os.path.join(marks, str(step))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)
    os.kill(cluster.processes[rank].pid, sig)
    sent.append(time.monotonic())


def fresh_world(cluster) -> float:
    """Restart the world and import the program again; the restart's seconds."""
    took = cluster.restart_sync()
    executor.raise_for_run(executor.execute(cluster, SETUP, sink=Timed()))
    return took


def reference(cluster, args, tmp: str) -> tuple[str, float]:
    """The undisturbed run's fingerprint and its steps per second after the first step."""
    marks = tempfile.mkdtemp(dir=tmp)
    sink, run = train_cell(cluster, args, os.path.join(tmp, "reference"), marks, [])
    executor.raise_for_run(run)
    got = results(sink.text)
    assert len({r["fingerprint"] for r in got.values()}) == 1, sink.text
    t = sink.steps
    rate = (args.steps - 1) / (t[args.steps] - t[1])
    return got[0]["fingerprint"], rate


def trial(cluster, args, kind: str, ref: str, tmp: str) -> dict:
    """One fault of ``kind`` at a random step, the restart, and the resume."""
    # JAX's preemption sync point counts one run's steps per world: each run gets a new one.
    fresh_world(cluster)
    ckpt, marks = tempfile.mkdtemp(dir=tmp), tempfile.mkdtemp(dir=tmp)
    # In the first half; a preemption notice in the first quarter, since JAX's sync point
    # takes up to about 1.4 s to be agreed (measured), and a run that ends first saves its
    # last step as usual, never having been preempted (counted as "notice too late").
    at = random.randint(2, max(2, args.steps // (4 if kind == "term" else 2)))
    rank = random.randrange(len(cluster.processes))
    sig = SIGNALS[kind]
    if kind == "kill0":
        rank = 0
    sent: list[float] = []
    judged: list[float] = []
    # A daemon: an interrupted run does not wait out its bounded wait for the mark.
    sender = threading.Thread(
        target=fault_at, args=(cluster, marks, at, rank, sig, sent), daemon=True
    )
    sender.start()
    t_start = time.monotonic()
    sink, _run = train_cell(cluster, args, ckpt, marks, judged)
    ended = time.monotonic()
    sender.join()
    detected = sink.saved_at if kind == "term" else (judged[0] if judged else ended)
    before = max(sink.steps, default=0)
    same_step = None
    if kind == "term":
        got = results(sink.text)
        steps = {r["step"] for r in got.values() if r["preempted"]}
        same_step = len(steps) == 1 and len(got) == len(cluster.processes)
        if not steps and sent:
            same_step = "notice too late"
    restart = fresh_world(cluster)
    resumed, run = train_cell(cluster, args, ckpt, tempfile.mkdtemp(dir=tmp), [])
    executor.raise_for_run(run)
    wall = time.monotonic() - t_start
    got = results(resumed.text)
    start = got[0]["start"]
    first = min(resumed.steps.values(), default=None)
    return {
        "step": at,
        "rank": rank,
        "detect": None if detected is None or not sent else detected - sent[0],
        "next_good": None if detected is None or first is None else first - detected,
        "restart": restart,
        "recomputed": max(0, before - start),
        "equal": all(r["fingerprint"] == ref for r in got.values()),
        "same_step": same_step,
        "wall": wall,
    }


def summary(kind: str, rows: list[dict], productive: float) -> str:
    """One line per fault kind; ``productive``: the reference's seconds for the steps."""

    def stat(key):
        vals = sorted(r[key] for r in rows if r[key] is not None)
        return f"{vals[len(vals) // 2]:.2f} ({max(vals):.2f})" if vals else "-"

    equal = sum(r["equal"] for r in rows)
    line = (
        f"{kind:5} trials {len(rows)}, median (max):  detected {stat('detect')} s  "
        f"restart {stat('restart')} s  next good step {stat('next_good')} s  recomputed <= "
        f"{max(r['recomputed'] for r in rows)} steps  bitwise equal {equal}/{len(rows)}"
        f"  goodput >= {min(productive / r['wall'] for r in rows):.2f}"
        f"  next good step <= 5 s: {sum(r['next_good'] is not None and r['next_good'] <= 5 for r in rows)}"
        f"/{len(rows)}"
    )
    if kind == "term":
        # Counted only when every process stopped at the sync point, at one step.
        line += f"  same step saved {sum(r['same_step'] is True for r in rows)}/{len(rows)}"
        late = sum(r["same_step"] == "notice too late" for r in rows)
        if late:
            line += f" ({late} ended before the notice took effect)"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1, help="trials per fault kind (default 1)")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--devices", type=int, default=1, help="devices per process")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=5, help="checkpoint interval in steps")
    ap.add_argument("--grace", type=float, default=1.0, help="seconds before a cell is hung")
    ap.add_argument(
        "--kinds", default="kill,term,stop,kill0", help="of kill,term,stop,kill0 (empty: none)"
    )
    ap.add_argument(
        "--heartbeat", type=float, default=3.0, help="JAX's heartbeat timeout (stop's detection)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--spare-world",
        action="store_true",
        help="restart by swapping in a spare world already joined to JAX (else: the standby)",
    )
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(SIGNALS):
        ap.error(f"--kinds takes {','.join(SIGNALS)}, comma-separated (got {args.kinds!r})")
    random.seed(args.seed)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="jaxsys-recovery-") as tmp:
        cluster = Cluster(
            hosts=args.hosts,
            devices_per_host=args.devices,
            heartbeat_timeout=args.heartbeat,
            spare_world=args.spare_world,
            progress=lambda e: None,
        )
        cluster.start_sync()
        try:
            executor.raise_for_run(executor.execute(cluster, SETUP, sink=Timed()))
            ref, rate = reference(cluster, args, tmp)
            path = "spare world" if args.spare_world else "standby"
            print(f"{args.hosts} x {args.devices}: {rate:.1f} steps/s (reference, after step 1); "
                  f"restarts from the {path}")  # fmt: skip
            for kind in kinds:
                rows = [trial(cluster, args, kind, ref, tmp) for _ in range(args.trials)]
                for r in rows:
                    print(f"  {kind} {r}")
                print(summary(kind, rows, args.steps / rate))
        finally:
            cluster.kill()
    left = [p.pid for p in psutil.Process().children(recursive=True)]
    print(f"processes left: {len(left)}")
    print(f"load average: start {load0[0]:.2f}, end {os.getloadavg()[0]:.2f} (2-core machine)")


if __name__ == "__main__":
    main()
