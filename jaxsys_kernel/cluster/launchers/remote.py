"""The ssh launcher: one engine set per named host, launched in parallel."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ... import _compat
from ...errors import ConfigError
from ..options import Flag
from ..teardown import START_TIME_TOLERANCE_S, sub_launchers
from .base import EngineContext, Launcher, host_part
from .kept import KeepsHosts

# Engines check the controller's heartbeat every period + 500 ms: 20 misses is 15 s.
SSH_HEARTBEAT_MISSES = 20
#: How many of the controller's heartbeats an engine away from the kernel's host may miss
#: before it leaves, where the default is not wanted.
HEARTBEAT_MISSES_VAR = "JAXSYS_ENGINE_HEARTBEAT_MISSES"
# Fewer than 3 misses (about 2 s) would take a busy controller for a dead one.
_MIN_MISSES = 3


def heartbeat_misses() -> int:
    """How many controller heartbeats a remote engine may miss before it leaves:
    ``$JAXSYS_ENGINE_HEARTBEAT_MISSES`` (at least 3), else 20, about 15 s.

    Fewer frees a dead kernel's hosts (or pods) sooner; more rides out a slow network.
    """
    raw = os.environ.get(HEARTBEAT_MISSES_VAR)
    if raw is None:
        return SSH_HEARTBEAT_MISSES
    try:
        return max(_MIN_MISSES, int(raw))
    except ValueError:
        raise ConfigError(
            f"{HEARTBEAT_MISSES_VAR}={raw!r} is not a whole number: give how many heartbeats "
            f"an engine may miss (say {SSH_HEARTBEAT_MISSES}), or unset it"
        ) from None


def remote_engine_args() -> list[str]:
    """The engine options that make an engine leave once its controller is gone."""
    return [f"--IPEngine.max_heartbeat_misses={heartbeat_misses()}"]


# Seconds a kill over ssh waits for the hosts to answer.
SSH_KILL_TIMEOUT_S = 10.0
# Run by the host's Python (standard library only): SIGKILL the process group of each
# engine pid, unless a process that started at another time holds the pid now (the
# start time as psutil gives it: boot time plus clock ticks). Each engine leads a group
# of its own, so what its cells started goes with it.
KILL_GROUPS = """
import json, os, signal
def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")
for pid, when in json.loads(%r):
    now = started(pid)
    if now is not None and (when is None or abs(now - when) > %r):
        continue
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            break
        except OSError:
            pass
