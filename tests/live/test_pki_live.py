"""Tests of the per-cluster PKI: files, certificate contents, rotation, bring-your-own
certificates, and (slow) real JAX processes talking mutual TLS with the certificates."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.pki import (
    ClusterPKI,
    peer_certificate_serial,
)

# -- real JAX processes ------------------------------------------------------------------

# Each process contributes pid + k to a global array of one element per process and prints
# the jitted sum; it then holds its place in the cluster until the go-file appears, sums
# again and shuts down cleanly.
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    pid, port, go, init_timeout, hold = (
        int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    addr = f"127.0.0.1:{port}"
    jax.distributed.initialize(coordinator_address=addr, num_processes=2, process_id=pid,
                               coordinator_bind_address=addr,
                               initialization_timeout=init_timeout)
    if pid == 0:
        print("READY", port, flush=True)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))

    def step(k):
        local = np.array([pid + k], np.float32)
        arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), local)
        return float(total(arr))

    print("SUM1", step(1), flush=True)
    deadline = time.monotonic() + hold
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("SUM2", step(10), flush=True)
    jax.distributed.shutdown()
    print("DONE", flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Child:
    """One JAX subprocess with its stdout and stderr in files."""

    def __init__(self, name, workdir: Path, args, extra_env):
        self.name = name
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        env.update(
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            JAX_PLATFORMS="cpu",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env)
        script = workdir / "child.py"
        if not script.exists():
            script.write_text(_CHILD)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *map(str, args)],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.started = time.monotonic()

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, marker: str, timeout: float) -> float:
        """Wait until ``marker`` is on stdout; return seconds since start."""
        deadline = time.monotonic() + timeout
        while marker not in self.stdout():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.proc.returncode}):\n{self.report()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: no {marker!r} after {timeout} s:\n{self.report()}")
            time.sleep(0.05)
        return time.monotonic() - self.started

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout} s:\n{self.report()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def report(self) -> str:
        return f"--- stdout\n{self.stdout()}\n--- stderr\n{self.stderr()[-4000:]}"


def _start_world(pki, workdir, port, go, *, hold=60, extra_env0=None):
    children = []
    for i in range(2):
        env = dict(pki.env(i))
        if i == 0:
            env.update(extra_env0 or {})
        children.append(_Child(f"p{i}", workdir, [i, port, go, 30, hold], env))
    return children


@pytest.mark.slow
def test_jax_processes_use_the_certificates(tmp_path):
    pki = ClusterPKI.create(tmp_path / "pki", "real", 2)
    port, go = _free_port(), tmp_path / "go"
    children = _start_world(pki, tmp_path, port, go)
    try:
        children[0].wait_for("READY", 60)
        for c in children:
            c.wait_for("SUM1", 60)
            assert "SUM1 3.0" in c.stdout(), c.report()
        t0 = time.monotonic()
        served = peer_certificate_serial(f"127.0.0.1:{port}", pki.credentials(1))
        print(f"probe took {time.monotonic() - t0:.3f} s")
        assert served == pki.serial(0)
        go.touch()
        for c in children:
            assert c.wait(30) == 0, c.report()
            assert "SUM2 21.0" in c.stdout() and "DONE" in c.stdout(), c.report()
    finally:
        for c in children:
            c.kill()


@pytest.mark.slow
def test_intruder_from_another_ca_is_refused(tmp_path):
    pki = ClusterPKI.create(tmp_path / "pki", "real", 2)
    # Same cluster id, so the URI SANs look right and only the CA differs.
    other = ClusterPKI.create(tmp_path / "other", "real", 2)
    port, go = _free_port(), tmp_path / "go"
    children = _start_world(pki, tmp_path, port, go, hold=90)
    intruders = []
    try:
        for c in children:
            c.wait_for("SUM1", 60)
            assert "SUM1 3.0" in c.stdout(), c.report()
        # One intruder trusts its own CA; the other trusts the cluster's CA (the CA
        # certificate is no secret) and so accepts the real coordinator.
        trusting = dict(other.env(1), JAX_MTLS_CA_FILE=str(pki.ca_file))
        for name, env in [("own-ca", other.env(1)), ("cluster-ca", trusting)]:
            intruders.append(_Child(f"intruder-{name}", tmp_path, [1, port, go, 3, 0], env))
        for c in intruders:
            rc = c.wait(45)
            print(f"{c.name}: rc={rc} after {time.monotonic() - c.started:.1f} s")
            assert rc != 0, c.report()
            assert "SUM1" not in c.stdout(), c.report()
        for c in children:
            assert c.proc.poll() is None, c.report()
        go.touch()
        for c in children:
            assert c.wait(30) == 0, c.report()
            assert "SUM2 21.0" in c.stdout() and "DONE" in c.stdout(), c.report()
    finally:
        for c in children + intruders:
            c.kill()

