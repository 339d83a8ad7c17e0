"""ipykernel reads the keywords of its shell's run_cell once per function, not per request."""

from __future__ import annotations

from ipykernel import ipkernel

from jaxsys_kernel import _compat


class Shell:
    async def run_cell_async(self, code, *, cell_id=None):
        return code


class NewerShell:
    async def run_cell_async(self, code, *, cell_id=None, cell_meta=None):
        return code


def test_each_function_is_read_once_and_answers_as_before(monkeypatch):
    real = ipkernel._accepts_parameters
    reads = []

    def counting(meth, names):
        reads.append(meth.__func__)
        return real(meth, names)

    monkeypatch.setattr(ipkernel, "_accepts_parameters", counting)
    assert _compat.memo_run_cell_signature()
    accepts = ipkernel._accepts_parameters
    names = ["cell_id", "cell_meta"]

    for shell in (Shell(), Shell(), Shell()):  # a bound method is a new object each time
        assert accepts(shell.run_cell_async, names) == {"cell_id": True, "cell_meta": False}
    assert reads == [Shell.run_cell_async]

    # Another function (a shell whose method was replaced) is read anew, with its own answer.
    assert accepts(NewerShell().run_cell_async, names) == {"cell_id": True, "cell_meta": True}
    assert reads == [Shell.run_cell_async, NewerShell.run_cell_async]


def test_a_caller_that_changes_its_answer_changes_no_later_one(monkeypatch):
    monkeypatch.setattr(ipkernel, "_accepts_parameters", ipkernel._accepts_parameters)
    assert _compat.memo_run_cell_signature()
    accepts = ipkernel._accepts_parameters
    first = accepts(Shell().run_cell_async, ["cell_id"])
    first["cell_id"] = False
    assert accepts(Shell().run_cell_async, ["cell_id"]) == {"cell_id": True}


def test_asked_twice_it_wraps_once(monkeypatch):
    monkeypatch.setattr(ipkernel, "_accepts_parameters", ipkernel._accepts_parameters)
    assert _compat.memo_run_cell_signature()
    once = ipkernel._accepts_parameters
    assert _compat.memo_run_cell_signature()
    assert ipkernel._accepts_parameters is once
