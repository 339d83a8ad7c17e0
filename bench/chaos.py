"""Fault injection in loops: what dies, whether the world survives it or says so, and what is
left behind, through a real kernel.

What is measured, in one run
----------------------------
1. **Helpers.** On a 2-process local cluster with one standby engine, ``--rounds`` times
   each idle and as often while a cell runs: SIGKILL to a standby engine, the fork server
   and the ipyparallel controller, and a telemetry agent's socket closed from a cell (the
   agent is a thread in the engine). A fault is *survived* when the next cell
   works without a restart, *reported* when a cell or the restart fails with words naming
   what died and what to do (and the restart then works), *failed* otherwise.
2. **Kernel SIGKILL, local** (``--kernel-kills``, 100 by default, or as many as fit in
   ``--seconds``), in turn idle, during a cell, and after ``%jaxsys stop
   --keep-allocation`` (the hosts kept on a lease of :data:`LOCAL_TTL_S`): seconds until no
   process of the kernel is left, and what is left after 15 s (processes,
   ``jaxsys-profile-<pid>-*`` / ``jaxsys-fork-<pid>-*`` directories, new
   ``jaxsys-trace-*`` directories), and after a kept kill, once the lease's TTL + 5 s have
   passed, the leases still live.
3. **Kernel SIGKILL, Slurm** (``--slurm-kills``, 20 by default) on the private Slurm of
   the test suite (tests/slurm.py; skipped, saying why, where it cannot run): in turn a
   running cluster, and an allocation kept with ``%jaxsys stop --keep-allocation``, then
   attached to again from a restarted kernel inside its lease (the reattach time), kept
   again, and the kernel killed; and a running cluster's kernel killed while slurmctld is
   stopped for 10 s. After the lease's TTL + 5 s (from slurmctld's return after an
   outage): jobs in the queue, processes here and on the hosts, directories.

Usage: ``python bench/chaos.py [--rounds 3] [--kernel-kills 100] [--seconds S]
[--slurm-kills 20]`` (``--rounds 0`` leaves the helpers out).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxsys_kernel import contract  # noqa: E402
from jaxsys_kernel.cluster.launchers.forks import SOCKET_DIR_PREFIX  # noqa: E402
from tests.harness import Kernel, new_tag, tagged_engines, wait_no_processes  # noqa: E402

START = "%jaxsys start --hosts 2 --devices-per-host 1 --standby {standby}"
RANKS = "%%multihost\nimport jax\nprint('rank', jax.process_index())"
SLEEPING = "%%multihost\nimport time\nprint('started', flush=True)\ntime.sleep(60)"
LEFT_AFTER_S = 15.0
WAIT_S = 60.0
TMP = Path(tempfile.gettempdir())


def load() -> str:
    return "load average (1, 5, 15 min): {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def dirs_of(pid: int) -> list[Path]:
    """The kernel ``pid``'s profile and fork-socket directories."""
    found: list[Path] = []
    for base in {TMP, Path("/tmp")}:
        for prefix in (contract.PROFILE_PREFIX, SOCKET_DIR_PREFIX):
            found += base.glob(f"{prefix}{pid}-*")
    return found


def traces() -> set[Path]:
    return set(TMP.glob("jaxsys-trace-*"))


