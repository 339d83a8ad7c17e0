"""After a fault the words lead somewhere: a world with no live process is not "degraded", and a
cell refused for it offers no literal ``--procs ...``."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.cells.guard import check_processes
from jaxsys_kernel.magics import recovery
from jaxsys_kernel.magics.health import health

from .test_cellrun import FakeProcesses
from .test_labextension import fake_cluster


def test_a_world_with_every_process_dead_is_not_degraded():
    said = health(fake_cluster(("dead", "dead")))
    assert said.state == "stopped" and said.warning
    assert said.line() == (
        "cluster: stopped (every process is dead (p0-1 dead); %jaxsys restart starts them again)"
    )


@pytest.mark.parametrize("states", [(("dead", ""), ("dead", "")), (("dead", ""), ("ready", ""))])
def test_a_cell_with_process_zero_dead_offers_only_the_world_restart(states):
    with pytest.raises(UsageError) as e:
        check_processes(FakeProcesses(*states), [0, 1], still_running=())
    said = str(e.value)
    assert "--procs" not in said and "%jaxsys restart restarts the whole world" in said


class Answers:
    """A cluster whose processes answer ``user_names`` with the given values."""

    def __init__(self, answers):
        self.answers = answers
        self.ranks = list(answers)
        self.processes = [type("P", (), {"state": "ready", "platform": "cpu"})] * len(answers)

    def call(self, ranks, fn, timeout):
        return type("Calls", (), {"results": {r: self.answers[r] for r in ranks}})


def test_a_rejoined_process_is_told_what_it_lacks_bounded():
    hostile = ["params", "x" * 10_000, 7, *(f"n{i}" for i in range(5000))]
    lines = recovery.rejoin_lines(Answers({0: hostile, 1: ["jax"], 2: ["params"]}), 1)
    assert lines[0].startswith("Process 1 starts empty and lacks n0, n1, ")
    assert "x" * 101 not in lines[0] and "and 1986 more, which the others hold" in lines[0]
    assert "%%multihost --procs 1" in lines[0]
    assert lines[1] == recovery.CPU_COLLECTIVE


def test_kill_guidance_for_process_zero_says_it_cannot_come_back():
    said = recovery.kill_guidance(object(), 0)
    assert "cannot come back alone" in said and recovery.WORLD_LOST in said


def test_a_cell_is_labelled_by_its_number_and_first_line():
    from jaxsys_kernel.cells.guard import Ledger, cell_label

    assert cell_label(10, "\n  x = f(y)  \nz = 2") == "[10] x = f(y)"
    assert cell_label(3, "y = " + "1" * 80) == "[3] y = " + "1" * 33 + "..."
    ledger = Ledger()
    ledger.record([0], [0, 1], "x = 1", "[4] x = 1")
    warning = ledger.record([0, 1], [0, 1], "print(x)", "[5] print(x)")
    assert warning.startswith("Warning: these processes are out of step: p0 ran 1 cell(s)")
    assert "([4] x = 1)" in warning and "this one ([5] print(x)) will hang" in warning


def test_a_name_defined_on_some_processes_only_is_explained_where_it_is_missing():
    from jaxsys_kernel.magics.hints import PartialNames, defined_names

    assert defined_names("import a.b as c, d.e\nx, (y, z) = 1, (2, 3)\ndef f(): w = 1") == {
        "c",
        "d",
        "x",
        "y",
        "z",
        "f",
    }
    names = PartialNames()
    names.record([0], [0, 1], "params = 1", "[7] params = 1")
    said = names.hint(1, "name 'params' is not defined")
    assert said.startswith("params was defined only on p0, by cell [7] params = 1")
    assert names.hint(0, "name 'params' is not defined") is None
    names.record([0, 1], [0, 1], "params = 2", "[8] params = 2")
    assert names.hint(1, "name 'params' is not defined") is None


def test_only_a_single_percent_line_followed_by_code_is_refused():
    from jaxsys_kernel.magics.hints import single_percent_transformer

    for kept in (["%multihost on\n"], ["%%multihost\n", "x = 1\n"], ["%multihost\n", "\n"]):
        assert single_percent_transformer(kept) == kept
    (refused,) = single_percent_transformer(["%multihost --procs 0\n", "x = 1\n"])
    assert "refuse_single_percent(' --procs 0')" in refused


def test_a_wait_for_processes_outside_the_cell_is_a_warning_state():
    said = health(fake_cluster(("ready", "ready")), waiting="p0 waits for p1")
    assert (said.state, said.warning) == ("waiting", True)
    assert said.reason == "p0 waits for p1, which do not run the cell"
    assert health(fake_cluster(("ready", "ready"))).state == "ready"


def test_interrupting_one_process_inside_jax_is_said_in_the_singular():
    from jaxsys_kernel.cells.hang import HangPolicy

    from .test_cellrun import DIVERGENCE_DUMP, Stacks

    said: list[str] = []
    HangPolicy("interrupt", Stacks({0: DIVERGENCE_DUMP}), say=said.append).interrupting([0])
    assert said == [
        "jaxsys: interrupting p0 while it waits inside JAX; the JAX world is now out of "
        "step: run %jaxsys restart."
    ]


def test_a_dead_process_log_is_read_bounded(tmp_path):
    from types import SimpleNamespace

    from jaxsys_kernel.cluster.launchers import native_log_file
    from jaxsys_kernel.magics import deaths

    path = native_log_file(tmp_path, 3, 2)
    path.parent.mkdir(parents=True)
    path.write_text("".join(f"line {i}\n" for i in range(100_000)) + "x" * 5000 + "\nlast\n")
    cluster = SimpleNamespace(world=SimpleNamespace(profile=tmp_path, incarnation=2))
    tail = deaths.dead_log(cluster, 3, 3)
    assert tail == "line 99999\n" + "x" * deaths.LINE_CHARS + "\nlast\n"
    assert deaths.dead_log(cluster, 2, 3) is None  # no log left: nothing to read


def test_a_dead_process_log_leaves_out_gloos_connection_notices(tmp_path):
    from types import SimpleNamespace

    from jaxsys_kernel.cluster.launchers import native_log_file
    from jaxsys_kernel.magics import deaths

    path = native_log_file(tmp_path, 1, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "last words of p1\n"
        "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n"
        "F0000 check failed\n"
    )
    cluster = SimpleNamespace(world=SimpleNamespace(profile=tmp_path, incarnation=0))
    assert deaths.dead_log(cluster, 1, 5) == "last words of p1\nF0000 check failed\n"
