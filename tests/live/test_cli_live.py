"""The jaxsys command line: install-kernel, run, cluster start|status|stop, lab."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from ..harness import write_notebook

ROOT = Path(__file__).parents[2]
JAXSYS = [sys.executable, "-m", "jaxsys_kernel.cli"]


def jaxsys(*args, env=None, timeout=180):
    return subprocess.run(
        [*JAXSYS, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_install_kernel_into_prefix(tmp_path):
    r = jaxsys("install-kernel", "--prefix", str(tmp_path), "--hosts", "3")
    assert r.returncode == 0, r.stderr
    spec = json.loads((tmp_path / "share/jupyter/kernels/jaxsys/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert spec["argv"][1:3] == ["-m", "jaxsys_kernel"]
    assert spec["env"]["JAXSYS_HOSTS"] == "3"
    assert spec["interrupt_mode"] == "signal"


def test_run_failing_notebook_exits_1_and_names_the_cell(tag, tmp_path):
    path = tmp_path / "bad.ipynb"
    write_notebook(
        path,
        [
            "%jaxsys start --hosts 2 --devices-per-host 1",
            "%%multihost\nimport jax\nif jax.process_index() == 1:\n    raise KeyError('broken-cell')",
            "print('never reached')",
        ],
    )
    r = jaxsys("run", str(path), "--output", str(tmp_path / "out.ipynb"))
    assert r.returncode == 1
    assert "broken-cell" in r.stderr and "KeyError on p1" in r.stderr
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[1].outputs and not out.cells[2].get("outputs")


def test_run_missing_notebook():
    r = jaxsys("run", "/no/such/notebook.ipynb")
    assert r.returncode == 2 and "no such notebook" in r.stderr


def test_cluster_start_status_stop(tag, tmp_path):
    env = dict(os.environ, JAXSYS_STATE_DIR=str(tmp_path))
    try:
        r = jaxsys("cluster", "start", "--hosts", "2", "--devices-per-host", "1", env=env)
        assert r.returncode == 0, r.stderr
        assert "ready: 2 processes" in r.stdout
        r = jaxsys("cluster", "status", env=env)
        assert r.returncode == 0, r.stdout
        lines = r.stdout.splitlines()
        assert "ready" in lines[0]
        # The process rows, then the line on memory per process.
        assert [ln.split()[0] for ln in lines[2:4]] == ["0", "1"]
        assert lines[4].startswith("memory:")
        state = json.loads((tmp_path / "default.json").read_text())
        # A script can drive the cluster through its ipyparallel connection file.
        import ipyparallel as ipp

        client = ipp.Client(state["connection_file"])
        try:
            assert sorted(client.ids) == [0, 1]
        finally:
            client.close()
        r = jaxsys("cluster", "start", "--hosts", "2", env=env)
        assert r.returncode == 1 and "already running" in r.stderr
    finally:
        r = jaxsys("cluster", "stop", env=env)
    assert r.returncode == 0 and "stopped" in r.stdout
    assert jaxsys("cluster", "status", env=env).returncode == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_lab_serves_the_kernel_and_the_notebooks(tag, tmp_path):
    port = _free_port()
    token = "jaxsys-test-token"
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
    )
    proc = subprocess.Popen(
        [
            *JAXSYS,
            "lab",
            "--notebook-dir",
            str(ROOT / "notebooks"),
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )

    def get(path):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = get("/api/kernelspecs")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(
                        f"JupyterLab did not come up: {proc.stderr.read1().decode()[-2000:]}"
                    ) from None
                time.sleep(0.3)
        specs = json.loads(body)["kernelspecs"]
        assert "jaxsys" in specs
        assert specs["jaxsys"]["spec"]["interrupt_mode"] == "signal"
        status, body = get("/api/contents/00-quickstart.ipynb")
        assert status == 200 and json.loads(body)["name"] == "00-quickstart.ipynb"
        status, body = get("/lab")
        assert status == 200 and b"JupyterLab" in body
        # ipyparallel's own cluster panel is off in this Lab (clusters come from jaxsys).
        page = body.decode()
        start = page.index('id="jupyter-config-data"')
        config = json.loads(page[page.index(">", start) + 1 : page.index("</script>", start)])
        assert "ipyparallel-labextension" in config["disabledExtensions"], config
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "jaxsys lab runs JupyterLab as its child"
        # SIGTERM to jaxsys lab alone (not its group): the server goes with it.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"still running after jaxsys lab: {[p.cmdline() for p in alive]}"
        log = proc.stderr.read().decode()
        if os.geteuid() == 0:
            assert "--allow-root is passed" in log
        assert "ipyparallel" not in log.split("ipyparallel's own cluster panel is off")[-1], log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=20)



@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user (setpriv)")
def test_an_installed_kernelspec_is_listed_for_every_user():
    # A shared install: another user's Jupyter must find and read the spec. The check runs
    # as `nobody` with the shell, as this machine's interpreter lives in root's 0700 home.
    if not Path("/usr/bin/setpriv").exists():
        pytest.skip("setpriv (util-linux) is missing")
    prefix = Path(tempfile.mkdtemp(prefix="jaxsys-shared-prefix-"))
    try:
        prefix.chmod(0o755)
        r = jaxsys("install-kernel", "--prefix", str(prefix))
        assert r.returncode == 0, r.stderr
        kernels = prefix / "share/jupyter/kernels"
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        listing = subprocess.run(
            [*as_nobody, "sh", "-c", f"ls {kernels} && cat {kernels}/jaxsys/kernel.json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.splitlines()[0] == "jaxsys"
        assert json.loads(listing.stdout.split("\n", 1)[1])["language"] == "python"
    finally:
        shutil.rmtree(prefix)


def _texts(output) -> str:
    if output.output_type == "stream":
        return output.text
    return output.get("data", {}).get("text/plain", "")


def test_a_saved_notebook_holds_one_output_per_progress_bar(tag, tmp_path):
    # nbclient-based tools save every output a kernel sends: a bar drawn with carriage
    # returns on a stream would be saved frame by frame.
    path = tmp_path / "start.ipynb"
    write_notebook(path, ["%jaxsys start --hosts 2 --devices-per-host 1", "%%multihost\n1 + 1"])
    r = subprocess.run(
        [str(Path(sys.executable).with_name("jupyter")), "execute", "--inplace", str(path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    texts = [_texts(o) for o in outputs]
    assert not [t for t in texts if "\r" in t], texts
    registered = [t for t in texts if "engines registered" in t]
    assert len(registered) == 1 and registered[0].startswith("engines registered 2/2"), texts
