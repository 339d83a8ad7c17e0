"""The cell path without a cluster: the cell machine driven by synthetic events and a fake
clock, the hang policy, the driver loop, and the hang report on captured stack dumps."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from ipyparallel import error as ipp_error
from IPython.core.error import UsageError

from jaxsys_kernel.cells import (
    CellMachine,
    MultihostError,
    MultihostHang,
    MultihostInterrupt,
    MultihostTimeout,
    Sink,
    cell_result,
    raise_for_run,
    render_errors,
    send,
)
from jaxsys_kernel.cells import report as rep
from jaxsys_kernel.cells.guard import Ledger, check_processes
from jaxsys_kernel.cells.hang import HangPolicy
from jaxsys_kernel.cells.run import DONE, INTERRUPT, JUDGE, WAIT
from jaxsys_kernel.cells.send import Driver
from jaxsys_kernel.contract import NATIVE_MIME, SUMMARY_MIME

from ..fakes import FakeProcesses, ScriptedQueue

WINDOW = 0.5

# faulthandler dumps captured from a 3-process cluster (paths shortened to a generic venv).
# p0 of a cell whose line 5 calls sync_global_devices, skipped by p2: every thread.
DIVERGENCE_DUMP = """\
Thread 0x00007f03b47f06c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait
  File "/usr/lib/python3.12/threading.py", line 655 in wait
  File "/opt/venv/lib/python3.12/site-packages/jaxsys_kernel/engine/agent.py", line 151 in _beat
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f03baffd6c0 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/jaxsys_kernel/engine/native_log.py", line 177 in _filter
  File "/opt/venv/lib/python3.12/site-packages/jaxsys_kernel/engine/native_log.py", line 163 in _run
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f03f9a056c0 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/zmq/devices/monitoredqueuedevice.py", line 27 in run_device
  File "/opt/venv/lib/python3.12/site-packages/zmq/devices/basedevice.py", line 248 in run
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f03fa2066c0 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/iostream.py", line 482 in _watch_pipe_fd
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f03faa076c0 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/iostream.py", line 478 in _watch_pipe_fd
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f03fbfff6c0 (most recent call first):
  File "/usr/lib/python3.12/selectors.py", line 468 in select
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1933 in _run_once
  File "/usr/lib/python3.12/asyncio/base_events.py", line 638 in run_forever
  File "/opt/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py", line 203 in start
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/thread.py", line 48 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Thread 0x00007f0400afd6c0 (most recent call first):
  File "/usr/lib/python3.12/selectors.py", line 468 in select
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1933 in _run_once
  File "/usr/lib/python3.12/asyncio/base_events.py", line 638 in run_forever
  File "/opt/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py", line 203 in start
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/iostream.py", line 168 in _thread_main
  File "/usr/lib/python3.12/threading.py", line 1010 in run
  File "/usr/lib/python3.12/threading.py", line 1073 in _bootstrap_inner
  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap

Current thread 0x00007f041e303b80 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/interpreters/pxla.py", line 420 in __call__
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/profiler.py", line 588 in wrapper
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 1172 in _pjit_call_impl_python
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 149 in _run_python_pjit
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 272 in cache_miss
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/traceback_util.py", line 194 in reraise_with_filtered_traceback
  File "/opt/venv/lib/python3.12/site-packages/jax/experimental/multihost_utils.py", line 134 in _handle_array_process_allgather
  File "/opt/venv/lib/python3.12/site-packages/jax/experimental/multihost_utils.py", line 158 in _pjit
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/tree_util.py", line 422 in <genexpr>
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/tree_util.py", line 422 in tree_map
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/tree.py", line 156 in map
  File "/opt/venv/lib/python3.12/site-packages/jax/experimental/multihost_utils.py", line 159 in process_allgather
  File "/opt/venv/lib/python3.12/site-packages/jax/experimental/multihost_utils.py", line 179 in assert_equal
  File "/opt/venv/lib/python3.12/site-packages/jax/experimental/multihost_utils.py", line 165 in sync_global_devices
  File "/tmp/ipykernel_6583/3847952674.py", line 5 in <module>
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3762 in run_ast_nodes
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3518 in run_cell_async
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/async_helpers.py", line 140 in _pseudo_sync_runner
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3305 in _run_cell
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3248 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/zmqshell.py", line 686 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 460 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/kernel.py", line 213 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 891 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 372 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 508 in dispatch_shell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 678 in shell_main
  File "/usr/lib/python3.12/asyncio/events.py", line 84 in _run
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1971 in _run_once
  File "/usr/lib/python3.12/asyncio/base_events.py", line 638 in run_forever
  File "/opt/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py", line 203 in start
  File "/opt/venv/lib/python3.12/site-packages/tornado/ioloop.py", line 534 in run_sync
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/app.py", line 995 in start
  File "/opt/venv/lib/python3.12/site-packages/traitlets/config/application.py", line 1080 in launch_instance
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/__main__.py", line 4 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""

