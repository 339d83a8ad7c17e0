"""Which native lines are chatter: printed by libraries on every run, useless in a cell.

Each filter takes whole lines (as :class:`~jaxsys_kernel.engine.fdpipe.LineAssembler`
makes them) and returns what of a line belongs in the cell: the line itself, the part of
it that is not chatter, or ``b""``. Chatter still goes to the process's native log.
"""

from __future__ import annotations

import re

# gloo prints "[Gloo] Rank R is connected to P peer ranks. Expected number of connected
# peer ranks is : P" on the first collective of every device set, to fd 1, in eight
# write() calls: the four literal pieces below, three numbers, and the newline. Two of its
# threads print at once, so the pieces of two messages interleave, and another writer's
# bytes may land between any two pieces. Numbers touching a piece are gloo's.
_GLOO_PIECES = re.compile(
    rb"\d*(?:\[Gloo\] Rank | is connected to | peer ranks\. "
    rb"|Expected number of connected peer ranks is : )\d*"
)
_GLOO_START = b"[Gloo] Rank "
# A line whose last bytes are the end of gloo's message ends with gloo's own newline.
_GLOO_END = re.compile(rb"Expected number of connected peer ranks is : \d+$")
_LEADING_DIGITS = re.compile(rb"^\d+")
_BLANK = re.compile(rb"^[ \t\r]*$")


class GlooFilter:
    """Cut gloo's connection message, or its pieces, out of whole lines.

    A line that holds nothing but gloo's pieces is chatter. Where another writer's bytes
    sit between the pieces, those bytes are kept, and the newline goes to whoever wrote it:
    when gloo's message ends a line, the other writer's text so far waits for the rest of
    its own line (:meth:`flush` releases it). While a message is half written (its newline
    has not come), a line that is empty or holds only digits is the rest of it, and digits
    that start a line are a number of it that another writer's line pushed away.

    Notes
    -----
    Bytes of another writer are kept exactly, except digits that touch a gloo piece, and
    digits that start one of its lines while gloo's message is half written: those cannot
    be told from gloo's own numbers. Writers that write whole lines at once (absl, glog,
    gRPC) touch no piece; a line of theirs starting with a digit at the very moment gloo
    is between two writes is the one case left.
    """

    def __init__(self):
        self.in_flight = 0
        self.dropped = 0
        self._carry = b""

    def feed_line(self, line: bytes) -> bytes:
        """Return what of ``line`` is not gloo's (``b""`` when nothing is yet).

        Parameters
        ----------
        line : bytes
            One whole line, with its newline.
        """
        line, self._carry = self._carry + line, b""
        body, newline = (line[:-1], b"\n") if line.endswith(b"\n") else (line, b"")
        half_written = self.in_flight > 0
        self.in_flight += body.count(_GLOO_START)
        ends_message = _GLOO_END.search(body) is not None
        rest, pieces = _GLOO_PIECES.subn(b"", body)
        if half_written:
            rest = _LEADING_DIGITS.sub(b"", rest, count=1)
        if not pieces and not half_written:
            return line
        if (_BLANK.match(rest) or ends_message) and newline:
            # Gloo's newline: another writer's text on this line waits for the rest of its
            # own line.
            self._carry = rest
            return self._gloo_newline(newline)
        return rest + newline

    def _gloo_newline(self, newline: bytes) -> bytes:
        self.in_flight = max(0, self.in_flight - 1)
        self.dropped += 1
        return b""

    def flush(self) -> bytes:
        """Forget any half-written message; return another writer's text still held.

        Called when a cell ends: the text comes back with a newline, as a line of its own.
        """
        self.in_flight = 0
        carry, self._carry = self._carry, b""
        return carry + b"\n" if carry.strip() else b""


# Lines gRPC, absl and XLA print on every start, to fd 2, whatever the program does.
_STDERR_CHATTER = (
    # gRPC, once its verbosity is raised for the handshake trace of process 0.
    re.compile(rb"^W\d{4} [\d:.]+\s+\d+ \S+:\d+\] Log level \w+ is not suitable for production"),
    # absl, before anything initialised its log.
    re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
)


def is_stderr_chatter(line: bytes) -> bool:
    """Whether a whole fd 2 line is known start-up chatter of gRPC, absl or XLA."""
    return any(p.match(line) for p in _STDERR_CHATTER)
