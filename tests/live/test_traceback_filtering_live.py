"""An error raised through JAX reads as plain JAX shows it: the user's line, JAX's frames folded.

A transfer-guard refusal is raised deep inside JAX (device_put, then the C++ transfer), so
without folding each process's traceback would be dozens of ``jax/_src`` frames. On a real
kernel with a 2-process cluster the refusal must show one traceback for both processes, the
user's own line with its arrow, and at most a handful of JAX lines.
"""

from __future__ import annotations

import re

import pytest

from ..harness import Kernel

pytestmark = pytest.mark.slow

# A handful: the innermost frame (where JAX raised) is kept, with its few lines of source.
MOST_JAX_LINES = 5


@pytest.fixture(scope="module")
def k(tag):
    kernel = Kernel(tag)
    try:
        out = kernel.execute("%jaxsys start --hosts 2 --devices-per-host 1", timeout=180)
        assert out.status == "ok", out.stderr
        yield kernel
    finally:
        kernel.shutdown()


def plain(out) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.error["traceback"]))


def test_a_transfer_guard_refusal_shows_the_users_line_and_folds_jax(k):
    guard = k.ok("%jaxsys transfer-guard disallow").stdout
    assert "h2d=disallow" in guard, guard
    try:
        out = k.execute(
            "%%multihost\nimport jax.numpy as jnp, numpy as np\njnp.ones(3) + np.ones(3)"
        )
    finally:
        k.ok("%jaxsys transfer-guard allow")
    assert out.status == "error"
    text = plain(out)
    # Both processes were refused the same way: one group, one traceback.
    assert "[p0-1] TransferGuardError: host-to-device transfer" in text, text
    assert text.count("Traceback (most recent call last)") == 1, text
    # The device's number, named twice in JAX's message, is one column of the table.
    assert re.search(r"cpu/id: \d+ on p0, \d+ on p1; process: 0 on p0, 1 on p1", text), text
    # The user's line, marked as the one that failed, as IPython shows it for plain JAX.
    assert re.search(r"----> 2 jnp\.ones\(3\) \+ np\.ones\(3\)", text), text
    assert re.search(r"\[\.\.\. \d+ frames? inside JAX hidden\]", text), text
    jax_lines = [line for line in text.splitlines() if "jax/_src" in line]
    assert len(jax_lines) <= MOST_JAX_LINES, "\n".join(jax_lines)


def test_jax_frames_are_folded_below_a_users_own_function(k):
    # The user's frames stay in order around the folded ones, whatever their depth.
    code = (
        "%%multihost\nimport jax, jax.numpy as jnp\n"
        "def step(x):\n"
        "    return jax.jit(lambda a: a.reshape(7))(x)\n"
        "step(jnp.ones(6))"
    )
    out = k.execute(code)
    assert out.status == "error"
    text = plain(out)
    assert text.count("Traceback (most recent call last)") == 1, text
    assert re.search(r"----> 4 step\(jnp\.ones\(6\)\)", text), text
    assert re.search(r"----> 3     return jax\.jit", text), text
    jax_lines = [line for line in text.splitlines() if "jax/_src" in line]
    assert len(jax_lines) <= MOST_JAX_LINES, "\n".join(jax_lines)
