"""The jaxsys kernel over the Jupyter protocol, with a real 2 x 2 cluster behind it.

Every message the tests receive is validated against the protocol schema (harness.py).
"""

from __future__ import annotations

import datetime
import queue
import re
import threading
import time

import pytest
from jupyter_kernel_test.msgspec_v5 import schema_fragments, validate_message

from jaxsys_kernel.telemetry import aggregate

from ..harness import status_table, tls_knock


def test_kernel_info(kernel):
    info = kernel.request("kernel_info")
    assert info["implementation"] == "jaxsys"
    assert info["language_info"]["name"] == "python"


def test_kernel_never_imports_jax(kernel):
    out = kernel.ok(
        "import sys; sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib')))"
    )
    assert out.text == "[]"


def test_device_counts_on_every_process(kernel):
    out = kernel.ok(
        "%%multihost\nimport jax\nprint(jax.process_count(), jax.device_count(), jax.local_device_count())"
    )
    assert out.stdout == "[p0-1] 2 4 2\n"


def test_identical_and_differing_lines(kernel):
    out = kernel.ok(
        "%%multihost\nimport jax\nprint('same')\nprint('rank', jax.process_index())\nprint('end')"
    )
    assert out.stdout == "[p0-1] same\n[p0] rank 0\n[p1] rank 1\n[p0-1] end\n"


def test_no_collate(kernel):
    out = kernel.ok("%%multihost --no-collate\nprint('x')")
    assert sorted(out.stdout.splitlines()) == ["[p0] x", "[p1] x"]


def test_stderr_is_collated_separately(kernel):
    out = kernel.ok("%%multihost\nimport sys\nprint('warn', file=sys.stderr)")
    assert out.stderr == "[p0-1] warn\n"


def test_procs_selection(kernel):
    out = kernel.ok("%%multihost --procs 1\nimport jax\nprint(jax.process_index())")
    assert out.stdout == "[p1] 1\n"


def test_cell_value_shown_once_when_identical(kernel):
    out = kernel.ok("%%multihost\nimport jax\njax.device_count()")
    assert out.text == "4"
    out = kernel.ok("%%multihost\njax.process_index() * 10")
    assert out.text == "[p0] 0\n[p1] 10"


def test_rich_display_from_process_zero_only(kernel):
    code = "%%multihost\nfrom IPython.display import HTML, display\nimport jax\ndisplay(HTML(f'<b>{jax.process_index()}</b>'))"
    out = kernel.ok(code)
    assert [d.get("text/html") for d in out.displays] == ["<b>0</b>"]
    out = kernel.ok(code.replace("%%multihost", "%%multihost --all-displays"))
    assert sorted(d.get("text/html") for d in out.displays) == ["<b>0</b>", "<b>1</b>"]


def test_error_on_one_process_is_named(kernel):
    out = kernel.execute(
        "%%multihost\nimport jax\nif jax.process_index() == 1:\n    raise ValueError('only on one')\nprint('survived')"
    )
    assert out.status == "error"
    assert out.error["ename"] == "MultihostError"
    assert "ValueError on p1" in out.error["evalue"]
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.error["traceback"]))
    assert "[p1] ValueError: only on one" in tb
    assert "raise ValueError('only on one')" in tb  # the user's own frame
    assert "ipyparallel" not in tb
    assert out.stdout == "[p0] survived\n"


def test_identical_errors_grouped(kernel):
    out = kernel.execute("%%multihost\n1/0")
    assert out.status == "error"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.error["traceback"]))
    assert tb.count("ZeroDivisionError: division by zero") >= 1
    assert "[p0-1] ZeroDivisionError" in tb
    assert "[p0]" not in tb and "[p1]" not in tb


def test_interrupt_reaches_the_engines(kernel):
    timer = threading.Timer(2.0, kernel.km.interrupt_kernel)
    t0 = time.monotonic()
    out = kernel.execute(
        "%%multihost\nimport time\nprint('sleeping')\ntime.sleep(60)", on_start=timer.start
    )
    took = time.monotonic() - t0
    assert out.status == "error"
    assert out.error["ename"] == "MultihostInterrupt"
    assert "interrupted processes p0-1" in out.error["evalue"]
    assert took < 10
    assert (
        re.search(r"\[p0(-1)?\] sleeping", out.stdout) and "sleeping" in out.stdout.split("\n")[-2]
    )
    # The engines are usable again.
    assert kernel.ok("%%multihost\nprint('back')").stdout == "[p0-1] back\n"