# The main thread of a process waiting in a jitted function (line 7) that p2 skipped.
JIT_DUMP = """\
Current thread 0x00007f115f374b80 (most recent call first):
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/interpreters/pxla.py", line 420 in __call__
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/profiler.py", line 588 in wrapper
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 1172 in _pjit_call_impl_python
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 149 in _run_python_pjit
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/pjit.py", line 272 in cache_miss
  File "/opt/venv/lib/python3.12/site-packages/jax/_src/traceback_util.py", line 194 in reraise_with_filtered_traceback
  File "/tmp/ipykernel_6819/3780696392.py", line 7 in <module>
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3762 in run_ast_nodes
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3518 in run_cell_async
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/async_helpers.py", line 140 in _pseudo_sync_runner
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3305 in _run_cell
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3248 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/zmqshell.py", line 686 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 460 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/kernel.py", line 213 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 891 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 372 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 508 in dispatch_shell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 678 in shell_main
  File "/usr/lib/python3.12/asyncio/events.py", line 84 in _run
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1971 in _run_once
  File "/usr/lib/python3.12/asyncio/base_events.py", line 638 in run_forever
  File "/opt/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py", line 203 in start
  File "/opt/venv/lib/python3.12/site-packages/tornado/ioloop.py", line 534 in run_sync
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/app.py", line 995 in start
  File "/opt/venv/lib/python3.12/site-packages/traitlets/config/application.py", line 1080 in launch_instance
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/__main__.py", line 4 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""

# The main thread of a process in time.sleep (line 2), past the cell's timeout.
SLEEP_DUMP = """\
Current thread 0x00007fad93d03b80 (most recent call first):
  File "/tmp/ipykernel_6937/2501892300.py", line 2 in <module>
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3823 in run_code
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3762 in run_ast_nodes
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3518 in run_cell_async
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/async_helpers.py", line 140 in _pseudo_sync_runner
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3305 in _run_cell
  File "/opt/venv/lib/python3.12/site-packages/IPython/core/interactiveshell.py", line 3248 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/zmqshell.py", line 686 in run_cell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 460 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/kernel.py", line 213 in do_execute
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 891 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/ipkernel.py", line 372 in execute_request
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 508 in dispatch_shell
  File "/opt/venv/lib/python3.12/site-packages/ipykernel/kernelbase.py", line 678 in shell_main
  File "/usr/lib/python3.12/asyncio/events.py", line 84 in _run
  File "/usr/lib/python3.12/asyncio/base_events.py", line 1971 in _run_once
  File "/usr/lib/python3.12/asyncio/base_events.py", line 638 in run_forever
  File "/opt/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py", line 203 in start
  File "/opt/venv/lib/python3.12/site-packages/tornado/ioloop.py", line 534 in run_sync
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/app.py", line 995 in start
  File "/opt/venv/lib/python3.12/site-packages/traitlets/config/application.py", line 1080 in launch_instance
  File "/opt/venv/lib/python3.12/site-packages/ipyparallel/engine/__main__.py", line 4 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""


# -- fakes ------------------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class ExecuteReply:
    """What ipyparallel resolves a successful execute request with (matched by name)."""


class Recorder(Sink):
    def __init__(self):
        super().__init__()
        self.out = ""
        self.err = ""
        self.displays: list[tuple[int, dict, bool]] = []
        self.summaries: list[dict] = []

    def stdout(self, text):
        self.out += text

    def stderr(self, text):
        self.err += text

    def display(self, rank, content, label):
        self.displays.append((rank, content, label))
        summary = content.get("data", {}).get(SUMMARY_MIME)
        if summary is not None:
            self.view(summary)

    def view(self, summary):
        self.summaries.append(summary)


def msg(msg_type: str, **content) -> dict:
    return {"header": {"msg_type": msg_type}, "content": content}


def stream(text: str, name: str = "stdout") -> tuple[str, dict]:
    return "iopub", msg("stream", name=name, text=text)


def native(text: str, name: str = "stdout") -> tuple[str, dict]:
    return "iopub", msg("display_data", data={NATIVE_MIME: {"name": name, "text": text}})


def replied(value=None, exc: BaseException | None = None) -> Future:
    fut: Future = Future()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(ExecuteReply() if value is None else value)
    return fut


def traceback_of(message: str, cell: int) -> list[str]:
    return [
        "\x1b[31mValueError\x1b[39m Traceback (most recent call last)",
        f"Cell \x1b[32mIn[{cell}]\x1b[39m, line 3",
        f"----> 3 raise ValueError({message!r})",
        f"ValueError: {message}",
    ]


def error_msg(message: str, cell: int = 1) -> tuple[str, dict]:
    return "iopub", msg(
        "error", ename="ValueError", evalue=message, traceback=traceback_of(message, cell)
    )


def remote_error(message: str) -> ipp_error.RemoteError:
    return ipp_error.RemoteError("ValueError", message, "\n".join(traceback_of(message, 1)))


def finish_ok(m: CellMachine, rank: int) -> None:
    m.feed(rank, "reply", replied())
    m.feed(rank, "idle", None)


def finish_error(m: CellMachine, rank: int, message: str = "boom", cell: int = 1) -> None:
    m.feed(rank, *error_msg(message, cell))
    m.feed(rank, "reply", replied(remote_error(message)))
    m.feed(rank, "idle", None)


def machine(procs=(0, 1), **kw) -> tuple[CellMachine, Recorder, Clock]:
    clock = Clock()
    sink = Recorder()
    kw.setdefault("window", WINDOW)
    return CellMachine(list(procs), sink, clock=clock, **kw), sink, clock


def settle(m: CellMachine, clock: Clock, until: float) -> None:
    """Advance the clock to ``until`` (absolute), stepping at every timer on the way."""
    while True:
        step = m.step()
        if step.kind != WAIT or step.until is None or step.until > until:
            break
        clock.t = max(clock.t, step.until)
    clock.t = max(clock.t, until)
    m.step()


# -- the machine: streaming and completion ---------------------------------------------------


