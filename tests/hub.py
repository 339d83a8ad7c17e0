"""A JupyterHub whose Labs run in Slurm jobs, for tests: real users, real batchspawner.

:class:`LabHub` makes two users with ``useradd`` (their homes in a temporary folder), and
runs JupyterHub with configurable-http-proxy and jaxsys's shipped configuration
(``share/jaxsys/jupyterhub_config.py``: batchspawner's ``SlurmSpawner``, the port-only
callback) on a private Slurm (tests/slurm.py) whose node is a namespace host. The proxy
listens on 127.0.0.1, the hub's API on the test network's bridge address (the Lab in the
namespace host calls it). Users' jobs run this checkout's venv: the Slurm node's mount
namespace makes its interpreter reachable by them (tests/slurm.py, ``other_users``).

Tests drive everything as a user would, over HTTP: the hub's REST API with a service token
and the users' own tokens, the Lab's REST API and a kernel's websocket through the proxy
(:class:`LabKernel`). Needs root, ``useradd``, ``runuser``, ``configurable-http-proxy`` and
JupyterHub with batchspawner; :func:`available` says what is missing.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import requests

from tests import slurm

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONFIG = ROOT / "share" / "jaxsys" / "jupyterhub_config.py"
# Seconds allowed for the hub to answer, and for a spawn or a stop to complete.
START_S = 60.0
SPAWN_S = 90.0
# How often (s) the hub asks Slurm about each server; small so that a test sees a poll soon.
POLL_S = 1
# Seconds a kernel's lease on its engines' Slurm job lasts unless renewed.
LEASE_TTL_S = 10


def available() -> str | None:
    """Why a hub cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (users made with useradd, jobs submitted as them)"
    missing = [t for t in ("useradd", "userdel", "runuser", "configurable-http-proxy")
               if shutil.which(t) is None]  # fmt: skip
    if missing:
        return f"{', '.join(missing)} not found (configurable-http-proxy: npm install -g configurable-http-proxy)"
    for module in ("jupyterhub", "batchspawner"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[test]')"
    return slurm.available()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_pids(user: str) -> list[int]:
    """Pids of every process running as ``user`` (zombies left out)."""
    uid = pwd.getpwnam(user).pw_uid
    out = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, AttributeError):
            continue
    return out


def wait_for(condition, timeout: float, what: str, step: float = 0.2):
    """``condition()``'s first truthy value; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(step)


class LabHub:
    """JupyterHub with batchspawner on a one-node private Slurm, and two test users.

    Attributes
    ----------
    users : tuple of str
        The two users, ``alice`` first.
    url : str
        The proxy's public URL (``http://127.0.0.1:PORT``).
    dir : Path
        The temporary folder holding the users' homes, the hub's database and logs.
    slurm : slurm.SlurmHosts
        The Slurm the Labs run on.
    """

    __test__ = False

    def __init__(self, *, safe_callback: bool = True):
        tag = secrets.token_hex(3)
        self.users = (f"jxa{tag}", f"jxb{tag}")
        self.safe_callback = safe_callback
        self.dir = Path(tempfile.mkdtemp(prefix="jaxsys-hub-"))
        os.chmod(self.dir, 0o755)
        self.url = ""
        self.service_token = secrets.token_hex(16)
        self._made_users: list[str] = []
        self._hub: subprocess.Popen | None = None
        venv = Path(sys.prefix)
        self.slurm = slurm.SlurmHosts(1, other_users=[str(venv), sys.base_prefix, str(ROOT)])

    def __enter__(self) -> LabHub:
        try:
            self.slurm.__enter__()
            for user in self.users:
                self._useradd(user)
            self._write_config()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- setup ----------------------------------------------------------------------------

    def _useradd(self, user: str) -> None:
        home = self.dir / "home" / user
        home.parent.mkdir(exist_ok=True)
        subprocess.run(["useradd", "-m", "-d", str(home), "-s", "/bin/bash", user],
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        self._made_users.append(user)

    def _write_config(self) -> None:
        self.port, hub_port, api_port = _free_port(), _free_port(), _free_port()
        bridge = self.slurm.hosts.bridge_address
        node_address = self.slurm.hosts.host_addresses[0]
        alice, bob = self.users
        load = f"load_subconfig({str(SHIPPED_CONFIG)!r})" if self.safe_callback else (
            "import batchspawner\nc.JupyterHub.spawner_class = 'batchspawner.SlurmSpawner'\n"
            f"c.SlurmSpawner.batchspawner_singleuser_cmd = {sys.prefix + '/bin/batchspawner-singleuser'!r}\n"
            f"c.SlurmSpawner.cmd = [{sys.prefix + '/bin/jupyterhub-singleuser'!r}]\n"
            "c.SlurmSpawner.req_nprocs = '2'\n"
            f"c.SlurmSpawner.environment = {{'SLURM_CONF': {self.slurm.env['SLURM_CONF']!r}}}"
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        (self.dir / "jupyterhub_config.py").write_text(f"""\
c = get_config()
{load}
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_bind_url = "http://{bridge}:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.pid_file = {str(self.dir / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{self.dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = {str(self.dir / "cookie_secret")!r}
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{{alice!r}, {bob!r}}}
c.JupyterHub.services = [{{"name": "harness", "api_token": {self.service_token!r}}}]
c.JupyterHub.load_roles = [{{"name": "harness", "services": ["harness"],
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "read:users"]}}]
c.JupyterHub.log_level = "DEBUG"
c.SlurmSpawner.exec_prefix = "runuser -m -u {{username}} --"
c.SlurmSpawner.poll_interval = {POLL_S}
c.SlurmSpawner.state_exechost_exp = {node_address!r}
# A lapsed lease ends an engines' job whose kernel is gone: sooner than the default 45 s.
c.SlurmSpawner.environment = {{"SLURM_CONF": {self.slurm.env["SLURM_CONF"]!r},
                              "JAXSYS_LEASE_TTL": "{LEASE_TTL_S}"}}
