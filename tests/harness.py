"""Helpers shared by the tests: a real jaxsys kernel over the Jupyter protocol, and a
process census that proves nothing was left behind."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field

import psutil
from jupyter_client.manager import KernelManager
from jupyter_kernel_test.msgspec_v5 import schema_fragments, validate_message

from jaxsys_kernel import cells as executor

# Every process a test starts inherits this tag, so the census finds exactly ours.
TAG_VAR = "JAXSYS_TEST_RUN"


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries ``tag``."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(TAG_VAR) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def is_engine(p: psutil.Process) -> bool:
    """Whether ``p`` is an engine: started as ``python -m ipyparallel.engine``, or forked by
    a fork server (a child of the server, which shares its command line)."""
    cmd = " ".join(p.cmdline())
    if "ipyparallel.engine" in cmd:
        return True
    if "jaxsys_kernel.engine.forkserver" not in cmd:
        return False
    parent = p.parent()
    return parent is not None and "jaxsys_kernel.engine.forkserver" in " ".join(parent.cmdline())


def tagged_engines(tag: str) -> list[psutil.Process]:
    """The live engines among the tagged processes."""
    found = []
    for p in tagged_processes(tag):
        try:
            if is_engine(p):
                found.append(p)
        except psutil.Error:
            pass
    return found


def wait_no_processes(tag: str, timeout: float = 10.0) -> list[str]:
    """Wait until no tagged process is left; return descriptions of any survivors."""
    deadline = time.monotonic() + timeout
    while True:
        left = tagged_processes(tag)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out = []
    for p in left:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:150]}")
        except psutil.Error:
            pass
    return out


@dataclass
class CellOutput:
    status: str
    stdout: str = ""
    stderr: str = ""
    results: list[dict] = field(default_factory=list)
    displays: list[dict] = field(default_factory=list)
    error: dict | None = None
    reply: dict | None = None
    messages: list[dict] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(r.get("text/plain", "") for r in self.results)

    @property
    def progress(self) -> str:
        """What progress bars showed: each is a display output updated in place."""
        return "\n".join(
            m["content"]["data"].get("text/plain", "")
            for m in self.messages
            if m["msg_type"] in ("display_data", "update_display_data")
        )


class Kernel:
    """A jaxsys kernel started through jupyter_client, with a tagged environment."""

    def __init__(self, tag: str, extra_env=None, spec_env=None):
        # The kernelspec's own env (JAXSYS_HOSTS=4, ...) takes precedence over this one,
        # so tests pass cluster sizes to %jaxsys start explicitly.
        self.tag = tag
        env = dict(os.environ)
        env[TAG_VAR] = tag
        env.update(extra_env or {})
        # jupyter_client picks free ports and the kernel binds them a moment later: on a
        # busy machine another process can take one in between ("Address already in use"),
        # and the kernel dies at start or never answers. A second start gets new ports; a
        # kernel that fails for any other reason fails again, and that is raised.
        for attempt in (1, 2):
            self._start(env, spec_env)
            try:
                self.kc.wait_for_ready(timeout=60)
                return
            except RuntimeError:
                self.kc.stop_channels()
                if self.km.is_alive():
                    self.km.shutdown_kernel(now=True)
                else:
                    self.km.cleanup_resources()
                if attempt == 2:
                    raise

    def _start(self, env: dict[str, str], spec_env) -> None:
        self.km = KernelManager(kernel_name="jaxsys")
        if spec_env:
            # What a user's kernelspec would say, e.g. JAXSYS_HOSTS.
            self.km.kernel_spec.env.update(spec_env)
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def execute(self, code: str, timeout: float = 120.0, on_start=None) -> CellOutput:
        # One cell at a time, as nbclient runs a cell allowed to raise: with stop_on_error,
        # ipykernel aborts requests that reach it before it has finished reacting to an
        # error, and a test sends its next cell as soon as the error's reply arrives.
        msg_id = self.kc.execute(code, stop_on_error=False)
        out = CellOutput(status="?")
        if on_start:
            on_start()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish in {timeout} s: {code[:80]!r}")
            msg = self.kc.get_iopub_msg(timeout=remaining)
            if msg["parent_header"].get("msg_id") != msg_id:
                # A view opens its comm outside any request (widgets/unstored.py); a front
                # end's widget manager takes it all the same, and so does this client.
                if msg["msg_type"] == "comm_open" and not msg["parent_header"]:
                    out.messages.append(msg)
                continue
            # The schema has no entries for widget comms; every other message is checked.
            if msg["msg_type"] in schema_fragments:
                validate_message(msg, msg["msg_type"], msg_id)
            out.messages.append(msg)
            t, c = msg["msg_type"], msg["content"]
            if t == "status" and c["execution_state"] == "idle":
                break
            if t == "stream":
                if c["name"] == "stdout":
                    out.stdout += c["text"]
                else:
                    out.stderr += c["text"]
            elif t == "execute_result":
                out.results.append(c["data"])
            elif t == "display_data":
                out.displays.append(c["data"])
            elif t == "error":
                out.error = c
        reply = self._shell_reply(msg_id)
        validate_message(reply, "execute_reply", msg_id)
        out.reply = reply["content"]
        out.status = reply["content"]["status"]
        if out.status == "error" and out.error is None:
            # UsageError is printed to stderr rather than published as an error message.
            out.error = reply["content"]
        return out

    def ok(self, code: str, timeout: float = 120.0) -> CellOutput:
        out = self.execute(code, timeout=timeout)
        assert out.status == "ok", f"cell failed: {out.error}\nstderr: {out.stderr}"
        return out

    def request(self, method: str, *args, **kwargs) -> dict:
        msg_id = getattr(self.kc, method)(*args, **kwargs)
        reply = self._shell_reply(msg_id)
        validate_message(reply, reply["msg_type"], msg_id)
        return reply["content"]

    def _shell_reply(self, msg_id: str, timeout: float = 30.0) -> dict:
        # A late reply to an earlier request (e.g. wait_for_ready's kernel_info) may come first.
        deadline = time.monotonic() + timeout
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.is_alive():
                self.km.shutdown_kernel(now=False)


@contextlib.contextmanager
def kernel_with_cluster(tag: str, start: str = "%jaxsys start --hosts 2 --devices-per-host 2"):
    """A jaxsys kernel whose cluster was started with the magic line ``start``."""
    k = Kernel(tag)
    try:
        out = k.execute(start, timeout=180)
        # The error's own words first: a summary line shows only the message's first line,
        # and the start's progress bars come before the error on stderr.
        why = " | ".join(str((out.error or {}).get("evalue")).splitlines())
        assert out.status == "ok", f"{start!r} failed: {why}\nstderr: {out.stderr}"
        yield k
    finally:
        k.shutdown()


def status_table(status: str) -> dict[int, dict[str, str]]:
    """``%jaxsys status``'s process table, by process, each row by its header's columns."""
    lines = status.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["process"])
    columns = lines[head].split()
    rows = {}
    for line in lines[head + 1 :]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = dict(zip(columns, cells, strict=False))
    return rows


def process_states(status: str) -> dict[int, str]:
    """Each process's state in ``%jaxsys status``'s table."""
    return {r: row["state"] for r, row in status_table(status).items()}


def write_notebook(path, cells: list[str]) -> None:
    """Save a notebook of code ``cells`` that runs on the jaxsys kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "jaxsys",
        "display_name": "jaxsys (multi-host JAX)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)


class OutputSink(executor.Sink):
    """Collects a cell's collated stdout and stderr, in arrival order."""

    def __init__(self):
        self.out = ""

    def stdout(self, text):
        self.out += text

    stderr = stdout


def run_on(cluster, code: str) -> str:
    """Run ``code`` on every process of ``cluster``; return its collated output or raise."""
    sink = OutputSink()
    executor.raise_for_run(executor.execute(cluster, code, sink=sink))
    return sink.out


def tls_knock(address: str, ca_file: str | None = None) -> None:
    """Connect to a TLS server (``host:port``) as a client that has no certificate.

    With ``ca_file`` the client checks the server against it; without, it trusts anyone.
    The handshake's outcome is ignored: the server's side of it is what tests look at.
    """
    import socket
    import ssl

    host, port = address.rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])  # gRPC servers negotiate HTTP/2
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:
                tls.recv(1)  # TLS 1.3: the server's verdict arrives after the handshake
        except (ssl.SSLError, OSError):
            pass