def test_normal_completion():
    m, sink, clock = machine()
    for r in (0, 1):
        m.feed(r, *stream("hello\n"))
    assert sink.out == "[p0-1] hello\n"
    finish_ok(m, 0)
    assert m.step().kind == WAIT
    clock.t += 2.0
    finish_ok(m, 1)
    assert m.step().kind == DONE
    run = m.finish()
    assert [run.results[r].status for r in (0, 1)] == ["ok", "ok"]
    assert run.seconds == pytest.approx(2.0)
    raise_for_run(run)  # nothing failed


def test_a_process_is_finished_only_with_its_reply_and_its_idle():
    m, _, _ = machine([0])
    m.feed(0, "idle", None)
    assert m.step().kind == WAIT
    m.feed(0, "reply", replied())
    assert m.step().kind == DONE


def test_a_line_is_held_for_its_twin_then_shown_alone():
    m, sink, clock = machine()
    m.feed(0, *stream("only p0 so far\n"))
    step = m.step()
    assert sink.out == "" and step.kind == WAIT and step.until == pytest.approx(clock.t + WINDOW)
    clock.t = step.until
    m.step()
    assert sink.out == "[p0] only p0 so far\n"


def test_a_partial_line_waits_for_its_end_or_for_the_process_to_finish():
    m, sink, _ = machine([0])
    m.feed(0, *stream("no newline"))
    m.step()
    assert sink.out == ""
    finish_ok(m, 0)
    assert m.step().kind == DONE
    m.finish()
    assert sink.out == "[p0] no newline\n"


def test_stderr_is_collated_apart_from_stdout():
    m, sink, _ = machine()
    for r in (0, 1):
        m.feed(r, *stream("warn\n", "stderr"))
        m.feed(r, *stream("out\n"))
    assert sink.err == "[p0-1] warn\n" and sink.out == "[p0-1] out\n"


def test_no_collate_labels_every_line_at_once():
    m, sink, _ = machine(collate=False)
    m.feed(1, *stream("x\n"))
    assert sink.out == "[p1] x\n"


def test_native_lines_are_collated_apart_from_python_lines():
    m, sink, _ = machine()
    # A native line arriving while Python's line is half printed does not split it.
    m.feed(0, *stream("sum "))
    m.feed(0, *native("[native] connected\n"))
    m.feed(1, *native("[native] connected\n"))
    m.feed(0, *stream("6.0\n"))
    m.feed(1, *stream("sum 6.0\n"))
    assert sink.out == "[p0-1] [native] connected\n[p0-1] sum 6.0\n"
    m.feed(0, *native("on stderr\n", "stderr"))
    for r in (0, 1):
        finish_ok(m, r)
    m.finish()
    assert sink.err == "[p0] on stderr\n"


def test_gloo_chatter_is_cut_out():
    m, sink, _ = machine([0])
    gloo = (
        "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
    )
    m.feed(0, *stream(gloo + "total 6.0\n"))
    m.feed(0, *native(gloo + "\n"))
    finish_ok(m, 0)
    m.finish()
    assert sink.out == "[p0] total 6.0\n"


def test_rich_displays_come_from_the_first_process_only():
    m, sink, _ = machine([2, 3])
    html = {"data": {"text/html": "<b>x</b>"}, "metadata": {}}
    m.feed(3, "iopub", msg("display_data", **html))
    m.feed(2, *stream("before\n"))
    m.feed(3, *stream("before\n"))
    m.feed(2, *stream("own\n"))
    m.feed(2, "iopub", msg("display_data", **html))
    assert [(r, label) for r, _, label in sink.displays] == [(2, False)]
    # What was printed before the display is shown before it, even a line held back.
    assert sink.out == "[p2-3] before\n[p2] own\n"


def test_all_displays_labels_each_process():
    m, sink, _ = machine(all_displays=True)
    for r in (0, 1):
        m.feed(r, "iopub", msg("display_data", data={"text/plain": str(r)}, metadata={}))
    assert [(r, label) for r, _, label in sink.displays] == [(0, True), (1, True)]


def test_summaries_reach_the_view_from_the_first_process_only():
    m, sink, _ = machine()
    for r in (0, 1):
        m.feed(r, "iopub", msg("display_data", data={SUMMARY_MIME: {"kind": "mesh", "r": r}}))
    assert sink.summaries == [{"kind": "mesh", "r": 0}]


def test_cell_value_and_its_summary():
    m, sink, _ = machine()
    for r in (0, 1):
        bundle = {"text/plain": "Mesh(x=2)", SUMMARY_MIME: {"kind": "mesh"}}
        m.feed(r, "iopub", msg("execute_result", data=bundle))
        finish_ok(m, r)
    result = cell_result(m.finish(), sink)
    assert sink.summaries == [{"kind": "mesh"}]
    assert repr(result) == "Mesh(x=2)"


def test_differing_values_are_listed_per_process():
    m, sink, _ = machine()
    for r in (0, 1):
        m.feed(r, "iopub", msg("execute_result", data={"text/plain": str(10 * r)}))
        finish_ok(m, r)
    assert repr(cell_result(m.finish(), sink)) == "[p0] 0\n[p1] 10"


# -- errors and engine death -------------------------------------------------------------------


def test_identical_errors_are_grouped():
    m, _, _ = machine()
    finish_error(m, 0, cell=3)
    finish_error(m, 1, cell=7)  # engines number their cells independently
    assert m.step().kind == DONE
    run = m.finish()
    with pytest.raises(MultihostError, match="2 of 2 processes failed: ValueError on p0-1"):
        raise_for_run(run)
    text = "\n".join(render_errors(run))
    assert text.count("[p0-1] ValueError: boom") == 1 and "[p0]" not in text