""")

    def start(self) -> None:
        """Start the hub (and its proxy) and wait until its API answers."""
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.slurm.env)
        env["JAXSYS_HUB_USER_ENV"] = sys.prefix
        env["JAXSYS_HUB_EXEC_PREFIX"] = "runuser -m -u {username} --"
        env["JAXSYS_HUB_RUNTIME"] = "00:30:00"
        log = open(self.dir / "hub.log", "ab")  # noqa: SIM115  (kept open by the hub)
        self._hub = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.dir / "jupyterhub_config.py")],
            cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()

        def answers() -> bool:
            if self._hub.poll() is not None:
                raise RuntimeError(f"the hub exited: {self.log_tail()}")
            try:
                return requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(answers, START_S, "the hub answering")

    def kill_hub(self) -> None:
        """SIGKILL the hub (its proxy and the Labs stay)."""
        os.kill(self._hub.pid, signal.SIGKILL)
        self._hub.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the hub's log."""
        path = self.dir / "hub.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "".join(text.splitlines(True)[-lines:])

    def hub_log(self) -> str:
        """The hub's whole log."""
        return (self.dir / "hub.log").read_text(errors="replace")

    # -- the hub's REST API ---------------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        """A request to ``/hub/api/<path>`` with ``token`` (the service's by default)."""
        headers = {"Authorization": f"token {token or self.service_token}"}
        return requests.request(method, f"{self.url}/hub/api/{path}", headers=headers,
                                timeout=30, **kw)  # fmt: skip

    def user_token(self, user: str) -> str:
        """A new API token of ``user`` (access to her own server)."""
        r = self.api("POST", f"users/{user}/tokens", json={"note": "test"})
        assert r.status_code in (200, 201), r.text
        return r.json()["token"]

    def server(self, user: str) -> dict | None:
        """The hub's model of ``user``'s default server, or None."""
        r = self.api("GET", f"users/{user}")
        assert r.status_code == 200, r.text
        return r.json().get("servers", {}).get("")

    def spawn(self, user: str) -> float:
        """Start ``user``'s Lab (a Slurm job) and wait until it is ready; seconds taken."""
        t0 = time.monotonic()
        r = self.api("POST", f"users/{user}/server")
        assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{self.log_tail()}"
        wait_for(lambda: (self.server(user) or {}).get("ready"), SPAWN_S,
                 f"{user}'s server ready\n{self.log_tail()}")  # fmt: skip
        return time.monotonic() - t0

    def ensure_server(self, user: str) -> None:
        """Spawn ``user``'s Lab unless it runs and is ready."""
        model = self.server(user)
        if model and model.get("ready"):
            return
        if model:
            self.stop(user)
        self.spawn(user)

    def stop(self, user: str) -> float:
        """Stop ``user``'s Lab through the hub; seconds until the hub says it is gone."""
        t0 = time.monotonic()
        r = self.api("DELETE", f"users/{user}/server")
        assert r.status_code in (202, 204), f"{r.status_code} {r.text}"
        wait_for(lambda: self.server(user) is None, SPAWN_S, f"{user}'s server gone")
        return time.monotonic() - t0

    def job_of(self, user: str) -> list[str]:
        """``JOBID NAME STATE`` of every job of ``user`` in the queue."""
        r = subprocess.run(["squeue", "-h", "-u", user, "-o", "%i %j %T"],
                           capture_output=True, text=True, timeout=10, env={**os.environ, **self.slurm.env})  # fmt: skip
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def server_token(self, user: str) -> str:
        """The token of ``user``'s running server, read from its process's environment, as
        she can read it herself."""
        uid = pwd.getpwnam(user).pw_uid
        for p in psutil.process_iter(["uids", "cmdline"]):
            try:
                if p.info["uids"].real != uid:
                    continue
                if any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or []):
                    token = p.environ().get("JUPYTERHUB_API_TOKEN")
                    if token:
                        return token
            except psutil.Error:
                continue
        raise AssertionError(f"no running server of {user} found")

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the Labs, the hub and its proxy; cancel the users' jobs, remove the users,
        the Slurm and the folder."""
        if self._hub is not None and self._hub.poll() is None:
            for user in self.users:
                try:
                    if self.server(user):
                        self.stop(user)
                except (AssertionError, requests.RequestException):
                    pass
            os.killpg(self._hub.pid, signal.SIGTERM)
            try:
                self._hub.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self._hub.pid, signal.SIGKILL)
                self._hub.wait(5)
        self._kill_proxy()
        for user in self._made_users:
            if self.slurm.env:
                subprocess.run(["scancel", "-s", "KILL", "-u", user], capture_output=True,
                               timeout=10, check=False, env={**os.environ, **self.slurm.env})  # fmt: skip
            for pid in user_pids(user):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            subprocess.run(["userdel", "-r", "-f", user], capture_output=True, timeout=30,
                           check=False)  # fmt: skip
        self._made_users = []
        self.slurm.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_proxy(self) -> None:
        pid_file = self.dir / "proxy.pid"
        try:
            pid = int(pid_file.read_text().strip())
            p = psutil.Process(pid)
            if "configurable-http-proxy" in " ".join(p.cmdline()):
                p.kill()
        except (OSError, ValueError, psutil.Error):
            pass


class LabKernel:
    """A kernel in a user's Lab, driven over the Lab's REST API and the kernel websocket.

    Parameters
    ----------
    hub : LabHub
    user : str
    token : str
        ``user``'s API token.
    name : str
        The kernelspec.
    """

    __test__ = False

    def __init__(self, hub: LabHub, user: str, token: str, name: str = "jaxsys"):
        self.base = f"{hub.url}/user/{user}/api"
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(f"{self.base}/kernels", json={"name": name}, headers=self.headers,
                          timeout=30)  # fmt: skip
        assert r.status_code == 201, f"{r.status_code} {r.text}"
        self.id = r.json()["id"]
        self.session = uuid.uuid4().hex
        self.connect()

    def connect(self) -> None:
        """Open the kernel's websocket (again, after a proxy that carried it went away)."""
        import websocket

        ws_url = self.base.replace("http://", "ws://") + f"/kernels/{self.id}/channels"
        # The server answers the handshake once the kernel is up (its imports take seconds).
        self.ws = websocket.create_connection(ws_url, header=self.headers, timeout=120)
        self.ws.settimeout(5)

    def execute(self, code: str, timeout: float = 120.0) -> tuple[str, str | None]:
        """Run ``code``; its printed text, and the error's name and value or None."""
        import websocket

        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session,
                       "username": "test", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        text, error, idle, replied = [], None, False, False
        deadline = time.monotonic() + timeout
        while not (idle and replied):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no reply within {timeout:g} s to {code!r}; so far: {''.join(text)}"
                )
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                replied = True
        return "".join(text), error

    def ok(self, code: str, timeout: float = 120.0) -> str:
        """Run ``code``, fail on an error; its printed text."""
        text, error = self.execute(code, timeout)
        assert error is None, f"{code!r} failed: {error}\n{text}"
        return text

    def close(self) -> None:
        """Close the websocket and shut the kernel down (if it still runs)."""
        self.ws.close()
        requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30)
