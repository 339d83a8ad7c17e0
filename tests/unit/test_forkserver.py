"""The fork server's decisions, without forking: which requests it serves (malformed ones,
strangers and failed forks are refused in words and leak nothing), how JAX settings
that differ reach a child, and the package whose ``__init__`` waits until it is needed."""

from __future__ import annotations

import array
import errno
import json
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from jaxsys_kernel import _compat, contract
from jaxsys_kernel.cluster.launchers import forks
from jaxsys_kernel.engine import forked, forkrequests, forkserver

from .free_pid import free_pid

IMPORTED = {"JAX_PLATFORMS": "cpu"}


def _request(**env):
    # What the server compares with its own environment, as the server has it.
    same = ("JAXSYS_PARENT_PID", "PYTHONPATH")
    parent = {k: os.environ[k] for k in same if os.environ.get(k)}
    return {"argv": ["--IPEngine.id=0"], "env": {**IMPORTED, **parent, **env}, "cwd": "/"}


def test_a_request_like_the_servers_is_served():
    assert forkserver.refusal(_request(JAXSYS_PROCESS_ID="3"), IMPORTED) is None
    assert forkserver.jax_changes(_request()["env"], IMPORTED) == {}


def test_a_jax_option_that_differs_is_served_and_named_as_a_change():
    req = _request(JAX_MTLS_CERT_FILE="/certs/p1.pem")
    assert forkserver.refusal(req, IMPORTED) is None
    assert forkserver.jax_changes(req["env"], IMPORTED) == {"JAX_MTLS_CERT_FILE": "/certs/p1.pem"}


def test_a_jax_variable_that_is_no_option_is_refused_by_name():
    why = forkserver.refusal(_request(JAX_SOMETHING_JAX_DOES_NOT_DECLARE="1"), IMPORTED)
    assert why and "JAX_SOMETHING_JAX_DOES_NOT_DECLARE" in why


def test_a_setting_the_request_drops_is_refused():
    req = {"argv": [], "env": {"PATH": "/bin"}}
    why = forkserver.refusal(req, IMPORTED)
    assert why and "JAX_PLATFORMS" in why and "unset" in why


def test_a_request_for_another_parent_is_refused(monkeypatch):
    monkeypatch.setenv("JAXSYS_PARENT_PID", "100")
    assert "another parent" in forkserver.refusal(_request(JAXSYS_PARENT_PID="1"), IMPORTED)
    assert forkserver.refusal(_request(JAXSYS_PARENT_PID="100"), IMPORTED) is None


def test_a_malformed_request_is_refused():
    assert "no environment" in forkserver.refusal({"argv": "x"}, IMPORTED)


