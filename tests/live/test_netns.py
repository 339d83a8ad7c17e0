"""Self-checks of the network-namespace hosts and the packet capture in ``tests/netns.py``.

These prove that processes in separate namespaces reach each other and the root
namespace over the private bridge, that a capture on the bridge sees their plaintext, and
that teardown leaves nothing behind. The slow test runs two JAX processes on two such
hosts, as a later cluster test will, and records what a capture sees of them without TLS.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from .. import netns

pytestmark = pytest.mark.usefixtures("tag")

# Seconds any one child process may live; the waits below are shorter than the test's own
# pytest timeout, so a stuck child fails the test instead of hanging it.
CHILD_TIMEOUT = 30.0

SERVER = textwrap.dedent(
    """
    import socket, sys
    addr, port, reply = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    with socket.create_server((addr, port)) as srv:
        srv.settimeout(20)
        print("READY", flush=True)
        conn, peer = srv.accept()
        with conn:
            conn.settimeout(20)
            data = b""
            while len(data) < 1 << 20 and (chunk := conn.recv(4096)):
                data += chunk
            conn.sendall(reply)
    print(peer[0], data.decode(), flush=True)
    """
)

CLIENT = textwrap.dedent(
    """
    import socket, sys
    addr, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    with socket.create_connection((addr, port), timeout=20) as conn:
        conn.sendall(marker)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while len(data) < 1 << 20 and (chunk := conn.recv(4096)):
            data += chunk
    print(data.decode(), flush=True)
    """
)


@pytest.fixture
def need_netns():
    """Skip, with the reason, where namespaces or tcpdump are not available."""
    reason = netns.available(need_capture=True)
    if reason is not None:
        pytest.skip(reason)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout, or an error once ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None and not select.select([proc.stdout], [], [], 0)[0]:
            raise AssertionError(f"no line from {proc.args} (rc={proc.poll()}): {line!r}")
        if select.select([proc.stdout], [], [], min(left, 0.5))[0]:
            byte = os.read(proc.stdout.fileno(), 1)
            if not byte:
                raise AssertionError(f"{proc.args} closed stdout after {line!r}")
            line += byte
    return line.decode()


def assert_torn_down(hosts: netns.TestHosts) -> None:
    """Nothing that ``hosts`` made survives: namespaces, links, hosts files."""
    assert not set(hosts.namespaces) & set(netns.namespace_names())
    shown = subprocess.run(
        ["ip", "link", "show", "dev", hosts.bridge], capture_output=True, timeout=10
    )
    assert shown.returncode != 0, f"bridge {hosts.bridge} is still there"
    assert hosts.leftovers() == []


def python_in(hosts: netns.TestHosts, i: int, script: str, *args: str) -> subprocess.Popen:
    """Run a Python ``script`` with ``args`` inside host ``i``, stdout piped."""
    return hosts.popen(
        i, [sys.executable, "-c", script, *args], CHILD_TIMEOUT, stdout=subprocess.PIPE
    )


def test_namespace_to_namespace(need_netns, tmp_path):
    """Host 1 sends a marker to a server on host 0; the bridge capture sees it."""
    port = 40123
    with netns.TestHosts(2) as hosts:
        assert set(hosts.namespaces) <= set(netns.namespace_names())
        assert len(set(hosts.host_addresses)) == 2
        with netns.Capture(hosts.bridge, tmp_path / "ns.pcap", ports=[port]) as cap:
            server = python_in(hosts, 0, SERVER, hosts.host_addresses[0], str(port), "PONG-77")
            client = None
            try:
                assert read_line(server, CHILD_TIMEOUT) == "READY\n"
                client = python_in(
                    hosts, 1, CLIENT, hosts.host_addresses[0], str(port), "NS-MARKER-5150"
                )
                reply, _ = client.communicate(timeout=CHILD_TIMEOUT)
                got, _ = server.communicate(timeout=CHILD_TIMEOUT)
            finally:
                netns.kill_group(server)
                if client is not None:
                    netns.kill_group(client)
        assert client.returncode == 0 and server.returncode == 0
        assert reply.decode().strip() == "PONG-77"
        # The server saw the client's own address: the packets went through the bridge.
        assert got.decode().split() == [hosts.host_addresses[1], "NS-MARKER-5150"]
        assert cap.contains(b"NS-MARKER-5150")
        assert cap.contains(b"PONG-77")
        assert (hosts.host_addresses[1], hosts.host_addresses[0]) in {
            (f[0], f[2]) for f in cap.flows()
        }
    assert_torn_down(hosts)


def test_namespace_to_root_namespace(need_netns, tmp_path):
    """A process in a namespace reaches a server on the bridge address, both ways."""
    with netns.TestHosts(2) as hosts:
        with socket.create_server((hosts.bridge_address, 0)) as srv:
            srv.settimeout(CHILD_TIMEOUT)
            port = srv.getsockname()[1]
            with netns.Capture(hosts.bridge, tmp_path / "root.pcap", ports=[port]) as cap:
                client = python_in(
                    hosts, 1, CLIENT, hosts.bridge_address, str(port), "UP-MARKER-2112"
                )
                try:
                    conn, peer = srv.accept()
                    with conn:
                        conn.settimeout(CHILD_TIMEOUT)
                        data = b""
                        while len(data) < 1 << 20 and (chunk := conn.recv(4096)):
                            data += chunk
                        conn.sendall(b"DOWN-MARKER-1984")
                    reply, _ = client.communicate(timeout=CHILD_TIMEOUT)
                finally:
                    netns.kill_group(client)
        assert peer[0] == hosts.host_addresses[1]
        assert data == b"UP-MARKER-2112"
        assert reply.decode().strip() == "DOWN-MARKER-1984"
        assert cap.contains(b"UP-MARKER-2112")
        assert cap.contains(b"DOWN-MARKER-1984")
    assert_torn_down(hosts)


def test_capture_keeps_only_its_ports(need_netns, tmp_path):
    """A capture limited to one port records nothing of a connection on another."""
    with netns.TestHosts(1) as hosts:
        with socket.create_server((hosts.bridge_address, 0)) as srv:
            srv.settimeout(CHILD_TIMEOUT)
            port = srv.getsockname()[1]
            with netns.Capture(hosts.bridge, tmp_path / "other.pcap", ports=[port + 1]) as cap:
                client = python_in(hosts, 0, CLIENT, hosts.bridge_address, str(port), "HIDDEN")
                try:
                    conn, _ = srv.accept()
                    conn.close()
                    client.communicate(timeout=CHILD_TIMEOUT)
                finally:
                    netns.kill_group(client)
    assert cap.segments() == []
    assert not cap.contains(b"HIDDEN")
    assert_torn_down(hosts)


JAX_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    pid, coordinator, own_address = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=2,
        process_id=pid,
        coordinator_bind_address=coordinator,
        initialization_timeout=30,
    )
    client = distributed.global_state.client
    if own_address != "-":
        # gloo otherwise binds to whatever gethostname() resolves to; there is no jax
        # option or environment variable for it, only this argument of the factory.
        def cpu_backend():
            gloo = _jax.make_gloo_tcp_collectives(
                distributed_client=client, hostname=own_address
            )
            return xla_bridge.make_cpu_client(collectives=gloo)

        xla_bridge.register_backend_factory("cpu", cpu_backend, priority=0, fail_quietly=False)

    kv = None
    if pid == 0:
        client.key_value_set("probe", "KV-MARKER-1234")
    else:
        kv = client.blocking_key_value_get("probe", 10000)

    mesh = Mesh(np.array(jax.devices()), ("x",))
    local = np.array([float(pid + 1)])
    arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local)
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(arr)
    print(json.dumps({
        "devices": jax.device_count(),
        "sum": float(np.asarray(total.addressable_data(0))),
        "kv": kv,
    }), flush=True)
    jax.distributed.shutdown()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("gloo_address", ["hosts-file", "factory-argument"])
def test_jax_processes_on_two_hosts(need_netns, tmp_path, gloo_address):
    """Two JAX processes, one per namespace: a KV exchange and a gloo all-reduce.

    gloo needs each process's own namespace address: either the namespace's hosts file
    maps the hostname to it (``hosts-file``), or the process passes it to gloo itself
    (``factory-argument``). Without TLS, the capture shows the KV value in plaintext.
    """
    port = 47011
    pin = gloo_address == "hosts-file"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["JAX_PLATFORMS"] = "cpu"
    script = tmp_path / "probe.py"
    script.write_text(JAX_SCRIPT)
    with netns.TestHosts(2, pin_hostname=pin) as hosts:
        coordinator = f"{hosts.host_addresses[0]}:{port}"
        logs = [tmp_path / f"p{i}.log" for i in range(2)]
        procs = []
        with netns.Capture(hosts.bridge, tmp_path / "jax.pcap") as cap:
            try:
                for i in range(2):
                    own = "-" if pin else hosts.host_addresses[i]
                    argv = [sys.executable, str(script), str(i), coordinator, own]
                    with open(logs[i], "wb") as log:
                        procs.append(
                            hosts.popen(i, argv, 90, env=env, stdout=subprocess.PIPE, stderr=log)
                        )
                outs = [p.communicate(timeout=100)[0].decode() for p in procs]
            finally:
                for p in procs:
                    netns.kill_group(p)
        for i, p in enumerate(procs):
            assert p.returncode == 0, f"process {i}: {outs[i]}\n{logs[i].read_text()[-3000:]}"
        results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        assert [r["devices"] for r in results] == [2, 2]
        assert [r["sum"] for r in results] == [3.0, 3.0]
        assert results[1]["kv"] == "KV-MARKER-1234"

        # The coordination service's RPCs are plain gRPC here: the value is readable.
        assert cap.contains(b"KV-MARKER-1234")
        a, b = hosts.host_addresses
        pairs = {(f[0], f[2]) for f in cap.flows() if port not in (f[1], f[3])}
        # gloo's own connections (not the coordinator's port) ran between the two hosts.
        assert {(a, b), (b, a)} <= pairs, f"gloo traffic not seen between hosts: {pairs}"
    assert_torn_down(hosts)
