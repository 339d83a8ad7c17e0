"""Native output of an engine: whole lines, chatter kept out of cells, a log of everything.

ipykernel captures fd 1 and fd 2 and feeds what native code writes there into the same
stream as Python's ``print``, chunk by chunk; gloo writes its connection message in eight
pieces from two threads, so the pieces landed inside the cell's own lines. Each engine
therefore puts pipes of its own on fd 1 and fd 2, after ipykernel's capture. Python's
``print`` never reaches them (``sys.stdout`` is ipykernel's stream, not fd 1), so the two
are apart by construction.

One reader thread reassembles the native bytes into whole lines and classifies them:

- every line goes to this process's native log (:func:`log_path`, :func:`log_tail`);
- known chatter (gloo's connection message, gRPC and absl start-up lines, the INFO records
  of process 0's handshake trace) goes there only;
- every other line goes to the running cell, as whole lines in iopub ``display_data`` with
  :data:`jaxsys_kernel.contract.NATIVE_MIME` (``{"name": "stdout" | "stderr", "text"}``),
  under the cell's request header. Outside a cell (``apply`` requests included) the log is
  the only place.

Cells are followed through IPython's ``pre_execute`` and ``post_execute`` events. At
``post_execute`` the thread that ran the cell reads the pipes itself before the cell is
reported done, so a line the cell wrote just before it returned still reaches that cell.

A partial line waits for its newline; it is not released after some idle time, because
that would cut gloo's message apart again (its eight writes come from threads that 2 busy
cores may pause between two writes). It is released when the cell ends, so that the cell
shows what it wrote, and when it grows past :data:`fdpipe.MAX_PARTIAL_LINE`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from IPython import get_ipython
from IPython.display import publish_display_data

from .. import contract
from .chatter import GlooFilter, is_stderr_chatter
from .fdpipe import FdReader, LineAssembler
from .guards import count_line
from .native_log import NativeLogWatch, watch_from_env
from .state import STATE

# Publishes ``text`` of stream ``name`` to the cell whose request header is ``header``.
Publisher = Callable[[str, str, dict], None]
TAIL_BLOCK = 65536
# A log past this size becomes ``<log>.1`` (replacing the one before) and a new one
# starts: process 0's handshake trace logs every connection, for as long as it runs.
MAX_LOG_BYTES = 32 * 1024 * 1024


class NativeLog:
    """This process's native log: appended to, flushed at once, bounded to two files.

    Parameters
    ----------
    path : str
        The log; the one before it is ``path + ".1"``.
    max_bytes : int
        Size at which the log is moved aside and a new one starts.
    """

    def __init__(self, path: str, max_bytes: int = MAX_LOG_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the life of the process
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        """Append ``data`` (whole lines) and flush it to the file."""
        self._file.write(data)
        self._file.flush()
        self._size += len(data)
        if self._size > self.max_bytes:
            self._file.close()
            try:
                os.replace(self.path, self.path + ".1")
            except OSError:
                pass  # then the log starts over in place
            self._file = open(self.path, "wb")  # noqa: SIM115 - as above
            self._size = 0

    def flush(self) -> None:
        """Nothing to do: every write is flushed."""

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class _Stream:
    """One descriptor's lines: reassembled, then filtered."""

    def __init__(self, name: str, watch: NativeLogWatch | None = None):
        self.name = name
        self.lines = LineAssembler()
        self.gloo = GlooFilter()
        self.watch = watch

    def keep(self, line: bytes) -> bytes:
        """What of ``line`` belongs in the cell (``b""`` for chatter)."""
        return self._not_chatter(self.gloo.feed_line(line))

    def finish(self) -> bytes:
        """At the end of a cell: what is held back (a partial line, text gloo split)."""
        line = self.lines.flush()
        kept = self.keep(line) if line is not None else b""
        return kept + self._not_chatter(self.gloo.flush())

    def _not_chatter(self, line: bytes) -> bytes:
        if not line or self.name != "stderr":
            return line
        if self.watch is not None:
            line = self.watch.feed_line(line)
        # JAX's transfer-guard log lines are counted here and still go to the cell.
        count_line(line)
        return b"" if is_stderr_chatter(line) else line


class NativeOutput:
    """Reads this process's fd 1 and fd 2 and routes each whole line.

    Parameters
    ----------
    log : binary file
        Where every line goes (opened for appending).
    publish : callable, optional
        ``publish(name, text, header)`` sends lines to the running cell; without it lines
        only go to the log.
    watch : NativeLogWatch, optional
        Reads fd 2's lines for refused TLS handshakes (process 0).
    fds : tuple of int
        The descriptors for stdout and stderr (other ones in tests).
    """

    def __init__(
        self,
        log: BinaryIO,
        publish: Publisher | None = None,
        watch: NativeLogWatch | None = None,
        fds: tuple[int, int] = (1, 2),
    ):
        self.log = log
        self.publish = publish
        self.streams = {fds[0]: _Stream("stdout"), fds[1]: _Stream("stderr", watch)}
        self.reader = FdReader(fds, self._on_data, name="jaxsys-native-output")
        self.forwarded = 0
        self.publish_errors = 0
        self._cell: dict | None = None

    def install(self) -> NativeOutput:
        """Take fd 1 and fd 2 over and start reading."""
        self.reader.install()
        return self

    def cell_started(self, header: dict) -> None:
        """A cell began: forward what is not chatter to it, under its request ``header``."""
        self.reader.drain()
        with self.reader.lock:
            self._cell = header

    def cell_finished(self) -> None:
        """The cell ended: forward what it wrote before it returned, then stop forwarding.

        Called on the thread that ran the cell, so everything that thread wrote is read
        here, before the kernel reports the cell done.
        """
        self.reader.drain()
        with self.reader.lock:
            try:
                for stream in self.streams.values():
                    held = stream.lines.pending
                    if held:
                        self._write_log(held + b"\n")
                    self._forward(stream, stream.finish())
            except Exception as e:  # noqa: BLE001 - never into the cell's hooks
                self.reader.fail(e)
            finally:
                self._cell = None

    def _on_data(self, fd: int, chunk: bytes) -> None:
        stream = self.streams[fd]
        self._route(stream, stream.lines.feed(chunk))

    def _route(self, stream: _Stream, lines: list[bytes]) -> None:
        if lines:
            self._write_log(b"".join(lines))
            self._forward(stream, b"".join(stream.keep(line) for line in lines))

    def _write_log(self, data: bytes) -> None:
        try:
            self.log.write(data)
            self.log.flush()
        except (OSError, ValueError):
            pass  # a full disk or a closed log must not stop the cell's output

    def _forward(self, stream: _Stream, kept: bytes) -> None:
        if kept and self._cell is not None and self.publish is not None:
            self.forwarded += kept.count(b"\n")
            try:
                self.publish(stream.name, kept.decode("utf-8", "replace"), self._cell)
            except Exception:  # noqa: BLE001 - the log already holds the lines
                self.publish_errors += 1


