"""Errors of many processes read as few: grouped, values tabled, cells numbered as shown."""

from __future__ import annotations

import pytest

from jaxsys_kernel.cells import MultihostError, MultihostTimeout, raise_for_run, render_errors
from jaxsys_kernel.cells.grouping import (
    group,
    hide_jax_frames,
    innermost_cell_line,
    renumber,
    table,
)
from jaxsys_kernel.cells.result import CellRun, ProcResult

RED, RESET = "\x1b[0;31m", "\x1b[0m"


def tb(message: str, cell: int = 5, line: int = 3, source: str = "raise ValueError(msg)"):
    """An engine's traceback, coloured as IPython colours it."""
    return [
        f"{RED}---------------------------------------------------------------------------{RESET}",
        f"{RED}ValueError{RESET}                                Traceback (most recent call last)",
        f"Cell {RED}In[{cell}]{RESET}, line {line}",
        f"{RED}----> {line}{RESET} {source}",
        "",
        f"{RED}ValueError{RESET}: {message}",
    ]


def err(message: str, ename: str = "ValueError", **kw) -> dict:
    return {"ename": ename, "evalue": message, "traceback": tb(message, **kw)}


def run_of(errors: dict[int, dict], procs=None, **kw) -> CellRun:
    procs = list(procs if procs is not None else errors)
    results = {r: ProcResult(r, "ok") for r in procs}
    for r, e in errors.items():
        results[r] = ProcResult(r, "error", error=e)
    return CellRun(procs=procs, results=results, **kw)


def test_errors_differing_in_a_number_are_one_group_with_a_table():
    run = run_of(
        {3: err("bad shard on device 6144"), 7: err("bad shard on device 14336")}, procs=range(8)
    )
    text = "\n".join(render_errors(run))
    assert text.count("Traceback (most recent call last)") == 1
    assert "[p3,7] ValueError: bad shard on device <device>" in text
    assert "  device: 6144 on p3, 14336 on p7" in text
    # The one traceback shown does not claim one process's value for the group.
    assert "6144\n" not in text.split("device: ")[1] and "bad shard on device 14336" not in text
    with pytest.raises(MultihostError, match=r"2 of 8 processes failed: ValueError on p3,7$"):
        raise_for_run(run)


def test_sixteen_processes_make_one_traceback_and_a_table_of_rows():
    run = run_of({r: err(f"bad shard on device {1024 * r}") for r in range(16)})
    lines = render_errors(run)
    assert sum("Traceback" in line for line in lines) == 1
    assert lines[1].split() == ["process", "device"]
    assert lines[2].split() == ["p0", "0"] and lines[17].split() == ["p15", "15360"]


def test_identical_errors_have_no_table():
    (g,) = group({0: err("boom 3"), 1: err("boom 3")})
    assert g.ranks == [0, 1] and g.labels == [] and table(g) == []


def test_different_lines_or_types_stay_apart():
    groups = group(
        {
            0: err("bad 1", line=3),
            1: err("bad 2", line=4),
            2: err("bad 3", ename="TypeError"),
        }
    )
    assert [g.ranks for g in groups] == [[0], [1], [2]]


def test_two_differing_numbers_get_their_own_names():
    (g,) = group(
        {
            0: err("shape (2, 8) on host 0"),
            1: err("shape (2, 8) on host 1"),
            2: err("shape (4, 8) on host 2"),
        }
    )
    assert g.labels == ["shape", "host"]
    assert g.message() == "shape (<shape>, 8) on host <host>"
    assert table(g) == ["  shape: 2 on p0, 2 on p1, 4 on p2; host: 0 on p0, 1 on p1, 2 on p2"]


def test_a_value_named_twice_is_one_column_under_both_names():
    msgs = {r: f"to device cpu:{d} on process {r}, CpuDevice(id={d})" for r, d in ((0, 0), (1, 8))}
    (g,) = group({r: err(m) for r, m in msgs.items()})
    assert g.message() == "to device cpu:<cpu> on process <process>, CpuDevice(id=<id>)"
    assert table(g) == ["  cpu/id: 0 on p0, 8 on p1; process: 0 on p0, 1 on p1"]
    many = group({r: err(f"cpu:{8 * r} id={8 * r} on {r}") for r in range(6)})
    assert table(many[0])[0].split() == ["process", "cpu/id", "on"]


def test_the_running_cell_gets_the_notebooks_number():
    lines = ["Cell In[3], line 2", "Cell In[1], line 7, in helper()"]
    assert renumber(lines, 4) == [
        "Cell In[4], line 2",
        "Cell In[earlier cell], line 7, in helper()",
    ]
    assert renumber(lines, None) == lines


def test_rendered_errors_say_the_notebooks_cell_number():
    run = run_of({0: err("x", cell=3), 1: err("x", cell=9)})
    text = "\n".join(render_errors(run, cell_number=4))
    assert f"Cell {RED}In[4]{RESET}" in text and "In[3]" not in text and "In[9]" not in text