def test_timeout_interrupts_and_reports(kernel):
    out = kernel.execute(
        "%%multihost --timeout 1\nimport time, jax\nif jax.process_index() == 0:\n    time.sleep(60)"
    )
    assert out.status == "error"
    assert out.error["ename"] == "MultihostTimeout"
    assert "still running: p0" in out.error["evalue"]
    assert "finished: p1" in out.error["evalue"]


def test_pull_sharded_array_is_gathered(kernel):
    kernel.ok(
        "%%multihost\n"
        "import jax, numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((2, 2), ('a', 'b'))\n"
        "pid = jax.process_index()\n"
        "local = np.arange(8, dtype=np.float32).reshape(2, 4) + 100 * pid\n"
        "g = jax.make_array_from_process_local_data(NamedSharding(mesh, P('a', 'b')), local)\n"
        "assert not g.is_fully_addressable"
    )
    out = kernel.ok("%pull g")
    assert "g <- p0: ndarray float32 (4, 4)" in out.stdout
    out = kernel.ok(
        "import numpy as np\nexpected = np.concatenate([np.arange(8).reshape(2, 4) + 100 * p for p in range(2)])\nbool((g == expected).all()), g.shape"
    )
    assert out.text == "(True, (4, 4))"


def test_pull_local_value_from_a_process(kernel):
    kernel.ok(
        "%%multihost\nimport jax\nv = {'rank': jax.process_index(), 'arr': jax.numpy.ones(3) * jax.process_index()}"
    )
    kernel.ok("%pull v --proc 1")
    out = kernel.ok("v['rank'], type(v['arr']).__name__, v['arr'].tolist()")
    assert out.text == "(1, 'ndarray', [1.0, 1.0, 1.0])"


@pytest.mark.parametrize(
    "line,fragment",
    [
        ("%pull nosuchname", "not defined on process 0"),
        ("%pull x --proc 7", "outside this cluster"),
        ("%pull", "arguments are required"),
        ("%%multihost --procs 3\n1", "--procs: process selection '3' is outside"),
        ("%%multihost --timeout -1\n1", "positive"),
        ("%jaxsys frobnicate", "invalid choice"),
        ("%jaxsys start", "already running"),
        ("%%local --x\n1", "takes no options"),
    ],
)
def test_misuse_is_a_usage_error(kernel, line, fragment):
    out = kernel.execute(line)
    assert out.status == "error"
    assert out.error["ename"] == "UsageError"
    assert fragment in out.error["evalue"]


def test_spmd_mode(kernel):
    kernel.ok("%multihost on")
    try:
        out = kernel.ok("import jax\nprint(jax.process_index())\nspmd_value = 5")
        assert out.stdout == "[p0] 0\n[p1] 1\n"
        out = kernel.ok("%%local\nimport sys\n'jax' in sys.modules")
        assert out.text == "False"
        out = kernel.ok("%jaxsys status")
        assert "process" in out.stdout
    finally:
        kernel.ok("%multihost off")
    assert kernel.ok("%%multihost\nspmd_value").text == "5"
    assert kernel.execute("spmd_value").status == "error"  # never defined in the kernel


def test_completion_from_process_zero(kernel):
    kernel.ok("%%multihost\nonly_on_engines_variable = 1")
    code = "%%multihost\nonly_on_engines_var"
    reply = kernel.request("complete", code, len(code))
    assert "only_on_engines_variable" in reply["matches"]
    assert code[reply["cursor_start"] : reply["cursor_end"]] == "only_on_engines_var"
    # A kernel cell completes from the kernel's own namespace.
    reply = kernel.request("complete", "only_on_engines_var", len("only_on_engines_var"))
    assert "only_on_engines_variable" not in reply["matches"]


def test_inspection_from_process_zero(kernel):
    kernel.ok("%%multihost\nimport jax.numpy as jnp")
    code = "%%multihost\njnp.sum"
    reply = kernel.request("inspect", code, len(code), 0)
    assert reply["found"]
    assert "Sum of the elements" in reply["data"]["text/plain"]


