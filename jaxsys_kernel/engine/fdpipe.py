"""Pipes of our own on file descriptors, read by one thread, reassembled into whole lines.

Native code (gloo, XLA, gRPC, absl) writes to fd 1 and fd 2 directly, often a line in
several ``write`` calls and from several threads at once: gloo writes its connection
message in eight pieces. :class:`FdReader` puts a pipe in front of each descriptor and
hands what arrives to a callback; :class:`LineAssembler` turns those chunks back into
whole lines. Neither knows what the lines mean.
"""

from __future__ import annotations

import fcntl
import os
import select
import threading
from collections.abc import Callable, Sequence

# A line this long without its newline is let through as a line of its own rather than
# held further: a writer that never ends its line must not grow memory without bound.
MAX_PARTIAL_LINE = 1 << 20
READ_SIZE = 65536
# Room in each pipe (Linux's default is 64 KiB): a writer that holds the GIL while it
# writes blocks the reader too once the pipe is full, so give bursts more room. Kept well
# under the per-user budget for pipe buffers, which 16 engines share.
PIPE_SIZE = 256 * 1024


class LineAssembler:
    """Cut a byte stream into whole lines, holding a partial line until its newline.

    Parameters
    ----------
    max_partial : int
        Bytes a partial line may hold before it is released as a line of its own.
    """

    def __init__(self, max_partial: int = MAX_PARTIAL_LINE):
        self.max_partial = max_partial
        self._partial = b""

    @property
    def pending(self) -> bytes:
        """The partial line held so far (no newline yet)."""
        return self._partial

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next chunk; return the lines it completed, each ending in ``\\n``.

        A partial line that grows past ``max_partial`` is returned too, with a newline
        added, so that the caller only ever sees whole lines.
        """
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        out = [line + b"\n" for line in lines]
        if len(self._partial) > self.max_partial:
            out.append(self._partial + b"\n")
            self._partial = b""
        return out

    def flush(self) -> bytes | None:
        """Release the held partial line (with a newline added), or None if there is none."""
        if not self._partial:
            return None
        line, self._partial = self._partial + b"\n", b""
        return line


class FdReader:
    """Put a pipe of our own on each of ``fds`` and read them all from one thread.

    Parameters
    ----------
    fds : sequence of int
        The descriptors to take over (1 and 2 in an engine).
    on_data : callable
        ``on_data(fd, chunk)``, called with the reader's lock held, from the reader
        thread or from :meth:`drain`. An exception from it ends the reader and gives every
        descriptor back (see :meth:`restore`).
    name : str
        The reader thread's name.

    Notes
    -----
    Writers keep blocking writes (only our read ends are non-blocking), so native code
    sees an ordinary pipe. What was on each descriptor before is kept open as
    :meth:`downstream`, so it can be given back.
    """

    def __init__(
        self,
        fds: Sequence[int],
        on_data: Callable[[int, bytes], None],
        name: str = "jaxsys-fd-reader",
    ):
        self.fds = tuple(fds)
        self.on_data = on_data
        self.name = name
        self.lock = threading.RLock()
        self.error: BaseException | None = None
        self._read: dict[int, int] = {}  # fd -> read end of our pipe
        self._saved: dict[int, int] = {}  # fd -> what it was before (a dup)
        self._inode: dict[int, tuple[int, int]] = {}
        self._open: set[int] = set()
        self._thread: threading.Thread | None = None

    def install(self) -> FdReader:
        """Take the descriptors over and start the reader thread.

        Raises
        ------
        OSError
            If a descriptor cannot be taken over (e.g. it is closed); whatever was already
            taken over is given back first.
        """
        try:
            for fd in self.fds:
                self._take(fd)
        except OSError:
            self.restore()
            raise
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _take(self, fd: int) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self._saved[fd] = os.dup(fd)
            st = os.fstat(read_fd)
            self._inode[fd] = (st.st_dev, st.st_ino)
            os.dup2(write_fd, fd)
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        flags = fcntl.fcntl(read_fd, fcntl.F_GETFL)
        fcntl.fcntl(read_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except (AttributeError, OSError):
            pass  # not Linux, or over the user's budget: the default size still works
        self._read[fd] = read_fd
        self._open.add(fd)

    def downstream(self, fd: int) -> int:
        """The descriptor that ``fd`` was before :meth:`install` (still open)."""
        return self._saved[fd]

    @property
    def alive(self) -> bool:
        """Whether the reader thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def drain(self) -> None:
        """Read everything already written, on the calling thread, before returning.

        What a thread wrote before calling this is handed to ``on_data`` by the time it
        returns, which the reader thread alone cannot promise.
        """
        if not self.alive:
            return
        with self.lock:
            try:
                for fd in sorted(self._open):
                    self._read_available(fd)
            except Exception as e:  # noqa: BLE001 - the caller is a cell's hook; see fail()
                self.fail(e)

    def fail(self, error: BaseException) -> None:
        """Give up: remember why and give every descriptor back (see :meth:`restore`).

        The reader thread then ends once the last writer of each pipe has let go.
        """
        self.error = error
        self.restore()

    def restore(self) -> None:
        """Give each descriptor back what it was, if it is still our pipe."""
        for fd, saved in self._saved.items():
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == self._inode[fd]:
                    os.dup2(saved, fd)
            except OSError:
                pass

    def _read_available(self, fd: int) -> None:
        while fd in self._open:
            try:
                chunk = os.read(self._read[fd], READ_SIZE)
            except BlockingIOError:
                return
            if not chunk:
                # Every write end is gone: the descriptor was moved elsewhere and closed.
                self._open.discard(fd)
                return
            self.on_data(fd, chunk)

    def _run(self) -> None:
        try:
            while self._open:
                by_read_end = {self._read[fd]: fd for fd in self._open}
                ready, _, _ = select.select(list(by_read_end), [], [])
                with self.lock:
                    for read_fd in ready:
                        self._read_available(by_read_end[read_fd])
        except BaseException as e:  # noqa: BLE001 - see below
            # A descriptor must never end at a pipe nobody reads: once it filled, every
            # writer (gRPC's logging inside the coordination service included) would block.
            self.fail(e)
