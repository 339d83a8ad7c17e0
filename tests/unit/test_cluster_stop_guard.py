"""``jaxsys cluster stop`` signals the background cluster's pid only while it still names
the process that served the cluster."""

from __future__ import annotations

import argparse
import json
import os

from jaxsys_kernel import cli
from jaxsys_kernel.cluster.teardown import start_time


def test_a_pid_given_to_another_process_is_not_signalled(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "STATE_DIR", tmp_path)
    sent, real_kill = [], os.kill

    def kill(pid, sig):
        # Signal 0 only asks whether the pid exists; any other is recorded, never sent.
        if sig == 0:
            return real_kill(pid, 0)
        sent.append((pid, sig))
        return None

    monkeypatch.setattr(os, "kill", kill)
    # The saved server's pid is this process's now, which started at another time.
    state = {"name": "c", "pid": os.getpid(), "started": start_time(os.getpid()) - 100.0}
    (tmp_path / "c.json").write_text(json.dumps({**state, "state": "ready"}))
    assert cli.cmd_cluster(argparse.Namespace(name="c", action="stop")) == 0
    assert sent == []
    assert f"pid {os.getpid()} is another process now" in capsys.readouterr().out
    assert not (tmp_path / "c.json").exists()