def publish_to_cell(name: str, text: str, header: dict) -> None:
    """Send native lines to the cell of ``header`` as ``display_data`` (NATIVE_MIME).

    Works from any thread: ipykernel's display publisher takes the parent header from a
    context variable, which is set for this call only.
    """
    shell = get_ipython()
    pub = getattr(shell, "display_pub", None)
    set_parent = getattr(pub, "set_thread_parent", None)
    token = set_parent(header) if set_parent is not None else None
    try:
        publish_display_data({contract.NATIVE_MIME: {"name": name, "text": text}})
    finally:
        if token is not None:
            pub.reset_thread_parent(token)


def default_log_path(environ=None) -> str:
    """Where this process keeps its native log when ``$JAXSYS_NATIVE_LOG`` is not set.

    In the engine's profile (``$IPP_PROFILE_DIR/log``) when it has one, else in the temp
    directory; named by :func:`jaxsys_kernel.contract.native_log_name`.
    """
    environ = os.environ if environ is None else environ
    env = contract.EngineEnv.from_env(environ)
    if env.native_log:
        return env.native_log
    name = contract.native_log_name(contract.rank_from_env(environ), env.incarnation)
    base = os.path.join(environ.get("IPP_PROFILE_DIR", ""), "log")
    if not environ.get("IPP_PROFILE_DIR") or not os.path.isdir(base):
        base = tempfile.gettempdir()
        name = f"jaxsys-{name[:-4]}-{os.getpid()}.log"
    return os.path.join(base, name)


def install_from_env() -> NativeOutput | None:
    """Read this engine's native output from now on; calling it again does nothing.

    Call it once ipykernel has captured fd 1 and fd 2 (after the engine registered), so
    that our pipes sit in front of its capture. Cells are followed through IPython's
    ``pre_execute`` / ``post_execute`` events.

    Returns
    -------
    NativeOutput or None
        None outside an IPython shell.
    """
    if STATE.output is not None:
        return STATE.output
    shell = get_ipython()
    if shell is None:
        return None
    path = default_log_path()
    try:
        log = NativeLog(path)
    except OSError:
        return None  # native output stays with ipykernel's capture, as before
    try:
        output = NativeOutput(log, publish_to_cell, watch=watch_from_env()).install()
    except OSError:
        # A descriptor that cannot be taken over (closed): leave it, never stop the engine.
        log.close()
        return None
    STATE.native_log_path = path
    shell.events.register("pre_execute", lambda: output.cell_started(_cell_header(shell)))
    shell.events.register("post_execute", output.cell_finished)
    STATE.output = output
    return output


def _cell_header(shell) -> dict:
    header = getattr(shell, "parent_header", None) or {}
    return dict(header.get("header", header))


def log_path() -> str | None:
    """The path of this process's native log, or None if it keeps none."""
    return STATE.native_log_path


def log_tail(lines: int | None = None) -> str:
    """The last ``lines`` lines of this process's native log (all of it when None).

    Reads from the end in blocks, so a large log costs only what is returned. The log
    keeps about the last 32 to 64 MiB (:class:`NativeLog`).

    Parameters
    ----------
    lines : int, optional
        How many lines; None for the whole log.

    Returns
    -------
    str
        The lines, each ending in a newline; empty when there is no log.
    """
    if STATE.native_log_path is None:
        return ""
    text = tail_file(STATE.native_log_path, lines)
    have = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if lines is None or have < lines:
        # The rest from the log before it, when the log was moved aside.
        text = (
            tail_file(STATE.native_log_path + ".1", None if lines is None else lines - have) + text
        )
    return text


def tail_file(path: str, lines: int | None = None) -> str:
    """The last ``lines`` lines of the file at ``path`` (see :func:`log_tail`)."""
    if lines is not None and lines <= 0:
        return ""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return ""
    with f:
        if lines is None:
            return f.read().decode("utf-8", "replace")
        pos = f.seek(0, os.SEEK_END)
        blocks: list[bytes] = []
        newlines = 0
        # One newline more than the lines wanted marks where the first of them starts.
        while pos > 0 and newlines <= lines:
            step = min(TAIL_BLOCK, pos)
            pos -= step
            f.seek(pos)
            blocks.append(f.read(step))
            newlines += blocks[-1].count(b"\n")
        data = b"".join(reversed(blocks))
    # A last line without its newline is a line too.
    cut = len(data) - (1 if data.endswith(b"\n") else 0)
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            break
    return data[cut + 1 :].decode("utf-8", "replace")