def test_an_error_without_an_iopub_message_takes_the_reply():
    m, _, _ = machine([0])
    m.feed(0, "reply", replied(remote_error("only in the reply")))
    m.feed(0, "idle", None)
    run = m.finish()
    err = run.results[0].error
    # ipyparallel's traceback is one string: it becomes lines, not characters.
    assert err["traceback"] == traceback_of("only in the reply", 1)
    assert "----> 3 raise ValueError('only in the reply')" in render_errors(run)


def test_a_dead_engine_ends_without_an_idle_message():
    m, _, _ = machine()
    finish_ok(m, 0)
    m.feed(1, "reply", replied(exc=ipp_error.EngineError("Engine set stopped: {}")))
    assert m.step().kind == DONE
    run = m.finish()
    assert run.results[1].status == "dead"
    with pytest.raises(MultihostError, match="1 of 2 processes failed: EngineError on p1"):
        raise_for_run(run)


def test_a_killed_engine_error_is_not_printed_one_character_per_line():
    # ipyparallel resolves the request of an engine that died with a RemoteError whose
    # traceback, a string, is of its own bookkeeping.
    died = ipp_error.RemoteError(
        "EngineError",
        "Engine 2 died while running task 'abc'",
        'Traceback (most recent call last):\n  File "client.py", line 889\nEngineError: died',
    )
    m, _, _ = machine([2])
    m.feed(2, "reply", replied(died))
    assert m.step().kind == DONE  # no idle will come
    run = m.finish()
    assert run.results[2].status == "dead"
    lines = render_errors(run)
    assert lines[0] == "[p2] EngineError: Engine 2 died while running task 'abc'"
    assert all(len(line) != 1 for line in lines)


def test_an_error_named_engineerror_that_the_cell_raised_is_an_error_not_a_death():
    # jaxsys's own EngineError (a refused initialize(), say) or a user's class of that name:
    # the engine sent it, so it carries the engine's details, and the engine lives on.
    raised = ipp_error.RemoteError(
        "EngineError",
        "jax.distributed.initialize(num_processes=4 (the running world has 2)) ...",
        "Traceback (most recent call last):\nEngineError: refused",
        {"engine_uuid": "u-1", "engine_id": 1, "method": "execute"},
    )
    m, _, _ = machine([1])
    m.feed(1, "reply", replied(raised))
    m.feed(1, "idle", None)
    assert m.step().kind == DONE
    run = m.finish()
    assert run.results[1].status == "error"
    assert run.results[1].error["ename"] == "EngineError"


def test_aborted_task():
    class TaskAborted(Exception):
        pass

    m, _, _ = machine([0])
    m.feed(0, "reply", replied(TaskAborted("msg-1")))
    m.feed(0, "idle", None)
    run = m.finish()
    assert run.results[0].status == "error" and run.results[0].error["ename"] == "TaskAborted"


# -- interrupts and timeouts ---------------------------------------------------------------------


def test_interrupt_signals_the_running_processes_and_waits_for_them():
    m, _, clock = machine()
    finish_ok(m, 1)
    m.interrupt_requested()
    step = m.step()
    assert step.kind == INTERRUPT and step.ranks == (0,)
    m.interrupted([0])
    step = m.step()
    assert step.kind == WAIT and step.until == pytest.approx(clock.t + 3.0)
    m.feed(0, *error_msg("stopped"))
    finish_error(m, 0, "stopped")
    assert m.step().kind == DONE
    assert m.finish().interrupted == [0]


def test_interrupt_gives_up_on_processes_that_do_not_stop():
    m, _, clock = machine()
    m.interrupt_requested()
    m.interrupted(list(m.step().ranks))
    clock.t += 3.0
    assert m.step().kind == DONE
    run = m.finish()
    assert run.by_status("running") == [0, 1]


def test_a_second_interrupt_stops_waiting():
    m, _, _ = machine()
    m.interrupt_requested()
    m.interrupted([0, 1])
    m.interrupt_requested()
    assert m.step().kind == DONE


def test_interrupt_with_nothing_running():
    m, _, _ = machine([0])
    finish_ok(m, 0)
    m.interrupt_requested()
    assert m.step().kind == DONE
    assert m.finish().interrupted == []


def test_timeout_is_judged_then_interrupted():
    m, _, clock = machine(timeout=5.0)
    finish_ok(m, 1)
    step = m.step()
    assert step.kind == WAIT and step.until == pytest.approx(105.0)
    clock.t = 105.0
    assert m.step().kind == JUDGE
    assert m.run.hang == "timeout" and m.run.timed_out and m.run.stuck == [0]
    m.judged("interrupt")
    assert m.step() == type(m.step())(INTERRUPT, ranks=(0,))
    m.interrupted([0])
    finish_error(m, 0, "KeyboardInterrupt")
    assert m.step().kind == DONE
    run = m.finish()
    with pytest.raises(
        MultihostTimeout, match=r"timed out after 5\.0 s; still running: p0; finished: p1"
    ):
        raise_for_run(run)


def test_no_grace_no_hang_check():
    m, _, clock = machine()
    finish_ok(m, 0)
    clock.t += 1000
    assert m.step() == type(m.step())(WAIT, until=None)


# -- failures, grace and the hang policy ----------------------------------------------------------


class Stacks:
    """A fake Cluster.dump_stacks returning fixed dumps and recording its calls."""

    def __init__(self, dumps: dict[int, str]):
        self.dumps = dumps
        self.calls: list[tuple[list[int], float | None]] = []

    def __call__(self, ranks, timeout=None):
        self.calls.append((list(ranks), timeout))
        return {r: self.dumps[r] for r in ranks if r in self.dumps}


