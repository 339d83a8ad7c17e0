"""What a launcher declares in its own module (its options' flags, its rank and size
variables, the job it attaches to) reaches every command line, every engine and the job
program, with nothing else naming it."""

from __future__ import annotations

import argparse
import ast
import logging

import pytest

from jaxsys_kernel import contract
from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.cluster.launchers import (
    EngineContext,
    Launcher,
    LocalLauncher,
    launcher_classes,
    make_launcher,
    registry,
)
from jaxsys_kernel.cluster.launchers.slurm import SlurmLauncher
from jaxsys_kernel.cluster.options import Flag
from jaxsys_kernel.errors import ConfigError
from jaxsys_kernel.job.program import Program, render

pytestmark = pytest.mark.unit


def test_every_flag_sets_an_option_of_its_own_launcher():
    for name, cls in launcher_classes().items():
        owner, known = cls.option_names()
        for fl in cls.flags:
            assert fl.key in known, f"{name}: {fl.flag} sets {fl.key!r}, not one of {owner}'s"


def test_a_launcher_flag_types_its_option_on_every_command_line():
    parser = argparse.ArgumentParser()
    ClusterConfig.add_arguments(parser)
    args = parser.parse_args(["--partition", "debug", "--ssh-arg=-p2222", "--hostfile", "h"])
    given = ClusterConfig.given(args)["launcher_options"]
    assert given == {"partition": "debug", "ssh_args": ["-p2222"], "hostfile": "h"}


class _Clash(LocalLauncher):
    name = "clash"
    takes_options = True
    options = {"hosts": "a name jaxsys has", "queue": "a queue", "other": "one more"}
    flags = (
        Flag("--hosts", "clashes with jaxsys's own", {}, "hosts"),
        Flag("--partition", "sets another option than Slurm's --partition", {}, "queue"),
        Flag("--time", "Slurm's --time, the same option", {}, "time"),
        Flag("--no-key", "sets no option", {}),
        Flag("--other", "a flag of its own", {}, "other"),
    )


def test_a_flag_that_would_clash_is_left_out_and_said(monkeypatch, caplog):
    classes = {**launcher_classes(), "clash": _Clash}
    monkeypatch.setattr(registry, "launcher_classes", lambda: classes)
    with caplog.at_level(logging.WARNING, logger="jaxsys.cluster"):
        flags = registry.launcher_flags.__wrapped__(frozenset({"--hosts"}))
    by_flag = {fl.flag: fl for fl in flags}
    assert by_flag["--other"].key == "other"
    assert by_flag["--partition"].key == "partition"  # Slurm's, declared first
    assert by_flag["--time"].help.startswith("Slurm")
    assert "--hosts" not in by_flag and "--no-key" not in by_flag
    said = caplog.text
    assert "clash launcher's flag --hosts is left out: jaxsys has it" in said
    assert "--partition is left out: the slurm launcher's sets 'partition'" in said
    assert "--no-key is left out: it sets no launcher option" in said


def test_a_launcher_flag_a_command_has_already_is_left_out(monkeypatch, caplog):
    flags = (*registry.launcher_flags(), Flag("--submit", "clashes with jaxsys job", {}, "x"))
    monkeypatch.setattr(registry, "launcher_flags", lambda reserved=frozenset(): flags)
    monkeypatch.setattr("jaxsys_kernel.cluster.config.launcher_flags", registry.launcher_flags)
    parser = argparse.ArgumentParser(prog="jaxsys job")
    parser.add_argument("--submit", action="store_true")
    with caplog.at_level(logging.WARNING, logger="jaxsys.cluster"):
        ClusterConfig.add_arguments(parser)
    assert parser.parse_args(["--submit"]).submit is True
    assert "the launcher flag --submit is left out: jaxsys job has its own" in caplog.text


@pytest.mark.parametrize("name", ["mpi", "slurm"])
def test_one_job_engines_find_their_rank_in_their_launchers_variables(name):
    cls = launcher_classes()[name]
    env = make_launcher(ClusterConfig(hosts=2, launcher=name)).one_job_env(EngineContext(1))
    assert contract.PROCESS_ID not in env
    variable = cls.rank_variables[0]
    assert contract.rank_from_env({**env, variable: "1"}) == 1
    # Another scheduler's variable, left over from a surrounding job, is not read.
    other = next(v for c in launcher_classes().values() for v in c.rank_variables if c is not cls)
    with pytest.raises(RuntimeError, match=f"set one of .*{variable}"):
        contract.rank_from_env({**env, other: "1"})


def _assigned(text: str, name: str):
    line = next(x for x in text.splitlines() if x.startswith(f"{name} = "))
    return ast.literal_eval(line.partition(" = ")[2])


def test_the_job_program_reads_every_launchers_rank_and_size_variables():
    text = render(Program(hosts=2, devices_per_host=1), "n.ipynb")
    ranks, sizes = _assigned(text, "RANK_VARIABLES"), _assigned(text, "SIZE_VARIABLES")
    for cls in launcher_classes().values():
        assert set(cls.rank_variables) <= set(ranks)
        assert set(cls.size_variables) <= set(sizes)
    assert (ranks[0], sizes[0]) == (contract.PROCESS_ID, contract.NUM_PROCESSES)


def test_one_launch_serves_every_launcher_that_starts_its_ranks_in_one_job():
    assert SlurmLauncher.launch is Launcher.launch
    assert launcher_classes()["mpi"].launch is Launcher.launch


def test_a_job_is_attached_to_through_its_launchers_allocation():
    alloc = SlurmLauncher.job_allocation("12", ntasks=3)
    assert isinstance(alloc, SlurmLauncher.allocation_kind)
    assert (alloc.job_id, alloc.ntasks) == ("12", 3)
    with pytest.raises(ConfigError, match="JOB must be a Slurm job id"):
        SlurmLauncher.job_allocation("12; rm")
    with pytest.raises(ConfigError, match="the local launcher keeps its hosts under a name"):
        LocalLauncher.job_allocation("12")


def test_a_stop_names_the_job_it_leaves_through_its_launcher():
    from types import SimpleNamespace

    from jaxsys_kernel.magics.actions_jobs import stop_note

    attached = ClusterConfig(hosts=2, launcher="slurm", launcher_options={"job_id": "12"})
    note = stop_note(SimpleNamespace(config=attached))
    assert note.startswith("jaxsys: Slurm job 12 keeps running (the cluster was attached")
    assert stop_note(SimpleNamespace(config=ClusterConfig(hosts=2))) is None


def test_a_launcher_flag_a_magic_has_already_is_left_out(monkeypatch, caplog):
    from IPython.core.magic_arguments import argument, magic_arguments

    from jaxsys_kernel.magics.actions_args import cluster_arguments

    flags = (*registry.launcher_flags(), Flag("--explain", "clashes with the magic's", {}, "x"))
    monkeypatch.setattr("jaxsys_kernel.cluster.config.launcher_flags", lambda r=(): flags)

    def start(session, args):
        """A magic with a flag of its own."""

    with caplog.at_level(logging.WARNING, logger="jaxsys.magics"):
        magic = magic_arguments("m")(
            cluster_arguments(argument("--explain", action="store_true")(start))
        )
    assert magic.parser.parse_args(["--explain", "--partition", "p"]).explain is True
    assert "the launcher flag --explain is left out: the magic has its own" in caplog.text
