"""``%jaxsys start --explain`` and ``--no-recoverability``: the plain-JAX call each process
made, rendered from what it reported; fate-sharing on a real cluster without recoverability."""

from __future__ import annotations

import time

from ..harness import Kernel, process_states


def test_live_explain_and_fate_sharing(tag):
    k = Kernel(tag)
    try:
        started = k.execute(
            "%jaxsys start --hosts 2 --devices-per-host 1 --heartbeat 2 --explain "
            "--no-recoverability",
            timeout=180,
        )
        assert started.status == "ok", started.stderr
        assert started.stdout.count("security:") == 1, started.stdout  # said once
        blocks = started.stdout.split("\n\n")
        for rank in (0, 1):
            block = next(b for b in blocks if b.startswith(f"# process {rank} "))
            assert f"process_id={rank}," in block and "num_processes=2," in block
            assert "heartbeat_timeout_seconds=2," in block
            assert f"process-{rank}.pem')" in block
            assert "'jax_enable_recoverability', False)" in block
        # What the explanation says is what the processes run with.
        facts = k.ok(
            "%%multihost\nimport jax\n"
            "print(jax.config.jax_enable_recoverability, jax.config.jax_mtls_peer_uri_prefix)"
        ).stdout
        assert facts.startswith("[p0-1] False spiffe://"), facts
        k.ok("%jaxsys kill 1")
        deadline = time.monotonic() + 30
        while True:
            rows = k.ok("%jaxsys status").stdout
            if process_states(rows)[0] == "dead":
                break  # process 0 went down with process 1: one fate
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
    finally:
        k.shutdown()