def failed_then_grace(action: str, dumps: dict[int, str]):
    """p1 fails before a collective p0 waits in; the grace passes; the policy judges."""
    said: list[str] = []
    policy = HangPolicy(action, Stacks(dumps), grace=2.0, code=FAIL_CODE, say=said.append)
    m, _, clock = machine(grace=2.0)
    finish_error(m, 1, "p1 fails before the collective")
    step = m.step()
    assert step.kind == WAIT and step.until == pytest.approx(clock.t + 2.0)
    clock.t = step.until
    assert m.step().kind == JUDGE and m.run.hang == "failure" and m.run.stuck == [0]
    m.judged(policy(m.run))
    return m, clock, policy, said


@pytest.mark.parametrize(
    "action,next_kind,outcome",
    [
        ("interrupt", INTERRUPT, "was interrupted"),
        ("restart", DONE, "was stopped by a world restart"),
        ("report", WAIT, "was left running"),
    ],
)
def test_failure_then_grace_is_a_hang_with_each_policy(action, next_kind, outcome):
    m, clock, policy, said = failed_then_grace(action, {0: ALLGATHER_DUMP})
    report = said[0]
    assert report.startswith("jaxsys hang doctor: p1 failed and p0 kept running for 2 s more")
    assert "p1: raised ValueError: p1 fails before the collective" in report
    assert "p0: still running" in report
    step = m.step()
    assert step.kind == next_kind
    if action == "interrupt":
        assert said[1] == "jaxsys: interrupting p0"
        assert policy.broken.startswith("p0 interrupted inside JAX at ")
        m.interrupted(list(step.ranks))
        clock.t += 3.0
        assert m.step().kind == DONE
    elif action == "report":
        assert step.until is None  # no limit: waits until the processes end or stop is pressed
        assert said[1].startswith("jaxsys: still waiting (--on-hang report)")
        finish_error(m, 0, "KeyboardInterrupt")
        assert m.step().kind == DONE
    else:
        assert said[1] == "jaxsys: restarting the JAX world" and policy.broken is None
    with pytest.raises(MultihostHang, match=f"ValueError on p1; p0 kept running.* and {outcome}"):
        raise_for_run(m.finish())


def test_divergence_without_a_stuck_collective_waits_until_the_deadline():
    said: list[str] = []
    policy = HangPolicy(
        "interrupt", Stacks({0: SLEEP_DUMP}), timeout=10.0, grace=1.0, say=said.append
    )
    m, _, clock = machine(grace=1.0, timeout=10.0)
    finish_ok(m, 1)
    clock.t += 1.0
    assert m.step().kind == JUDGE and m.run.hang == "divergence"
    assert policy(m.run) == "wait" and said == []
    m.judged("wait")
    assert m.run.hang is None and m.run.stuck == []
    step = m.step()
    assert step.kind == WAIT and step.until == pytest.approx(110.0)  # the deadline only
    clock.t = 110.0
    assert m.step().kind == JUDGE and m.run.hang == "timeout"
    assert policy(m.run) == "interrupt"
    assert said[0].startswith("jaxsys hang doctor: the cell passed its timeout of 10 s")
    assert policy.broken is None  # interrupted outside JAX: the world is fine


def test_divergence_in_a_collective_is_a_hang():
    said: list[str] = []
    dumps = {0: DIVERGENCE_DUMP, 1: p1_of(DIVERGENCE_DUMP)}
    policy = HangPolicy("interrupt", Stacks(dumps), grace=2.0, code=DIVERGENT_CODE, say=said.append)
    m, _, clock = machine([0, 1, 2], grace=2.0)
    finish_ok(m, 2)
    clock.t += 2.0
    assert m.step().kind == JUDGE and m.run.hang == "divergence"
    assert policy(m.run) == "interrupt"
    assert "p2 finished, but p0-1 still wait inside JAX 2 s later" in said[0]
    m.judged("interrupt")
    m.interrupted(list(m.step().ranks))
    clock.t += 3.0
    assert m.step().kind == DONE
    with pytest.raises(MultihostHang, match="p0-1 waited inside JAX .* that p2 never entered"):
        raise_for_run(m.finish())


def test_without_any_stack_a_divergence_is_not_called_a_hang():
    # No evidence of a stuck collective: wait on (the deadline still holds).
    policy = HangPolicy("interrupt", Stacks({}), grace=1.0, say=lambda _: None)
    m, _, clock = machine([0, 1, 2], grace=1.0)
    finish_ok(m, 2)
    clock.t += 1.0
    m.step()
    assert policy(m.run) == "wait"
    # One stack inside JAX, one missing: a missing stack counts as inside JAX.
    policy = HangPolicy("interrupt", Stacks({0: DIVERGENCE_DUMP}), grace=1.0, say=lambda _: None)
    assert policy(m.run) == "interrupt"


def test_wait_answers_a_divergence_only():
    m, _, clock = machine(timeout=1.0)
    clock.t += 1.0
    assert m.step().kind == JUDGE
    with pytest.raises(ValueError, match="'wait' answers a divergence"):
        m.judged("wait")
    with pytest.raises(ValueError, match="one of report"):
        m.judged("ignore")


def test_interrupting_outside_a_judgement_checks_for_jax():
    said: list[str] = []
    stacks = Stacks({0: DIVERGENCE_DUMP, 1: SLEEP_DUMP})
    policy = HangPolicy("interrupt", stacks, say=said.append)
    policy.interrupting([0, 1])
    assert stacks.calls == [([0, 1], 1.0)]
    assert policy.broken.startswith("p0-1 interrupted inside JAX")
    assert said == [
        "jaxsys: interrupting p0-1 while they wait inside JAX; the JAX world is now out of "
        "step: run %jaxsys restart."
    ]
    calm = HangPolicy("interrupt", Stacks({0: SLEEP_DUMP}), say=said.append)
    calm.interrupting([0])
    assert calm.broken is None


