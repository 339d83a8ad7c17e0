"""Start-up of one JAX process: learn its rank, then join the distributed runtime."""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import tempfile
import threading
import time

from .. import _compat, contract
from . import joining, ports, preemption, readiness
from .state import STATE

# Launchers put the rank in different variables (see contract.RANK_VARIABLES).
RANK_VARIABLES = contract.RANK_VARIABLES


OUTPUT_FLUSH_INTERVAL = 0.05
# Set for engines on other hosts: their stack dumps reach the kernel as telemetry.
ENV_STACKS_RELAY = contract.RELAY_STACKS
STACK_RELAY_INTERVAL = 0.1
GO_WAIT_S = readiness.GO_WAIT_S
MAX_STACK_DUMP = 256 * 1024


def process_rank() -> int:
    """Return this process's JAX process index, read from its environment.

    Returns
    -------
    int
        The rank given by the launcher.

    Raises
    ------
    RuntimeError
        If none of the rank variables is set.
    """
    return contract.rank_from_env()


def describe_process() -> dict:
    """Report who this engine is, before JAX starts.

    Also arms ``faulthandler`` on SIGUSR1 so that the stacks of a process blocked in a
    collective can be dumped into its log without interrupting it, and starts reading
    what native code writes to fd 1 and fd 2 (:mod:`jaxsys_kernel.engine.output`; in the
    process serving the coordination service that includes refused TLS handshakes).

    Returns
    -------
    dict
        ``rank``, ``pid``, ``started`` (when this process started, which a teardown checks
        before it signals the pid), ``host``, ``address`` and ``nanny_pid`` (None without a
        nanny).
    """
    if hasattr(signal, "SIGUSR1"):
        # A file of its own: fd 2 is captured by ipykernel and would land in cell output.
        env = contract.EngineEnv.from_env()
        relay = env.relay_stacks
        stack_file = env.stack_file or (_own_stack_file() if relay else None)
        if stack_file and STATE.boot.stack_fh is None:
            STATE.boot.stack_fh = open(stack_file, "a")  # noqa: SIM115 - kept open for faulthandler
            if relay:
                _start_stack_relay(stack_file)
        faulthandler.register(
            signal.SIGUSR1, file=STATE.boot.stack_fh or sys.__stderr__, all_threads=True
        )
    # ipykernel sends buffered output every 0.2 s; processes flushing out of phase would
    # then print the same line up to 0.2 s apart, too far apart for the kernel to merge.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = OUTPUT_FLUSH_INTERVAL
        _compat.quick_empty_flush(stream)
    # Deferred: these need IPython's shell, which exists only once the engine has started.
    from . import display, output, programs

    display.register_formatters()
    # Only now are fd 1 and fd 2 ipykernel's pipes: ours must sit in front of them.
    output.install_from_env()
    # A script runs as under `python`: a clean sys.argv, and %run raises what it raised.
    programs.install_shell()
    # Deferred: as above.
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    _compat.quiet_engine_iopub(kernel)
    _compat.quiet_engine_log(kernel)
    _compat.memo_run_cell_signature()
    nanny_pid = _compat.nanny_pid()
    host = socket.gethostname()
    address = _host_address(host)
    return {
        "rank": process_rank(),
        "pid": os.getpid(),
        "started": _started(),
        "host": host,
        "address": address,
        "nanny_pid": nanny_pid,
    }


def wait_booted(timeout: float) -> int:
    """This process's pid once its start-up imports (``import jax`` among them, which runs
    on after the engine has registered) have finished, waiting at most ``timeout`` seconds;
    0 when they have not."""
    early = STATE.boot.early
    return os.getpid() if early is not None and early.done.wait(timeout) else 0