def test_status_lists_every_process(kernel):
    out = kernel.ok("%jaxsys status")
    lines = out.stdout.splitlines()
    assert lines[0] == "cluster: ready"
    header = next(ln for ln in lines if ln.startswith("process"))
    assert header.split() == ["process", "engine", "pid", "host", "devices", "state", "memory"]
    table = status_table(out.stdout)
    assert sorted(table) == [0, 1]
    assert [table[r]["engine"] for r in (0, 1)] == ["0", "1"]  # engine i is process i
    assert all(row["state"] == "ready" for row in table.values())
    assert any(ln.startswith("standby: ") for ln in lines)
    assert any(ln.startswith("security: mTLS on the coordination service") for ln in lines)


def test_security_audit_lists_every_endpoint(kernel):
    out = kernel.ok("%jaxsys security")
    text = out.stdout
    assert "JAX coordination service" in text and "mTLS" in text
    assert "ipyparallel registration" in text and "CurveZMQ" in text
    assert "JAX data plane (gloo collectives)" in text or "gloo" in text
    assert "Jupyter kernel channels" in text
    assert "with no protection" in text  # gloo stays plaintext and is said so


def _coordinator(kernel) -> str:
    return kernel.ok(
        "print(get_ipython()._jaxsys_session.cluster.coordinator_address)"
    ).stdout.strip()


def _notices_until(kernel, notices: str, done, timeout: float = 30.0) -> str:
    """Run empty cells until the notices printed after them satisfy ``done`` (or time out).

    Notices come from a post-cell hook, once what they report has reached the kernel.
    """
    deadline = time.monotonic() + timeout
    while not done(notices) and time.monotonic() < deadline:
        time.sleep(0.1)
        out = kernel.ok("pass")
        # A notice that something worked goes to stdout, a warning to stderr.
        notices += out.stdout + out.stderr
    return notices


def test_the_kernel_reports_who_was_refused(kernel):
    # The refusal travels from process 0 as telemetry and is reported once, after the
    # first cell that ends once it has arrived: this one, or a later one.
    address = _coordinator(kernel)
    notices = kernel.execute("pass", on_start=lambda: tls_knock(address)).stderr
    notices = _notices_until(kernel, notices, lambda text: text != "")
    assert re.fullmatch(
        r"jaxsys: the coordination service refused 1 connection\(s\) from 127\.0\.0\.1: "
        r"it presented no certificate\. The cluster is unaffected; %jaxsys security lists "
        r"every refusal\.\n",
        notices,
    ), notices
    assert kernel.ok("pass").stderr == ""
    table = kernel.ok("%jaxsys security").stdout
    assert re.search(r"127\.0\.0\.1 +1 +\S+ +\S+ +it presented no certificate", table), table
    assert "refused: 1 connection(s) from 1 address(es)" in kernel.ok("%jaxsys status").stdout
    assert kernel.ok("%%multihost\nprint('fine')").stdout == "[p0-1] fine\n"


def test_logs_shows_the_native_chatter_kept_out_of_cells(kernel):
    # The refused handshake above made process 0's gRPC log its trace: kept out of the
    # cell, it is in the process's native log.
    out = kernel.ok("%jaxsys logs 0 --tail 200")
    assert 0 < len(out.stdout.splitlines()) <= 200
    assert "handshake" in out.stdout
    assert len(kernel.ok("%jaxsys logs p0 --tail 2").stdout.splitlines()) == 2
    bad = kernel.execute("%jaxsys logs 5")
    assert bad.status == "error" and bad.error["ename"] == "UsageError"
    assert "there is no process 5; this cluster's processes are p0-1" in bad.error["evalue"]


@pytest.mark.parametrize("magic", ["%multihost", "%jaxsys", "%pull", "%%local"])
def test_magic_help_has_examples(kernel, magic):
    out = kernel.ok(f"{magic}?")
    pages = [p["data"]["text/plain"] for p in out.reply["payload"] if p.get("source") == "page"]
    assert pages and "Examples" in pages[0], pages


def test_world_restart_from_the_kernel(kernel):
    out = kernel.ok("%jaxsys restart", timeout=120)
    assert re.search(r"JAX world ready again in \d+\.\d s", out.stdout)
    # Progress is not an error: one output per stage, rewritten in place, none on stderr.
    assert "processes initialised 2/2" in out.progress and out.stderr == ""
    assert kernel.ok("%%multihost\nimport jax\nprint(jax.device_count())").stdout == "[p0-1] 4\n"