def test_hang_policy_rejects_an_unknown_action():
    with pytest.raises(ValueError, match="--on-hang must be one of report, interrupt, restart"):
        HangPolicy("ignore", Stacks({}))


# -- the driver loop ------------------------------------------------------------------------------


def test_driver_turns_the_stop_button_into_an_interrupt():
    m, sink, clock = machine()
    signalled: list[list[int]] = []
    warned: list[list[int]] = []
    events = ScriptedQueue(
        clock,
        [(0, *stream("sleeping\n")), (1, *stream("sleeping\n")), KeyboardInterrupt]
        + [(0, *error_msg("KeyboardInterrupt")), (0, "reply", replied(remote_error("x")))]
        + [(0, "idle", None)],
    )

    def interrupt(ranks):
        signalled.append(ranks)
        return ranks

    driver = Driver(m, events, interrupt, on_interrupt=warned.append)
    with pytest.raises(MultihostInterrupt) as err:
        driver.run()
    assert signalled == [[0, 1]] and warned == [[0, 1]]
    assert str(err.value) == "interrupted processes p0-1; did not stop within 3 s: p1"
    assert sink.out == "[p0-1] sleeping\n"


def test_driver_asks_the_policy_and_interrupts_by_default():
    m, _, clock = machine(timeout=1.0)
    events = ScriptedQueue(clock, [])
    signalled: list[list[int]] = []
    run = Driver(m, events, lambda r: signalled.append(r) or r).run()
    assert run.hang == "timeout" and run.hang_action == "interrupt" and signalled == [[0, 1]]
    assert run.seconds == pytest.approx(1.0 + 3.0)


def test_driver_ends_a_cell_that_completes():
    m, _, clock = machine()
    events = ScriptedQueue(
        clock, [(r, kind, p) for r in (0, 1) for kind, p in (("reply", replied()), ("idle", None))]
    )
    assert Driver(m, events, lambda r: r).run().by_status("ok") == [0, 1]


def test_a_death_the_probe_finds_ends_the_wait_without_the_hubs_word():
    # p0 dies; p1 waits for it in a collective and never replies; the hub would drop p0
    # only after its missed heartbeats. The probe finds p0 gone: after the grace, the
    # cell is judged failed, not at its timeout.
    m, _, clock = machine(timeout=60.0, grace=1.0)
    started = clock.t
    events = ScriptedQueue(clock, [(1, *stream("waiting\n"))])
    asked: list[set[int]] = []

    def probe(ranks):
        asked.append(ranks)
        return {0: "its pid 41 is gone"} if clock.t - started >= 0.5 else {}

    run = Driver(m, events, lambda r: r, probe=probe).run()
    assert run.by_status("dead") == [0]
    assert run.results[0].error["evalue"] == "process 0 died: its pid 41 is gone"
    assert run.hang == "failure"
    # Found within a probe's period of the death, judged a grace later.
    assert run.seconds < 0.5 + send.PROBE_S + 1.0 + 3.0
    assert all(r == {0, 1} for r in asked[:2]) and asked[-1] == {1}


def test_without_a_probe_only_the_hub_says_a_process_died():
    m, _, clock = machine(timeout=5.0, grace=1.0)
    events = ScriptedQueue(clock, [(1, *stream("waiting\n"))])
    run = Driver(m, events, lambda r: r).run()
    assert run.by_status("dead") == [] and run.hang == "timeout"


def test_a_divergence_deadline_that_passes_while_the_driver_looks_is_no_error():
    # The watch's next deadline depends on the clock: asked twice, it can be a time and then
    # None, once that time has passed in between. (With a timeout the machine has a time
    # of its own to wait for, which the watch's deadline is compared with.)
    m, _, clock = machine(timeout=30.0)
    events = ScriptedQueue(
        clock, [(r, kind, p) for r in (0, 1) for kind, p in (("reply", replied()), ("idle", None))]
    )

    class Watch:
        answers = iter([clock.t + 0.5])

        def deadline(self):
            return next(self.answers, None)

        def tick(self, running, failed):
            pass

        def intercept(self, rank, kind, payload):
            return False  # no divergence records in this cell

    assert Driver(m, events, lambda r: r, watch=Watch()).run().by_status("ok") == [0, 1]


# -- the same-program guard ----------------------------------------------------------------------


def test_a_cell_for_a_process_that_is_not_running_says_why():
    cluster = FakeProcesses(("ready", ""), ("dead", "its pid 41 is gone"), ("starting", ""))
    check_processes(cluster, [0], still_running=())
    with pytest.raises(UsageError) as e:
        check_processes(cluster, [0, 1, 2], still_running=())
    assert str(e.value) == (
        "p1-2 are not running (p1 dead: its pid 41 is gone; p2 starting); run on the others "
        "with --procs 0, or bring them back with %jaxsys restart"
    )


def test_same_program_guard():
    ledger = Ledger()
    assert ledger.record([0], [0, 1], "x = 1") is None
    warning = ledger.record([0, 1], [0, 1], "print('together')")
    assert warning.startswith("Warning: these processes are out of step: p0 ran 1 cell(s)")
    assert "p1 ran 0 cell(s)" in warning and "(the hang doctor will say where)." in warning
    assert ledger.record([0, 1], [0, 1], "print('again')") is None


