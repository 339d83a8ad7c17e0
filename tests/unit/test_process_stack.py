"""Dump stacks tells a reader where each process is: its own code, or idle."""

from __future__ import annotations

from jaxsys_kernel.cells.report import IDLE, process_stack

SITE = "/venv/lib/python3.12/site-packages"

IDLE_DUMP = f"""\
Current thread 0x00007f03b4ff1740 (most recent call first):
  File "/usr/lib/python3.12/selectors.py", line 468 in select
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1949 in _run_once
  File "{SITE}/ipykernel/kernelapp.py", line 739 in start
"""

BUSY_DUMP = f"""\
Thread 0x00007f03b47f06c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Current thread 0x00007f03b4ff1740 (most recent call first):
  File "{SITE}/jax/_src/array.py", line 640 in _value
  File "{SITE}/jax/_src/array.py", line 300 in __array__
  File "/tmp/ipykernel_77/123456.py", line 3 in step
  File "/tmp/ipykernel_77/123456.py", line 6 in <module>
  File "{SITE}/IPython/core/interactiveshell.py", line 3577 in run_code
"""

CODE = "import jax\ndef step(x):\n    return float(x)\n\n\nstep(y)\n"


def test_an_idle_process_says_so():
    assert process_stack(IDLE_DUMP) == [IDLE]


def test_a_busy_process_shows_its_whole_user_stack_outermost_first():
    lines = process_stack(BUSY_DUMP, CODE)
    assert lines[0] == ">> line 6: step(y)"
    assert lines[1] == ">> line 3 in step: return float(x)"
    assert lines[2].startswith("** Array.") and "array.py" in lines[2]
    assert not any("interactiveshell" in line or "selectors" in line for line in lines)


def test_no_answer():
    assert process_stack("") == ["(no stack: the process did not answer)"]
