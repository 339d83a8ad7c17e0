"""A program written for ``python`` runs unchanged in ``%%multihost`` cells, live.

A 2 x 1 cluster in a real kernel: ``%run`` fails its cell when the script raises, a pasted
argparse program sees the argv of ``python`` with no script, ``%run script.py --steps 3``
gives the script its own argv and ``__main__``, and a script in the published style (argparse,
a bare ``jax.distributed.initialize()``, a sharded computation, ``shutdown()`` at its end)
prints the same checksums bitwise run plain as 2 processes and with ``%run``, after which a
collective cell still works.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from ..harness import Kernel

pytestmark = pytest.mark.slow

# The published style: argparse, a bare initialize() that finds the world from Slurm's
# variables (as srun sets them), a computation over an array sharded across the processes,
# a checksum per step, and shutdown() at the end.
TRAIN = textwrap.dedent(
    """\
    import argparse

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--steps", type=int, default=1)
        args = parser.parse_args()
        jax.distributed.initialize()
        mesh = jax.make_mesh((jax.device_count(),), ("d",))
        n = 4 * jax.device_count()
        data = np.linspace(-2.0, 2.0, n, dtype=np.float32)
        x = jax.make_array_from_callback((n,), NamedSharding(mesh, P("d")), lambda i: data[i])

        @jax.jit
        def step(w, x):
            loss = lambda w: jnp.mean((jnp.sin(x) * w - jnp.cos(x)) ** 2)
            return w - 0.1 * jax.grad(loss)(w)

        w = np.float32(0.5)
        for i in range(args.steps):
            w = step(w, x)
            print(f"step {i} checksum {np.asarray(w).tobytes().hex()}", flush=True)
        jax.distributed.shutdown()


    if __name__ == "__main__":
        main()
    """
)

COLLECTIVE = (
    "%%multihost\nimport jax, numpy as np\n"
    "from jax.experimental import multihost_utils as mu\n"
    "print('gathered', mu.process_allgather(np.array([jax.process_index()])).ravel().tolist())"
)


def plain(out) -> str:
    tb = "\n".join((out.error or {}).get("traceback", []))
    return re.sub(r"\x1b\[[0-9;]*m", "", tb + "\n" + out.stdout + out.stderr)


@pytest.fixture(scope="module")
def k(tag):
    kernel = Kernel(tag)
    try:
        out = kernel.execute("%jaxsys start --hosts 2 --devices-per-host 1", timeout=180)
        assert out.status == "ok", out.stderr
        yield kernel
    finally:
        kernel.shutdown()


def test_a_run_script_that_raises_fails_the_cell_on_every_process(k, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("print('before the error')\nraise ValueError('the script failed')\n")
    out = k.execute(f"%%multihost\n%run {script}")
    text = plain(out)
    assert out.status == "error", text
    assert "[p0-1] before the error" in text, text
    assert "[p0-1] ValueError: the script failed" in text, text
    assert "Traceback" in text, text
    # The next cell runs as usual.
    assert "[p0-1] still here" in k.ok("%%multihost\nprint('still here')").stdout


def test_a_non_zero_exit_fails_the_cell_and_exit_zero_does_not(k, tmp_path):
    bad, good = tmp_path / "bad.py", tmp_path / "good.py"
    bad.write_text("import sys\nsys.exit(3)\n")
    good.write_text("import sys\nprint('done')\nsys.exit(0)\n")
    out = k.execute(f"%%multihost\n%run {bad}")
    assert out.status == "error" and "SystemExit" in plain(out), plain(out)
    assert "[p0-1] done" in k.ok(f"%%multihost\n%run {good}").stdout


def test_a_pasted_program_sees_the_argv_of_python(k):
    out = k.ok(
        "%%multihost\nimport argparse, sys\nprint('argv', sys.argv)\n"
        "p = argparse.ArgumentParser()\np.add_argument('--steps', type=int, default=1)\n"
        "print('steps', p.parse_args().steps)"
    )
    assert "[p0-1] argv ['']" in out.stdout, out.stdout
    assert "[p0-1] steps 1" in out.stdout, out.stdout


def test_run_gives_the_script_its_own_argv_and_main(k, tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint('argv', sys.argv[1:], __name__)\n")
    out = k.ok(f"%%multihost\n%run {script} --steps 3")
    assert "[p0-1] argv ['--steps', '3'] __main__" in out.stdout, out.stdout
    # And the process's own argv is clean again afterwards.
    assert "[p0-1] [''] " in k.ok("%%multihost\nimport sys\nprint(sys.argv, '')").stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_plain(script, steps: int) -> list[str]:
    """The script as 2 plain processes, the world read from Slurm's variables."""
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAXSYS_"))}
        env.update(
            SLURM_JOB_ID="1",
            SLURM_STEP_NODELIST="127.0.0.1",
            SLURM_NTASKS="2",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_STEP_NUM_NODES="1",
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_PLATFORMS="cpu",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), "--steps", str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs


