"""The ipyparallel controller SIGKILLed under a running cluster, through a real kernel: the
running world carries on (the next cell works), ``%jaxsys status`` says the cluster is
degraded, naming the controller, that cells still run and that nothing can come back, and
what to do; doing it (stop, start) gives a working cluster, and nothing is left."""

from __future__ import annotations

import os
import signal

from ..harness import Kernel, new_tag, wait_no_processes
from .test_chaos_live import RANKS, _kernel_side, _ranks_ok, _wait

START = "%jaxsys start --hosts 2 --devices-per-host 1 --standby 0"


def test_status_says_the_controller_died_and_what_to_do_while_cells_run_on():
    tag = new_tag()
    k = Kernel(tag)
    try:
        k.ok(START, timeout=180)
        pid = _kernel_side(k, "c.world.ipp.controller.process.pid")
        os.kill(pid, signal.SIGKILL)
        _ranks_ok(k)  # the running world carries on
        line = _wait(
            lambda: next(
                (
                    x
                    for x in k.ok("%jaxsys status").stdout.splitlines()
                    if x.startswith("cluster: degraded")
                ),
                None,
            ),
            "the status to name the controller's death",
        )
        assert f"the ipyparallel controller (pid {pid}) was killed by SIGKILL" in line, line
        assert "cells still run, but no process can be restarted" in line, line
        assert line.endswith("then %jaxsys stop and %jaxsys start)"), line
        assert k.execute(RANKS).status == "ok"
        # What it says to do works.
        k.ok("%jaxsys stop")
        k.ok(START, timeout=180)
        _ranks_ok(k)
        assert k.ok("%jaxsys status").stdout.startswith("cluster: ready")
        k.ok("%jaxsys stop")
    finally:
        k.shutdown()
    left = wait_no_processes(tag, timeout=15)
    assert not left, left
