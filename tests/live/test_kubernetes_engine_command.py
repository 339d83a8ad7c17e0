"""What every pod of a notebook's Kubernetes world runs (``jaxsys_kernel.engine.pod``), run
here on a Secret's directory this test writes, with a stand-in for the engine: it starts
the engine of each generation in a profile of its own with the generation's environment,
ends it (with what it started) when the generation changes, waits after a keep, ends the
pod when nobody comes, and ends it at once when the Secret lacks the engine's config."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxsys_kernel.cluster.launchers.kubernetes import CREDENTIALS_DIR
from jaxsys_kernel.cluster.launchers.kubernetes_world import pod_command
from jaxsys_kernel.engine.pod import ENGINE_CONFIG, ENGINE_FILE, ENV_FILE, GENERATION, WAIT_FILE

pytestmark = [pytest.mark.live, pytest.mark.timeout(60)]

# The engine's stand-in: says its arguments and environment, starts a child that would
# outlive it, and runs until it is killed.
ENGINE = """#!/bin/sh
echo "$$ $* GEN_ENV=$GEN_ENV" >> "$RECORD"
sleep 300 &
echo "child $!" >> "$RECORD"
exec sleep 300
"""


def _generation(creds: Path, gen: str, engine: bool = True, wait: float = 1.0) -> None:
    """Write a generation the way the kubelet projects a Secret: the generation last."""
    for name in (ENGINE_FILE, ENGINE_CONFIG, ENV_FILE):
        (creds / name).unlink(missing_ok=True)
    if engine:
        (creds / ENGINE_FILE).write_text("{}")
        (creds / ENGINE_CONFIG).write_text("c = get_config()\n")
        (creds / ENV_FILE).write_text(json.dumps({"GEN_ENV": gen}))
    (creds / WAIT_FILE).write_text(f"{wait:g}")
    (creds / GENERATION).write_text(gen)


def _until(what: str, test, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (got := test()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.05)
    return got


def _lines(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_the_pod_command_runs_the_engine_module_with_the_secrets_directory():
    cmd = pod_command("python3", ["--IPEngine.max_heartbeat_misses=20"], wait=7)
    assert cmd[:3] == ["python3", "-m", "jaxsys_kernel.engine.pod"]
    assert f"--credentials={CREDENTIALS_DIR}" in cmd and "--wait=7" in cmd
    assert cmd[cmd.index("--") + 1 :] == ["--IPEngine.max_heartbeat_misses=20"]


def test_engines_follow_the_generations_and_the_pod_ends_when_nobody_comes(tmp_path):
    creds, record = tmp_path / "creds", tmp_path / "record"
    creds.mkdir()
    engine = tmp_path / "engine"
    engine.write_text(ENGINE)
    engine.chmod(0o755)
    _generation(creds, "g1")
    argv = [sys.executable, "-m", "jaxsys_kernel.engine.pod", f"--credentials={creds}"]
    argv += ["--wait=30", f"--python={engine}", "--no-fork-server"]
    argv += ["--", "--IPEngine.max_heartbeat_misses=20"]
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "RECORD": str(record)}
    pod = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _until("the first engine and its child", lambda: len(_lines(record)) >= 2)
        lines = _lines(record)
        pid, *args = lines[0].split()
        assert args[:2] == ["-m", "ipyparallel.engine"]
        profile = Path(args[2].removeprefix("--profile-dir="))
        assert profile.parent == tmp_path and (profile / ENGINE_CONFIG).exists()
        assert args[3:] == [
            f"--IPEngine.url_file={creds / ENGINE_FILE}",
            "--IPEngine.max_heartbeat_misses=20",
            "GEN_ENV=g1",
        ]
        child = int(lines[1].split()[1])
        # Another kernel's generation replaces the engine, and what it started goes too.
        _generation(creds, "g2")
        _until("the second engine", lambda: "GEN_ENV=g2" in record.read_text())
        assert not _alive(int(pid)) and not _alive(child)
        assert not profile.exists()
        # A keep ends the engine; the pod waits (1 s, as the keep says), then ends.
        _generation(creds, "kept-1", engine=False, wait=1.0)
        t0 = time.monotonic()
        assert pod.wait(15) == 0
        assert 0.9 < time.monotonic() - t0 < 10
    finally:
        pod.kill()
        pod.wait()
    err = pod.stderr.read()
    assert "kept (kept-1): waiting 1 s" in err and "no kernel took this pod" in err, err
    assert record.read_text().count("GEN_ENV") == 2


def test_a_missing_config_ends_the_pod_before_an_engine_starts(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    _generation(creds, "g1")
    (creds / ENGINE_CONFIG).unlink()
    argv = [sys.executable, "-m", "jaxsys_kernel.engine.pod", f"--credentials={creds}"]
    out = subprocess.run(
        [*argv, "--python=/bin/false", "--no-fork-server"],
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert out.returncode == 1 and ENGINE_CONFIG in out.stderr, out.stderr
