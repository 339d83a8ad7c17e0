"""The cluster's parts without a cluster: validated options, launcher classes, engine
environments, generated blocking twins, stack dumps and teardown's hold on launcher files."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from jaxsys_kernel import Cluster, contract
from jaxsys_kernel.cluster import teardown
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import (
    EngineContext,
    LocalLauncher,
    MpiLauncher,
    SlurmLauncher,
    SshLauncher,
    make_launcher,
)
from jaxsys_kernel.cluster.loop import AsyncFirst
from jaxsys_kernel.cluster.records import ProgressEvent
from jaxsys_kernel.errors import ConfigError

from ..fakes import FakeHub, FakeIppCluster, FakePKI

# -- ClusterConfig ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"launcher": "pbs"}, "unknown launcher 'pbs'; choose one of local, ssh, mpi, slurm"),
        ({"hosts": 0}, "hosts must be at least 1, got 0"),
        ({"hosts": []}, "hosts is an empty list; give at least one host name"),
        ({"hosts": 2, "launcher": "ssh"}, "the ssh launcher needs host names"),
        ({"devices_per_host": 0}, "devices_per_host must be at least 1, got 0"),
        ({"hosts": 2, "process_env": {2: {}}}, "process_env names process 2, outside 0-1"),
        ({"ca_file": "ca.pem"}, "give both ca_file and cert_dir"),
        (
            {"secure": False, "ca_file": "ca.pem", "cert_dir": "certs"},
            "ca_file/cert_dir make no sense with secure=False",
        ),
        (
            {"hosts": ["a"], "launcher": "ssh", "addresses": ["10.0.0.1"]},
            "addresses and process_prefix apply to the local launcher only",
        ),
        (
            {"hosts": 1, "launcher": "mpi", "process_prefix": {0: ["taskset"]}},
            "addresses and process_prefix apply to the local launcher only",
        ),
        ({"hosts": 2, "addresses": ["10.0.0.1"]}, "addresses has 1 entries for 2 processes"),
        (
            {"launcher_options": {"ssh_args": []}},
            "launcher_options apply to the ssh, mpi, slurm and kubernetes launchers",
        ),
        (
            {"hosts": ["a"], "launcher": "ssh", "launcher_options": {"ssh_arg": []}},
            "ssh_arg is not a setting of ipyparallel's SSH",
        ),
    ],
)
def test_config_refuses_what_cannot_work(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig(**kwargs)
    # Cluster checks the same, with the same words, before anything starts.
    with pytest.raises(ValueError, match=re.escape(message)):
        Cluster(**kwargs)


def test_config_fills_defaults():
    cfg = ClusterConfig(hosts=3, process_env={"1": {"A": "1"}}, env={"B": "2"})
    assert cfg.nprocs == 3 and cfg.host_names is None and cfg.ranks == [0, 1, 2]
    assert cfg.addresses == ["127.0.0.1"] * 3
    assert cfg.process_env == {1: {"A": "1"}} and cfg.env == {"B": "2"}
    assert cfg.launcher_options == {}
    ssh = ClusterConfig(hosts=["u@n1:2222", "n2"], launcher="ssh")
    assert ssh.nprocs == 2 and ssh.host_names == ["u@n1:2222", "n2"]
    assert ssh.launcher_options == {"remote_python": sys.executable}
    mine = ClusterConfig(hosts=["n1"], launcher="ssh", launcher_options={"remote_python": "py"})
    assert mine.launcher_options == {"remote_python": "py"}


def test_user_env_layers_process_env_over_env_over_os_environ(monkeypatch):
    monkeypatch.setenv("JAXSYS_TEST_LAYER", "os")
    cfg = ClusterConfig(hosts=2, env={"JAXSYS_TEST_LAYER": "env"}, process_env={1: {"X": "1"}})
    assert cfg.user_env(0)["JAXSYS_TEST_LAYER"] == "env"
    assert cfg.user_env(1)["X"] == "1" and "X" not in cfg.user_env(0)


# -- launchers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,cls",
    [
        ({"hosts": 2}, LocalLauncher),
        ({"hosts": ["a", "b"], "launcher": "ssh"}, SshLauncher),
        ({"hosts": 2, "launcher": "mpi"}, MpiLauncher),
        ({"hosts": 2, "launcher": "slurm"}, SlurmLauncher),
    ],
)
def test_launcher_is_chosen_once_from_the_config(kwargs, cls):
    assert type(make_launcher(ClusterConfig(**kwargs))) is cls
    c = Cluster(**kwargs)
    assert type(c._launcher) is cls
    # The name stays readable as a string.
    assert c.launcher == cls.name == kwargs.get("launcher", "local")


def test_what_each_launcher_can_do():
    assert LocalLauncher.engine_pids_here and LocalLauncher.restarts_one_process
    assert SshLauncher.restarts_one_process and not SshLauncher.engine_pids_here
    assert not SshLauncher.launcher_pids_here
    for cls in (MpiLauncher, SlurmLauncher):
        assert not cls.restarts_one_process and not cls.engine_pids_here
        assert cls.launcher_pids_here


def _env(launcher, rank=1, **ctx):
    return launcher.engine_env(rank, EngineContext(**ctx))


def test_local_engine_env(tmp_path):
    launcher = make_launcher(ClusterConfig(hosts=2, devices_per_host=3, init_timeout=20))
    env = _env(launcher, rank=1, incarnation=2, coordinator="127.0.0.1:1234", profile=tmp_path)
    engine = contract.EngineEnv.from_env(env)
    assert engine.process_id == 1 and engine.num_processes == 2
    assert engine.parent_pid == os.getpid() and not engine.no_pdeathsig
    assert engine.coordinator == "127.0.0.1:1234" and engine.early_init
    assert engine.init_timeout == 20.0 and engine.heartbeat_timeout == 10.0
    assert engine.stack_file == str(tmp_path / "log" / contract.stack_file_name(1, 2))
    assert engine.native_log == str(tmp_path / "log" / contract.native_log_name(1, 2))
    assert not engine.relay_stacks and engine.incarnation == 2
    assert env["XLA_FLAGS"].split()[-1] == "--xla_force_host_platform_device_count=3"
    assert env["JAX_PLATFORMS"] == os.environ.get("JAX_PLATFORMS", "cpu")
    assert env["JAX_ENABLE_RECOVERABILITY"] == "1" and env["PYTHONUNBUFFERED"] == "1"


def test_ssh_engine_env_has_no_parent_and_relays_stacks(tmp_path):
    launcher = make_launcher(ClusterConfig(hosts=["a", "b"], launcher="ssh"))
    env = _env(launcher, incarnation=1, profile=tmp_path)
    engine = contract.EngineEnv.from_env(env)
    assert contract.PARENT_PID not in env and engine.no_pdeathsig and engine.relay_stacks
    assert contract.STACK_FILE not in env and contract.COORDINATOR not in env
    assert "JAX_PLATFORMS" not in env or env["JAX_PLATFORMS"] == os.environ["JAX_PLATFORMS"]


@pytest.mark.parametrize("kind", ["mpi", "slurm"])
def test_batch_engine_env_relays_stacks_and_keeps_the_death_signal(kind, tmp_path):
    env = _env(make_launcher(ClusterConfig(hosts=2, launcher=kind)), profile=tmp_path)
    assert env[contract.RELAY_STACKS] == "1"
    assert contract.PARENT_PID not in env and contract.NO_PDEATHSIG not in env


def test_engine_env_layers(tmp_path):
    cfg = ClusterConfig(
        hosts=2,
        cache_dir="/cache",
        recoverable=False,
        heartbeat_timeout=None,
        env={"JAX_MTLS_CERT_FILE": "mine.pem", "A": "env"},
        process_env={0: {"A": "p0", "GRPC_VERBOSITY": "ERROR"}},
    )
    launcher = make_launcher(cfg)
    env0 = _env(launcher, rank=0, pki=FakePKI(), telemetry=FakeHub(), profile=tmp_path)
    env1 = _env(launcher, rank=1, pki=FakePKI(), telemetry=FakeHub(), profile=tmp_path)
    # The user's variables win over the certificates', a process's own over everyone's.
    assert env1["JAX_MTLS_CERT_FILE"] == "mine.pem" and env1["A"] == "env" and env0["A"] == "p0"
    assert env1[contract.TELEMETRY] == "tcp://127.0.0.1:5555"
    assert env1["JAX_COMPILATION_CACHE_DIR"] == "/cache"
    assert "JAX_ENABLE_RECOVERABILITY" not in env1 and contract.HEARTBEAT_TIMEOUT not in env1
    # Only process 0 traces refused handshakes; a verbosity the user chose stays.
    assert env0[contract.WATCH_HANDSHAKES] == "1" and "handshaker" in env0["GRPC_TRACE"]
    assert env0["GRPC_VERBOSITY"] == "ERROR" and contract.DROP_NATIVE_INFO not in env0
    assert contract.WATCH_HANDSHAKES not in env1
    no_pki = _env(launcher, rank=0, profile=tmp_path)
    assert contract.WATCH_HANDSHAKES not in no_pki


def test_batch_launch_env_leaves_the_rank_to_the_launcher(tmp_path):
    launcher = make_launcher(ClusterConfig(hosts=2, launcher="mpi"))
    launcher.ipp = FakeIppCluster()
    seen = launcher.ipp.started
    asyncio.run(launcher.launch(EngineContext(incarnation=3, profile=tmp_path), print))
    assert contract.PROCESS_ID not in seen["environment"]
    assert seen["n"] == 2 and seen["engine_set_id"] == "all-i3"
    assert launcher.engine_sets == {0: "all-i3", 1: "all-i3"}


def test_engine_arguments(tmp_path):
    local = make_launcher(ClusterConfig(hosts=2))
    args = local.engine_args(1, EngineContext(profile=tmp_path))
    assert "--IPEngine.id=1" in args and "--IPEngine.enable_nanny=False" in args
    assert f"--IPEngine.url_file={tmp_path / contract.ENGINE_CONNECTION_FILE}" in args
    ssh = make_launcher(ClusterConfig(hosts=["a"], launcher="ssh"))
    assert ssh.nanny_args() == ["--IPEngine.max_heartbeat_misses=20"]
    assert not any(
        a.startswith("--IPEngine.url_file=") for a in ssh.engine_args(0, EngineContext())
    )
    assert make_launcher(ClusterConfig(hosts=1, launcher="slurm")).nanny_args() == []


def test_remote_engines_heartbeat_misses_follow_the_environment(monkeypatch):
    ssh = make_launcher(ClusterConfig(hosts=["a"], launcher="ssh"))
    monkeypatch.setenv("JAXSYS_ENGINE_HEARTBEAT_MISSES", "4")
    assert ssh.nanny_args() == ["--IPEngine.max_heartbeat_misses=4"]
    # Too few would take a busy controller for a dead one.
    monkeypatch.setenv("JAXSYS_ENGINE_HEARTBEAT_MISSES", "1")
    assert ssh.nanny_args() == ["--IPEngine.max_heartbeat_misses=3"]
    monkeypatch.setenv("JAXSYS_ENGINE_HEARTBEAT_MISSES", "soon")
    with pytest.raises(ConfigError, match="JAXSYS_ENGINE_HEARTBEAT_MISSES='soon'"):
        ssh.nanny_args()


def test_coordinator_and_certificate_hosts():
    local = make_launcher(ClusterConfig(hosts=2, addresses=["10.1.0.1", "10.1.0.2"]))
    assert local.early_coordinator().startswith("10.1.0.1:")
    assert local.certificate_hosts() == ["10.1.0.1", "10.1.0.2"]
    ssh = make_launcher(ClusterConfig(hosts=["me@node7:2222", "node8"], launcher="ssh"))
    assert ssh.early_coordinator() is None
    assert ssh.coordinator_host("127.0.1.1") == "node7"
    assert ssh.certificate_hosts() == ["node7", "node8"]
    mpi = make_launcher(ClusterConfig(hosts=2, launcher="mpi"))
    assert mpi.coordinator_host("10.0.0.9") == "10.0.0.9" and mpi.certificate_hosts() is None


def test_controller_placement():
    local = make_launcher(ClusterConfig(hosts=1))
    assert local._controller_kwargs() == {"controller_ip": "127.0.0.1"}
    assert local.telemetry_addresses() == ("127.0.0.1", "127.0.0.1")
    slurm = make_launcher(ClusterConfig(hosts=1, launcher="slurm"))
    kwargs = slurm._controller_kwargs()
    # Engines run as one step of the job (srun), which holds the hosts between worlds.
    assert kwargs["controller_ip"] == "*"
    assert kwargs["engine_launcher_class"].__name__ == "SrunEngineSetLauncher"
    assert slurm.telemetry_addresses()[0] == "0.0.0.0"


def test_remote_stacks_come_back_as_telemetry():
    hub = FakeHub(dumps={0: (1, "old"), 1: (0, "")})

    def relay(ranks, sig):  # as engines' relays do: a new dump for each rank signalled
        assert sig == signal.SIGUSR1
        for r in ranks:
            seq, _ = hub.dumps[r]
            hub.dumps[r] = (seq + 1, f"stack of p{r}")

    launcher = make_launcher(ClusterConfig(hosts=["a", "b"], launcher="ssh"))
    out = launcher.dump_stacks([0, 1], 1.0, relay, None, hub)
    assert out == {0: "stack of p0", 1: "stack of p1"}
    assert launcher.dump_stacks([0], 1.0, relay, None, None) == {}


# -- the generated blocking twins --------------------------------------------------------------


@pytest.mark.parametrize("name", ["start", "restart", "restart_process"])
def test_every_public_coroutine_has_a_generated_twin(name):
    coro, twin = getattr(Cluster, name), getattr(Cluster, f"{name}_sync")
    assert inspect.iscoroutinefunction(coro) and not inspect.iscoroutinefunction(twin)
    assert twin.__doc__ == f"Blocking twin of :meth:`{name}`."
    assert twin.__name__ == f"{name}_sync"
    assert inspect.signature(twin).parameters.keys() == inspect.signature(coro).parameters.keys()
    # The coroutine keeps its own documentation.
    assert coro.__doc__ and "Blocking twin" not in coro.__doc__


def test_stop_sync_is_the_kill_it_always_was():
    assert Cluster.stop_sync.__doc__ == "Blocking twin of :meth:`stop`."
    c = Cluster(hosts=1, progress=lambda e: None)
    assert c.stop_sync() >= 0 and c.state == "stopped"
    # Teardown needs no loop: none was started for it.
    assert c._loop is None


class _Worker(AsyncFirst):
    async def where(self, stage: str) -> str:
        """Report progress, and say which thread ran the work."""
        self._report(stage, 1, 1)
        return threading.current_thread().name

    async def fail(self) -> None:
        """Raise."""
        raise KeyError("from the loop")

    async def time_out(self) -> None:
        """Raise the builtin TimeoutError, as a client that got no answer does."""
        await asyncio.sleep(0.1)
        raise TimeoutError("no answer")


def test_twins_run_on_the_private_loop_and_progress_on_the_caller():
    events = []
    w = _Worker(progress=lambda e: events.append((e, threading.current_thread().name)))
    assert w.where_sync("sync") == "jaxsys-cluster-loop"
    assert asyncio.run(w.where("async")) == "jaxsys-cluster-loop"
    me = threading.current_thread().name
    assert events == [(ProgressEvent("sync", 1, 1), me), (ProgressEvent("async", 1, 1), me)]
    with pytest.raises(KeyError, match="from the loop"):
        w.fail_sync()
    assert _Worker.fail_sync.__doc__ == "Blocking twin of :meth:`fail`."


def test_a_coroutine_that_raises_timeout_error_ends_its_twin_at_once():
    # TimeoutError is what a waiting caller saw when the work had not finished yet; raised
    # by the work itself, it must end the wait, not make it re-raise forever.
    w = _Worker(progress=lambda e: None)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer") as info:
        w.time_out_sync()
    assert time.monotonic() - t0 < 5
    # Raised once: the traceback did not grow with re-raises.
    assert len(traceback.extract_tb(info.value.__traceback__)) < 20
    with pytest.raises(TimeoutError, match="no answer"):
        asyncio.run(w.time_out())


# -- teardown ----------------------------------------------------------------------------------


def test_disowned_launchers_leave_their_files_to_teardown(tmp_path, monkeypatch, caplog):
    from ipyparallel.cluster.launcher import LocalProcessLauncher

    log = logging.getLogger("jaxsys.test.launcher")

    def launcher(name: str) -> LocalProcessLauncher:
        made = LocalProcessLauncher(
            work_dir=".", profile_dir=str(tmp_path), cluster_id=name, log=log
        )
        Path(made.output_file).write_text("engine output\n")
        return made

    kept, raced = launcher("kept"), launcher("raced")
    teardown.disown_output([kept])
    real_isfile = os.path.isfile

    def profile_removed_meanwhile(path):
        # Teardown removes the profile between ipyparallel's check and its own removal.
        found = real_isfile(path)
        if found:
            os.unlink(path)
        return found

    monkeypatch.setattr(os.path, "isfile", profile_removed_meanwhile)
    with caplog.at_level(logging.WARNING, logger=log.name):
        # What a launcher does when its process has stopped: read its log, delete it.
        assert kept.get_output(remove=True) == ""
        assert [r.getMessage() for r in caplog.records] == []
        raced.get_output(remove=True)
    # Without being disowned, the launcher reports the file teardown took from it.
    assert ["Failed to remove" in r.getMessage() for r in caplog.records] == [True]


def test_pid_alive():
    assert teardown.pid_alive(os.getpid())
    assert not teardown.pid_alive(None) and not teardown.pid_alive(0)


def test_the_early_coordinator_port_is_held_until_teardown():
    """Nothing else on this machine is given the port before process 0 binds it, yet a
    server that sets SO_REUSEPORT (as gRPC does) still can bind and serve it."""
    import socket

    local = make_launcher(ClusterConfig(hosts=2))
    host, port = local.early_coordinator().rsplit(":", 1)
    port = int(port)
    with socket.socket() as intruder, pytest.raises(OSError):
        intruder.bind((host, port))
    with socket.socket() as server, socket.socket() as client:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # (Only so that the check below is not refused by this connection's TIME_WAIT.)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen()
        client.connect((host, port))
        conn, _ = server.accept()
        conn.close()
    # A new world gets a new port; the old one is let go.
    assert int(local.early_coordinator().rsplit(":", 1)[1]) != port
    with socket.socket() as s:
        # SO_REUSEADDR passes the closed connection's TIME_WAIT, never a bound socket.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    local.release_ports()
    assert local._held_ports == []


def test_an_engine_holds_the_port_it_found_until_jax_binds_it():
    import socket

    from jaxsys_kernel.engine import bootstrap

    port = bootstrap.free_port("127.0.0.1")
    try:
        with socket.socket() as intruder, pytest.raises(OSError):
            intruder.bind(("127.0.0.1", port))
    finally:
        bootstrap._release_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_transfer_socket_port_is_kept_for_jax():
    import socket
    import types

    from jaxsys_kernel.engine import transfers

    chosen = {}
    fake_jax = types.SimpleNamespace(
        config=types.SimpleNamespace(update=lambda name, value: chosen.update({name: value}))
    )
    env = {contract.TRANSFER_PORTS: "1"}
    address = transfers.configure(fake_jax, "127.0.0.1:1234", environ=env)
    assert chosen == {transfers.OPTION: address}
    port = int(address.rsplit(":", 1)[1])
    with socket.socket() as intruder, pytest.raises(OSError):
        intruder.bind(("127.0.0.1", port))
    assert transfers.configure(fake_jax, "127.0.0.1:1234", environ={}) is None
