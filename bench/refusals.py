"""How fast the kernel learns that the coordination service refused a connection.

What is measured, in one run
----------------------------
A TLS client without a certificate connects to process 0's coordination service (loopback)
and is refused; the time from opening the connection until ``Cluster.refusals()`` counts it
is taken, ``--rounds`` times. The same cluster then runs a trivial cell while a burst of such
clients knocks, and the cell's output is checked for leaked gRPC trace lines (there must be
none). Target: median <= 0.5 s, worst <= 1 s.

Usage: ``python bench/refusals.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import Cluster  # noqa: E402
from jaxsys_kernel import cells as executor  # noqa: E402
from tests.harness import OutputSink, tls_knock  # noqa: E402

# Measured without a standby: its engines would boot alongside what is measured
# (bench/faults.py measures the standby).
os.environ.setdefault("JAXSYS_STANDBY", "0")

WAIT_LIMIT = 10.0


def attempts(cluster: Cluster) -> int:
    return sum(r["attempts"] for r in cluster.refusals())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    cluster = Cluster(hosts=2, devices_per_host=1, progress=lambda e: None)
    cluster.start_sync()
    latencies = []
    try:
        for _ in range(args.rounds):
            before = attempts(cluster)
            t0 = time.monotonic()
            tls_knock(cluster.coordinator_address)
            while attempts(cluster) == before:
                if time.monotonic() - t0 > WAIT_LIMIT:
                    raise SystemExit(f"a refusal was not reported within {WAIT_LIMIT:g} s")
                time.sleep(0.001)
            latencies.append(time.monotonic() - t0)
        stop = threading.Event()

        def burst() -> None:
            for _ in range(200):
                if stop.is_set():
                    return
                tls_knock(cluster.coordinator_address)

        knocker = threading.Thread(target=burst, daemon=True)
        before = attempts(cluster)
        knocker.start()
        sink = OutputSink()
        run = executor.execute(
            cluster, "import time\nfor i in range(5):\n    print(i)\n    time.sleep(0.1)", sink=sink
        )
        stop.set()
        knocker.join(timeout=30)
        executor.raise_for_run(run)
        time.sleep(0.5)
        during = attempts(cluster) - before
    finally:
        cluster.kill()
    leaked = sink.out != "".join(f"[p0-1] {i}\n" for i in range(5))
    med = statistics.median(latencies)
    print(f"{'measure':36} {'value':>9}")
    print(f"{'knock -> reported, median (s)':36} {med:9.4f}")
    print(f"{'knock -> reported, worst (s)':36} {max(latencies):9.4f}")
    print(f"{'refusals during a 0.5 s cell':36} {during:9d}")
    print(f"{'trace lines leaked into the cell':36} {'yes' if leaked else 'none':>9}")
    print()
    print(
        f"refusals: reported after {med * 1000:.1f} ms median, {max(latencies) * 1000:.1f} ms worst "
        f"over {len(latencies)} knocks (target <= 500 / 1000 ms); cell output "
        f"{'CHANGED' if leaked else 'unchanged'} with {during} refusals during it"
    )
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