def _checksums(text: str) -> list[str]:
    return re.findall(r"step \d+ checksum [0-9a-f]+", text)


def test_a_published_script_runs_unchanged_and_bitwise_equal(k, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    outputs = _run_plain(script, 3)
    expected = _checksums(outputs[0])
    assert len(expected) == 3 and _checksums(outputs[1]) == expected, outputs

    out = k.ok(f"%%multihost\n%run {script} --steps 3")
    lines = out.stdout.splitlines()
    got = [line.removeprefix("[p0-1] ") for line in lines if "checksum" in line]
    assert got == expected, out.stdout
    # Both processes printed each checksum (merged as one line), initialize() and
    # shutdown() each said one line, and the world still runs a collective.
    assert all(line.startswith("[p0-1] ") for line in lines if "checksum" in line), lines
    notes = [line for line in lines if "jaxsys owns" in line or "initialize() ignored" in line]
    assert len(notes) == 2, out.stdout
    assert "[p0-1] gathered [0, 1]" in k.ok(COLLECTIVE).stdout
    assert "ready" in k.ok("%jaxsys status").stdout


def test_shutdown_in_a_cell_leaves_the_world_usable(k):
    out = k.ok("%%multihost\nimport jax\njax.distributed.shutdown()")
    assert (
        "[p0-1] jaxsys: jax.distributed.shutdown() ignored: jaxsys owns this JAX world"
        in out.stdout
    ), out.stdout
    assert "%jaxsys stop ends it" in out.stdout
    assert "[p0-1] gathered [0, 1]" in k.ok(COLLECTIVE).stdout


def test_initialize_that_disagrees_with_the_world_is_refused(k):
    out = k.ok("%%multihost\nimport jax\njax.distributed.initialize()")
    assert "[p0-1] jaxsys: jax.distributed.initialize() ignored" in out.stdout, out.stdout
    agree = k.ok(
        "%%multihost\nimport jax\n"
        "jax.distributed.initialize(num_processes=2, process_id=jax.process_index())"
    )
    assert "initialize() ignored" in agree.stdout, agree.stdout
    out = k.execute("%%multihost\nimport jax\njax.distributed.initialize(num_processes=4)")
    text = plain(out)
    assert out.status == "error", text
    assert "num_processes=4 (the running world has 2)" in text, text
    assert "jaxsys owns the world" in text, text
    assert "[p0-1] gathered [0, 1]" in k.ok(COLLECTIVE).stdout


def test_a_parameters_cell_run_beside_a_ready_cluster_reaches_every_process(k):
    # What papermill injects, run in the kernel while the cluster is up.
    k.ok("# Parameters\nsteps_given = 5\nname_given = 'run-a'")
    out = k.ok("%%multihost\nprint('got', steps_given, name_given)")
    assert "[p0-1] got 5 run-a" in out.stdout, out.stdout
    # A plain cell without the comment stays the kernel's own.
    k.ok("kernel_only = 1")
    out = k.execute("%%multihost\nkernel_only")
    assert out.status == "error" and "NameError" in plain(out), plain(out)