def wait_for(cond, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    return None


def said(out) -> str:
    return (out.error or {}).get("evalue", "") + out.stderr


def kernel_side(k: Kernel, expr: str):
    """``expr`` evaluated in the kernel, ``c`` being its cluster (None when it fails)."""
    out = k.execute(
        f"import json as _j\nc = get_ipython()._jaxsys_session.cluster\nprint(_j.dumps({expr}))",
        timeout=WAIT_S,
    )
    if out.status != "ok":
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def cell_under_way(k: Kernel, code: str = SLEEPING) -> str:
    """Send ``code``; return its message id once both processes have printed 'started'."""
    msg_id = k.kc.execute(code)
    seen = ""
    deadline = time.monotonic() + WAIT_S
    while "started" not in seen and time.monotonic() < deadline:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
    return msg_id


# -- helpers killed -------------------------------------------------------------------------


def finish(k: Kernel, msg_id: str) -> str:
    """The status of the cell ``msg_id`` once it has ended."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        if msg["parent_header"].get("msg_id") == msg_id and idle:
            break
    return k._shell_reply(msg_id)["content"]["status"]


def standby_pids(k: Kernel) -> tuple[str, list[int]]:
    pids = wait_for(
        lambda: kernel_side(k, "c.standby_status()['ready'] and c.world.standby.pids(c.world)")
    )
    return "standby engine", pids or []


def fork_server_pid(k: Kernel) -> tuple[str, list[int]]:
    pid = kernel_side(k, "c.world.launcher.forks.pid")
    return f"fork server (pid {pid})", [pid]


def controller_pid(k: Kernel) -> tuple[str, list[int]]:
    pid = kernel_side(k, "c.world.ipp.controller.pid")
    return f"controller (pid {pid})", [pid]


# What is killed, found before any cell runs (the kernel answers one cell at a time).
FAULTS = {
    "standby engine": standby_pids,
    "fork server": fork_server_pid,
    "controller": controller_pid,
}
AGENT = "telemetry agent"
CLOSE_AGENT = (
    "%%multihost\nimport time, jax\nfrom jaxsys_kernel.engine.state import STATE\n"
    "STATE.agent._sock.close()\n{wait}print(int(jax.jit(lambda x: x + 1)(1)))"
)


def fresh_cluster(k: Kernel) -> None:
    """A new cluster: its fork server and standby are what the next faults kill."""
    k.execute("%jaxsys stop")
    if k.execute(START.format(standby=1), timeout=WAIT_S).status != "ok":
        raise RuntimeError("the cluster did not start")


def one_fault(k: Kernel, name: str, during: bool) -> str:
    """One fault, idle or while a cell runs: survived, reported or failed."""
    if name == AGENT:
        # The agent is a thread in the engine: its socket is closed from a cell, after
        # which that cell's hooks and a compile's listeners send through it.
        out = k.execute(CLOSE_AGENT.format(wait="time.sleep(1)\n" if during else ""))
        return outcome(k, AGENT) if out.status == "ok" else "failed"
    named, pids = FAULTS[name](k)
    msg_id = cell_under_way(k, SLEEPING.replace("60", "2")) if during else None
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    if name == "fork server":
        wait_for(lambda: not tagged_engines(k.tag) or None, 15)  # they follow their server
    if msg_id is not None:
        finish(k, msg_id)  # ok, or an error naming the death: outcome() checks the next cell
    got = outcome(k, named.split(" (pid")[0])
    if name == "controller" and got == "survived":
        # Its schedulers still route cells; what matters is the next restart.
        got = outcome_after_restart(k, named)
    return got


def outcome(k: Kernel, named: str) -> str:
    """survived, reported or failed, and the world working again in every case but failed."""
    out = k.execute(RANKS, timeout=WAIT_S)
    if out.status == "ok" and "rank 1" in out.stdout:
        return "survived"
    text = said(out)
    if out.status == "error" and named in text and "%jaxsys" in text:
        restart = k.execute("%jaxsys restart", timeout=WAIT_S)
        if restart.status != "ok":
            text = said(restart)
            if named not in text or "%jaxsys start" not in text:
                return "failed"
            if k.execute(START.format(standby=1), timeout=WAIT_S).status != "ok":
                return "failed"
        return "reported" if k.execute(RANKS).status == "ok" else "failed"
    return "failed"


def helper_faults(rounds: int) -> dict[str, dict[str, int]]:
    """Each helper killed ``rounds`` times idle and as often during a cell, in one kernel
    (a fresh cluster before each round): outcomes by helper."""
    tag = new_tag()
    seen = {name: {"survived": 0, "reported": 0, "failed": 0} for name in (*FAULTS, AGENT)}
    k = Kernel(tag)
    pid = k.pid
    try:
        for _ in range(rounds):
            for during in (False, True):
                fresh_cluster(k)
                for name in seen:
                    got = one_fault(k, name, during)
                    seen[name][got] += 1
                    if got == "failed":
                        fresh_cluster(k)
        k.execute("%jaxsys stop")
    finally:
        k.shutdown()
    left = wait_no_processes(tag, LEFT_AFTER_S)
    seen["_left"] = {"processes": len(left), "directories": len(dirs_of(pid))}
    return seen


def outcome_after_restart(k: Kernel, named: str) -> str:
    restart = k.execute("%jaxsys restart", timeout=WAIT_S)
    if restart.status == "ok":
        return "survived"
    text = said(restart)
    if named not in text or "%jaxsys start" not in text:
        return "failed"
    ok = k.execute(START.format(standby=1), timeout=WAIT_S).status == "ok"
    return "reported" if ok and k.execute(RANKS).status == "ok" else "failed"


# -- the kernel killed ------------------------------------------------------------------------


def start_problem(k: Kernel) -> str | None:
    """Why ``START`` failed in ``k`` (None when it worked); a hang is a failure too."""
    try:
        out = k.execute(START.format(standby=0), timeout=WAIT_S)
    except (TimeoutError, queue.Empty):
        return f"no answer within {WAIT_S:g} s"
    return None if out.status == "ok" else said(out)[-300:]


#: The lease of local hosts kept in the loop: what is left is counted this long + 5 s after.
LOCAL_TTL_S = 6.0
LOCAL_MODES = ("idle", "during a cell", "kept")


def live_leases(state_dir: str) -> int:
    """Leases of kept hosts under ``state_dir`` that have not lapsed."""
    from jaxsys_kernel.cluster import lease

    found = Path(state_dir, "hosts").glob("lease-*")
    return sum(1 for path in found if (held := lease.read(path)) and not held.lapsed())


def kill_one(tag: str, mode: str, env: dict) -> tuple[int, float | None, str | None]:
    """One kernel, its cluster started (and kept, in the "kept" mode), SIGKILLed: its pid,
    the seconds until none of its processes is left, and why it did not start."""
    k = Kernel(tag, extra_env=env)
    pid = k.pid
    try:
        why = start_problem(k)
        if not why and mode == "during a cell":
            cell_under_way(k)
        elif not why and mode == "kept":
            out = k.execute("%jaxsys stop --keep-allocation")
            if out.status != "ok" or "are kept" not in out.stdout:
                why = f"the keep failed: {(said(out) or out.stdout)[-300:]}"
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        k.kc.stop_channels()
        k.km.cleanup_resources()
        wait_no_processes(tag, LEFT_AFTER_S)
        wait_for(lambda: not dirs_of(pid), LEFT_AFTER_S)
        return pid, None if why else time.monotonic() - t0, why
    finally:
        for line in wait_no_processes(tag, 0):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def kernel_kills(n: int, seconds: float | None = None) -> dict:
    """The kernel SIGKILLed ``n`` times (or as often as fits in ``seconds``), in turn idle,
    during a cell and with its hosts kept."""
    times, left_procs, left_dirs, left_traces, left_leases, failed = [], 0, 0, 0, 0, 0
    ends = None if seconds is None else time.monotonic() + seconds
    counts = dict.fromkeys(LOCAL_MODES, 0)
    with tempfile.TemporaryDirectory(prefix="jaxsys-chaos-state-") as state_dir:
        env = {"JAXSYS_STATE_DIR": state_dir, "JAXSYS_LEASE_TTL": str(LOCAL_TTL_S)}
        for i in range(n):
            if ends is not None and time.monotonic() > ends:
                break
            tag, before, mode = new_tag(), traces(), LOCAL_MODES[i % len(LOCAL_MODES)]
            try:
                pid, took, why = kill_one(tag, mode, env)
            except RuntimeError as e:  # its ports taken before it bound them (a busy machine)
                failed += 1
                print(f"  kill {i + 1}: the kernel did not start: {e}", flush=True)
                continue
            counts[mode] += 1
            if why:
                failed += 1
                print(f"  kill {i + 1} ({mode}): the cluster did not start: {why}", flush=True)
            if took is not None:
                times.append(took)
            if mode == "kept":
                time.sleep(LOCAL_TTL_S + 5)  # what is left is counted after the lease's end
                left_leases += live_leases(state_dir)
            left_procs += len(wait_no_processes(tag, 0))
            left_dirs += len(dirs_of(pid))
            left_traces += len(traces() - before)
    return {
        "kills": sum(counts.values()),
        **{f"  of them {mode}": c for mode, c in counts.items()},
        "failed starts (kernel or cluster)": failed,
        "processes left": left_procs,
        "directories left": left_dirs,
        "trace directories left": left_traces,
        f"kept leases live after TTL {LOCAL_TTL_S:g} s + 5 s": left_leases,
        "seconds to nothing (median)": statistics.median(times) if times else float("nan"),
        "seconds to nothing (max)": max(times) if times else float("nan"),
    }


# -- the kernel killed on Slurm -------------------------------------------------------------


SLURM_START = (
    "%jaxsys start --launcher slurm --hosts 2 --devices-per-host 1 "
    "--sbatch-arg=--ntasks-per-node=1 --env JAX_PLATFORMS=cpu"
)
# Longer than a kernel's restart on a busy machine (a kept job's lease must outlive it).
SLURM_TTL_S = 15.0


SLURM_MODES = ("running", "kept", "slurmctld down")
# Seconds slurmctld stays stopped around the kernel's death in the "slurmctld down" mode.
OUTAGE_S = 10.0


def slurm_kill(hosts, tag: str, state_dir: str, mode: str) -> tuple[float | None, list[int]]:
    """One kernel on the private Slurm, SIGKILLed with a running cluster, with a kept job
    (attached to again from a restarted kernel first), or with a running cluster while
    slurmctld is down for :data:`OUTAGE_S`: the reattach time (None when not kept) and the
    pids the kernel had."""
    keep = mode == "kept"
    env = {"JAXSYS_STATE_DIR": state_dir, "JAXSYS_LEASE_TTL": str(SLURM_TTL_S)}
    k = Kernel(tag, extra_env=env)
    pids, attach = [k.pid], None
    try:
        out = k.execute(SLURM_START, timeout=180)
        if out.status != "ok":
            raise RuntimeError(f"the Slurm cluster did not start: {said(out)[-500:]}")
        if keep:
            k.ok("%jaxsys stop --keep-allocation")
            k.km.restart_kernel(now=False)
            k.kc.wait_for_ready(timeout=60)
            pids.append(k.pid)
            t0 = time.monotonic()
            out = k.execute("%jaxsys attach", timeout=180)
            attach = time.monotonic() - t0
            if out.status != "ok" or k.execute(RANKS).status != "ok":
                raise RuntimeError(f"attach failed: {said(out)[-500:]}")
            k.ok("%jaxsys stop --keep-allocation")
        if mode == "slurmctld down":
            hosts.stop_controller()
    finally:
        # Killed also when a step failed: what it leaves is counted all the same.
        os.kill(k.pid, signal.SIGKILL)
        k.kc.stop_channels()
        k.km.cleanup_resources()
    if mode == "slurmctld down":
        time.sleep(OUTAGE_S)  # the outage itself: the watchdog's squeue fails meanwhile
        hosts.start_controller()
    return attach, pids


def slurm_kills(n: int) -> dict | str:
    """``n`` kernel kills on the private Slurm; a sentence when it cannot run here."""
    from tests import slurm

    reason = slurm.available()
    if reason:
        return f"skipped: no private Slurm here ({reason})"
    jobs = procs = dirs = failed = 0
    attaches: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="jaxsys-chaos-state-") as state_dir,
        slurm.SlurmHosts(2) as hosts,
    ):
        for i in range(n):
            tag = new_tag()
            mode = SLURM_MODES[i % len(SLURM_MODES)]
            try:
                attach, pids = slurm_kill(hosts, tag, state_dir, mode)
            except RuntimeError as e:  # counted, and what it left is counted too
                failed += 1
                attach, pids = None, []
                print(f"  kill {i + 1} ({mode}): {e}", flush=True)
            killed = time.monotonic()
            if attach is not None:
                attaches.append(attach)
            # The figure is what is left once the lease's TTL + 5 s have passed.
            time.sleep(max(0.0, killed + SLURM_TTL_S + 5 - time.monotonic()))
            jobs += len(hosts.queue())
            procs += len(wait_no_processes(tag, 0)) + len(hosts.namespace_pids())
            dirs += sum(len(dirs_of(pid)) for pid in pids)
            hosts.wait_queue_empty(30)  # the next kill starts from an empty queue
            for line in wait_no_processes(tag, 0):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    return {
        "kills": n,
        "failed (start or attach)": failed,
        "jobs left": jobs,
        "processes left": procs,
        "directories left": dirs,
        "reattach s (median)": statistics.median(attaches) if attaches else float("nan"),
        "reattach s (max)": max(attaches) if attaches else float("nan"),
    }


def show(title: str, figures: dict | str) -> None:
    print(title)
    if isinstance(figures, str):
        print(f"  {figures}")
        return
    for key, value in figures.items():
        print(f"  {key:34} {value:.2f}" if isinstance(value, float) else f"  {key:34} {value}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="idle and in-cell kills of each helper")
    ap.add_argument("--kernel-kills", type=int, default=100, help="local kernel SIGKILLs")
    ap.add_argument(
        "--seconds", type=float, default=None, help="at most this long for the local kills"
    )
    ap.add_argument("--slurm-kills", type=int, default=20, help="kernel SIGKILLs on Slurm")
    args = ap.parse_args(argv)
    print(load())
    if args.rounds:
        show_helpers(helper_faults(args.rounds))
    show(
        "kernel SIGKILL, local cluster (idle, during a cell, kept, in turn)",
        kernel_kills(args.kernel_kills, args.seconds),
    )
    print(load())
    if args.slurm_kills:
        show(
            f"kernel SIGKILL, private Slurm (in turn: running; kept and reattached; running "
            f"with slurmctld down {OUTAGE_S:g} s; left after TTL {SLURM_TTL_S:g} s + 5 s)",
            slurm_kills(args.slurm_kills),
        )
        print(load())
    return 0


def show_helpers(helpers: dict) -> None:
    left = helpers.pop("_left")
    print(f"{'helper killed':18} {'tried':>6} {'survived':>9} {'reported':>9} {'failed':>7}")
    for name, got in helpers.items():
        print(
            f"{name:18} {sum(got.values()):6} {got['survived']:9} {got['reported']:9}"
            f" {got['failed']:7}"
        )
    print(
        f"left after the helpers' kernel: {left['processes']} processes, "
        f"{left['directories']} directories"
    )
    print(load())


if __name__ == "__main__":
    sys.exit(main())
