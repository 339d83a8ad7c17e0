"""Whether this kernel's front end is a terminal, which draws progress differently.

A notebook front end updates a display output in place (``update_display_data``), and a
notebook saved by nbclient keeps one output per display; so a kernel shows a progress bar as
one display. ``jupyter console`` prints a display once and ignores its updates: the bar
would stay at its first frame. It prints stream text as it comes, so there a carriage
return redraws the line, as in any terminal.

The protocol does not say which front end asks. The kernel that ``jupyter console`` starts
is its child, so the parent's command line tells; a console attached to a running kernel
(``--existing``) is not seen, and ``JAXSYS_PROGRESS`` (``stream`` or ``display``) decides
whatever the parent.
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


def parent_command() -> str:
    """The command line of this process's parent, or '' when it cannot be read."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def progress_as_stream(environ: dict[str, str] | None = None, parent: str | None = None) -> bool:
    """Whether progress should be drawn with carriage returns on stdout (a terminal front
    end) rather than as a display updated in place.

    Parameters
    ----------
    environ : dict, optional
        The environment (default: this process's).
    parent : str, optional
        The parent's command line (default: read from ``/proc``).

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
    return any(word in command for word in TERMINALS)


@functools.cache
def _say_ignored(value: str) -> None:
    """Name a value of :data:`PROGRESS_VARIABLE` that means nothing, once per value."""
    print(
        f"jaxsys: {PROGRESS_VARIABLE}={value!r} is neither 'stream' nor 'display'; "
        "progress is drawn as the front end suggests",
        file=sys.stderr,
    )
