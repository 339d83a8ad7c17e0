"""``%jaxsys logs --procs``: processes named as every other action names them, P kept."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.engine import output
from jaxsys_kernel.magics import actions

from .test_magics_dispatch import fake_cluster, jaxsys


@pytest.fixture
def logs_session(shell, session):
    session.cluster = fake_cluster(states=("ready", "ready", "ready", "ready"))
    session.require_cluster = lambda: session.cluster
    return session


def test_procs_names_one_process_as_p_does(shell, logs_session, capsys):
    jaxsys(shell, "logs --procs 2 --tail 5")
    assert logs_session.cluster.calls == [(output.log_tail, (5,))]
    # One process: its log alone, exactly as `%jaxsys logs 2` prints it.
    assert capsys.readouterr().out == "gloo: connected\nabsl: INFO noise\n"


def test_procs_shows_each_log_under_its_process(shell, logs_session, capsys):
    jaxsys(shell, "logs --procs 1,3")
    assert logs_session.cluster.calls == [(output.log_tail, (40,))] * 2
    text = "gloo: connected\nabsl: INFO noise\n"
    assert capsys.readouterr().out == f"[p1]\n{text}[p3]\n{text}"


def test_procs_reads_only_running_processes(shell, logs_session):
    logs_session.cluster = fake_cluster(states=("ready", "dead"))
    with pytest.raises(UsageError, match="process 1 is dead; .*%jaxsys restart 1"):
        jaxsys(shell, "logs --procs all")
    # Nothing is printed for process 0 either: the line failed as a whole.
    assert logs_session.cluster.calls == [(output.log_tail, (40,))]


@pytest.mark.parametrize(
    "line,fragment",
    [
        ("logs 1 --procs 2", "name the processes as P or with --procs, not both"),
        ("logs --procs 9", r"%jaxsys logs --procs: .*9"),
        ("logs --procs x", r"%jaxsys logs --procs: "),
        ("logs", "%jaxsys logs needs a process, e.g. %jaxsys logs 0"),
    ],
)
def test_a_bad_procs_says_what_is_wrong(shell, logs_session, line, fragment):
    with pytest.raises(UsageError, match=fragment):
        jaxsys(shell, line)
    assert logs_session.cluster.calls == []


def test_the_positional_p_still_works(shell, logs_session, capsys):
    jaxsys(shell, "logs p3 --tail 7")
    assert logs_session.cluster.calls == [(output.log_tail, (7,))]
    assert capsys.readouterr().out == "gloo: connected\nabsl: INFO noise\n"


def test_logs_help_shows_procs():
    text = actions.ACTIONS["logs"].help()
    assert "--procs" in text and "%jaxsys logs --procs 1,3" in text
