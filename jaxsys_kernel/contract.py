"""Every name the kernel side and the engines share, in one place.

The kernel starts engines with environment variables, reads files they write and decodes
mime bundles they display; each of those names is defined here once. This module imports
nothing from the package (and nothing outside the standard library), so both sides, the
engines' start-up config files included, can import it without cost.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

# -- environment variables the kernel sets on every engine ---------------------------------

PROCESS_ID = "JAXSYS_PROCESS_ID"
NUM_PROCESSES = "JAXSYS_NUM_PROCESSES"
# The kernel's pid: an engine whose parent is no longer it exits at once (profile.py).
PARENT_PID = "JAXSYS_PARENT_PID"
NO_PDEATHSIG = "JAXSYS_NO_PDEATHSIG"
EARLY_INIT = "JAXSYS_EARLY_INIT"
INIT_TIMEOUT = "JAXSYS_INIT_TIMEOUT"
COORDINATOR = "JAXSYS_COORDINATOR"
HEARTBEAT_TIMEOUT = "JAXSYS_HEARTBEAT_TIMEOUT"
STACK_FILE = "JAXSYS_STACK_FILE"
RELAY_STACKS = "JAXSYS_RELAY_STACKS"
# Where an engine keeps the native output (gloo, XLA, gRPC, absl) kept out of cells.
NATIVE_LOG = "JAXSYS_NATIVE_LOG"
INCARNATION = "JAXSYS_INCARNATION"
TELEMETRY = "JAXSYS_TELEMETRY"
TELEMETRY_KEY = "JAXSYS_TELEMETRY_KEY"
HEARTBEAT_INTERVAL = "JAXSYS_HEARTBEAT_INTERVAL"
WATCH_HANDSHAKES = "JAXSYS_WATCH_HANDSHAKES"
DROP_NATIVE_INFO = "JAXSYS_DROP_NATIVE_INFO"
# Launchers that start every rank with one environment (one job) name each process's
# mTLS certificate and key by a path with RANK_FIELD in it; the engine fills in its rank
# and sets JAX's own variables before it imports JAX (engine/bootstrap.py).
MTLS_CERT_TEMPLATE = "JAXSYS_MTLS_CERT_TEMPLATE"
MTLS_KEY_TEMPLATE = "JAXSYS_MTLS_KEY_TEMPLATE"
RANK_FIELD = "{rank}"

# -- environment variables of the kernel (set in the kernelspec) and the CLI -------------

HOSTS = "JAXSYS_HOSTS"
DEVICES_PER_HOST = "JAXSYS_DEVICES_PER_HOST"
LAUNCHER = "JAXSYS_LAUNCHER"
STATE_DIR = "JAXSYS_STATE_DIR"

# Where a process finds its rank: ours, which jaxsys sets for each process it starts on
# its own. A launcher that starts every rank with one environment (mpiexec, srun) declares
# the variables it sets instead (Launcher.rank_variables) and names them, comma-separated,
# in RANK_VARIABLE_NAMES. Engine ids never decide the rank: they follow registration order.
RANK_VARIABLES = (PROCESS_ID,)
RANK_VARIABLE_NAMES = "JAXSYS_RANK_VARIABLES"

# -- the JupyterLab extension ----------------------------------------------------------------

# The editor language the kernel names in its codemirror_mode (labextension/src/highlight.ts).
EDITOR_LANGUAGE = "jaxsys-ipython"

# -- mime types ------------------------------------------------------------------------------

# Mesh and sharding summaries displayed by engines, turned into views by the kernel.
SUMMARY_MIME = "application/vnd.jaxsys.summary+json"

# -- files -----------------------------------------------------------------------------------

# In the cluster's profile directory: the controller's engine connection file, copied
# once complete (engines wait for this copy, which appears atomically).
ENGINE_CONNECTION_FILE = "security/jaxsys-engine.json"
PROFILE_PREFIX = "jaxsys-profile-"
# Beside the profiles: the engine logs of a failed start, which its error names.
START_LOGS_PREFIX = "jaxsys-start-logs-"


def stack_file_name(rank: int, incarnation: int) -> str:
    """Name of the file process ``rank`` of one incarnation writes its stack dumps to."""
    return f"stacks-p{rank}-i{incarnation}.txt"


def native_log_name(rank: int, incarnation: int) -> str:
    """Name of the file process ``rank`` of one incarnation keeps native chatter in."""
    return f"native-p{rank}-i{incarnation}.log"


# -- typed engine environment -------------------------------------------------------------


def _opt_float(raw: str | None) -> float | None:
    return float(raw) if raw not in (None, "") else None


@dataclass(frozen=True)
class EngineEnv:
    """What the kernel tells one engine through its environment.

    ``to_env`` writes only what is set; ``from_env`` reads it back (missing values take
    the defaults below), so both sides agree on names and formats by construction.
    """

    process_id: int | None = None
    num_processes: int | None = None
    coordinator: str | None = None
    init_timeout: float = 60.0
    heartbeat_timeout: float | None = None
    early_init: bool = False
    parent_pid: int | None = None
    no_pdeathsig: bool = False
    stack_file: str | None = None
    relay_stacks: bool = False
    native_log: str | None = None
    incarnation: int = 0

    _NAMES = {
        "process_id": PROCESS_ID,
        "num_processes": NUM_PROCESSES,
        "coordinator": COORDINATOR,
        "init_timeout": INIT_TIMEOUT,
        "heartbeat_timeout": HEARTBEAT_TIMEOUT,
        "early_init": EARLY_INIT,
        "parent_pid": PARENT_PID,
        "no_pdeathsig": NO_PDEATHSIG,
        "stack_file": STACK_FILE,
        "relay_stacks": RELAY_STACKS,
        "native_log": NATIVE_LOG,
        "incarnation": INCARNATION,
    }

    def to_env(self) -> dict[str, str]:
        """The variables to set: flags as ``"1"``, numbers without trailing zeros."""
        env: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            if value is True:
                text = "1"
            elif isinstance(value, float):
                text = f"{value:g}"
            else:
                text = str(value)
            env[self._NAMES[f.name]] = text
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineEnv:
        """Read the variables back (``os.environ`` by default).

        Raises
        ------
        ValueError
            If a variable holds something its field cannot take, naming the variable.
        """
        environ = os.environ if environ is None else environ
        values: dict = {}
        for f in fields(cls):
            name = cls._NAMES[f.name]
            raw = environ.get(name)
            if raw is None or raw == "":
                continue
            try:
                if f.name in ("early_init", "no_pdeathsig", "relay_stacks"):
                    values[f.name] = raw not in ("0", "false", "False")
                elif f.name in ("process_id", "num_processes", "parent_pid", "incarnation"):
                    values[f.name] = int(raw)
                elif f.name in ("init_timeout", "heartbeat_timeout"):
                    values[f.name] = _opt_float(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                raise ValueError(f"${name}={raw!r} is not a valid {f.name}") from None
        return cls(**values)


# Every variable of EngineEnv: what a kernel may hand a standby engine when it takes over.
ENGINE_VARIABLES = frozenset(EngineEnv._NAMES.values())


def rank_variables(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The variables this process may find its rank in, in order: :data:`RANK_VARIABLES`,
    then those its launcher named in :data:`RANK_VARIABLE_NAMES`."""
    environ = os.environ if environ is None else environ
    named = [n.strip() for n in environ.get(RANK_VARIABLE_NAMES, "").split(",") if n.strip()]
    return (*RANK_VARIABLES, *(n for n in named if n not in RANK_VARIABLES))


