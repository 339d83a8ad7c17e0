"""Per-cell dispatch overhead of ``%%multihost`` against raw ``%%px``.

What is measured
----------------
A real jaxsys kernel is started with jupyter_client and driven over the Jupyter protocol,
exactly as a notebook front end would drive it. Inside the kernel a cluster is started with
``%jaxsys start``, and ipyparallel's own ``%%px`` magics are registered on the very same
engines (``cluster.view.activate()``). Then two trivial cells are timed, alternately
(A B A B ..., after a few untimed warm-up cells of each kind)::

    %%multihost          %%px
    x = 1                x = 1

The round trip of one cell runs from just before its ``execute_request`` is sent until both
its ``execute_reply`` (shell channel) and the ``status: idle`` message whose parent is that
request (iopub channel) have arrived. The cell body does almost nothing, so the figure is the
cost of getting a cell to every process and the result back: what jaxsys adds on top of
ipyparallel (output collation, per-process bookkeeping) shows up as the difference between
the two kinds. Alternating the kinds makes slow drift of the machine (other load, thermal
state, garbage) hit both equally.

This is done at 4 processes (2 CPU devices each) and at 8 processes (1 CPU device each, to
keep memory down; the device count does not take part in dispatch), each in a fresh kernel.

Target
------
Median round trip of ``%%multihost`` divided by that of ``%%px``: at most 1.10 at every
process count. The script reports the ratio and never fails on it; it exits non-zero only
when the benchmark itself could not run.

Usage
-----
``python bench/dispatch.py [--quick] [--reps N] [--sizes 4,8]``; ``--quick`` does 10
timed cells of each kind instead of 40.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import statistics
import sys
import tempfile
import time

import psutil
from _procs import reap
from jupyter_client.manager import start_new_kernel

MULTIHOST_CELL = "%%multihost\nx = 1"
PX_CELL = "%%px\nx = 1"
# Uncollated output may run one process's text into the next one's label.
PID_LINE = re.compile(r"pid (\d+)")
# With --broadcast, %%multihost is timed a second time with its cells sent as one message
# through the controller's broadcast scheduler; the switch is flipped in untimed cells.
BROADCAST_SWITCH = "import jaxsys_kernel.cells.send as _send\n_send.BROADCAST = {on}"
TARGET = 1.10
# Dispatch does not depend on the number of devices, so the larger world gets one device
# per process: eight JAX CPU clients with two devices each is memory nobody needs here.
DEVICES_PER_HOST = {4: 2, 8: 1}

CELL_TIMEOUT = 60.0
START_TIMEOUT = 240.0  # a cluster of 8 on two slow cores takes a while to come up
KERNEL_START_TIMEOUT = 60.0


class BenchError(RuntimeError):
    """The benchmark could not run as intended (a cell failed or timed out)."""


def run_cell(kc, code: str, timeout: float = CELL_TIMEOUT) -> tuple[float, dict, list[str]]:
    """Execute ``code`` and return (round trip seconds, reply content, text output).

    Raises BenchError if the reply or the idle status does not arrive within ``timeout``
    seconds, so that a wedged kernel ends the run instead of hanging it.
    """
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    deadline = t0 + timeout
    output: list[str] = []
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise BenchError(f"no idle status within {timeout:g} s for cell {code!r}")
        try:
            msg = kc.get_iopub_msg(timeout=remaining)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            output.append(content["text"])
        elif kind == "display_data":
            # Streaming %%px publishes each engine's output as a display, not a stream.
            output.append(content.get("data", {}).get("text/plain", ""))
        elif kind == "error":
            output.append("\n".join(content.get("traceback") or [content.get("evalue", "")]))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    # ipykernel sends the reply before the idle status, so it is normally already queued
    # and this measures max(reply, idle) to within a queue read.
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise BenchError(f"no execute_reply within {timeout:g} s for cell {code!r}")
        try:
            reply = kc.get_shell_msg(timeout=remaining)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.perf_counter() - t0
    return elapsed, reply["content"], output


def run_ok(kc, code: str, timeout: float = CELL_TIMEOUT) -> tuple[float, str]:
    """Like :func:`run_cell`, but a cell that raised is a BenchError."""
    elapsed, content, output = run_cell(kc, code, timeout)
    text = "".join(output)
    if content.get("status") != "ok":
        raise BenchError(
            f"cell {code!r} failed: {content.get('ename')}: {content.get('evalue')}\n{text}"
        )
    return elapsed, text


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile; q in [0, 100]."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def measure(n: int, reps: int, warmup: int, broadcast: bool = False) -> dict:
    """Start a kernel and a cluster of ``n`` processes; time both kinds of cell."""
    dph = DEVICES_PER_HOST.get(n, 1)
    km = kc = log = None
    kernel_pid = None
    tracked: dict[int, psutil.Process] = {}
    leftovers: list[str] = []
    # Filled in by the finally clause too, after the return value is built.
    result: dict = {"n": n, "devices_per_host": dph, "leftovers": leftovers, "tracked": 0}
    try:
        # The kernel's own stderr (warnings, tracebacks) goes to a file, shown on failure.
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in the finally below
        km, kc = start_new_kernel(
            kernel_name="jaxsys", startup_timeout=KERNEL_START_TIMEOUT, stdout=log, stderr=log
        )
        kernel_pid = km.provisioner.pid if km.provisioner is not None else None

        t_start, text = run_ok(
            kc, f"%jaxsys start --hosts {n} --devices-per-host {dph}", timeout=START_TIMEOUT
        )
        # Remember everything the kernel started, so that after shutdown we can check that
        # it is gone even though the engines run in sessions of their own.
        if kernel_pid is not None:
            tracked.update({p.pid: p for p in descendants(kernel_pid)})
        _, text = run_ok(
            kc,
            "import json as _json\n"
            "_c = get_ipython()._jaxsys_session.cluster\n"
            "_c.view.block = True\n"
            "_c.view.activate()\n"
            "print(_json.dumps({'targets': _c.view.targets, 'engines': _c.engine_ids(),"
            " 'pids': [p.pid for p in _c.processes]}))",
        )
        info = json.loads(text.strip().splitlines()[-1])
        if list(info["targets"]) != list(info["engines"]):
            raise BenchError(
                f"%%px targets {info['targets']} are not the cluster's engines {info['engines']}"
            )
        # Both kinds must really run on every process, or the comparison is meaningless.
        # Read back from the engines: streamed %%px output at 64 engines may lose lines.
        run_ok(kc, "%%px\nimport os\n_bench_pid = os.getpid()")
        _, out = run_ok(kc, "print(_json.dumps(_c.view.pull('_bench_pid', block=True)))")
        px_pids = sorted(json.loads(out.strip().splitlines()[-1]))
        if px_pids != sorted(info["pids"]):
            raise BenchError(
                f"%%px ran on pids {px_pids}, the cluster's are {sorted(info['pids'])}"
            )
        _, out = run_ok(kc, "%%multihost --no-collate\nimport os\nprint('pid', os.getpid())")
        mh_pids = sorted(int(w) for w in PID_LINE.findall(out))
        if mh_pids != sorted(info["pids"]):
            raise BenchError(
                f"%%multihost ran on pids {mh_pids}, the cluster's are {sorted(info['pids'])}"
            )

        def broadcast_cell() -> float:
            run_ok(kc, BROADCAST_SWITCH.format(on=True))
            try:
                return run_ok(kc, MULTIHOST_CELL)[0]
            finally:
                run_ok(kc, BROADCAST_SWITCH.format(on=False))

        cells = {"multihost": lambda: run_ok(kc, MULTIHOST_CELL)[0]}
        if broadcast:
            cells["broadcast"] = broadcast_cell
        cells["px"] = lambda: run_ok(kc, PX_CELL)[0]
        for _ in range(warmup):
            for cell in cells.values():
                cell()
        times: dict[str, list[float]] = {kind: [] for kind in cells}
        result["load"] = os.getloadavg()[0]
        for _ in range(reps):
            for kind, cell in cells.items():
                times[kind].append(cell())

        t_stop, text = run_ok(kc, "%jaxsys stop", timeout=30)
        result.update(start_s=t_start, stop_s=t_stop, times=times)
        return result
    except BaseException:
        if log is not None:
            log.seek(0)
            tail = log.read()[-3000:]
            if tail.strip():
                print(f"--- kernel log (tail) ---\n{tail}\n---", file=sys.stderr)
        raise
    finally:
        if kernel_pid is not None:
            tracked.update({p.pid: p for p in descendants(kernel_pid)})
            try:
                tracked.setdefault(kernel_pid, psutil.Process(kernel_pid))
            except psutil.NoSuchProcess:
                pass
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            try:
                km.shutdown_kernel(now=False)
            except Exception as e:  # noqa: BLE001 - fall through to the hard checks below
                print(f"warning: polite kernel shutdown failed: {e!r}", file=sys.stderr)
            if km.is_alive():
                print("warning: kernel still alive after shutdown; killing it", file=sys.stderr)
                km.shutdown_kernel(now=True)
        result["tracked"] = len(tracked)
        survivors = reap(list(tracked.values()), timeout=10)
        if log is not None:
            log.close()
        for p in survivors:
            leftovers.append(f"pid {p.pid}")
        if survivors:
            print(
                f"warning: {len(survivors)} process(es) outlived the kernel shutdown and were "
                f"killed: {', '.join(leftovers)}",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 timed cells of each kind, not 40")
    ap.add_argument("--reps", type=int, default=None, help="timed cells of each kind")
    ap.add_argument("--warmup", type=int, default=None, help="untimed cells of each kind first")
    ap.add_argument("--sizes", default="4,8", help="process counts, comma-separated")
    ap.add_argument(
        "--broadcast", action="store_true", help="also time %%%%multihost sent as one broadcast"
    )
    args = ap.parse_args(argv)
    reps = args.reps or (10 if args.quick else 40)
    warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    sizes = [int(s) for s in args.sizes.split(",") if s]

    print(
        f"dispatch: {reps} timed cells of each kind after {warmup} warm-up, interleaved; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    load0 = os.getloadavg()[0]
    results = []
    for n in sizes:
        r = measure(n, reps, warmup, args.broadcast)
        results.append(r)
        gone = "none left over" if not r["leftovers"] else f"LEFT OVER: {', '.join(r['leftovers'])}"
        print(
            f"  n={n}: cluster up in {r['start_s']:.1f} s, stopped in {r['stop_s']:.2f} s; "
            f"{r['tracked']} kernel-side processes tracked, {gone}; "
            f"load average (1 min) {r['load']:.1f} when timing began",
            flush=True,
        )

    header = f"{'n':>3} {'dev/host':>8} {'kind':>10} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}"
    print()
    print(header)
    print("-" * len(header))
    ratios = []
    for r in results:
        for kind in r["times"]:
            t = r["times"][kind]
            print(
                f"{r['n']:>3} {r['devices_per_host']:>8} {kind:>10} "
                f"{statistics.median(t) * 1e3:>10.1f} {percentile(t, 90) * 1e3:>8.1f} "
                f"{min(t) * 1e3:>8.1f}"
            )
        ratio = statistics.median(r["times"]["multihost"]) / statistics.median(r["times"]["px"])
        ratios.append((r["n"], ratio))
        print(f"{'':>3} {'':>8} {'ratio':>10} {ratio:>10.2f}")
        if "broadcast" in r["times"]:
            bcast = statistics.median(r["times"]["broadcast"]) / statistics.median(r["times"]["px"])
            print(f"{'':>3} {'':>8} {'bcast/px':>10} {bcast:>10.2f}")
    print()
    print(
        f"load average (1 min) at start {load0:.1f}, at end {os.getloadavg()[0]:.1f}; "
        "anything else running on the machine slows both kinds alike"
    )
    parts = ", ".join(f"n={n} {ratio:.2f}" for n, ratio in ratios)
    print(f"dispatch: multihost/px median ratio {parts} (target <= {TARGET:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
