"""Cluster options declared once: the flags every command takes from ClusterConfig, the
standby option, the saved form, the layers settings resolve in, and --procs for kill and
restart."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel import Cluster, cli
from jaxsys_kernel.cluster import options as opts
from jaxsys_kernel.cluster.config import STANDBY_VARIABLE, ClusterConfig
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.job import from_notebook, render
from jaxsys_kernel.magics import actions, lifecycle

from ..fakes import StartSession

# Every flag %jaxsys start took before the options were declared once, by option name.
TODAYS_FLAGS = {
    "--hosts": "hosts",
    "--devices-per-host": "devices_per_host",
    "--launcher": "launcher",
    "--cache-dir": "cache_dir",
    "--init-timeout": "init_timeout",
    "--env": "env",
    "--insecure": "secure",
    "--ca-file": "ca_file",
    "--cert-dir": "cert_dir",
    "--heartbeat": "heartbeat_timeout",
    "--no-recoverability": "recoverable",
    "--partition": "launcher_options",
    "--time": "launcher_options",
    "--account": "launcher_options",
    "--sbatch-arg": "launcher_options",
    "--hostfile": "launcher_options",
}


def _declared_flags() -> dict[str, str]:
    return {fl.flag: f.name for f in opts.declared(ClusterConfig) for fl in opts.flags_of(f)}


def _flags_of(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _subparser(name: str):
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    return sub.choices[name]


# -- one declaration, every command ------------------------------------------------------------


def test_every_flag_of_today_is_declared_with_the_same_meaning():
    declared = _declared_flags()
    assert {f: declared.get(f) for f in TODAYS_FLAGS} == TODAYS_FLAGS
    assert declared["--standby"] == "standby"


@pytest.mark.parametrize("command", ["cluster", "run", "job"])
def test_the_commands_and_the_magic_take_every_declared_flag(command):
    declared = set(_declared_flags())
    assert declared <= _flags_of(actions.start.parser)
    assert declared <= _flags_of(_subparser(command))


def test_options_that_no_command_line_can_type_stay_declared():
    names = {f.name for f in opts.declared(ClusterConfig)}
    flagged = set(_declared_flags().values())
    assert names - flagged == {"process_env", "process_prefix"}
    doc = ClusterConfig.__doc__
    for name in names:
        assert f"\n    {name} : " in doc, name
    assert "Typed as --standby." in doc


LINE = (
    "--hosts a,b --launcher slurm --devices-per-host 3 --init-timeout 30 --heartbeat 2 "
    "--insecure --no-recoverability --no-telemetry --env K=V --env A=b=c --standby 1 "
    "--register-timeout 90 --partition p --time 5:00 --sbatch-arg=--hold --sbatch-arg=-N1"
)
EXPECTED = {
    "hosts": ["a", "b"],
    "launcher": "slurm",
    "devices_per_host": 3,
    "init_timeout": 30.0,
    "heartbeat_timeout": 2.0,
    "secure": False,
    "recoverable": False,
    "telemetry": False,
    "env": {"K": "V", "A": "b=c"},
    "standby": 1,
    "register_timeout": 90.0,
    "launcher_options": {"partition": "p", "time": "5:00", "sbatch_args": ["--hold", "-N1"]},
}


def test_the_magic_and_the_command_read_a_line_the_same_way():
    from IPython.core.magic_arguments import parse_argstring

    magic = ClusterConfig.given(parse_argstring(actions.start, LINE))
    command = ClusterConfig.given(
        cli.build_parser().parse_args(["cluster", "start", *LINE.split()])
    )
    assert magic == command == EXPECTED
    # Nothing typed, nothing given: a command line is one layer that names only what it sets.
    assert ClusterConfig.given(cli.build_parser().parse_args(["cluster", "start"])) == {}


def test_a_bad_value_names_its_flag():
    with pytest.raises(ConfigError, match="--env takes KEY=VALUE, got 'oops'"):
        ClusterConfig.given(cli.build_parser().parse_args(["run", "nb", "--env", "oops"]))
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["cluster", "start", "--init-timeout", "0"])


# -- Cluster forwards, and says what it does not know --------------------------------------------


def test_cluster_does_not_repeat_the_options():
    params = inspect.signature(Cluster).parameters
    assert list(params) == [
        "hosts",
        "devices_per_host",
        "launcher",
        "config",
        "progress",
        "options",
    ]
    c = Cluster(hosts=2, devices_per_host=3, launcher="local", cache_dir="none", telemetry=False)
    assert (c.nprocs, c.devices_per_host, c.cache_dir, c.telemetry_enabled) == (2, 3, None, False)
    assert Cluster(3, 1).config == ClusterConfig(hosts=3, devices_per_host=1)
    # A config made before, with options that replace its own.
    again = Cluster(config=c.config, devices_per_host=1)
    assert (again.nprocs, again.devices_per_host, again.telemetry_enabled) == (2, 1, False)


def test_an_unknown_option_is_named_with_the_known_ones():
    with pytest.raises(TypeError, match=r"Cluster has no option 'devices'") as err:
        Cluster(hosts=2, devices=2)
    assert isinstance(err.value, ConfigError)
    assert "did you mean 'devices_per_host'?" in str(err.value)
    assert "hosts, devices_per_host, launcher" in str(err.value) and "standby" in str(err.value)


# -- standby -------------------------------------------------------------------------------------


def test_standby_is_a_count_or_none(monkeypatch):
    monkeypatch.delenv(STANDBY_VARIABLE, raising=False)
    assert ClusterConfig(hosts=2).standby is None
    assert ClusterConfig(hosts=2, standby=0).standby == 0
    assert ClusterConfig(hosts=2, standby=3).standby == 3
    for bad, words in ((-1, "0 or more"), (1.5, "whole number"), (True, "whole number")):
        with pytest.raises(ConfigError, match=words):
            ClusterConfig(hosts=2, standby=bad)


def test_standby_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv(STANDBY_VARIABLE, " 2 ")
    assert ClusterConfig(hosts=2).standby == 2
    assert ClusterConfig(hosts=2, standby=0).standby == 0  # given wins
    monkeypatch.setenv(STANDBY_VARIABLE, "")
    assert ClusterConfig(hosts=2).standby is None
    for raw in ("two", "-1"):
        monkeypatch.setenv(STANDBY_VARIABLE, raw)
        with pytest.raises(ConfigError, match=rf"\$JAXSYS_STANDBY='{raw}'"):
            ClusterConfig(hosts=2)


# -- the saved form ------------------------------------------------------------------------------


def _rich() -> ClusterConfig:
    return ClusterConfig(
        hosts=["n1", "n2"],
        launcher="ssh",
        devices_per_host=1,
        env={"A": "1"},
        process_env={1: {"B": "2"}},
        heartbeat_timeout=None,
        launcher_options={"ssh_args": ["-p", "2222"]},
        standby=0,
    )


def test_to_dict_keeps_what_was_given_and_round_trips():
    cfg = _rich()
    d = cfg.to_dict()
    assert d == {
        "hosts": ["n1", "n2"],
        "launcher": "ssh",
        "devices_per_host": 1,
        "env": {"A": "1"},
        "process_env": {"1": {"B": "2"}},
        "heartbeat_timeout": None,
        "launcher_options": {"ssh_args": ["-p", "2222"]},
        "standby": 0,
    }
    assert json.loads(json.dumps(d)) == d
    assert ClusterConfig.from_dict(d) == cfg
    assert ClusterConfig().to_dict() == {}


def test_a_file_round_trips_and_derived_values_are_derived_again(tmp_path):
    path = tmp_path / "cluster.json"
    _rich().to_file(path)
    assert ClusterConfig.from_file(path) == _rich()
    small = ClusterConfig(hosts=2)
    small.to_file(path)
    # The registration deadline was derived from 2 hosts; a file loaded at 8 derives its own.
    bigger = ClusterConfig.from_dict({**ClusterConfig.from_file(path).to_dict(), "hosts": 8})
    assert bigger.register_timeout > small.register_timeout


@pytest.mark.parametrize(
    "content,words",
    [
        ('{"hosts": 2, "devices": 1}', "has no option 'devices'; did you mean 'devices_per_host'?"),
        ('{"hosts": "four"}', "option 'hosts' takes int | Sequence[str], got 'four'"),
        ('{"secure": 1}', "option 'secure' takes bool"),
        ('{"devices_per_host": true}', "option 'devices_per_host' takes int"),
        ('["hosts"]', "expected options by name"),
        ("{hosts: 2}", "is not JSON"),
    ],
)
def test_a_bad_file_is_named_with_what_is_wrong(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        ClusterConfig.from_file(path)
    assert words in str(err.value) and str(path) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read the cluster options in"):
        ClusterConfig.from_file(tmp_path / "missing.json")


# -- layers --------------------------------------------------------------------------------------


def test_layers_resolve_lowest_first():
    kernelspec = {"hosts": 4, "devices_per_host": 2, "launcher": "local"}
    line = {"hosts": 2, "init_timeout": None, "env": {"A": "line", "B": "line"}}
    override = {"hosts": 8, "env": {"B": "override"}}
    assert opts.merge_layers(kernelspec, None, line, override) == {
        "hosts": 8,
        "devices_per_host": 2,
        "launcher": "local",
        "env": {"A": "line", "B": "override"},
    }
    assert opts.merge_layers(
        {"launcher_options": {"time": "5:00"}}, {"launcher_options": {"partition": "p"}}
    ) == {"launcher_options": {"time": "5:00", "partition": "p"}}


def test_the_kernelspec_layer_reads_only_what_is_set():
    assert opts.kernelspec_layer({}) == {}
    env = {"JAXSYS_HOSTS": "3", "JAXSYS_DEVICES_PER_HOST": "1", "JAXSYS_LAUNCHER": "mpi"}
    assert opts.kernelspec_layer(env) == {"hosts": 3, "devices_per_host": 1, "launcher": "mpi"}
    with pytest.raises(ConfigError, match=r"\$JAXSYS_HOSTS='0'"):
        opts.kernelspec_layer({"JAXSYS_HOSTS": "0"})


def test_the_override_of_jaxsys_run_wins_over_the_line():
    environ = {opts.OVERRIDES_VARIABLE: json.dumps({"hosts": 8})}
    layered = ClusterConfig.layered({"hosts": 4}, {"hosts": 2, "cache_dir": "/c"}, environ=environ)
    assert layered == {"hosts": 8, "cache_dir": "/c"}
    assert ClusterConfig.layered({"hosts": 4}, {"hosts": 2}, environ={}) == {"hosts": 2}
    with pytest.raises(ConfigError, match=r"\$JAXSYS_OVERRIDES has no option 'host'"):
        ClusterConfig.layered(environ={opts.OVERRIDES_VARIABLE: '{"host": 8}'})
    with pytest.raises(ConfigError, match=r"\$JAXSYS_OVERRIDES is not JSON"):
        ClusterConfig.layered(environ={opts.OVERRIDES_VARIABLE: "hosts=8"})


class _Started(Exception):
    pass


class _Lifecycle(lifecycle.Lifecycle):
    cluster = None


def test_the_session_starts_with_every_layer(monkeypatch):
    seen = {}

    def cluster(**kwargs):
        seen.update(kwargs)
        raise _Started

    monkeypatch.setattr(lifecycle, "Cluster", cluster)
    monkeypatch.setenv("JAXSYS_HOSTS", "6")
    monkeypatch.setenv("JAXSYS_DEVICES_PER_HOST", "3")
    monkeypatch.setenv(opts.OVERRIDES_VARIABLE, json.dumps({"devices_per_host": 1}))
    with pytest.raises(_Started):
        _Lifecycle().start(hosts=None, devices_per_host=2, init_timeout=30.0)
    assert (seen["hosts"], seen["devices_per_host"], seen["init_timeout"]) == (6, 1, 30.0)


def test_jaxsys_run_hands_its_flags_to_the_kernel(monkeypatch, tmp_path, capsys):
    import nbclient
    import nbformat

    seen = {}

    class Client:
        def __init__(self, nb, **kwargs):
            pass

        def execute(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(nbclient, "NotebookClient", Client)
    monkeypatch.setattr(cli, "_ensure_kernelspec", lambda: None)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), path)
    assert cli.main(["run", str(path), "--hosts", "3", "--standby", "0"]) == 0
    assert json.loads(seen["env"][opts.OVERRIDES_VARIABLE]) == {"hosts": 3, "standby": 0}
    seen.clear()
    assert cli.main(["run", str(path)]) == 0
    assert opts.OVERRIDES_VARIABLE not in seen["env"]
    # One layer, checked with the notebook's own line: a Slurm flag needs no --launcher here.
    assert cli.main(["run", str(path), "--partition", "debug"]) == 0
    assert json.loads(seen["env"][opts.OVERRIDES_VARIABLE]) == {
        "launcher_options": {"partition": "debug"}
    }
    seen.clear()
    assert cli.main(["run", str(path), "--env", "oops"]) == 2
    assert "jaxsys run: --env takes KEY=VALUE, got 'oops'" in capsys.readouterr().err
    assert seen == {}


def _notebook(tmp_path, *sources):
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": []} for s in sources]
    path = tmp_path / "nb.ipynb"
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def test_a_job_resolves_the_notebooks_line_between_kernelspec_and_override(tmp_path):
    path = _notebook(
        tmp_path,
        "%jaxsys start --hosts 4 --devices-per-host 1 --init-timeout 30 --explain",
        "%%multihost --procs 1-2\nprint(1)",
    )
    prog = from_notebook(
        path, overrides={"hosts": 3}, kernelspec={"hosts": 8, "devices_per_host": 5}
    )
    assert (prog.hosts, prog.devices_per_host, prog.options["init_timeout"]) == (3, 1, 30.0)
    assert prog.cells[0].procs == [1, 2]
    assert from_notebook(path, kernelspec={"hosts": 8}).hosts == 4
    bad = _notebook(tmp_path, "%jaxsys start --hosts 2 --init-timeout soon")
    with pytest.raises(ConfigError, match="cell 0's %jaxsys start line: .*--init-timeout"):
        from_notebook(bad)


def test_jaxsys_job_takes_the_option_flags(tmp_path, capsys):
    path = _notebook(tmp_path, "%jaxsys start --hosts 4 --init-timeout 30", "%%multihost\nprint(1)")
    out = tmp_path / "out"
    code = cli.main(
        ["job", str(path), "--launcher", "slurm", "--hosts", "2", "--heartbeat", "7",
         "--sbatch-arg=--hold", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    sbatch = (out / "job.sbatch").read_text()
    assert "#SBATCH --ntasks=2" in sbatch and "--hold" in sbatch
    program = (out / "program.py").read_text()
    assert "heartbeat_timeout_seconds=7," in program and "initialization_timeout=30," in program
    assert render(from_notebook(path), "nb.ipynb").count("initialization_timeout=60,") == 1
    assert cli.main(["job", str(path), "--hosts", "0", "--out", str(out)]) == 2
    assert "--hosts must be at least 1" in capsys.readouterr().err


def test_jaxsys_cluster_start_layers_a_saved_file_under_its_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXSYS_HOSTS", raising=False)
    saved = tmp_path / "saved.json"
    ClusterConfig(hosts=3, launcher="slurm", launcher_options={"time": "5:00"}).to_file(saved)
    args = cli.build_parser().parse_args(
        ["cluster", "start", "--config", str(saved), "--partition", "p", "--devices-per-host", "1"]
    )
    cfg = cli.cluster_config(args)
    assert (cfg.nprocs, cfg.devices_per_host, cfg.launcher) == (3, 1, "slurm")
    assert {"time": "5:00", "partition": "p"}.items() <= cfg.launcher_options.items()


def test_jaxsys_cluster_start_refuses_bad_options_before_starting_anything(tmp_path, capsys):
    monkeypatch_dir = tmp_path / "state"
    args = cli.build_parser().parse_args(["cluster", "start", "--hosts", "2", "--standby", "-1"])
    assert cli._start_background(args, monkeypatch_dir / "default.json") == 2
    assert "standby must be 0 or more processes" in capsys.readouterr().err
    assert not monkeypatch_dir.exists()


# -- %jaxsys start, kill, restart, attach ---------------------------------------------------------


def test_start_hands_the_session_every_option_it_was_given(shell, session):
    shell.run_line_magic(
        "jaxsys",
        "start --hosts 2 --standby 0 --no-telemetry --register-timeout 90 "
        "--addresses 10.0.0.1,10.0.0.2 --controller-ip 10.0.0.1",
    )
    ((name, _, kwargs),) = session.calls
    assert name == "start"
    assert {k: kwargs[k] for k in ("standby", "telemetry", "register_timeout", "addresses")} == {
        "standby": 0,
        "telemetry": False,
        "register_timeout": 90.0,
        "addresses": ["10.0.0.1", "10.0.0.2"],
    }
    assert kwargs["controller_ip"] == "10.0.0.1" and kwargs["hosts"] == 2


@pytest.mark.parametrize(
    "line,calls",
    [
        (
            "kill --procs 0,1",
            [("kill_process", (0, "KILL"), {}), ("kill_process", (1, "KILL"), {})],
        ),
        ("kill --procs 1 --signal TERM", [("kill_process", (1, "TERM"), {})]),
        ("restart --procs 1", [("restart_process", (1,), {})]),
        ("restart p1", [("restart_process", (1,), {})]),
    ],
)
def test_kill_and_restart_take_procs(shell, session, line, calls):
    shell.run_line_magic("jaxsys", line)
    assert session.calls == calls


@pytest.mark.parametrize(
    "line,words",
    [
        ("kill", "%jaxsys kill needs a process, e.g. %jaxsys kill 2"),
        ("kill 1 --procs 1", "name the processes as P or with --procs, not both"),
        ("kill --procs 5", "%jaxsys kill --procs: process selection '5' is outside"),
        ("restart --procs x", "%jaxsys restart --procs: bad process selection 'x'"),
    ],
)
def test_kill_and_restart_refuse_a_bad_selection(shell, session, line, words):
    with pytest.raises(UsageError, match=words):
        shell.run_line_magic("jaxsys", line)
    assert session.calls == []


def test_attach_takes_the_launcher_from_the_registry(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSYS_STATE_DIR", str(tmp_path))  # where attach keeps the job
    from jaxsys_kernel.cluster.allocation import JobState, JobStatus
    from jaxsys_kernel.cluster.allocation_slurm import SlurmAllocation
    from jaxsys_kernel.cluster.launchers import launcher_class

    monkeypatch.setattr(
        SlurmAllocation, "poll", lambda self: JobStatus(JobState.RUNNING, hosts=["a", "b"])
    )
    session = StartSession(cluster=None)
    actions.dispatch(session, "attach 42")
    name = session.kwargs["launcher"]
    assert "job_id" in launcher_class(name).option_names()[1]
    assert session.kwargs["hosts"] == 2 and session.kwargs["launcher_options"] == {"job_id": "42"}
    assert name != SlurmAllocation.kind


def test_the_declaration_is_a_plain_dataclass():
    # Fields made by option() are ordinary dataclass fields: defaults, no mutable ones.
    for f in opts.declared(ClusterConfig):
        assert f.default is not dataclasses.MISSING and not isinstance(f.default, dict | list)
