"""A reply or an output over the kernel's bound ($JAXSYS_MAX_REPLY_BYTES, set small here) is
refused before the kernel reads it: the request that asked for the reply ends at once with an
error naming the limit and how to raise it, a cell whose output was cut says so, and the
kernel, the processes and the next cell are fine."""

from __future__ import annotations

import time

from jaxsys_kernel.cluster import reply_limit

from ..harness import Kernel, new_tag, wait_no_processes

LIMIT = 2**20
# Long enough for a %pull on a loaded machine; a refused reply must end far sooner than a
# cell's own timeout (a reply that never comes would wait for that).
ENDS_WITHIN_S = 30.0


def test_a_reply_over_the_limit_is_an_error_in_words_and_the_next_cell_works():
    tag = new_tag()
    k = Kernel(tag, extra_env={reply_limit.ENV: str(LIMIT)})
    try:
        out = k.execute("%jaxsys start --hosts 2 --devices-per-host 1 --standby 0", timeout=180)
        assert out.status == "ok", out.stderr
        out = k.execute(f"%%multihost\nbig = b'x' * {3 * LIMIT}\nsmall = 7")
        assert out.status == "ok", out.stderr
        t0 = time.monotonic()
        out = k.execute("%pull big", timeout=ENDS_WITHIN_S)
        took = time.monotonic() - t0
        said = f"{out.stderr}\n{out.error}"
        assert out.status == "error", said
        assert "over its limit of 1 MiB" in said and reply_limit.ENV in said, said
        assert "%jaxsys start" in said, said
        assert took < ENDS_WITHIN_S, took
        out = k.execute("%pull small")
        assert out.status == "ok" and "small <- p0: int" in out.stdout, out.stderr
        out = k.execute("%%multihost\nimport jax\nprint('rank', jax.process_index())")
        assert out.status == "ok", out.stderr
        assert "[p0] rank 0" in out.stdout and "[p1] rank 1" in out.stdout, out.stdout
        out = k.execute("print(small + 1)")
        assert out.status == "ok" and "8" in out.stdout, out.stderr
        # Output over the bound: the cell ends, saying whose output was cut and why.
        t0 = time.monotonic()
        out = k.execute(
            f"%%multihost\nprint('y' * {3 * LIMIT} if jax.process_index() == 0 else 'small')",
            timeout=ENDS_WITHIN_S,
        )
        took = time.monotonic() - t0
        said = f"{out.stdout}\n{out.stderr}\n{out.error}"
        assert "output over the kernel's limit of 1 MiB" in said, said[:2000]
        assert "y" * 1000 not in said
        assert took < ENDS_WITHIN_S, took
        out = k.execute("%%multihost\nprint('after', jax.process_index())")
        assert out.status == "ok", out.stderr
        assert "[p0] after 0" in out.stdout and "[p1] after 1" in out.stdout, out.stdout
        out = k.execute("print(small + 2)")
        assert out.status == "ok" and "9" in out.stdout, out.stderr
    finally:
        k.shutdown()
        k.km.cleanup_resources()
    assert not wait_no_processes(tag, timeout=15)