def take_over(settings: dict[str, str]) -> dict:
    """Become the process a standby engine was kept for, then report who it is.

    A standby engine boots with its rank's environment but without what belongs to one
    incarnation of the world (which incarnation, and the stack and native-log files named
    after it): the kernel hands those over here, just before the engine is identified.

    Parameters
    ----------
    settings : dict of str to str
        Environment variables of :class:`jaxsys_kernel.contract.EngineEnv` to set.

    Returns
    -------
    dict
        What :func:`describe_process` returns.

    Raises
    ------
    ValueError
        For a variable that is not one of the engine's own, which a stale kernel could send.
    """
    strangers = sorted(set(settings) - contract.ENGINE_VARIABLES)
    if strangers:
        raise ValueError(f"take_over sets only the engine's own variables, not {strangers}")
    os.environ.update(settings)
    return describe_process()


def _started() -> float | None:
    """This process's start time as psutil reads it (the kernel compares the two)."""
    # Deferred: only registration needs it.
    import psutil

    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return None


def _host_address(host: str) -> str:
    """This host's address for the others: a non-loopback one if its name has any.

    Debian maps the host name to 127.0.1.1 by default; other hosts cannot use that.
    """
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return "127.0.0.1"
    addresses = [info[4][0] for info in infos]
    outside = [a for a in addresses if not a.startswith("127.")]
    return (outside or addresses or ["127.0.0.1"])[0]


def _own_stack_file() -> str:
    """A stack file on this host: in the engine's profile if it has one, else in /tmp."""
    base = os.path.join(os.environ.get("IPP_PROFILE_DIR", ""), "log")
    if not os.path.isdir(base):
        base = tempfile.gettempdir()
    return os.path.join(base, f"jaxsys-stacks-p{process_rank()}-{os.getpid()}.txt")


def _start_stack_relay(path: str) -> None:
    """Send what faulthandler appends to ``path`` to the kernel, as telemetry.

    faulthandler writes from its C signal handler, which works while the main thread sits
    in a collective; this thread only needs the GIL, which JAX releases while it waits.
    """
    # Deferred: the boot path (the engine's config file) imports this module before anything else runs; the agent is loaded only when telemetry is on.
    from ..telemetry import schema
    from . import agent

    def relay() -> None:
        offset = os.path.getsize(path) if os.path.exists(path) else 0
        while True:
            time.sleep(STACK_RELAY_INTERVAL)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size <= offset:
                continue
            time.sleep(0.05)  # the rest of the dump lands within microseconds
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            offset += len(data)
            text = data.decode("utf-8", "replace")[-MAX_STACK_DUMP:]
            agent.publish(schema.STACKS, text=text)

    threading.Thread(target=relay, name="jaxsys-stack-relay", daemon=True).start()


def free_port(bind: str = "") -> int:
    """Return a TCP port that is free on this host, and keep it so until JAX binds it.

    A port merely found free can be given to another socket before the coordination
    service binds it. The port stays bound here (not listening) until :func:`initialize`
    has run; ``SO_REUSEPORT`` lets gRPC, which sets it too, bind the same port meanwhile.

    Parameters
    ----------
    bind : str
        Address to probe on; the empty string means every interface.

    Returns
    -------
    int
        A port number.
    """
    _release_port()
    STATE.boot.held_port = ports.hold_port(bind)
    return STATE.boot.held_port.getsockname()[1]


def _release_port() -> None:
    held, STATE.boot.held_port = STATE.boot.held_port, None
    if held is not None:
        held.close()


class _EarlyInit:
    """JAX start-up begun by the engine itself, in a thread, before it registered."""

    def __init__(self):
        self.done = threading.Event()
        # Set by the kernel's initialize(): every process is ready, join now.
        self.go = threading.Event()
        self.doing = "starting"
        self.coordinator: str | None = None
        self.result: dict | None = None
        self.error: BaseException | None = None


