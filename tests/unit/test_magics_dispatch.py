"""``%jaxsys`` and the other magics' parsing, without a cluster: every action against a fake
session, its own options and help, and the errors a mistyped line must give."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from jaxsys_kernel.cluster.calls import EngineCalls
from jaxsys_kernel.engine import output
from jaxsys_kernel.magics import actions, register_magics
from jaxsys_kernel.magics.actions_args import MAX_LINE, seconds
from jaxsys_kernel.magics.magics import JAXSYS_ACTIONS, JaxSysMagics, action_help_transformer

from ..fakes import FakeEngine, FakeSession


@pytest.fixture(scope="module")
def shell():
    return globalipapp.start_ipython() or globalipapp.get_ipython()  # None once started


@pytest.fixture
def session(shell):
    fake = FakeSession()
    shell.register_magics(JaxSysMagics(shell, fake))
    return fake


def jaxsys(shell, line: str):
    return shell.run_line_magic("jaxsys", line)


def only_call(session) -> tuple:
    assert len(session.calls) == 1, session.calls
    return session.calls[0]


# -- every action, with every spelling that worked before ---------------------------------------


def test_start_takes_every_option_it_always_took(shell, session):
    jaxsys(
        shell,
        "start --hosts 4 --devices-per-host 2 --launcher ssh --cache-dir /c --init-timeout 30 "
        "--env K=V --env A=b=c --insecure --ca-file ca.pem --cert-dir certs --heartbeat 2",
    )
    name, args, kwargs = only_call(session)
    assert name == "start" and args == ()
    assert kwargs == {
        "hosts": 4,
        "devices_per_host": 2,
        "launcher": "ssh",
        "cache_dir": "/c",
        "init_timeout": 30.0,
        "secure": False,
        "ca_file": "ca.pem",
        "cert_dir": "certs",
        "env": {"K": "V", "A": "b=c"},
        "heartbeat_timeout": 2.0,
    }


def test_start_defaults_and_host_lists(shell, session):
    jaxsys(shell, "start --hosts node1,node2,")
    _, _, kwargs = only_call(session)
    assert kwargs["hosts"] == ["node1", "node2"]
    # Left to the layers below the line (the kernelspec's), then the declared defaults.
    assert kwargs["init_timeout"] is None and kwargs["secure"] is None
    assert kwargs["devices_per_host"] is None and kwargs["launcher"] is None
    assert "heartbeat_timeout" not in kwargs  # the cluster's own default applies


def test_start_transfer_ports_and_thread_guard(shell, session):
    jaxsys(shell, "start --transfer-ports --thread-guard")
    _, _, kwargs = only_call(session)
    assert kwargs["env"] == {"JAXSYS_TRANSFER_PORTS": "1"} and session.thread_guard is True
    session.calls.clear()
    jaxsys(shell, "start")
    assert only_call(session)[2]["env"] == {} and session.thread_guard is False


def test_multihost_thread_guard_reaches_the_session(shell, session):
    shell.run_cell_magic("multihost", "--thread-guard", "print(1)")
    assert only_call(session)[2]["thread_guard"] is True
    session.calls.clear()
    shell.run_cell_magic("multihost", "", "print(1)")
    # None: the cluster's default (%jaxsys start --thread-guard) decides.
    assert only_call(session)[2]["thread_guard"] is None


@pytest.mark.parametrize(
    "line,fragment",
    [
        ("start --devices-per-host 0", "--devices-per-host must be at least 1"),
        ("start --env novalue", "--env takes KEY=VALUE"),
        ("start --launcher pbs", "invalid choice"),
        ("start --devices-per-host two", "invalid int value"),
    ],
)
def test_start_refuses_bad_values(shell, session, line, fragment):
    with pytest.raises(UsageError, match=fragment):
        jaxsys(shell, line)
    assert session.calls == []


def test_stop(shell, session, capsys):
    jaxsys(shell, "stop")
    assert only_call(session)[0] == "stop"
    assert capsys.readouterr().out == "jaxsys: cluster stopped in 0.25 s\n"


def test_restart_world_and_one_process(shell, session, capsys):
    jaxsys(shell, "restart")
    jaxsys(shell, "restart 1")
    jaxsys(shell, "restart p1")
    assert session.calls == [
        ("restart", (), {}),
        ("restart_process", (1,), {}),
        ("restart_process", (1,), {}),
    ]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "jaxsys: restarted all 2 processes; JAX world ready again in 1.5 s. All names defined "
        "on the processes are gone; re-run the cells that built them, or restore from a "
        "checkpoint."
    )
    assert out[1] == "jaxsys: process 1 restarted and rejoined the JAX world in 0.5 s"


@pytest.mark.parametrize("line,signal", [("kill 1", "KILL"), ("kill 1 --signal TERM", "TERM")])
def test_kill(shell, session, capsys, line, signal):
    jaxsys(shell, line)
    assert only_call(session) == ("kill_process", (1, signal), {})
    assert capsys.readouterr().out == f"killed p1 with {signal}\n"


@pytest.mark.parametrize(
    "line,fragment",
    [
        ("kill", "%jaxsys kill needs a process, e.g. %jaxsys kill 2"),
        ("kill x", "expected a process number such as 2, got 'x'"),
        ("kill 1 --signal HUP", "invalid choice: 'HUP'"),
        ("inspect", "%jaxsys inspect needs a name, e.g. %jaxsys inspect jnp.sum"),
        ("logs", "%jaxsys logs needs a process, e.g. %jaxsys logs 0"),
        ("logs 0 --tail 0", "at least 1"),
        ("logs 0 --tail many", "expected a whole number"),
    ],
)
def test_missing_or_bad_arguments(shell, session, line, fragment):
    with pytest.raises(UsageError, match=fragment):
        jaxsys(shell, line)
    assert session.calls == []


def test_inspect_passes_name_cursor_and_detail(shell, session, capsys):
    jaxsys(shell, "inspect jnp.sum --detail 1")
    assert only_call(session) == ("remote_inspect", ("jnp.sum", 7, 1), {})
    assert capsys.readouterr().out == "Object `jnp.sum` not found on process 0.\n"


@pytest.mark.parametrize(
    "action,call", [("status", "status_rows"), ("dashboard", "show_dashboard")]
)
def test_actions_without_options_call_the_session(shell, session, capsys, action, call):
    result = jaxsys(shell, action)
    assert [c[0] for c in session.calls][0] == call
    if action == "dashboard":
        assert result == "the dashboard"  # returned, so the kernel displays the widget
    else:
        assert "security: mTLS (test)" in capsys.readouterr().out


def test_rotate_certs_names_every_serial(shell, session, capsys):
    jaxsys(shell, "rotate-certs")
    out = capsys.readouterr().out
    assert "new certificates written for p0 (serial 0x1234567890)" in out
    assert "p1 (serial 0xfedcba0987)" in out


# -- options that belong to another action -----------------------------------------------------

OWN = {name: set(actions.ACTIONS[name].options()) for name in JAXSYS_ACTIONS}
FLAGS = sorted({o for opts in OWN.values() for o in opts if o.startswith("--")})


@pytest.mark.parametrize("name", JAXSYS_ACTIONS)
def test_an_option_of_another_action_is_refused_naming_the_actions_own(shell, session, name):
    # A foreign flag that abbreviates one of the action's own (start's --time and barrier's
    # --timeout) is that option, as argparse reads unique prefixes.
    foreign = [
        f for f in FLAGS if f not in OWN[name] and not any(o.startswith(f) for o in OWN[name])
    ]
    assert foreign
    words = {
        "kill": "1",
        "restart": "1",
        "inspect": "x",
        "logs": "0",
        "cache": "show",
        "transfer-guard": "log",
        "divergence": "on",
        "profile": "start",
        "where": "on",
        "slow": "1",
        "barrier": "b",
    }.get(name, "")
    for flag in foreign:
        with pytest.raises(UsageError) as err:
            jaxsys(shell, f"{name} {words} {flag} 1")
        message = str(err.value)
        assert message.startswith(f"%jaxsys {name} does not take {flag};"), message
        own = ", ".join(actions.ACTIONS[name].options())
        assert (f"it takes {own}" if own else "it takes no options") in message
        assert f"%jaxsys help {name}" in message
    assert session.calls == []


def test_an_extra_word_is_refused(shell, session):
    with pytest.raises(
        UsageError, match=r"%jaxsys stop got an extra 'now'; it takes --keep-allocation, --name"
    ):
        jaxsys(shell, "stop now")
    with pytest.raises(UsageError, match=r"%jaxsys kill got an extra '3'; it takes P, --signal"):
        jaxsys(shell, "kill 2 3")
    assert session.calls == []


def test_an_unknown_action_lists_the_actions(shell, session):
    with pytest.raises(UsageError, match="invalid choice: 'frobnicate'") as err:
        jaxsys(shell, "frobnicate")
    assert all(repr(name) in str(err.value) for name in JAXSYS_ACTIONS)
    with pytest.raises(UsageError, match="arguments are required: action"):
        jaxsys(shell, "")


def test_the_action_table():
    assert JAXSYS_ACTIONS == (
        "start",
        "stop",
        "restart",
        "kill",
        "status",
        "dashboard",
        "security",
        "rotate-certs",
        "inspect",
        "logs",
        "cache",
        "transfer-guard",
        "divergence",
        "profile",
        "where",
        "slow",
        "attach",
        "barrier",
        "watch",
        "unwatch",
    )
    assert OWN["transfer-guard"] == {"LEVEL", "--h2d", "--d2h", "--d2d", "--reset-counts"}
    assert OWN["barrier"] == {"NAME", "--timeout"}
    assert OWN["start"] == {
        "--hosts",
        "--devices-per-host",
        "--launcher",
        "--cache-dir",
        "--init-timeout",
        "--env",
        "--insecure",
        "--ca-file",
        "--cert-dir",
        "--heartbeat",
        "--no-recoverability",
        "--explain",
        "--transfer-ports",
        "--thread-guard",
        # For a batch scheduler's allocation (the slurm and mpi launchers).
        "--partition",
        "--time",
        "--account",
        "--sbatch-arg",
        "--ssh-arg",
        "--hostfile",
        # The kubernetes launcher's pods.
        "--image",
        "--namespace",
        "--pod-template",
        "--kubeconfig",
        "--ttl-after-finished",
        # Every other option ClusterConfig declares a flag for.
        "--register-timeout",
        "--addresses",
        "--controller-ip",
        "--no-telemetry",
        "--standby",
        "--no-fork-server",
        "--spare-world",
    }
    assert OWN["kill"] == {"P", "--signal", "--procs"} and OWN["inspect"] == {"NAME", "--detail"}
    assert OWN["logs"] == {"P", "--tail", "--procs"} and OWN["restart"] == {"P", "--procs"}
    assert all(not OWN[n] for n in ("status", "dashboard", "security", "rotate-certs"))
    assert OWN["stop"] == {"--keep-allocation", "--name"}


# -- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", JAXSYS_ACTIONS)
def test_every_action_has_numpydoc_help_with_examples(name):
    text = actions.ACTIONS[name].help()
    assert text.startswith(f"%jaxsys {name}")
    assert "\nParameters\n----------\n" in text
    examples = text.split("\nExamples\n--------\n")[1]
    assert f"%jaxsys {name}" in examples
    for option in OWN[name]:
        assert f"\n{option} : " in text, option


@pytest.mark.parametrize("name", JAXSYS_ACTIONS)
@pytest.mark.parametrize("spelling", ["help {name}", "{name} --help", "{name} -h", "{name} ?"])
def test_help_spellings_print_the_actions_help(shell, session, capsys, name, spelling):
    jaxsys(shell, spelling.format(name=name))
    assert capsys.readouterr().out == actions.ACTIONS[name].help() + "\n"
    assert session.calls == []  # asking for help runs nothing


@pytest.mark.parametrize("suffix", ["?", "??", " ?"])
def test_action_question_mark_becomes_help(shell, suffix):
    assert action_help_transformer([f"%jaxsys kill{suffix}\n"]) == ["%jaxsys help kill\n"]
    shell.input_transformers_cleanup.append(action_help_transformer)
    try:
        assert shell.transform_cell(f"%jaxsys rotate-certs{suffix}") == (
            "get_ipython().run_line_magic('jaxsys', 'help rotate-certs')\n"
        )
    finally:
        shell.input_transformers_cleanup.remove(action_help_transformer)
    # Everything else is left alone, including IPython's own help on the magic.
    assert action_help_transformer(["%jaxsys?\n", "x?\n"]) == ["%jaxsys?\n", "x?\n"]


def test_register_magics_installs_the_help_transformer():
    registered, hooks = [], []
    fake = SimpleNamespace(
        register_magics=registered.append,
        input_transformers_cleanup=[],
        events=SimpleNamespace(register=lambda event, fn: hooks.append(event)),
    )
    register_magics(fake)
    assert isinstance(registered[0], JaxSysMagics)
    assert action_help_transformer in fake.input_transformers_cleanup
    assert register_magics(fake) is fake._jaxsys_session  # once per shell


def test_jaxsys_question_mark_lists_every_action_with_examples(shell, session, capsys):
    doc = JaxSysMagics.jaxsys.__doc__
    assert doc == actions.overview()
    for name, act in actions.ACTIONS.items():
        assert f"%jaxsys {name}" in doc and act.summary in doc
    assert "\nExamples\n--------\n" in doc
    for option in ("--cache-dir", "--insecure", "--ca-file", "--cert-dir", "--tail"):
        assert option in doc
    jaxsys(shell, "help")
    assert capsys.readouterr().out == doc + "\n"


# -- lines that cannot be read ------------------------------------------------------------------


@pytest.mark.parametrize(
    "magic,line",
    [
        ("jaxsys", '"x'),
        ("jaxsys", "start --cache-dir 'unclosed"),
        ("multihost", '--procs "0'),
        ("pull", "'x"),
    ],
)
def test_an_unclosed_quote_is_a_usage_error(shell, session, magic, line):
    with pytest.raises(UsageError, match="No closing quotation"):
        shell.run_line_magic(magic, line)
    assert session.calls == []


def test_an_unclosed_quote_in_a_cell_magic_line(shell, session):
    with pytest.raises(UsageError, match="No closing quotation"):
        shell.run_cell_magic("multihost", '--timeout "1', "print(1)")
    assert session.calls == []


BAD_SECONDS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "0", "-1", "abc", ""]


@pytest.mark.parametrize("value", BAD_SECONDS)
@pytest.mark.parametrize(
    "magic,line",
    [
        ("jaxsys", "start --init-timeout={v}"),
        ("jaxsys", "start --heartbeat={v}"),
        ("multihost", "--timeout={v}"),
        ("multihost", "--grace={v}"),
    ],
)
def test_every_seconds_option_takes_only_finite_positive_numbers(
    shell, session, magic, line, value
):
    arg = line.format(v=repr(value) if value == "" else value)
    with pytest.raises(UsageError, match="number of seconds"):
        if magic == "multihost":
            shell.run_cell_magic(magic, arg, "print(1)")
        else:
            shell.run_line_magic(magic, arg)
    assert session.calls == []


def test_seconds_options_pass_good_values(shell, session):
    jaxsys(shell, "start --init-timeout 0.5 --heartbeat 1e3")
    _, _, kwargs = only_call(session)
    assert kwargs["init_timeout"] == 0.5 and kwargs["heartbeat_timeout"] == 1000.0
    shell.run_cell_magic("multihost", "--timeout 2.5 --grace 3", "print(1)")
    name, args, kwargs = session.calls[1]
    assert name == "run_cell" and kwargs["timeout"] == 2.5 and kwargs["grace"] == 3.0


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_seconds_accepts_exactly_the_finite_positive_numbers(value):
    import argparse

    text = repr(value)
    if math.isfinite(value) and value > 0:
        assert seconds(text) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(text)


# -- long lines and variable expansion ----------------------------------------------------------


@pytest.mark.parametrize(
    "magic,cell", [("jaxsys", None), ("pull", None), ("multihost", None), ("multihost", "x")]
)
def test_an_over_long_line_is_refused_before_anything_else(shell, session, magic, cell):
    line = "start " + "$" * 100_000  # took IPython's expansion well over 15 s
    with pytest.raises(UsageError, match=f"100006 characters long; at most {MAX_LINE}"):
        if cell is None:
            shell.run_line_magic(magic, line)
        else:
            shell.run_cell_magic(magic, line, cell)
    assert session.calls == []


def test_a_long_local_line_is_refused_without_echoing_it(shell, session):
    with pytest.raises(UsageError) as err:
        shell.run_cell_magic("local", "x" * 100_000, "1")
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("magic", ["jaxsys", "multihost", "pull", "local"])
def test_ipython_never_expands_the_magics_lines(shell, session, monkeypatch, magic):
    def refuse(*args, **kwargs):
        raise AssertionError("IPython expanded the line")

    monkeypatch.setattr(shell, "var_expand", refuse)
    assert getattr(getattr(JaxSysMagics, magic), "_ipython_magic_no_var_expand", False)
    if magic == "jaxsys":
        shell.run_line_magic("jaxsys", "stop")
    elif magic == "pull":
        shell.run_line_magic("pull", "$x")
        assert session.calls[-1] == ("pull", ("$x", 0), {})  # a name is never expanded
    elif magic == "multihost":
        shell.run_cell_magic("multihost", "--procs 0", "print(1)")
    else:
        shell.run_cell_magic("local", "", "1")


def test_jaxsys_expands_variables_of_a_bounded_line_itself(shell, session):
    # Notebooks write --cache-dir {cache_dir}; that keeps working.
    shell.user_ns.update(cache_dir="/tmp/cache", n=3)
    jaxsys(shell, "start --hosts $n --cache-dir {cache_dir}/x")
    _, _, kwargs = only_call(session)
    assert kwargs["hosts"] == 3 and kwargs["cache_dir"] == "/tmp/cache/x"
    # A line IPython could not expand is used as written, as IPython does.
    jaxsys(shell, "start --cache-dir {undefined_name}")
    assert session.calls[1][2]["cache_dir"] == "{undefined_name}"


def test_an_expansion_that_grows_past_the_limit_is_refused(shell, session):
    shell.user_ns["huge"] = "x" * (MAX_LINE + 1)
    with pytest.raises(UsageError, match="characters long"):
        jaxsys(shell, "start --cache-dir {huge}")
    assert session.calls == []


# -- %jaxsys logs -------------------------------------------------------------------------------


class FakeLogCluster(EngineCalls):
    """Processes whose engines answer at once; ``call`` is the real one."""

    def __init__(self, answer, states):
        self.calls: list = []
        self.processes = [
            SimpleNamespace(rank=r, state=s, engine_id=None if s != "ready" else 10 + r)
            for r, s in enumerate(states)
        ]
        self.nprocs = len(states)
        self.ranks = list(range(len(states)))
        self.client = {10 + r: FakeEngine(answer, self.calls) for r in range(len(states))}

    def refresh_states(self):
        pass

    def _require_ready(self):
        pass

    def _check_rank(self, rank):
        assert 0 <= rank < self.nprocs


def fake_cluster(answer="gloo: connected\nabsl: INFO noise\n", states=("ready", "ready")):
    return FakeLogCluster(answer, states)


@pytest.fixture
def logs_session(shell, session):
    session.cluster = fake_cluster()
    session.require_cluster = lambda: session.cluster
    return session


def test_logs_shows_the_tail_of_the_processs_native_log(shell, logs_session, capsys):
    jaxsys(shell, "logs 1")
    assert logs_session.cluster.calls == [(output.log_tail, (40,))]
    assert capsys.readouterr().out == "gloo: connected\nabsl: INFO noise\n"
    jaxsys(shell, "logs p0 --tail 5")
    assert logs_session.cluster.calls[-1] == (output.log_tail, (5,))


def test_logs_of_a_process_with_no_log_says_so(shell, logs_session, capsys):
    logs_session.cluster = fake_cluster(answer="")
    jaxsys(shell, "logs 0")
    assert capsys.readouterr().out == "jaxsys: process 0 has no native log lines yet\n"


@pytest.mark.parametrize(
    "process,fragment",
    [
        ("7", "there is no process 7; this cluster's processes are p0-1"),
        ("-1", "there is no process -1; this cluster's processes are p0-1"),
        ("x", "expected a process number such as 0, got 'x'; this cluster's processes are p0-1"),
    ],
)
def test_logs_of_a_bad_process_names_the_clusters_processes(shell, logs_session, process, fragment):
    with pytest.raises(UsageError, match=fragment):
        jaxsys(shell, f"logs {process}")
    assert logs_session.cluster.calls == []


def test_logs_of_a_dead_process_is_a_usage_error(shell, logs_session):
    logs_session.cluster = fake_cluster(states=("ready", "dead"))
    with pytest.raises(UsageError, match="process 1 is dead; .*%jaxsys restart 1"):
        jaxsys(shell, "logs 1")


def test_logs_never_waits_forever_for_a_busy_process(shell, logs_session):
    logs_session.cluster = fake_cluster(answer=TimeoutError("busy"))
    with pytest.raises(UsageError, match="did not send its log within 10 s"):
        jaxsys(shell, "logs 0")


def test_logs_help_names_the_default():
    text = actions.ACTIONS["logs"].help()
    assert "--tail : int >= 1, default 40" in text