"""


class SshLauncher(KeepsHosts, Launcher):
    """One engine per named host, started over ssh; engines there are killed over ssh.

    Engines run without the death signal (the process that spawns them on their host exits
    at once), so when the kernel dies without a teardown they leave when the controller's
    heartbeats stop.
    """

    name = "ssh"
    ipp_launcher = "ssh"
    flags = (
        Flag(
            "--ssh-arg",
            "ssh: one more ssh option, e.g. --ssh-arg=-p2222",
            {"action": "append", "metavar": "ARG"},
            "ssh_args",
        ),
    )
    needs_host_names = True
    launcher_pids_here = False
    restarts_one_process = True

    @classmethod
    def default_options(cls) -> dict[str, Any]:
        # Suits hosts that share this machine's filesystem.
        return {"remote_python": sys.executable}

    @classmethod
    def batch_job(cls, program, nprocs, out_dir, options):
        # Process i on host i, each started over ssh; one failure stops them all.
        hosts = list(options.get("host_names") or ())
        if len(hosts) != nprocs:
            raise NotImplementedError(
                "jaxsys job --launcher ssh runs one process per named host: give them with "
                "--hosts node1,node2,..."
            )
        ssh = [f"--ssh-arg={a}" for a in options.get("ssh_args", [])]
        return {}, [sys.executable, "-m", "jaxsys_kernel.job.ssh", str(program), ".", *hosts, *ssh]

    def coordinator_host(self, p0_address: str) -> str:
        # The name that reached process 0's host is the one to give the others: what that
        # host says of itself may be a loopback alias (Debian's 127.0.1.1).
        return host_part(self.config.host_names[0])

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        # The process that spawns an engine on its host exits at once; the engine must not
        # die with it. It goes when the controller stops answering its heartbeats.
        return {**super()._engine_fields(rank, ctx), "no_pdeathsig": True}

    def nanny_args(self) -> list[str]:
        # No death signal reaches an engine started over ssh: when the kernel dies, the
        # controller goes with it and the engine leaves once its heartbeats stop.
        return remote_engine_args()

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        # Each launch is several ssh round trips; hosts are reached all at once.
        launched = 0
        total = self.config.nprocs
        report("engines launched over ssh", 0, total)

        async def launch(rank: int) -> None:
            nonlocal launched
            await self.launch_rank(rank, f"p{rank}-i{ctx.incarnation}", ctx)
            launched += 1
            report("engines launched over ssh", launched, total)

        await asyncio.gather(*(launch(r) for r in self.config.ranks))

    async def launch_rank(
        self, rank: int, set_id: str, ctx: EngineContext, *, engine_id: int | None = None
    ) -> None:
        """What ``ipyparallel.Cluster.start_engines`` does, with the blocking ssh calls of
        the launcher's ``start`` moved to a worker thread, so that hosts start in parallel.
        """
        # Deferred: tornado arrives with ipyparallel, which only a starting cluster imports.
        from tornado.ioloop import IOLoop

        ipp = self.ipp
        # Launchers call back on the loop they were made on: this one, not the worker's.
        loop = IOLoop.current()
        kwargs: dict[str, Any] = {
            "environment": self.engine_env(rank, ctx),
            "engine_args": self.engine_args(rank, ctx, engine_id),
            **self.config.launcher_options,
        }
        es = ipp.engine_launcher_class(
            work_dir=".",
            parent=ipp,
            log=ipp.log,
            profile_dir=ipp.profile_dir,
            cluster_id=ipp.cluster_id,
            engine_set_id=set_id,
            loop=loop,
            engines={self.config.host_names[rank]: {"n": 1, "loop": loop}},
            **kwargs,
        )
        # Known before it starts, so that a teardown meanwhile finds it.
        _compat.attach_engine_set(ipp, set_id, es)
        if engine_id is None:
            self.engine_sets[rank] = set_id
        await asyncio.to_thread(es.start, 1)

    def kill_remote(self, engine_sets: Sequence, processes: Sequence = ()) -> None:
        """SIGKILL every engine started over ssh, on its host, all hosts at once, and
        the process group of each of ``processes`` (their engines' pids) there."""
        launchers = [
            sub
            for es in engine_sets
            for sub in sub_launchers(es)
            if isinstance(getattr(sub, "pid", None), int) and sub.pid > 1
        ]
        groups = self._groups_by_launcher(processes)

        def kill(sub) -> None:
            # The launcher would fetch the engine's log once it stopped; nobody reads it
            # now, and the host may be gone by then.
            _compat.forget_launcher_output(sub)
            try:
                _compat.ssh_kill(sub, sub.pid, signal.SIGKILL)
                if groups.get(id(sub)):
                    code = KILL_GROUPS % (json.dumps(groups[id(sub)]), START_TIME_TOLERANCE_S)
                    sub.ssh_sender.check_output_python_code(code, timeout=SSH_KILL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a host that cannot be reached keeps its engine
                pass

        deadline = time.monotonic() + SSH_KILL_TIMEOUT_S
        threads = []
        for sub in launchers:
            t = threading.Thread(target=kill, args=(sub,), daemon=True)
            try:
                t.start()
            except RuntimeError:  # at interpreter exit no thread can start: one at a time
                kill(sub)
            else:
                threads.append(t)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        # Each launcher keeps an ssh session open that waits for its engine; with the
        # engine gone it returns, and it must, before its host may go away under it.
        for sub in launchers:
            _compat.release_ssh_waiter(sub, deadline - time.monotonic())

    def _groups_by_launcher(self, processes: Sequence) -> dict[int, list]:
        """``[pid, start time]`` of each process's engine, by the launcher that started it
        (its host's ssh connection)."""
        groups: dict[int, list] = {}
        for p in processes:
            es = self.engine_set(p.rank)
            if es is None or not p.pid:
                continue
            for sub in sub_launchers(es):
                groups.setdefault(id(sub), []).append([p.pid, p.started])
        return groups