def own_credentials() -> None:
    """Point JAX at this process's own mTLS certificate and key, where the launcher named
    them by a path to complete with the rank (one environment for every rank).

    Raises
    ------
    RuntimeError
        If the rank is unknown or its certificate or key is missing.
    """
    for template_var, option, what in (
        (contract.MTLS_CERT_TEMPLATE, "jax_mtls_cert_file", "certificate"),
        (contract.MTLS_KEY_TEMPLATE, "jax_mtls_key_file", "key"),
    ):
        template = os.environ.get(template_var)
        if not template:
            continue
        path = template.replace(contract.RANK_FIELD, str(process_rank()))
        if not os.path.isfile(path):
            raise RuntimeError(
                f"process {process_rank()} has no mTLS {what} at {path}: "
                "the cluster's certificates must be on a filesystem every host shares"
            )
        # JAX reads JAX_<OPTION> when it is imported; an engine that imported it already
        # is told directly.
        os.environ[option.upper()] = path
        jax = sys.modules.get("jax")
        if jax is not None:
            jax.config.update(option, path)


def start_early_init() -> None:
    """Begin ``import jax`` and, if the launcher gave the world's shape, initialisation.

    Called from the engine's config file while the engine registers with the hub, so that
    the slowest part of start-up overlaps with it. The environment
    (:class:`jaxsys_kernel.contract.EngineEnv`) carries the rank, the number of processes,
    the coordinator and the timeouts; without a coordinator only the import happens.
    """
    if STATE.boot.early is not None:
        return
    # JAX's handler is installed in the thread below while the engine registers, and the
    # engine would install its own when done: SIGTERM must stay a preemption notice.
    preemption.leave_sigterm_to_jax()
    early = STATE.boot.early = _EarlyInit()
    try:
        env = contract.EngineEnv.from_env()
        own_credentials()
    except (ValueError, RuntimeError) as e:
        # Handed to the kernel by initialize(), like any other start-up error.
        early.error = e
        early.done.set()
        return
    coordinator = early.coordinator = env.coordinator

    def run():
        try:
            early.doing = "importing JAX"
            time.sleep(readiness.import_delay(process_rank()))
            # Deferred: this thread exists to import JAX while the engine registers.
            import jax  # noqa: F401 - the import is the point

            if not coordinator:
                # Deferred: a standby engine imports now, while nobody waits for it, what
                # taking over and joining will need.
                from . import agent, display, output, transfers  # noqa: F401
            if coordinator:
                if env.num_processes is None:
                    raise RuntimeError(f"${contract.NUM_PROCESSES} is not set")
                # Joining starts JAX's initialisation timeout: wait until every process
                # has imported, which the kernel says by calling initialize().
                early.doing = "ready"
                if not early.go.wait(GO_WAIT_S):
                    raise TimeoutError(f"no word to join within {GO_WAIT_S:g} s")
                early.doing = "joining"
                early.result = _join(
                    coordinator,
                    env.num_processes,
                    process_rank(),
                    bind_address=coordinator,
                    timeout=env.init_timeout,
                    heartbeat_timeout=env.heartbeat_timeout,
                )
        except BaseException as e:  # noqa: BLE001 - handed to the kernel by initialize()
            early.error = e
        finally:
            early.done.set()

    threading.Thread(target=run, name="jaxsys-early-init", daemon=True).start()


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    bind_address: str | None = None,
    timeout: float = 60.0,
    heartbeat_timeout: float | None = None,
) -> dict:
    """Join the JAX distributed runtime as ``process_id``.

    Parameters
    ----------
    coordinator_address : str
        ``host:port`` of the coordination service, served by process 0.
    num_processes : int
        Number of processes in the world.
    process_id : int
        This process's index; must equal its rank from the environment.
    bind_address : str, optional
        Where process 0 binds the coordination service (loopback for local clusters).
    timeout : float
        Seconds to wait for every process to join.
    heartbeat_timeout : float, optional
        Seconds without heartbeats after which a process is considered dead.

    Returns
    -------
    dict
        ``process_index``, ``process_count``, ``local_devices`` (ids), ``device_count``,
        ``platform`` and ``seconds`` spent initialising.
    """
    rank = process_rank()
    if rank != process_id:
        raise RuntimeError(f"asked to join as process {process_id} but this engine has rank {rank}")
    own_credentials()
    early = STATE.boot.early
    if early is not None and early.coordinator == coordinator_address:
        early.go.set()
        if not early.done.wait(timeout):
            raise TimeoutError(f"process {rank} did not join within {timeout:g} s")
        if early.error is not None:
            raise early.error
        return early.result
    if early is not None:
        # Let a running import finish instead of racing it.
        early.done.wait(timeout)
    try:
        return _join(
            coordinator_address,
            num_processes,
            process_id,
            bind_address=bind_address,
            timeout=timeout,
            heartbeat_timeout=heartbeat_timeout,
        )
    finally:
        _release_port()


