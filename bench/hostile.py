"""Hostile input against a real kernel with a 2-process cluster, counted.

What is tried, in one run
-------------------------
1. **Telemetry decoder**: random bytes, random JSON and valid events with one field made
   hostile, fed to a telemetry receiver (``--events`` of them): taken, or dropped with a
   reason; anything else would be a defect.
2. **Magic lines, in-process**: ``--lines`` random lines and lines built from the magics'
   own actions and options with hostile values, against a fake session: a UsageError or
   success, and how long each took to answer.
3. **Magic lines, in the kernel**: a fixed corpus of garbage (bad options and values for
   every action, unclosed quotes, non-finite numbers, lines of 10 KB to 1 MB), each sent
   to the live kernel, timed from request to reply.
4. **Intruders on every listening socket** of the kernel and the cluster, taken from the
   audit: random bytes, HTTP/2, ZeroMQ without a key and with a wrong key, TLS without a
   certificate. Handled means: afterwards the cluster still computes and every listener
   is still there.
5. **A key holder on an engine** sends the malformed events and eight 50 MB events to the
   telemetry socket, ``--rounds`` times: counted by the receiver, and the kernel's memory.

The kernel's RSS is sampled every 50 ms throughout (its peak is printed), and the ratios
(slowest magic answer to the median one; the kernel's RSS after 400 MB of events to before)
come from this one run. Usage: ``python bench/hostile.py [--events N] [--lines N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402

from jaxsys_kernel.telemetry import schema  # noqa: E402
from jaxsys_kernel.telemetry.hub import TelemetryHub  # noqa: E402
from tests.harness import TAG_VAR, kernel_with_cluster, new_tag, wait_no_processes  # noqa: E402
from tests.intruders import (  # noqa: E402
    AUDIT_CELL,
    HEALTH_CELL,
    KEY_HOLDER,
    MALFORMED,
    knock_all,
)

COLLECTIVE = """%%multihost --timeout 60
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils as mu
print('sum', float(mu.process_allgather(jnp.ones(2) * (jax.process_index() + 1)).sum()))
"""
HOSTILE_VALUES = [
    0, -1, 2**70, 1e999, -1e999, float("nan"), True, None, "", "x" * 5000, [], {}, [1.5],
    "\uff11", [1e999], {"a": [1]},
]  # fmt: skip


def random_json(rng: random.Random, depth: int = 0):
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.choice(
            [rng.randrange(-(2**80), 2**80), float(f"{rng.random()}e{rng.randrange(-400, 400)}")]
        )
    if pick in (2, 3, 4):
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(12)))
    if pick in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(random_json(rng, 3)): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def hostile_event(rng: random.Random) -> bytes:
    kind = rng.choice(schema.KINDS)
    ev = schema.event(kind, rng.randrange(2), 1, time.time(), busy=False, devices=[0])
    ev.update(name="x", text="t", peer="1.2.3.4:5", error="e", entries=1, bytes=2)
    ev[rng.choice([*ev, "extra"])] = rng.choice(HOSTILE_VALUES)
    return json.dumps(ev, allow_nan=True).encode()


def fuzz_decoder(n: int, rng: random.Random) -> dict:
    hub = TelemetryHub(2, curve=False)
    makers = {
        "random bytes": lambda: rng.randbytes(rng.randrange(300)),
        "random JSON": lambda: json.dumps(random_json(rng), allow_nan=True).encode(),
        "hostile events": lambda: hostile_event(rng),
    }
    tried: Counter = Counter()
    try:
        for i in range(n):
            kind = list(makers)[i % len(makers)]
            hub._take(makers[kind]())  # never raises: taken or dropped and counted
            tried[kind] += 1
        health = hub.health()
    finally:
        hub.close()
    return {"tried": dict(tried), "taken": health.accepted, "dropped": health.dropped}


def fuzz_magics(n: int, rng: random.Random) -> dict:
    from IPython.testing.globalipapp import start_ipython

    from jaxsys_kernel.magics import actions
    from jaxsys_kernel.magics.magics import JaxSysMagics
    from tests.unit.test_hostile_magics import OPTIONS, VALUES, AnySession, NotFaked

    shell = start_ipython()
    shell.register_magics(JaxSysMagics(shell, AnySession()))
    vocabulary = [*actions.ACTIONS, *OPTIONS, *VALUES]
    outcomes: Counter = Counter()
    times = []
    for i in range(n):
        if i % 4 == 3:
            line = "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(200)))
        else:
            line = " ".join(rng.choice(vocabulary) for _ in range(rng.randrange(8)))
        magic = ("jaxsys", "multihost", "pull")[i % 3]
        t0 = time.monotonic()
        try:
            with quiet_stdout():
                shell.run_line_magic(magic, line)
            outcomes["ran"] += 1
        except UsageError:
            outcomes["UsageError"] += 1
        except NotFaked:
            outcomes["ran"] += 1  # parsed; the fake session has no answer for it
        except Exception as e:  # noqa: BLE001 - counted: any of these is a defect
            outcomes[f"other: {type(e).__name__}"] += 1
        times.append(time.monotonic() - t0)
    return {"tried": n, "outcomes": dict(outcomes), "times": times}


@contextlib.contextmanager
def quiet_stdout():
    """What the magics print (help pages, %pull's line on stderr) goes nowhere."""
    with open(os.devnull, "w") as null:
        with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
            yield


def kernel_corpus() -> list[str]:
    """Garbage for every action and magic; none of it may do anything but say why."""
    lines = []
    for action in ("start", "kill", "restart", "logs", "inspect", "status", "security"):
        for tail in ("--nope", "--timeout nan", "--hosts 1e309", "x y z", '"x', "p9999", "-1"):
            lines.append(f"%jaxsys {action} {tail}")
    lines += [
        "%jaxsys",
        "%jaxsys nope",
        '%jaxsys "x',
        "%jaxsys 'x",
        "%jaxsys start --hosts \uff12 --devices-per-host 0",
        "%jaxsys kill p",
        "%jaxsys kill 2 --signal HUP",
        "%jaxsys logs 0 --tail -5",
        "%jaxsys logs 0 --tail 9999999999999999999999",
        "%pull",
        "%pull 'x",
        "%pull x --proc 1e3",
        "%multihost maybe",
        "%multihost --timeout inf on",
        "%%multihost --timeout nan\nprint(1)",
        "%%multihost --timeout 1e309\nprint(1)",
        "%%multihost --grace -1\nprint(1)",
        "%%multihost --procs 0-\nprint(1)",
        "%%multihost --on-hang explode\nprint(1)",
        "%%local --opt\nprint(1)",
    ]
    for size in (10_000, 100_000, 1_000_000):
        lines.append("%jaxsys status " + "x" * size)
        lines.append("%%multihost --procs " + "1," * (size // 2) + "\nprint(1)")
    return lines


def run_corpus(k, lines: list[str]) -> dict:
    outcomes: Counter = Counter()
    times = {}
    ran: list[str] = []
    for line in lines:
        t0 = time.monotonic()
        out = k.execute(line, timeout=120)
        times[line] = time.monotonic() - t0
        if out.status == "ok":
            outcomes["ran"] += 1
            ran.append(line)
        else:
            outcomes[out.error.get("ename", "?")] += 1
    # Carrying a long line to the kernel costs time of its own: a comment cell of the same
    # length, side by side, tells it apart from what the magic takes.
    longest = max(lines, key=len)
    t0 = time.monotonic()
    k.execute("#" + "x" * (len(longest) - 1), timeout=120)
    baseline = time.monotonic() - t0
    return {
        "tried": len(lines),
        "outcomes": dict(outcomes),
        "times": times,
        "longest": longest,
        "baseline": baseline,
        "ran": ran,
    }


class PeakRSS:
    """Samples a process's RSS every 50 ms in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def kernel_json(k, code: str) -> dict:
    out = k.execute(code)
    assert out.status == "ok", out.error
    return json.loads(out.stdout.strip().splitlines()[-1])


def intruders(k) -> dict:
    before = kernel_json(k, AUDIT_CELL)
    addresses = [e["address"] for e in before["audit"] if e["name"] != "Jupyter server"]
    t0 = time.monotonic()
    attempts = knock_all(addresses)
    took = time.monotonic() - t0
    computes = k.execute(COLLECTIVE).stdout == "[p0-1] sum 6.0\n"
    after = kernel_json(k, AUDIT_CELL)
    still = set(after["os"]) >= set(before["os"])
    return {
        "sockets": len(addresses),
        "tried": Counter(a.kind for a in attempts),
        "outcomes": Counter(a.outcome for a in attempts),
        "handled": len(attempts) if computes and still else 0,
        "seconds": took,
    }


def key_holder(k, rounds: int) -> dict:
    kernel = psutil.Process(k.pid)
    before = kernel_json(k, HEALTH_CELL)["health"]
    rss_before = kernel.memory_info().rss
    for _ in range(rounds):
        out = k.execute(KEY_HOLDER.format(malformed=MALFORMED), timeout=300)
        assert "[p1] sent" in out.stdout, out.error
    want = sum(before["dropped"].values()) + rounds * len(MALFORMED)
    deadline = time.monotonic() + 30
    while True:
        now = kernel_json(k, HEALTH_CELL)
        if sum(now["health"]["dropped"].values()) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {
        "malformed": rounds * len(MALFORMED),
        "huge": rounds * 8,
        "dropped": sum(now["health"]["dropped"].values()) - sum(before["dropped"].values()),
        "closed": now["health"]["disconnects"] - before["disconnects"],
        "live": now["live"],
        "rss_before": rss_before,
        "rss_after": kernel.memory_info().rss,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--lines", type=int, default=3_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    rng = random.Random(20260)
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    t0 = time.monotonic()
    dec = fuzz_decoder(args.events, rng)
    dec_s = time.monotonic() - t0
    mag = fuzz_magics(args.lines, rng)

    tag = new_tag()
    os.environ[TAG_VAR] = tag
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as k:
        peak = PeakRSS(k.pid)
        rss_start = psutil.Process(k.pid).memory_info().rss
        corpus = run_corpus(k, kernel_corpus())
        intr = intruders(k)
        keys = key_holder(k, args.rounds)
        computes = k.execute(COLLECTIVE).stdout == "[p0-1] sum 6.0\n"
        peak_rss = peak.stop()
    left = wait_no_processes(tag, timeout=15)
    report(dec, dec_s, mag, corpus, intr, keys, computes, rss_start, peak_rss, left)
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if computes and not left else 1


def report(dec, dec_s, mag, corpus, intr, keys, computes, rss_start, peak_rss, left) -> None:
    mib = 1 << 20
    taken, dropped = dec["taken"], sum(dec["dropped"].values())
    print(f"\ntelemetry decoder: {sum(dec['tried'].values())} inputs in {dec_s:.1f} s")
    print(f"  tried: {dec['tried']}")
    print(f"  taken {taken}, dropped {dropped} (by reason: {dict(sorted(dec['dropped'].items()))})")
    print(f"  unaccounted: {sum(dec['tried'].values()) - taken - dropped}")
    times = mag["times"]
    print(f"\nmagic lines in-process: {mag['tried']} tried; {mag['outcomes']}")
    print(
        f"  answer time: median {statistics.median(times) * 1e3:.2f} ms, "
        f"slowest {max(times) * 1e3:.1f} ms (ratio {max(times) / statistics.median(times):.0f}x)"
    )
    ktimes = corpus["times"]
    slowest = max(ktimes, key=ktimes.get)
    median = statistics.median(ktimes.values())
    print(f"\nmagic lines in the kernel: {corpus['tried']} tried; {corpus['outcomes']}")
    print(f"  the ones that ran (valid after all): {[line[:60] for line in corpus['ran']]}")
    print(
        f"  round trip: median {median * 1e3:.0f} ms, slowest {ktimes[slowest] * 1e3:.0f} ms "
        f"for a {len(slowest)}-character line (ratio {ktimes[slowest] / median:.1f}x)"
    )
    longest = corpus["longest"]
    print(
        f"  the longest line ({len(longest)} characters): {ktimes[longest] * 1e3:.0f} ms; a "
        f"comment cell of the same length: {corpus['baseline'] * 1e3:.0f} ms "
        f"(ratio {ktimes[longest] / corpus['baseline']:.2f})"
    )
    print(f"\nintruders: {sum(intr['tried'].values())} on {intr['sockets']} listening sockets")
    print(f"  tried: {dict(intr['tried'])}; how the ports answered: {dict(intr['outcomes'])}")
    print(f"  handled (cluster computes, every listener still there): {intr['handled']}")
    print(f"\nkey holder on p1: {keys['malformed']} malformed and {keys['huge']} events of 50 MB")
    print(
        f"  dropped and counted {keys['dropped']}; connections closed by ZeroMQ "
        f"{keys['closed']} (an oversized message closes its sender's connection, with what "
        f"was queued behind it); liveness afterwards {keys['live']}"
    )
    ratio = keys["rss_after"] / keys["rss_before"]
    print(
        f"  kernel RSS {keys['rss_before'] / mib:.0f} MiB before, {keys['rss_after'] / mib:.0f} "
        f"MiB after {keys['huge'] * 50} MB sent (ratio {ratio:.2f})"
    )
    print(
        f"\nkernel memory: {rss_start / mib:.0f} MiB at start, peak {peak_rss / mib:.0f} MiB "
        f"(ratio {peak_rss / rss_start:.2f}); the cluster computes at the end: {computes}; "
        f"processes left over: {len(left)}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
