"""The command every pod of a notebook's Kubernetes world runs, run here by ``/bin/sh``:
it makes the engine's profile in the pod's temporary directory from the Secret's config,
passes the launcher's arguments on, and ends the pod when the Secret lacks the config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.launchers.kubernetes import CREDENTIALS_DIR
from jaxsys_kernel.cluster.launchers.kubernetes_world import ENGINE_CONFIG, engine_command

pytestmark = pytest.mark.live


def test_the_engine_command_makes_its_own_profile_and_passes_its_arguments(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / ENGINE_CONFIG).write_text("c = get_config()\n")
    cmd = engine_command("echo", ["--IPEngine.max_heartbeat_misses=20"])
    # The same script, with the Secret's directory moved where this test can write.
    script = cmd[2].replace(CREDENTIALS_DIR, str(creds))
    out = subprocess.run(
        [*cmd[:2], script, *cmd[3:]],
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.split()
    assert out[:2] == ["-m", "ipyparallel.engine"]
    profile = Path(out[2].removeprefix("--profile-dir="))
    assert profile.parent == tmp_path and (profile / ENGINE_CONFIG).exists()
    assert out[3:] == [
        f"--IPEngine.url_file={creds}/ipcontroller-engine.json",
        "--IPEngine.max_heartbeat_misses=20",
    ]


def test_a_missing_config_ends_the_pod_before_an_engine_starts(tmp_path):
    cmd = engine_command("echo")
    out = subprocess.run(
        cmd,
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert out.returncode != 0 and out.stdout == ""
    assert ENGINE_CONFIG in out.stderr