def interrupted_run(verbose_source="time.sleep(30)") -> CellRun:
    kb = {
        "ename": "KeyboardInterrupt",
        "evalue": "",
        "traceback": [
            "KeyboardInterrupt                         Traceback (most recent call last)",
            "Cell In[2], line 6",
            f"----> 6 {verbose_source}",
            "File .../jax/_src/array.py:640, in _value",
            '--> 640 raise RuntimeError("Fetching value for non-addressable")',
            "KeyboardInterrupt: ",
        ],
    }
    gloo = {
        "ename": "XlaRuntimeError",
        "evalue": "DEADLINE_EXCEEDED: gloo timed out",
        "traceback": ["XlaRuntimeError: DEADLINE_EXCEEDED: gloo timed out"] * 30,
    }
    return run_of(
        {1: kb, 2: kb, 3: gloo},
        procs=range(4),
        hang="timeout",
        stuck=[1, 2, 3],
        timed_out=True,
        seconds=3.0,
    )


def test_after_a_hang_report_interrupt_tracebacks_fold_to_a_line_each():
    run = interrupted_run()
    lines = render_errors(run)
    assert lines[0] == "[p1-2] interrupted at line 6: time.sleep(30) (KeyboardInterrupt)"
    assert lines[1].startswith("[p3] interrupted (then XlaRuntimeError: DEADLINE_EXCEEDED")
    assert not any("non-addressable" in line or "Traceback" in line for line in lines)
    assert "" not in lines[:3]  # no empty line between the folded lines


def test_verbose_shows_the_interrupt_tracebacks():
    run = interrupted_run()
    text = "\n".join(render_errors(run, verbose=True))
    assert "non-addressable" in text and text.count("Traceback") == 1
    with pytest.raises(MultihostTimeout) as info:
        raise_for_run(run)
    assert "non-addressable" not in "\n".join(info.value._render_traceback_())
    info.value.verbose = True
    assert "non-addressable" in "\n".join(info.value._render_traceback_())


def test_innermost_cell_line():
    assert innermost_cell_line(tb("x", line=3)) == "line 3: raise ValueError(msg)"
    assert innermost_cell_line(["no cell here"]) is None


def test_innermost_cell_line_reads_ipythons_arrows_of_any_width():
    lines = [
        "Cell In[12], line 105",
        "    104 x = 1",
        "--> 105 step(x)",
        "File .../jax/_src/array.py:640, in _value",
        "--> 640 raise RuntimeError('not this one')",
    ]
    assert innermost_cell_line(lines) == "line 105: step(x)"


SITE = "/venv/lib/python3.12/site-packages"


def jax_traceback() -> list[str]:
    frames = [f"File {SITE}/jax/_src/api.py:{100 + i}, in f{i}(x)\n  {i} code\n" for i in range(20)]
    return [
        "---------------------------------------------------------------------------",
        "TransferGuardError                        Traceback (most recent call last)",
        "Cell In[4], line 3",
        "      2 x = make()",
        "----> 3 jax.device_put(x, other)",
        "",
        *frames,
        f"File {SITE}/jax/_src/dispatch.py:500, in _check(x)",
        "--> 500 raise TransferGuardError(msg)",
        "",
        "TransferGuardError: transfer refused",
    ]


def test_jax_internal_frames_are_hidden_but_the_raise_site_stays():
    lines = hide_jax_frames(jax_traceback())
    text = "\n".join(lines)
    assert "----> 3 jax.device_put(x, other)" in text
    assert "[... 20 frames inside JAX hidden]" in text and "api.py" not in text
    assert "dispatch.py:500" in text and text.endswith("TransferGuardError: transfer refused")


def test_hiding_keeps_each_chained_tracebacks_raise_site():
    chained = [*jax_traceback(), "", "The above exception was the direct cause of:", ""]
    chained += jax_traceback()
    text = "\n".join(hide_jax_frames(chained))
    assert text.count("dispatch.py:500") == 2 and text.count("inside JAX hidden") == 2
    assert "The above exception was the direct cause" in text


def test_rendered_groups_hide_jax_frames():
    err = {
        "ename": "TransferGuardError",
        "evalue": "transfer refused",
        "traceback": jax_traceback(),
    }
    run = run_of({0: err, 1: err})
    text = "\n".join(render_errors(run))
    assert "api.py" not in text and "inside JAX hidden" in text


def test_frames_sent_as_one_string_each_are_read_too():
    # IPython's structured traceback holds one multi-line string per frame.
    tb_ = [
        "-" * 75 + "\nKeyboardInterrupt    Traceback (most recent call last)",
        "Cell In[2], line 6\n      5 x = 1\n----> 6 time.sleep(30)\n",
        f"File {SITE}/jax/_src/api.py:10, in f()\n---> 10 wait()\n",
        f"File {SITE}/jax/_src/api.py:20, in g()\n---> 20 wait()\n",
        "KeyboardInterrupt: ",
    ]
    assert innermost_cell_line(tb_) == "line 6: time.sleep(30)"
    kept = hide_jax_frames(tb_)
    assert "api.py:10" not in "\n".join(kept) and "api.py:20" in "\n".join(kept)


def test_an_error_knows_the_number_the_notebook_shows_for_its_cell():
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.user_ns["make"] = lambda: MultihostError(run_of({}), "x").cell_number
    result = shell.run_cell("n = make()", store_history=True)
    assert shell.user_ns["n"] == result.execution_count


def test_one_value_named_twice_by_the_same_word_is_named_once():
    errors = {
        r: {
            "ename": "JaxRuntimeError",
            "evalue": f"copy from device cpu:{d} to device cpu:{d} refused",
            "traceback": [],
        }
        for r, d in ((0, 0), (1, 2048))
    }
    (g,) = group(errors)
    assert table(g) == ["  cpu: 0 on p0, 2048 on p1"]
