"""Values and introspection from the engines: ``%pull``, and completion and inspection
answered by process 0 inside ``%%multihost`` cells."""

from __future__ import annotations

from typing import Any

import ipyparallel as ipp
from IPython.core.error import UsageError

from .._ranges import format_procs
from ..cells.spmd import is_local_cell
from ..engine.registry import engine_module

# Seconds a completion or inspection request may take before the kernel answers itself.
REMOTE_TIMEOUT = 5.0
# Seconds %pull waits for the processes (a large global array takes a while to gather).
PULL_TIMEOUT = 120.0

probes = engine_module("probes")


class RemoteValues:
    """``%pull``, completion and inspection (a part of
    :class:`~jaxsys_kernel.magics.session.MultihostSession`)."""

    def pull(self, name: str, proc: int = 0) -> Any:
        """Bring the value named ``name`` from process ``proc`` into the kernel.

        A jax.Array that spans processes arrives as the full global numpy array; gathering
        it is a collective, so every process takes part.
        """
        cluster = self.require_cluster()
        if not name.isidentifier():
            raise UsageError(f"%pull takes a variable name, got {name!r}")
        if not 0 <= proc < cluster.nprocs:
            raise UsageError(
                f"--procs {proc} is outside this cluster's processes 0-{cluster.nprocs - 1}"
            )
        ref = ipp.Reference(name)
        kind = self._pull_one(
            cluster,
            probes.describe_value,
            ref,
            proc,
            {"NameError": "{name!r} is not defined on process {proc}"},
            name,
        )
        if kind["kind"] != "global":
            return self._pull_one(
                cluster,
                probes.fetch_value,
                ref,
                proc,
                {"TypeError": "cannot pull {name!r}: {evalue}"},
                name,
                proc,
            )
        kinds = cluster.call(None, probes.describe_value, ref, timeout=PULL_TIMEOUT).values()
        differing = [r for r, k in kinds.items() if k != kind]
        if differing:
            raise UsageError(
                f"{name!r} differs between processes (see {format_procs(differing)}); every "
                "process must hold the same global array to gather it"
            )
        # Gathering a global array is a collective: every process takes part.
        return cluster.call(None, probes.fetch_value, ref, proc, timeout=PULL_TIMEOUT).values()[
            proc
        ]

    @staticmethod
    def _pull_one(cluster, fn, ref, proc: int, explain: dict, name: str, *args) -> Any:
        """``fn(ref, *args)`` on process ``proc``; a remote error named in ``explain`` becomes
        a UsageError with that text."""
        calls = cluster.call([proc], fn, ref, *args, timeout=PULL_TIMEOUT)
        error = calls.errors.get(proc)
        if isinstance(error, ipp.RemoteError) and error.ename in explain:
            text = explain[error.ename].format(name=name, proc=proc, evalue=error.evalue)
            raise UsageError(text) from None
        return calls.values()[proc]

    def remote_code(self, code: str, cursor_pos: int) -> tuple[str, int] | None:
        """If ``code`` runs on the engines, return it (and the cursor) as the engines see it."""
        if self.cluster is None or self.cluster.state != "ready":
            return None
        first, nl, rest = code.partition("\n")
        if first.lstrip().startswith("%%multihost"):
            offset = len(first) + len(nl)
            if cursor_pos < offset:
                return None
            return rest, cursor_pos - offset
        if self.spmd and not is_local_cell(code):
            return code, cursor_pos
        return None

    def remote_complete(self, code: str, cursor_pos: int) -> dict | None:
        """Completion reply from process 0, or None when the kernel should answer."""
        target = self.remote_code(code, cursor_pos)
        if target is None:
            return None
        body, pos = target
        offset = len(code) - len(body)
        try:
            reply = self._apply0(probes.complete, body, pos)
        except Exception:  # noqa: BLE001 - fall back to local completion, never fail a keypress
            return None
        reply["cursor_start"] = reply.get("cursor_start", pos) + offset
        reply["cursor_end"] = reply.get("cursor_end", pos) + offset
        for comp in reply.get("metadata", {}).get("_jupyter_types_experimental", []):
            comp["start"] += offset
            comp["end"] += offset
        return reply

    def remote_inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> dict | None:
        """Inspection reply from process 0, or None when the kernel should answer."""
        target = self.remote_code(code, cursor_pos)
        if target is None:
            return None
        body, pos = target
        try:
            return self._apply0(probes.inspect, body, pos, detail_level)
        except Exception:  # noqa: BLE001 - fall back to local inspection
            return None

    def _apply0(self, fn, *args, timeout: float = REMOTE_TIMEOUT):
        return self.cluster.call([0], fn, *args, timeout=timeout).values()[0]