def p1_of(dump: str) -> str:
    """The same stack as another process would dump it: other thread ids, another pid."""
    return dump.replace("0x00007f", "0x00007e").replace("ipykernel_6583", "ipykernel_6590")


DIVERGENT_CODE = """\
import jax
from jax.experimental import multihost_utils
x = 1
if jax.process_index() != 2:
    multihost_utils.sync_global_devices('b')
print('done')
"""

FAIL_CODE = """\
import jax, numpy as np
from jax.experimental import multihost_utils
if jax.process_index() == 1:
    raise ValueError('p1 fails before the collective')
multihost_utils.process_allgather(np.ones(3))
"""

JIT_CODE = """\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((3,), ('x',))
a = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x')), np.ones(1))
f = jax.jit(lambda a: a.sum())
if jax.process_index() != 2:
    print(f(a).block_until_ready())
"""

# p0 of FAIL_CODE: the same wait, entered through process_allgather on line 5.
ALLGATHER_DUMP = "\n".join(
    ln
    for ln in DIVERGENCE_DUMP.splitlines()
    if "in assert_equal" not in ln and "in sync_global_devices" not in ln
).replace('3847952674.py", line 5', '1690360436.py", line 5')

SITE = "/opt/venv/lib/python3.12/site-packages"


def dump_of(*frames: tuple[str, int, str]) -> str:
    """A main-thread dump of the given frames, innermost first."""
    lines = [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
    return "Current thread 0x00007f00aa (most recent call first):\n" + "\n".join(lines) + "\n"


ENGINE = [
    (f"{SITE}/IPython/core/interactiveshell.py", 3823, "run_code"),
    (f"{SITE}/ipykernel/ipkernel.py", 460, "do_execute"),
]


def stuck_run(procs, stuck, **results):
    from jaxsys_kernel.cells import CellRun, ProcResult

    run = CellRun(procs=list(procs), results={r: ProcResult(rank=r) for r in procs})
    for r in procs:
        if r not in stuck:
            run.results[r].status = "ok"
    for r, (ename, evalue) in results.items():
        res = run.results[int(r[1:])]
        res.status, res.error = "error", {"ename": ename, "evalue": evalue, "traceback": []}
    run.stuck = list(stuck)
    return run


# -- the hang report -------------------------------------------------------------------------


def test_report_groups_identical_stacks_user_frame_first_and_names_the_divergence():
    run = stuck_run([0, 1, 2], [0, 1])
    stacks = {0: DIVERGENCE_DUMP, 1: p1_of(DIVERGENCE_DUMP)}
    text = rep.report(run, stacks, "why", code=DIVERGENT_CODE)
    assert text == (
        "jaxsys hang doctor: why\n"
        "  p0-1 wait in sync_global_devices (your line 5); p2 finished the cell without reaching it\n"
        "  p0-1: still running\n"
        "      >> line 5: multihost_utils.sync_global_devices('b')\n"
        "      ** multihost_utils.sync_global_devices (jax/experimental/multihost_utils.py:165)\n"
        "  p2: finished\n"
        "  (>> your code, ** the JAX call it waits in; outermost call first)"
    )


def test_report_of_a_failure_before_a_collective():
    run = stuck_run([0, 1], [0], p1=("ValueError", "p1 fails before the collective"))
    text = rep.report(run, {0: ALLGATHER_DUMP}, "why", code=FAIL_CODE)
    assert "  p0 waits in process_allgather (your line 5); p1 raised ValueError without" in text
    assert "  p0: still running\n      >> line 5: multihost_utils.process_allgather(" in text
    assert "** multihost_utils.process_allgather (jax/experimental/multihost_utils.py:159)" in text
    assert "  p1: raised ValueError: p1 fails before the collective" in text


def test_a_jitted_call_is_named_as_such():
    run = stuck_run([0, 1, 2], [0, 1])
    text = rep.report(run, {0: JIT_DUMP, 1: p1_of(JIT_DUMP)}, "why", code=JIT_CODE)
    assert "p0-1 wait in a jitted function (your line 7); p2 finished the cell" in text
    assert "      >> line 7: print(f(a).block_until_ready())\n" in text
    assert "      ** a jitted function (jax/_src/pjit.py:272)\n" in text


def test_block_until_ready_reached_through_the_users_module():
    dump = dump_of(
        (f"{SITE}/jax/_src/array.py", 605, "block_until_ready"),
        (f"{SITE}/jax/_src/tree_util.py", 422, "tree_map"),
        (f"{SITE}/jax/_src/api.py", 3011, "block_until_ready"),
        (f"{SITE}/jax/_src/traceback_util.py", 194, "reraise_with_filtered_traceback"),
        ("/home/me/project/train.py", 12, "step"),
        ("/tmp/ipykernel_77/123.py", 2, "<module>"),
        *ENGINE,
    )
    where = rep.describe(rep.main_frames(dump), code="import train\ntrain.step()\n")
    assert where.lines == [
        ">> line 2: train.step()",
        "   train.py:12 in step",
        "** jax.block_until_ready (jax/_src/api.py:3011)",
    ]
    assert where.call == "jax.block_until_ready" and where.line == 2


def test_code_from_an_earlier_cell_and_long_stacks():
    middle = [(f"/home/me/lib/m{i}.py", i, f"f{i}") for i in range(5)]
    dump = dump_of(
        (f"{SITE}/jax/experimental/multihost_utils.py", 165, "sync_global_devices"),
        *middle,
        ("/tmp/ipykernel_77/111.py", 3, "helper"),
        ("/tmp/ipykernel_77/222.py", 1, "<module>"),
        *ENGINE,
    )
    where = rep.describe(rep.main_frames(dump), code="helper()\n", max_frames=6)
    assert where.lines == [
        ">> line 1: helper()",
        "   ... 3 more",
        "   m2.py:2 in f2",
        "   m1.py:1 in f1",
        "   m0.py:0 in f0",
        "** multihost_utils.sync_global_devices (jax/experimental/multihost_utils.py:165)",
    ]
    where = rep.describe(rep.main_frames(dump), code="helper()\n", max_frames=20)
    assert where.lines[1] == ">> line 3 in helper (an earlier cell)"


def test_a_process_out_of_jax_has_no_call_and_no_divergence_sentence():
    run = stuck_run([0, 1], [0])
    text = rep.report(run, {0: SLEEP_DUMP}, "why", code="import time\ntime.sleep(30)\n")
    assert text.splitlines()[1:3] == ["  p0: still running", "      >> line 2: time.sleep(30)"]
    assert not text.splitlines()[1].startswith("  p0 wait")


def test_a_missing_stack_is_said():
    run = stuck_run([0, 1], [0, 1])
    text = rep.report(run, {0: SLEEP_DUMP}, "why")
    assert "  p1: still running\n      (no stack: the process did not answer SIGUSR1)" in text


def test_sixteen_processes_fit_one_screen():
    run = stuck_run(range(16), range(15))
    stacks = {
        r: DIVERGENCE_DUMP.replace("ipykernel_6583", f"ipykernel_{7000 + r}") for r in range(15)
    }
    text = rep.report(run, stacks, "why", code=DIVERGENT_CODE)
    assert len(text.splitlines()) <= 10
    assert "  p0-14: still running" in text and "  p15: finished" in text


def test_sixteen_different_stacks_still_fit_one_screen():
    run = stuck_run(range(16), range(15))
    stacks = {
        r: DIVERGENCE_DUMP.replace('3847952674.py", line 5', f'3847952674.py", line {r + 1}')
        for r in range(15)
    }
    text = rep.report(run, stacks, "why", code=DIVERGENT_CODE)
    lines = text.splitlines()
    assert len(lines) <= rep.SCREEN
    assert "  p3: still running, multihost_utils.sync_global_devices (jax/" in text


def test_the_timeout_is_said_once():
    said: list[str] = []
    policy = HangPolicy(
        "interrupt", Stacks({0: SLEEP_DUMP, 1: SLEEP_DUMP}), timeout=1.5, say=said.append
    )
    m, _, clock = machine(timeout=1.5)
    clock.t += 1.5
    m.step()
    policy(m.run)
    assert said[0].count("timeout") == 1
    assert said[0].startswith("jaxsys hang doctor: the cell passed its timeout of 1.5 s\n")
    assert "  p0-1: still running\n      >> line 2\n" in said[0]


def test_which_thread_and_whether_it_waits_in_jax():
    frames = rep.main_frames(DIVERGENCE_DUMP)
    assert frames[0].func == "__call__" and frames[0].in_jax
    assert rep.waiting_in_jax({0: DIVERGENCE_DUMP, 1: SLEEP_DUMP}, [0, 1, 2]) == [True, False, True]
    assert rep.innermost(DIVERGENCE_DUMP) == (
        "** multihost_utils.sync_global_devices (jax/experimental/multihost_utils.py:165)"
    )
    assert rep.innermost("") == "(no stack)"


def test_short_paths():
    assert rep.short_path(f"{SITE}/jax/_src/api.py") == "jax/_src/api.py"
    assert rep.short_path("/usr/lib/python3.12/contextlib.py") == "contextlib.py"
    assert rep.short_path("/home/me/pkg/__init__.py") == "pkg/__init__.py"


def test_python_plumbing_between_frames_is_left_out():
    dump = dump_of(
        ("/usr/lib/python3.12/threading.py", 359, "wait"),
        ("/usr/lib/python3.12/queue.py", 180, "get"),
        (f"{SITE}/jax/experimental/multihost_utils.py", 620, "live_devices"),
        ("/usr/lib/python3.12/contextlib.py", 137, "__enter__"),
        ("/tmp/jaxsys-03-x/ft_train.py", 45, "membership_barrier"),
        ("/tmp/ipykernel_77/222.py", 4, "<module>"),
        *ENGINE,
    )
    where = rep.describe(rep.main_frames(dump))
    assert where.lines == [
        ">> line 4",
        "   ft_train.py:45 in membership_barrier",
        "** multihost_utils.live_devices (jax/experimental/multihost_utils.py:620)",
        "   queue.py:180 in get",
        "   threading.py:359 in wait",
    ]
    assert where.call is None  # it waits in the queue, not in JAX


def test_a_special_method_is_named_by_the_function_inside_it():
    # multihost_utils.live_devices is an object: its frames are __call__, then _live_devices.
    dump = dump_of(
        (f"{SITE}/jax/experimental/multihost_utils.py", 590, "_live_devices"),
        (f"{SITE}/jax/experimental/multihost_utils.py", 673, "__call__"),
        ("/usr/lib/python3.12/contextlib.py", 137, "__enter__"),
        ("/tmp/ipykernel_77/222.py", 3, "barrier"),
        ("/tmp/ipykernel_77/222.py", 7, "<module>"),
        *ENGINE,
    )
    where = rep.describe(rep.main_frames(dump))
    assert where.lines[-1] == (
        "** multihost_utils._live_devices (jax/experimental/multihost_utils.py:590)"
    )
    assert where.lines[:2] == [">> line 7", ">> line 3 in barrier"]
