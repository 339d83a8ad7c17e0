"""At 8 processes: the registration deadline grows with N, and a timeout names who is missing."""

import re
import shutil
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from jaxsys_kernel import Cluster
from jaxsys_kernel.cluster.config import default_register_timeout
from jaxsys_kernel.cluster.records import ClusterStartError

HOSTS = 8
SILENT = 5
# Long enough for seven engines to register on two busy cores (all eight took 3.7 s at a
# load average of 16), short enough for a test, which waits all of it.
DEADLINE = 15.0


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_default_deadline_grows_with_the_processes():
    assert Cluster(hosts=HOSTS, devices_per_host=1).register_timeout == default_register_timeout(
        HOSTS
    )
    assert default_register_timeout(64) > default_register_timeout(HOSTS) >= 60.0


@pytest.mark.timeout(240)
def test_an_engine_that_never_registers_is_named():
    marker = f"jaxsys-silent-engine-{uuid.uuid4().hex}"
    # Process 5 runs a Python that sleeps instead of the engine: it never registers.
    silent = [sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"]
    stages = []
    cluster = Cluster(
        hosts=HOSTS,
        devices_per_host=1,
        register_timeout=DEADLINE,
        process_prefix={SILENT: silent},
        progress=lambda ev: stages.append((ev.stage, ev.done, ev.total)),
    )
    with pytest.raises(ClusterStartError) as info:
        cluster.start_sync()
    message = str(info.value)
    assert f"only {HOSTS - 1} of {HOSTS} engines registered within {DEADLINE:g} s" in message
    assert f"missing: process {SILENT}\n" in message
    assert "register_timeout" in message
    # The logs it names outlive the cluster's profile, which the failed start removed.
    kept = Path(re.search(r"engine logs are kept in (\S+)\. ", message).group(1))
    try:
        assert kept.is_dir() and any(kept.iterdir())
        assert kept.stat().st_mode & 0o077 == 0
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    # Progress showed k/N while it waited.
    assert ("engines registered", HOSTS - 1, HOSTS) in stages
    # Nothing is left behind, the silent stand-in included.
    assert cluster.state != "ready"
    assert _marked(marker) == []
