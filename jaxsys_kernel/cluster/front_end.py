"""Whether this kernel's front end is a terminal, which draws progress differently.

A notebook front end updates a display output in place (``update_display_data``), and a
notebook saved by nbclient keeps one output per display; so a kernel shows a progress bar as
one display. ``jupyter console`` prints a display once and ignores its updates: the bar
would stay at its first frame. It prints stream text as it comes, so there a carriage
return redraws the line, as in any terminal.

The protocol does not say which front end asks. The kernel that ``jupyter console`` starts
is its child, so the parent's command line tells. A console attached to a running kernel
(``jupyter console --existing``) is no parent: it is found as the process at the other end
of a TCP connection to the kernel's shell port (``/proc/net/tcp`` names the connection's
socket, a process's ``/proc/PID/fd`` the socket's owner; both bounded). When a console and
a notebook share a kernel, the console's carriage returns win: a notebook draws them too,
a console never draws a display's updates. ``JAXSYS_PROGRESS`` (``stream`` or ``display``)
decides whatever the front ends.
"""

from __future__ import annotations

import functools
import os
import sys

#: Overrides the guess: ``stream`` (carriage returns on stdout) or ``display``.
PROGRESS_VARIABLE = "JAXSYS_PROGRESS"
#: The words in a parent's command line that mark a terminal front end.
TERMINALS = ("jupyter-console", "jupyter_console")
#: A command line longer than this is read only this far (it is only searched).
MAX_CMDLINE = 4096
#: Processes looked at for the owner of a connection to the kernel (a bounded scan).
MAX_PROCESSES = 4096
#: Lines of ``/proc/net/tcp`` read (each a connection of this network namespace).
MAX_CONNECTIONS = 20_000
#: The socket state of an established TCP connection in ``/proc/net/tcp``.
ESTABLISHED = "01"


def parent_command() -> str:
    """The command line of this process's parent, or '' when it cannot be read."""
    return command_of(os.getppid())


def progress_as_stream(environ: dict[str, str] | None = None, parent: str | None = None) -> bool:
    """Whether progress should be drawn with carriage returns on stdout (a terminal front
    end) rather than as a display updated in place.

    Parameters
    ----------
    environ : dict, optional
        The environment (default: this process's).
    parent : str, optional
        The parent's command line (default: read from ``/proc``, and then the processes
        connected to the kernel are looked at too).

    Examples
    --------
    >>> progress_as_stream({}, "/usr/bin/python3 /venv/bin/jupyter-console --kernel jaxsys")
    True
    >>> progress_as_stream({"JAXSYS_PROGRESS": "display"}, "jupyter-console")
    False
    """
    env = os.environ if environ is None else environ
    chosen = env.get(PROGRESS_VARIABLE, "").strip().lower()
    if chosen in ("stream", "display"):
        return chosen == "stream"
    if chosen:
        _say_ignored(env[PROGRESS_VARIABLE])
    command = parent_command() if parent is None else parent
    if any(word in command for word in TERMINALS):
        return True
    return parent is None and any(
        any(word in command_of(pid) for word in TERMINALS) for pid in attached_processes()
    )


def command_of(pid: int) -> str:
    """The command line of process ``pid``, or '' when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def kernel_ports() -> set[int]:
    """The shell port of this kernel when it listens on TCP (empty outside a kernel)."""
    try:
        # Deferred: only a kernel has an app to ask (and `jaxsys cluster start` no ipykernel).
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return set()
    if not IPKernelApp.initialized():
        return set()
    app = IPKernelApp.instance()
    return {app.shell_port} if app.transport == "tcp" and app.shell_port else set()


def client_sockets(ports: set[int], tables=("/proc/net/tcp", "/proc/net/tcp6")) -> set[str]:
    """The socket inodes of established connections to one of ``ports`` from their
    client's side (its local port is not one of them)."""
    inodes = set()
    for table in tables:
        try:
            with open(table) as f:
                lines = [line for _, line in zip(range(MAX_CONNECTIONS + 1), f, strict=False)]
        except OSError:
            continue
        for line in lines[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED:
                continue
            local, remote = (int(a.rpartition(":")[2], 16) for a in fields[1:3])
            if remote in ports and local not in ports:
                inodes.add(fields[9])
    return inodes


def attached_processes(ports: set[int] | None = None) -> list[int]:
    """The processes connected to this kernel's shell port (a console with ``--existing``,
    a notebook server...), found through their sockets; empty outside a kernel."""
    ports = kernel_ports() if ports is None else ports
    inodes = client_sockets(ports) if ports else set()
    if not inodes:
        return []
    return _owners(frozenset(f"socket:[{i}]" for i in inodes))


@functools.lru_cache(maxsize=8)
def _owners(links: frozenset[str]) -> list[int]:
    """The processes holding one of the sockets ``links`` (cached: connections outlive
    many progress bars)."""
    found = []
    pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for pid in pids[:MAX_PROCESSES]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in links:
                    found.append(int(pid))
                    break
            except OSError:
                continue
    return found


@functools.cache
def _say_ignored(value: str) -> None:
    """Name a value of :data:`PROGRESS_VARIABLE` that means nothing, once per value."""
    print(
        f"jaxsys: {PROGRESS_VARIABLE}={value!r} is neither 'stream' nor 'display'; "
        "progress is drawn as the front end suggests",
        file=sys.stderr,
    )