def test_rotate_certs_magic(kernel):
    kernel.ok("get_ipython()._jaxsys_session.cluster.rotation_poll = 0.2")
    out = kernel.ok("%jaxsys rotate-certs")
    assert "new certificates written for p0 (serial" in out.stdout and "p1 (serial" in out.stdout
    assert "every 10 minutes" in out.stdout
    assert "still presents the old one" in kernel.ok("%jaxsys status").stdout
    # Restarted processes load the new files at once; the kernel notices and says so, once.
    restarted = kernel.ok("%jaxsys restart", timeout=120)
    notices = _notices_until(
        kernel,
        restarted.stdout + restarted.stderr,
        lambda text: "now presents the rotated certificate" in text,
    )
    assert re.search(
        r"jaxsys: the coordination service now presents the rotated certificate "
        r"\(serial 0x[0-9a-f]+\), \d+\.\d s after rotate-certs\.",
        notices,
    ), notices
    after = kernel.ok("pass")
    assert "rotated certificate" not in after.stdout + after.stderr
    assert "presented by the coordination service since" in kernel.ok("%jaxsys status").stdout


def _stamp(date) -> float:
    # jupyter_client hands dates over parsed or as ISO strings, depending on the path.
    if isinstance(date, str):
        date = datetime.datetime.fromisoformat(date.replace("Z", "+00:00"))
    return date.timestamp()


def _widget_states(out) -> list[dict]:
    return [
        m["content"]["data"]["state"]
        for m in out.messages
        if m["msg_type"] == "comm_open" and "_view_kind" in m["content"]["data"].get("state", {})
    ]


def test_displaying_a_mesh_shows_its_view_once(kernel):
    out = kernel.ok("%%multihost\nimport jax\nmesh = jax.make_mesh((2, 2), ('x', 'y'))\nmesh")
    views = [s for s in _widget_states(out) if s["_view_kind"] == "mesh"]
    assert len(views) == 1
    info = views[0]["info"]
    assert info["shape"] == [2, 2] and info["axis_names"] == ["x", "y"]
    assert info["devices"] == [0, 1, 2048, 2049] and info["process"] == [0, 0, 1, 1]


def test_process_spanning_array_shows_its_sharding(kernel):
    out = kernel.ok(
        "%%multihost\n"
        "import numpy as np\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((2, 2), ('x', 'y'))\n"
        "arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P('x', None)), np.ones((2, 6), np.float32))\n"
        "arr"
    )
    (state,) = [s for s in _widget_states(out) if s["_view_kind"] == "sharding"]
    info = state["info"]
    assert info["shape"] == [4, 6] and info["spec"] == ["x", None]
    blocks = {tuple(map(tuple, b["index"])): b for b in info["blocks"]}
    assert set(blocks) == {((0, 2), (0, 6)), ((2, 4), (0, 6))}
    assert sorted(map(tuple, blocks[((0, 2), (0, 6))]["holders"])) == [(0, 0), (1, 0)]
    assert sorted(map(tuple, blocks[((2, 4), (0, 6))]["holders"])) == [(2048, 1), (2049, 1)]
    assert "Array(shape=(4, 6)" in out.text  # the value's text follows the view


def test_show_draws_a_sharding(kernel):
    out = kernel.ok("%%multihost\nimport jaxsys_kernel\njaxsys_kernel.show(arr.sharding)")
    (state,) = [s for s in _widget_states(out) if s["_view_kind"] == "sharding"]
    assert state["info"]["shape"] == [2, 1]


def _view_message(msg) -> dict:
    """A view's custom message (row deltas, appended log lines), or {}."""
    if msg["msg_type"] != "comm_msg":
        return {}
    data = msg["content"]["data"]
    return data.get("content", {}) if data.get("method") == "custom" else {}


