"""A dashboard's cluster never outlives its page.

Voilà starts one kernel per page view, and so one cluster per visitor. When the page is
closed, Voilà's own beacon asks its server to shut the kernel down, and the server refuses
it (the beacon carries no XSRF token): the kernel and every process of its cluster would
then run until Voilà stops. A kernel started by Voilà (it says so in ``SERVER_SOFTWARE``)
therefore watches its own page: every :data:`POLL_S` seconds it asks Voilà's server, on
loopback, how many front ends are connected to it and when it last had traffic
(``GET /api/kernels/<id>``). Once a page has connected and then none has been, and the kernel
has had no traffic, for :data:`IDLE_S` seconds (:data:`NEVER_S` when no page has connected:
one closed as soon as it loaded may come and go between two questions), it asks the server
to shut it down (``DELETE`` on the same
address, with a token of its own as both XSRF cookie and header); the server's shutdown
request then stops the cluster as any kernel shutdown does. If the server cannot be asked,
the kernel stops its cluster itself.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

# Seconds between two questions to the server (one loopback request each).
POLL_S = 2.0
# Seconds with no page connected, after one was, before the kernel asks to be shut down;
# the variable, when set to positive seconds, gives another (a test, a busy server).
IDLE_S = 20.0
IDLE_VARIABLE = "JAXSYS_PAGE_IDLE_S"
# Seconds without a page and without traffic before a kernel no page has been seen on
# gives up (the notebook's execution, while the page waits for it, is traffic).
NEVER_S = 60.0
# The most a poll may read from the server (the kernel model is a few hundred bytes).
MAX_REPLY = 64 * 1024


# Loopback only: a proxy named in the environment must not see these requests.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def voila_kernel_url(env: dict[str, str], connection_file: str) -> str | None:
    """The address of this kernel's model on the Voilà server that started it, else None.

    Examples
    --------
    >>> voila_kernel_url({"SERVER_SOFTWARE": "voila/0.5.13", "VOILA_APP_PORT": "8866",
    ...                   "VOILA_BASE_URL": "/"}, "/tmp/kernel-ab12.json")
    'http://127.0.0.1:8866/api/kernels/ab12'
    """
    if not env.get("SERVER_SOFTWARE", "").startswith("voila/"):
        return None
    port = env.get("VOILA_APP_PORT", "")
    name = os.path.basename(connection_file or "")
    if not port.isdigit() or not (name.startswith("kernel-") and name.endswith(".json")):
        return None
    kernel_id = name[len("kernel-") : -len(".json")]
    base = "/" + env.get("VOILA_BASE_URL", "/").strip("/")
    base = base.rstrip("/") + "/"
    return f"http://127.0.0.1:{port}{base}api/kernels/{kernel_id}"


def idle_seconds(env: dict[str, str]) -> float:
    """Seconds a closed page's kernel waits: ``JAXSYS_PAGE_IDLE_S`` if it holds positive
    seconds, else :data:`IDLE_S` (a value that is not is named on stderr).

    Examples
    --------
    >>> idle_seconds({"JAXSYS_PAGE_IDLE_S": "5"}), idle_seconds({})
    (5.0, 20.0)
    """
    raw = env.get(IDLE_VARIABLE, "").strip()
    if not raw:
        return IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        print(
            f"jaxsys: {IDLE_VARIABLE}={raw[:40]!r} is not a positive number of seconds; "
            f"a closed page's kernel waits {IDLE_S:g} s",
            file=sys.__stderr__,
        )
        return IDLE_S
    return value


def _ask(url: str) -> tuple[int | None, str]:
    """How many front ends the server says are connected (None if it cannot say), and
    when the kernel last had traffic as the server writes it."""
    try:
        with _LOOPBACK.open(url, timeout=5.0) as reply:
            model = json.loads(reply.read(MAX_REPLY))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(model, dict):
        return None, ""
    count = model.get("connections")
    return (count if isinstance(count, int) else None), str(model.get("last_activity"))[:64]


def _ask_shutdown(url: str) -> bool:
    """Ask the server to shut this kernel down; whether it agreed."""
    token = secrets.token_hex(16)
    request = urllib.request.Request(
        url, method="DELETE", headers={"X-XSRFToken": token, "Cookie": f"_xsrf={token}"}
    )
    try:
        with _LOOPBACK.open(request, timeout=30) as reply:
            return 200 <= reply.status < 300
    except OSError:
        return False


class PageWatch:
    """Follows the page of one kernel started by Voilà and ends the kernel after it.

    Parameters
    ----------
    url : str
        This kernel's model on the Voilà server (:func:`voila_kernel_url`).
    stop_cluster : callable
        Stops the kernel's cluster; called when the server cannot shut the kernel down.
    clock : callable
        The monotonic clock.
    idle_s : float
        Seconds without a page, after one was seen, before the kernel ends.
    """

    def __init__(
        self,
        url: str,
        stop_cluster: Callable[[], None],
        clock=time.monotonic,
        idle_s: float = IDLE_S,
    ):
        self.url = url
        self.idle_s = idle_s
        self.stop_cluster = stop_cluster
        self.clock = clock
        self.started = clock()
        self.seen_page = False
        self.alone_since: float | None = None
        self.activity = ""
        self.quiet_since = self.started
        self.done = False

    def step(self, connections: int | None, activity: str = "") -> bool:
        """Take one answer from the server; True once the kernel should end."""
        now = self.clock()
        if connections is None:
            return False
        if activity != self.activity:
            self.activity, self.quiet_since = activity, now
        if connections > 0:
            self.seen_page, self.alone_since = True, None
            return False
        if self.alone_since is None:
            self.alone_since = now
        limit = self.idle_s if self.seen_page else NEVER_S
        return now - max(self.alone_since, self.quiet_since) >= limit

    def end(self) -> None:
        """Ask the server to shut the kernel down; stop the cluster here if it will not."""
        self.done = True
        print("jaxsys: the page is closed; this dashboard's cluster stops", file=sys.__stderr__)
        if not _ask_shutdown(self.url):
            self.stop_cluster()

    def run(self) -> None:
        while not self.done:
            time.sleep(POLL_S)
            if self.step(*_ask(self.url)):
                self.end()


def watch_page(kernel) -> PageWatch | None:
    """Start following the page when ``kernel`` was started by Voilà; None otherwise."""
    # Deferred: only a kernel (never the magics' tests) has a connection file.
    from ipykernel.connect import get_connection_file

    try:
        connection_file = get_connection_file()
    except (RuntimeError, AttributeError):
        return None
    url = voila_kernel_url(dict(os.environ), connection_file)
    if url is None:
        return None
    watch = PageWatch(url, kernel.jaxsys.shutdown, idle_s=idle_seconds(dict(os.environ)))
    threading.Thread(target=watch.run, name="jaxsys-page-watch", daemon=True).start()
    return watch


__all__ = ["PageWatch", "idle_seconds", "voila_kernel_url", "watch_page"]