def rank_from_env(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank, from the first of :func:`rank_variables` that is set.

    Raises
    ------
    RuntimeError
        If none is set.
    """
    environ = os.environ if environ is None else environ
    names = rank_variables(environ)
    for name in names:
        value = environ.get(name)
        if value is not None:
            return int(value)
    raise RuntimeError(f"no rank in the environment; set one of {', '.join(names)}")


# -- native output ----------------------------------------------------------------------------

# Whole lines that native code (gloo, XLA, gRPC, absl) wrote to an engine's fd 1 or fd 2 and
# that are not known chatter travel to the kernel as display_data with this mime type, never
# inside Python's own stream, so they cannot split a line Python printed. The payload is
# ``{"name": "stdout" | "stderr", "text": "one or more whole lines, each ending in \\n"}``.
NATIVE_MIME = "application/vnd.jaxsys.native+json"

# -- the persistent compilation cache ---------------------------------------------------------

# In a cluster's cache directory: jaxsys's records of the entries process 0 wrote (compile
# time in float seconds, jaxlib version), one ``<key>.json`` each. JAX reads only
# ``*-cache`` files there.
CACHE_META_DIR = "jaxsys-meta"
# ``--cache-dir`` value that starts a cluster without a persistent cache.
NO_CACHE = "none"

# -- cross-host transfers ---------------------------------------------------------------------

# Set ("1") on every engine of a cluster started with --transfer-ports: each JAX process
# opens its cross-host transfer socket on a free port of its own (JAX's port 0 hangs).
TRANSFER_PORTS = "JAXSYS_TRANSFER_PORTS"
