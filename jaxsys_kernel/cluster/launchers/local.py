"""The local launcher: every process on this machine, signalled and killed directly."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...engine.ports import hold_port
from .. import stacks
from ..exit_watch import ExitWatch
from ..profile import engine_file
from .base import EngineContext, Launcher, native_log_file, stack_file
from .forks import ForkServer, plain_engine_cmd
from .kept import KeepsHosts

#: Seconds a death's description waits for the exit status of the engine's process (the
#: stand-in of a forked engine ends moments after the engine).
EXIT_WAIT = 1.0


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


if TYPE_CHECKING:
    from ..records import ProcessInfo


class LocalLauncher(KeepsHosts, Launcher):
    """Processes on this machine, one engine set per rank, signalled directly (no nanny)."""

    name = "local"
    places_processes = True
    takes_options = False
    engine_pids_here = True
    restarts_one_process = True
    # Processes here cost only this machine's memory, which the standby's size accounts for.
    standby_by_default = True
    uses_engine_file_copy = True
    loopback_only = True
    default_platforms = "cpu"

    @classmethod
    def batch_job(cls, program, nprocs, out_dir, options):
        # One process per rank on this machine; one failure stops them all.
        return {}, [sys.executable, "-m", "jaxsys_kernel.job.local", str(program), str(nprocs), "."]

    def __init__(self, config):
        super().__init__(config)
        self.forks: ForkServer | None = None
        self._plain_after_forks: set[int] = set()
        # Room for a world and the one it replaces: older worlds' pidfds are closed first.
        self.exits = ExitWatch(limit=2 * config.nprocs + 8)

    def _controller_kwargs(self) -> dict[str, Any]:
        return {"controller_ip": self.config.controller_ip or "127.0.0.1"}

    def make_ipp_cluster(self, profile, secure):
        ipp = super().make_ipp_cluster(profile, secure)
        if self.config.fork_server and len(self.config.process_prefix) < self.config.nprocs:
            # Started now, so that its imports overlap the controller's start-up.
            env = {**os.environ, **self.import_env(), **self.config.env}
            self.forks = ForkServer(profile, env, float(self.config.register_timeout))
        return ipp

    def release(self) -> None:
        super().release()
        self.exits.close()
        forks, self.forks = self.forks, None
        if forks is not None:
            forks.stop()

    def certificate_hosts(self) -> list[str] | None:
        return self.config.addresses

    def early_coordinator(self) -> str | None:
        # Held until the world is torn down: process 0 binds it seconds after launch.
        self.release_ports()
        host = self.config.addresses[0]
        try:
            hold = hold_port(host)
        except OSError:
            # An address of another network namespace: its ports are not ours to hold,
            # and a port free on loopback here is as good a guess as any.
            hold = hold_port("127.0.0.1")
        self._held_ports.append(hold)
        return f"{host}:{hold.getsockname()[1]}"

    def _engine_fields(self, rank: int, ctx: EngineContext) -> dict[str, Any]:
        fields: dict[str, Any] = {"parent_pid": os.getpid()}
        if ctx.profile is not None:
            fields["stack_file"] = str(stack_file(ctx.profile, rank, ctx.incarnation))
            fields["native_log"] = str(native_log_file(ctx.profile, rank, ctx.incarnation))
        return fields

    def _platform_env(self) -> dict[str, str]:
        return {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", self.default_platforms)}

    def nanny_args(self) -> list[str]:
        # The nanny relays signals to remote engines. Local engines are signalled directly,
        # and starting a nanny costs each engine ~1 s of start-up on a busy machine.
        return ["--IPEngine.enable_nanny=False"]

    def engine_args(self, rank: int, ctx: EngineContext, engine_id: int | None = None) -> list[str]:
        return [
            *super().engine_args(rank, ctx, engine_id),
            f"--IPEngine.url_file={engine_file(ctx.profile)}",
        ]

    async def launch(self, ctx: EngineContext, report: Callable[[str, int, int], None]) -> None:
        for rank in self.config.ranks:
            await self.launch_rank(rank, f"p{rank}-i{ctx.incarnation}", ctx)

    async def launch_rank(
        self, rank: int, set_id: str, ctx: EngineContext, *, engine_id: int | None = None
    ) -> None:
        kwargs: dict[str, Any] = {
            "environment": self.engine_env(rank, ctx),
            "engine_args": self.engine_args(rank, ctx, engine_id),
        }
        prefix = self.config.process_prefix.get(rank)
        if prefix:
            # Another namespace or CPU set: a process of its own, not a fork of the server.
            kwargs["engine_cmd"] = [*prefix, sys.executable, "-m", "ipyparallel.engine"]
        elif self.forks is not None and self.forks.failure() is None:
            kwargs["engine_cmd"] = self.forks.engine_cmd()
        else:
            # Dies with the kernel even while it boots (the stand-in's --plain mode).
            kwargs["engine_cmd"] = plain_engine_cmd()
            if self.forks is not None:
                # The server died: this rank is a plain engine now (see death_reason).
                self._plain_after_forks.add(rank)
        await self.ipp.start_engines(n=1, engine_set_id=set_id, **kwargs)
        if engine_id is None:
            self.engine_sets[rank] = set_id

    def _signal_here(self, processes, ranks, sig):
        sent, rest = [], []
        for r in ranks:
            p = processes[r]
            if not p.pid:
                rest.append(r)
                continue
            try:
                os.kill(p.pid, sig)
                sent.append(r)
            except ProcessLookupError:
                pass
        return sent, rest

    def process_gone(self, p: ProcessInfo) -> bool:
        # Checked directly: the hub notices only after missed heartbeats.
        return bool(self.processes_gone([p]))

    def processes_gone(self, processes):
        # One look at every pidfd: at 64 processes, 0.3 ms of CPU before each cell otherwise.
        known = [p for p in processes if p.pid is not None]
        ended = self.exits.ended_among([(p.pid, p.started) for p in known])
        return [p for p in known if (p.pid, p.started) in ended]

    def death_reason(self, p: ProcessInfo) -> str:
        # A forked engine dies with its fork server: name that death and what to do. An
        # engine started after the server died is a plain one: not its cause.
        why = super().death_reason(p)
        code = self._exit_code(p.rank)
        if code is not None:
            why += f" ({_how_it_ended(code)})"
        failed = self.forks.failure() if self.forks is not None else None
        if failed and p.rank not in self._plain_after_forks:
            return f"{why}: {failed}"
        return why

    def _exit_code(self, rank: int) -> int | None:
        """The exit status of the process ipyparallel started for ``rank`` (a fork's stand-in
        ends as its engine did), as its engine set records it, waiting at most
        :data:`EXIT_WAIT` for the record; None if unknown (an engine taken from the standby
        belongs to another set)."""
        engine_set = self.engine_set(rank)
        if engine_set is None:
            return None
        deadline = time.monotonic() + EXIT_WAIT
        while True:
            stopped = getattr(engine_set, "stop_data", None) or {}
            for data in (stopped.get("engines") or {}).values():
                if isinstance(data, dict) and isinstance(data.get("exit_code"), int):
                    return data["exit_code"]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def dump_stacks(self, ranks, timeout, send_signal, stack_files, telemetry):
        return stacks.local_stacks({r: stack_files(r) for r in ranks}, send_signal, timeout)
