"""Drive a real JupyterLab in headless chromium from the tests.

The module has two halves. :class:`Lab` runs a private JupyterLab server on loopback, with
its own settings, runtime and data directories, and takes it down again, kernels included.
The helpers below it (:func:`open_notebook`, :func:`run_all`, :func:`run_cell`,
:func:`wait_for`, :func:`wait_idle`, :func:`screenshot`) work on a page of playwright's
synchronous API.

The browser is Debian's chromium (``apt-get install chromium``); playwright's own browser
download is never used. :func:`launch` starts it with the flags that are needed when running
as root in a container.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

#: The browser binary; override with the ``CHROMIUM`` environment variable.
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

#: Flags for chromium: headless, as root, and without any traffic of its own.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: Where :func:`screenshot` puts relative paths (git-ignored).
ARTIFACTS = Path(__file__).parents[1] / "artifacts"

# Lab settings that keep pop-ups out of the page: no "get Jupyter news?" toast and no
# update check. The file name is the plugin id's second half.
_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

# Environment variables that point Jupyter and IPython at per-user state. Lab gets its own
# copies so that nothing in ~/.jupyter, ~/.local/share/jupyter or ~/.ipython leaks in.
# sys.prefix/share/jupyter, where the jaxsys kernelspec and the widget labextensions are
# installed, stays on the search path: jupyter_core always appends it (ENV_JUPYTER_PATH).
_STATE_DIRS = {
    "JUPYTER_CONFIG_DIR": "config",
    "JUPYTER_RUNTIME_DIR": "runtime",
    "JUPYTER_DATA_DIR": "data",
    "JUPYTERLAB_SETTINGS_DIR": "settings",
    "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
    "IPYTHONDIR": "ipython",
}
# Extra search paths a user may have set; dropped so the server sees only the venv's files.
_DROPPED_VARS = ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH")


def available() -> str | None:
    """Say why browser tests cannot run here, or ``None`` if they can.

    Returns
    -------
    str or None
        A reason suitable for ``pytest.skip``, or ``None`` when both chromium and the
        playwright package are present.
    """
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    return None


# Talk to the server directly, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:150]}"
    except psutil.Error:
        return str(p.pid)


class Lab:
    """A private JupyterLab server on 127.0.0.1, used as a context manager.

    The server runs in its own process group with a random token. Its settings, runtime,
    data, workspace and IPython directories live under ``work_dir``, so a user's own
    configuration cannot change what the tests see, while the environment's
    ``share/jupyter`` (kernelspecs, prebuilt labextensions) is still found.

    Processes inherit this process's environment, so a test tag in ``os.environ`` reaches
    the server, its kernels and whatever those start.

    Parameters
    ----------
    root_dir : path-like
        The directory the server serves notebooks from.
    work_dir : path-like, optional
        Where to keep the server's state and its log. A temporary directory, removed on
        :meth:`close`, when not given.
    start_timeout : float
        Seconds to wait for ``/api/status`` to answer.
    stop_timeout : float
        Seconds to wait for the server (and then for its kernels) to exit before SIGKILL.
    extra_args : sequence of str, optional
        More command-line options for ``jupyter lab``.

    Attributes
    ----------
    url : str
        The server's base URL, ending in ``/``.
    token : str
        The token a browser or REST client must present.
    log_path : pathlib.Path
        The server's combined stdout and stderr.
    killed : list of str
        After :meth:`close`: processes that had to be SIGKILLed because they outlived the
        server's own shutdown (kernels or their children). Empty when all went well.
    """

    def __init__(
        self,
        root_dir,
        work_dir=None,
        start_timeout: float = 60.0,
        stop_timeout: float = 20.0,
        extra_args=(),
    ):
        self.root_dir = Path(root_dir)
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="jaxsys-lab-"))
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args)
        self.token = secrets.token_hex(16)
        self.port = 0
        self.url = ""
        self.log_path = self.work_dir / "lab.log"
        self.killed: list[str] = []
        self._proc: subprocess.Popen | None = None

    # -- life cycle --------------------------------------------------------------------

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var in _DROPPED_VARS:
            env.pop(var, None)
        for var, sub in _STATE_DIRS.items():
            path = self.work_dir / sub
            path.mkdir(parents=True, exist_ok=True)
            env[var] = str(path)
        for name, value in _SETTINGS.items():
            f = self.work_dir / _STATE_DIRS["JUPYTERLAB_SETTINGS_DIR"] / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(value))
        return env

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            # Fail rather than silently move to another port than the one we poll.
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            # window.jupyterapp lets the helpers read kernel state and run commands.
            "--LabApp.expose_app_in_browser=True",
            # Nothing that reaches beyond loopback.
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start the server and wait until its REST API answers.

        Raises
        ------
        RuntimeError
            If the server exits or does not answer within ``start_timeout`` seconds; the
            message ends with the tail of its log.
        """
        env = self._env()
        deadline = time.monotonic() + self.start_timeout
        for _attempt in range(3):  # another process may grab the free port in between
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}/"
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.root_dir,
                    start_new_session=True,
                )
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break
                try:
                    self.api("GET", "api/status", timeout=2)
                    return
                except OSError:
                    time.sleep(0.2)
            if self._proc.poll() is None:
                break  # still running but silent: a timeout, not a port clash
            if "already in use" not in self.log_tail():
                break
        tail = self.log_tail()
        self.close()
        raise RuntimeError(f"JupyterLab did not come up on {self.url}:\n{tail}")

    def close(self) -> None:
        """Shut every kernel down, stop the server, and make sure no child outlives it.

        Kernels run in sessions of their own, so a signal to the server's process group
        does not reach them. They are therefore deleted through the REST API first (the
        kernel then stops its cluster), and the server is stopped with SIGTERM, after
        which it shuts down any kernel still left. Whatever the server started and is
        still alive ``stop_timeout`` seconds later is SIGKILLed and listed in
        :attr:`killed`. Safe to call more than once.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        children: list[psutil.Process] = []
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(proc.pid).children(recursive=True)
            with contextlib.suppress(OSError, ValueError):
                for k in self.kernels():
                    with contextlib.suppress(OSError):
                        self.api("DELETE", f"api/kernels/{k['id']}", timeout=self.stop_timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        _gone, alive = psutil.wait_procs(children, timeout=self.stop_timeout)
        for p in alive:
            self.killed.append(_describe(p))
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- REST ----------------------------------------------------------------------------

    def api(self, method: str, path: str, body=None, timeout: float = 10.0):
        """Call the server's REST API.

        Parameters
        ----------
        method : str
            HTTP method, e.g. ``"GET"``.
        path : str
            Path below the base URL, e.g. ``"api/kernels"``.
        body : object, optional
            Sent as JSON.
        timeout : float
            Seconds for the whole request.

        Returns
        -------
        object or None
            The decoded JSON reply, or ``None`` for an empty one.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with _OPENER.open(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def kernels(self) -> list[dict]:
        """The server's running kernels, as ``/api/kernels`` lists them."""
        return self.api("GET", "api/kernels")

    def kernelspecs(self) -> list[str]:
        """Names of the kernelspecs the server can start."""
        return sorted(self.api("GET", "api/kernelspecs")["kernelspecs"])

    def page_url(self, path: str = "lab") -> str:
        """A browser URL for ``path`` below the base URL, carrying the token."""
        sep = "&" if "?" in path else "?"
        return f"{self.url}{path}{sep}token={self.token}"

    def log_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


# -- browser ----------------------------------------------------------------------------


@contextlib.contextmanager
def launch(width: int = 1400, height: int = 900):
    """Start chromium under playwright and yield a fresh page.

    Parameters
    ----------
    width, height : int
        The viewport in CSS pixels.

    Yields
    ------
    playwright.sync_api.Page
        A page in a new context with its own temporary profile.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            yield context.new_page()
        finally:
            browser.close()


_KERNEL_STATUS = (
    "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status"
)


def open_notebook(page, lab: Lab, name: str, timeout: float = 120.0) -> None:
    """Open notebook ``name`` (relative to the root dir) and wait for an idle kernel.

    Parameters
    ----------
    page : playwright.sync_api.Page
    lab : Lab
    name : str
        Path of the notebook below ``lab.root_dir``.
    timeout : float
        Seconds for the page to load and the kernel to reach ``idle``.
    """
    page.goto(lab.page_url(f"lab/tree/{name}"), timeout=timeout * 1000)
    page.wait_for_function(f"({_KERNEL_STATUS})() === 'idle'", timeout=timeout * 1000)
    # A visible cell: Lab restores the notebooks open before, whose hidden panels may come
    # first in the page.
    wait_for(page, ".jp-NotebookPanel .jp-Cell >> visible=true", timeout)


def _command(page, command: str) -> None:
    page.evaluate("(c) => window.jupyterapp.commands.execute(c)", command)


def run_all(page) -> None:
    """Run every cell of the current notebook (Lab's ``notebook:run-all-cells``).

    This only queues the cells; follow it with :func:`wait_idle` or :func:`wait_for`.
    """
    _command(page, "notebook:run-all-cells")


def run_cell(page, index: int) -> None:
    """Make cell ``index`` of the current notebook active and run it.

    Like :func:`run_all`, this returns once the cell is queued.
    """
    page.evaluate(
        "(i) => { window.jupyterapp.shell.currentWidget.content.activeCellIndex = i; }", index
    )
    _command(page, "notebook:run-cell")


def wait_idle(page, timeout: float = 120.0) -> None:
    """Wait until no cell of the current notebook is queued or running and the kernel idles.

    Parameters
    ----------
    page : playwright.sync_api.Page
    timeout : float
        Seconds.
    """
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " if (w?.sessionContext?.session?.kernel?.status !== 'idle') return false;"
        " return ![...w.node.querySelectorAll('.jp-InputArea-prompt')]"
        "   .some(p => p.textContent.includes('*')); }",
        timeout=timeout * 1000,
    )


#: Selector of one output of a notebook cell.
OUTPUT = ".jp-OutputArea-output"


def assert_no_errors(page) -> None:
    """Fail if any cell of the open notebook shows an error output."""
    errors = page.locator("[data-mime-type='application/vnd.jupyter.error']")
    assert errors.count() == 0, errors.all_inner_texts()


def open_sidebar(page, ready: str = "#jaxsys-sidebar", timeout: float = 120.0) -> None:
    """Click the jaxsys status item and wait for ``ready`` in the sidebar it opens.

    The item shows once the kernel's jaxsys comm has answered, which on a loaded machine
    can come well after the kernel is idle: both waits end on their condition, within
    ``timeout`` seconds.
    """
    page.locator("#jaxsys-status").click(timeout=timeout * 1000)
    wait_for(page, ready, timeout)


def wait_for(page, selector: str, timeout: float = 30.0):
    """Wait for the first element matching ``selector`` to be visible.

    Parameters
    ----------
    page : playwright.sync_api.Page
    selector : str
        A playwright selector, e.g. ``".jp-OutputArea-output:has-text('hi')"``.
    timeout : float
        Seconds.

    Returns
    -------
    playwright.sync_api.Locator
        The element found.
    """
    loc = page.locator(selector).first
    loc.wait_for(state="visible", timeout=timeout * 1000)
    return loc


def screenshot(page, path) -> Path:
    """Save a full-page screenshot; a relative ``path`` goes under ``tests/artifacts/``.

    Returns
    -------
    pathlib.Path
        Where the image was written.
    """
    path = Path(path)
    if not path.is_absolute():
        path = ARTIFACTS / path
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    return path


def describe_notebook(page) -> str:
    """What the page shows, for a failing test's report: the kernel's status, each cell's
    prompt and outputs, and the jaxsys sidebar's message and log where it is open.

    A page that cannot be read says so instead of raising over the real failure.
    """
    try:
        return page.evaluate(
            "() => { const w = window.jupyterapp?.shell?.currentWidget;"
            " const out = [`kernel: ${w?.sessionContext?.session?.kernel?.status}`];"
            " for (const [i, c] of [...document.querySelectorAll('.jp-Cell')].entries()) {"
            "   const p = c.querySelector('.jp-InputArea-prompt')?.textContent ?? '';"
            "   const o = [...c.querySelectorAll('.jp-OutputArea-output')]"
            "     .map(n => n.textContent).join(' | ');"
            "   out.push(`cell ${i} ${p} ${o.slice(-2000)}`); }"
            " const s = document.querySelector('#jaxsys-sidebar');"
            " if (s) { out.push('sidebar message: ' +"
            "   (s.querySelector('.jaxsys-message')?.textContent ?? ''));"
            "   out.push('sidebar log:\\n' + (s.querySelector('.jaxsys-log')?.textContent ?? '')); }"
            " return out.join('\\n'); }"
        )
    except Exception as e:  # noqa: BLE001 - the report must not hide the failure
        return f"(the page could not be read: {e})"
