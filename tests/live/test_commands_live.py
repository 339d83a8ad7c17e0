"""The command registry on a real 2-process cluster: a button's restart of one process means
what ``%jaxsys restart P`` means, on every surface."""

from __future__ import annotations

import pytest

from ..harness import kernel_with_cluster
from .test_labextension_comm import CommClient, said

pytestmark = pytest.mark.slow

# Process 1 ignores SIGINT and sleeps: the timeout's interrupt cannot free it, so it outlives
# the cell and the session marks it as still running.
OUTLIVES_ITS_CELL = """%%multihost --timeout 2 --grace 2
import jax, signal, time
if jax.process_index() == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(300)
"""


@pytest.fixture(scope="module")
def k(tag):
    with kernel_with_cluster(tag, "%jaxsys start --hosts 2 --devices-per-host 1") as kernel:
        yield kernel


def test_a_process_restarted_from_a_button_is_not_out_of_step(k):
    client = CommClient(k)
    client.wait_state(lambda s: s["cluster"] is not None, timeout=30, what="with a cluster")
    out = k.execute(OUTLIVES_ITS_CELL)
    assert out.status == "error" and out.error["ename"] == "MultihostTimeout", out.error
    refused = k.execute("%%multihost\nprint('queued')")
    assert refused.status == "error" and "out of step: p1" in refused.error["evalue"]

    # The sidebar's (and the dashboard's) restart of one process: the registry's restart.
    reply = client.wait_reply(client.command("restart", 1), timeout=120)
    assert reply["ok"] and reply["message"].startswith("p1 rejoined in"), said(reply)
    assert k.ok("%%multihost\nprint('back')").stdout == "[p0-1] back\n"