def _join(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    bind_address: str | None,
    timeout: float,
    heartbeat_timeout: float | None,
) -> dict:
    t0 = time.perf_counter()
    # Deferred: engines import JAX only once start-up is under way (start_early_init).
    import jax

    # Deferred: only processes with --transfer-ports need it, after JAX is imported.
    from . import transfers

    # Before the backend starts: JAX reads the transfer socket's address only then.
    transfer_address = transfers.configure(jax, coordinator_address)
    call = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
        "initialization_timeout": int(max(1, timeout)),
        **joining.options(bind_address, heartbeat_timeout),
    }
    time.sleep(readiness.join_delay(process_id))
    if process_id != 0:
        # Not before process 0 listens: JAX's own timeout still judges one that never does.
        joining.wait_for_coordinator(jax, coordinator_address, timeout)
    jax.distributed.initialize(**call)
    # Touching the devices completes backend start-up (the topology exchange), so a
    # process that cannot start its backend fails here, inside the deadline, not later.
    local = jax.local_devices()
    if jax.process_index() != process_id:
        raise RuntimeError(f"JAX reports process_index {jax.process_index()} for rank {process_id}")
    # Deferred: the agent starts only after JAX has joined, and only with telemetry.
    from . import agent, programs

    agent.start_from_env(process_id)
    # From now on the world is jaxsys's: a program's own initialize() and shutdown() are
    # checked against it and kept from ending it.
    programs.own_world(jax, call)
    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "local_devices": [d.id for d in local],
        "device_count": jax.device_count(),
        "platform": local[0].platform if local else "",
        "seconds": time.perf_counter() - t0,
        # What %jaxsys start --explain shows: the call made and the settings it ran under.
        "call": call,
        "settings": _explained_settings(jax) + _transfer_setting(transfer_address),
    }


# The JAX options that shape initialize() besides its arguments, each with the environment
# variable that set it here (JAX reads JAX_<NAME> into jax_<name> at import).
EXPLAINED_OPTIONS = (
    "jax_enable_recoverability",
    "jax_mtls_cert_file",
    "jax_mtls_key_file",
    "jax_mtls_ca_file",
    "jax_mtls_peer_uri_prefix",
    "jax_distributed_verify_secure_credentials",
)


def _transfer_setting(address: str | None) -> list[dict]:
    """The transfer socket jaxsys set (``--transfer-ports``), as an explained option."""
    if address is None:
        return []
    # Deferred: only processes with --transfer-ports need it.
    from . import transfers

    return [
        {
            "option": transfers.OPTION,
            "value": address,
            "set_by": "set by jaxsys (--transfer-ports): a port of its own, 0 does not work",
        }
    ]


def _explained_settings(jax) -> list[dict]:
    """Each explained option's value in this process and the variable that set it."""
    rows = []
    for name in EXPLAINED_OPTIONS:
        value = getattr(jax.config, name, None)
        var = name.upper()
        rows.append({"option": name, "value": value, "env": var, "env_value": os.environ.get(var)})
    return rows