def test_another_pythonpath_is_refused(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/a")
    assert "PYTHONPATH" in forkserver.refusal(_request(PYTHONPATH="/b"), IMPORTED)


class _Holder:
    def __init__(self, value):
        self.value = value


class _Config:
    def __init__(self, **values):
        self._value_holders = {k: _Holder(v) for k, v in values.items()}
        self.updates = {}

    def update(self, name, value):
        self.updates[name] = value


@pytest.mark.parametrize(
    ("current", "text", "parsed"),
    [(False, "true", True), (True, "0", False), (3, "7", 7), (0.5, "2.5", 2.5), (None, "x", "x")],
)
def test_an_option_is_set_from_its_variable_as_jax_parses_it(current, text, parsed):
    config = _Config(jax_foo=current)
    _compat.set_jax_option_from_env(config, "JAX_FOO", text)
    assert config.updates == {"jax_foo": parsed}
    assert type(config.updates["jax_foo"]) is type(parsed)


def test_a_variable_without_an_option_has_none():
    assert _compat.jax_option(_Config(jax_foo=1), "JAX_BAR") is None
    assert _compat.jax_option(object(), "JAX_FOO") is None


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazypkg_demo"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("RAN = True\nfrom . import heavy\n")
    (root / "heavy.py").write_text("VALUE = 42\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "leaf.py").write_text("from lazypkg_demo import heavy as h\nLEAF = h.VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazypkg_demo"
    for name in [m for m in sys.modules if m.startswith("lazypkg_demo")]:
        del sys.modules[name]


def test_a_lazy_package_imports_submodules_without_its_init(package):
    forkserver.lazy_package(package)
    # Deferred: the package exists only once the fixture wrote it.
    import lazypkg_demo.sub.leaf as leaf

    assert leaf.LEAF == 42
    mod = sys.modules[package]
    assert "RAN" not in mod.__dict__
    # A name only its __init__ defines runs it, once.
    assert mod.RAN is True
    assert type(mod) is types.ModuleType


def test_the_stand_in_imports_only_the_standard_library():
    source = Path(forked.__file__).read_text()
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from "))
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_stand_in_is_run_by_path_without_site():
    class _Proc:
        pid = 4321

    server = forks.ForkServer.__new__(forks.ForkServer)
    server.socket_path, server.ready_wait, server.proc = "/tmp/s", 30.0, _Proc()
    cmd = server.engine_cmd()
    assert cmd[1:3] == ["-S", forked.__file__]
    assert cmd[3:] == ["/tmp/s", "4321", "30"]


def test_the_stand_in_asks_for_its_arguments():
    assert forked.main([]) == 2


# -- malformed requests, peers and failed forks, on a server in this process ----------------

BAD_BODIES = {
    "a JSON list": b"[]",
    "deep nesting": b"[" * 200000,
    "not UTF-8": b'{"argv": ["\xff\xfe"]}',
    "not JSON": b"{argv",
    "argv of numbers": json.dumps({"argv": [1], "env": {}}).encode(),
    "env of numbers": json.dumps({"argv": [], "env": {"A": 1}}).encode(),
    "cwd a number": json.dumps({"argv": [], "env": {}, "cwd": 3}).encode(),
}


@pytest.fixture
def server(tmp_path):
    srv = forkserver.ForkServer(str(tmp_path / "s"), parent_fd=None, kernel_pid=os.getpid())
    srv.listen()
    yield srv
    srv.close()


def _client(server) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(server.path)
    return conn


def _send(conn, body: bytes, length: int | None = None, nfds: int = forkrequests.NFDS) -> None:
    fds = array.array("i", [0, 1, 2, 1][:nfds])
    header = forkrequests.HEADER.pack(len(body) if length is None else length)
    conn.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if nfds else [])
    if body:
        conn.sendall(body)


def _answer(server, conn, timeout: float = 10.0) -> dict:
    """Turn the server's loop until ``conn`` has its one-line answer."""
    deadline = time.monotonic() + timeout
    conn.setblocking(False)
    data = b""
    while b"\n" not in data:
        assert time.monotonic() < deadline, "no answer from the fork server"
        server.serve_once(0.05)
        try:
            data += conn.recv(65536)
        except BlockingIOError:
            pass
    conn.close()
    return json.loads(data.split(b"\n")[0])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kind", sorted(BAD_BODIES))
def test_a_malformed_body_is_refused_in_words(server, kind):
    conn = _client(server)
    _send(conn, BAD_BODIES[kind])
    why = _answer(server, conn)["refused"]
    assert why and "fork server failed" not in why, why


@pytest.mark.parametrize(
    ("send", "named"),
    [
        (lambda c: _send(c, b"{}", length=1 << 30), "bytes (at most"),
        (lambda c: (_send(c, b"{}", length=50), c.shutdown(socket.SHUT_WR)), "ended after"),
        (lambda c: _send(c, b"{}", nfds=2), "not 2"),
        (lambda c: _send(c, b"{}", nfds=0), "not 0"),
        (lambda c: (c.sendall(b"\0\0"), c.shutdown(socket.SHUT_WR)), "ended after 2 bytes"),
        (lambda c: _send(c, b"{}x", length=2), "bytes follow"),
    ],
    ids=["oversize", "truncated", "two fds", "no fds", "half a header", "trailing bytes"],
)
def test_a_malformed_frame_is_refused_in_words(server, send, named):
    conn = _client(server)
    send(conn)
    assert named in _answer(server, conn)["refused"]


def test_three_hundred_bad_requests_leak_nothing_and_the_next_is_answered(server, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/here")
    kinds = list(BAD_BODIES.values())
    before = _open_fds()
    for i in range(300):
        conn = _client(server)
        _send(conn, kinds[i % len(kinds)])
        assert "refused" in _answer(server, conn)
    assert _open_fds() == before
    # The next well-formed request is still read and judged (here: refused on its merits).
    conn = _client(server)
    _send(conn, json.dumps({"argv": [], "env": {"PYTHONPATH": "/elsewhere"}}).encode())
    assert _answer(server, conn) == {"refused": "PYTHONPATH differs"}


def test_a_silent_client_does_not_hold_up_the_others(server):
    server.request_timeout = 0.5
    silent = _client(server)
    t0 = time.monotonic()
    conn = _client(server)
    _send(conn, b"[]")
    assert "not an object" in _answer(server, conn)["refused"]
    assert time.monotonic() - t0 < 0.5, "the server waited on the silent client"
    assert "no whole request within 0.5 s" in _answer(server, silent)["refused"]
    assert not server.pending


def test_a_process_the_kernel_did_not_start_is_refused(tmp_path):
    srv = forkserver.ForkServer(str(tmp_path / "s"), parent_fd=None, kernel_pid=1)
    srv.listen()
    try:
        conn = _client(srv)
        _send(conn, b"{}")
        why = _answer(srv, conn)["refused"]
    finally:
        srv.close()
    assert f"process {os.getpid()} was not started by the kernel (pid 1)" in why


def test_the_peer_check_serves_the_kernel_and_its_children():
    a, b = socket.socketpair()
    with a, b:
        assert forkrequests.peer_refusal(a, os.getpid()) is None
        assert forkrequests.peer_refusal(a, os.getppid()) is None
        assert "not started by the kernel" in forkrequests.peer_refusal(a, 1)


def test_a_failed_fork_is_refused_so_the_stand_in_starts_a_plain_engine(server, monkeypatch, capfd):
    def no_fork():
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(forkserver.os, "fork", no_fork)
    conn = _client(server)
    result = []
    asker = threading.Thread(target=lambda: result.append(forked.request_fork(conn, ["-x"])))
    asker.start()
    deadline = time.monotonic() + 30
    while asker.is_alive():
        assert time.monotonic() < deadline, "the stand-in got no answer"
        server.serve_once(0.05)
    conn.close()
    assert result == [(None, "the fork failed (Resource temporarily unavailable)")]
    assert "refused a request: the fork failed" in capfd.readouterr().err


class _Proc:
    pid = 4321

    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


def _kernel_side(tmp_path, log: str, code=None):
    server = forks.ForkServer.__new__(forks.ForkServer)
    server.proc, server.log_path, server._failure = _Proc(code), tmp_path / "log", None
    server.log_path.write_text(log)
    return server


def test_the_status_counts_engines_started_plain_after_a_failed_fork(tmp_path):
    line = "jaxsys fork server: refused a request: the fork failed (Resource ...)\n"
    server = _kernel_side(tmp_path, "started\n" + line * 2)
    assert server.status_line().endswith(
        "2 engine(s) started plain after a failed fork" + f" (see {server.log_path})"
    )
    assert _kernel_side(tmp_path, "").status_line() == "fork server: pid 4321, serving"


def test_the_servers_death_is_said_with_what_to_do_and_its_log_kept(tmp_path):
    server = _kernel_side(tmp_path, "\n".join(f"line {i}" for i in range(40)), code=-9)
    why = server.failure()
    assert "the fork server (pid 4321) was killed by SIGKILL" in why
    assert "%jaxsys restart starts them again as plain engines" in why
    assert why.endswith("line 39") and "line 27" not in why
    server.log_path.unlink()  # the profile goes at stop; what was said stays
    assert server.failure() == why
    assert server.status_line().startswith("fork server: the fork server (pid 4321) was killed")


def test_socket_directories_of_dead_owners_are_removed(tmp_path):
    dead = free_pid()
    stale = tmp_path / f"{forks.SOCKET_DIR_PREFIX}{dead}-abc"
    mine = tmp_path / f"{forks.SOCKET_DIR_PREFIX}{os.getpid()}-def"
    for d in (stale, mine):
        d.mkdir()
        (d / "s").write_text("")
    assert forks.remove_stale_socket_dirs(tmp_path) == [stale]
    assert not stale.exists() and mine.exists()


def test_the_fork_socket_is_listed_by_the_security_audit(tmp_path):
    # Deferred: the audit imports Jupyter's connection helpers, which this file needs nowhere else.
    from jaxsys_kernel.cluster import audit

    server = types.SimpleNamespace(socket_path=str(tmp_path / "s"), pid=4321)
    cluster = types.SimpleNamespace(
        world=types.SimpleNamespace(launcher=types.SimpleNamespace(forks=server))
    )
    (endpoint,) = audit._fork_server_endpoints(cluster)
    assert endpoint.address == server.socket_path and endpoint.pid == 4321
    assert "fork server" in endpoint.name and endpoint.protection != "nothing"
    assert "fork server" in audit.format_audit([endpoint])


def test_jaxsys_status_has_the_fork_servers_line(shell, session, capsys, tmp_path):
    line = "jaxsys fork server: refused a request: the fork failed (Cannot allocate memory)\n"
    session.cluster.world = types.SimpleNamespace(
        launcher=types.SimpleNamespace(forks=_kernel_side(tmp_path, line))
    )
    shell.run_line_magic("jaxsys", "status")
    out = capsys.readouterr().out
    assert "fork server: pid 4321, serving; 1 engine(s) started plain after a failed fork" in out
    session.cluster.world = None
    shell.run_line_magic("jaxsys", "status")
    assert "fork server" not in capsys.readouterr().out


def test_the_stand_in_names_the_variables_of_the_contract():
    # Copied, since the stand-in imports nothing of the package.
    assert forked.PARENT_PID == contract.PARENT_PID
    assert forked.NO_PDEATHSIG == contract.NO_PDEATHSIG


def test_a_plain_engine_is_the_stand_in_in_plain_mode():
    cmd = forks.plain_engine_cmd()
    assert cmd[1:] == ["-S", forked.__file__, forked.PLAIN]