def test_dashboard_updates_reach_the_client_while_a_cell_blocks(kernel):
    # The reader below sees only the messages of its two cells: a row that arrived between
    # them (a process's first heartbeat after a quick start) would be missed, so the view
    # is shown again until it opens with every process's row.
    deadline = time.monotonic() + 30
    while True:
        out = kernel.ok("%jaxsys dashboard")
        states = {s["_view_kind"]: s for s in _widget_states(out)}
        assert sorted(states) == ["cache", "live", "mesh", "sharding", "stragglers"]
        held = {r["rank"]: r for r in states["live"]["liveness"]}
        # The view opens with its first state; its rows may follow at once as deltas.
        for m in out.messages:
            delta = _view_message(m)
            if delta.get("type") == "rows" and delta.get("trait") == "liveness":
                held = aggregate.apply_rows(held, delta)
        if len(held) == 2:
            break
        assert time.monotonic() < deadline, f"the dashboard opened with the rows of {sorted(held)}"
        time.sleep(0.2)
    t0 = time.time()
    out = kernel.ok("%%multihost\nimport time\ntime.sleep(3)")
    # Rows travel as deltas after the view's first state; a reader applies them in turn.
    updates, busy = [], []
    for m in out.messages:
        delta = _view_message(m)
        if delta.get("type") == "rows" and delta.get("trait") == "liveness":
            held = aggregate.apply_rows(held, delta)
            updates.append(m)
            busy.append([held[r]["busy"] for r in sorted(held)])
    # The view is refreshed from the telemetry thread, so updates flow while the cell runs.
    assert len(updates) >= 2
    stamps = [_stamp(m["header"]["date"]) for m in updates]
    assert min(stamps) < t0 + 2.5
    assert [True, True] in busy


def _event_log(msg) -> list[str]:
    """Log lines a dashboard message carries: the whole log, or lines appended to it."""
    if msg["msg_type"] != "comm_msg":
        return []
    whole = msg["content"]["data"].get("state", {}).get("event_log", [])
    return whole or _view_message(msg).get("log", {}).get("append", [])


def _iopub_until(kernel, msg_id: str, done, timeout: float, seen: list[dict]) -> dict:
    """Collect the iopub messages of request ``msg_id`` into ``seen`` until ``done(msg)``."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            msg = kernel.kc.get_iopub_msg(timeout=max(0.01, remaining))
        except queue.Empty:
            msg = None
        if msg is None or remaining <= 0:
            types = [m["msg_type"] for m in seen]
            raise AssertionError(f"waited {timeout} s in vain; the request's messages: {types}")
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in schema_fragments:
            validate_message(msg, msg["msg_type"], msg_id)
        seen.append(msg)
        if done(msg):
            return msg


def test_dashboard_log_shows_a_refusal_while_a_cell_runs(kernel, tmp_path):
    # The dashboard is updated from the telemetry thread, and ipykernel stamps those comm
    # messages with the parent of the request the kernel last started. Knocking as soon
    # as the request was sent raced with the kernel starting the cell: a refusal that
    # arrived first was logged under the previous cell's header. So the knock waits for
    # the cell's busy status, and the cell runs until the test has seen the log entry.
    address = _coordinator(kernel)
    kernel.ok("%jaxsys dashboard")
    release = tmp_path / "release"
    msg_id = kernel.kc.execute(
        "import os, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
    )
    seen: list[dict] = []
    _iopub_until(
        kernel,
        msg_id,
        lambda m: m["msg_type"] == "status" and m["content"]["execution_state"] == "busy",
        30,
        seen,
    )
    tls_knock(address)
    refusal = re.compile(
        r"refused 1 connection\(s\) from 127\.0\.0\.1: it presented no certificate$"
    )
    try:
        _iopub_until(kernel, msg_id, lambda m: any(map(refusal.search, _event_log(m))), 30, seen)
    finally:
        release.touch()
    # The entry came while the cell was still running: no idle status before it.
    assert not any(
        m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen
    )
    _iopub_until(
        kernel,
        msg_id,
        lambda m: m["msg_type"] == "status" and m["content"]["execution_state"] == "idle",
        30,
        seen,
    )
    assert kernel._shell_reply(msg_id)["content"]["status"] == "ok"


def test_the_same_warning_from_every_process_shows_once(kernel):
    # Each engine compiles the cell as its own temporary file, which a warning names.
    out = kernel.ok('%%multihost\nimport warnings\nwarnings.warn("the same on every process")')
    lines = out.stderr.splitlines()
    assert lines[0].startswith("[p0-1] <cell"), out.stderr
    assert lines[0].endswith(":2: UserWarning: the same on every process"), out.stderr
    assert "ipykernel_" not in out.stderr and len(lines) == 2, out.stderr
