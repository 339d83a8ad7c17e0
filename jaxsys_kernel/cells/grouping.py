"""Errors of many processes, read as few: grouped, with what differs shown once as a table.

Sixteen processes that raise ``ValueError(f"bad shard on device {d}")`` raise one error
that differs only in ``d``. Grouping such errors by their exact text would show sixteen
tracebacks; here they group by exception type, message with its numbers masked, and
traceback (with the message cut out of it), and the numbers that differ become one table:
``device: 6144 on p3, 14336 on p7``.

Two more things make a traceback read as the notebook does:

- Engines number their cells independently of the notebook, so a traceback's
  ``Cell In[7]`` is renumbered to the notebook's number for the running cell, and earlier
  cells are named as such rather than by a number the notebook never showed.
- After a hang report, the tracebacks of the processes that were interrupted say only
  where JAX's internals were when the signal came: each folds to one line unless asked for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._ranges import format_procs

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A number standing as a word of its own: ``6144``, ``-1``, ``0.5``; not the 3 of ``p3``
# or of ``float32``, nor a part of a dotted version or path.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
# The cell label IPython writes, ``Cell In[7]``, possibly with colour codes around ``In[7]``.
_CELL = re.compile(r"In\[(\d+)\]")
_WORD_BEFORE = re.compile(r"([A-Za-z_][\w-]*)\W*$")
# Above this many processes the differing values are a table, one row each, not one line.
INLINE_MAX = 4


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes."""
    return _ANSI.sub("", text)


def lines_of(tb) -> list[str]:
    """A traceback as lines, whether it came as one string or as a list."""
    if not tb:
        return []
    if isinstance(tb, str):
        return tb.splitlines()
    return [str(line) for line in tb]


@dataclass
class ErrorGroup:
    """Processes that raised the same error, but for some numbers in its message.

    Attributes
    ----------
    ranks : list of int
        The processes, in order.
    error : dict
        The lowest rank's error (``ename``, ``evalue``, ``traceback``).
    labels : list of str
        A name for each number that differs between the processes (the word before it).
    values : dict of int to list of str
        For each process, its differing numbers, in the order of ``labels``.
    """

    ranks: list[int]
    error: dict
    labels: list[str] = field(default_factory=list)
    values: dict[int, list[str]] = field(default_factory=dict)
    _numbers: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def ename(self) -> str:
        """The exception's type name."""
        return str(self.error.get("ename"))

    def message(self) -> str:
        """The lowest rank's message, each differing number replaced by ``<label>``."""
        return _masked(str(self.error.get("evalue") or ""), self._slots(), self.labels)

    def _slots(self) -> list[int]:
        first = self._numbers[self.ranks[0]]
        return [i for i in range(len(first)) if len({self._numbers[r][i] for r in self.ranks}) > 1]


def _with_message(text: str, err: dict, message: str) -> str:
    """``text`` with the error's ``ename: evalue`` line(s) saying ``message`` instead."""
    ename, evalue = str(err.get("ename")), str(err.get("evalue") or "")
    if not evalue:
        return text
    said = re.compile(re.escape(ename) + r"((?:\x1b\[[0-9;]*m)*: )" + re.escape(evalue))
    return said.sub(lambda m: ename + m.group(1) + message, text)


def _key(err: dict) -> tuple[str, str, str]:
    template = _NUMBER.sub("#", str(err.get("evalue") or ""))
    text = strip_ansi("\n".join(lines_of(err.get("traceback"))))
    text = _with_message(text, err, template)
    return str(err.get("ename")), template, _CELL.sub("In[]", text)


def _masked(text: str, slots: Sequence[int], labels: Sequence[str]) -> str:
    names = dict(zip(slots, labels, strict=True))
    count = iter(range(len(_NUMBER.findall(text))))

    def sub(m: re.Match) -> str:
        i = next(count)
        return f"<{names[i]}>" if i in names else m.group(0)

    return _NUMBER.sub(sub, text)


def _label(evalue: str, slot: int, taken: set[str]) -> str:
    m = list(_NUMBER.finditer(evalue))[slot]
    word = _WORD_BEFORE.search(evalue[: m.start()])
    name = word.group(1) if word else f"value {slot + 1}"
    while name in taken:
        name += "'"
    taken.add(name)
    return name


def group(errors: dict[int, dict]) -> list[ErrorGroup]:
    """Group processes' errors that differ at most in the numbers of their messages.

    Parameters
    ----------
    errors : dict of int to dict
        Each process's error (``ename``, ``evalue``, ``traceback``), in display order.

    Returns
    -------
    list of ErrorGroup
        One per distinct error, in order of its lowest rank.
    """
    groups: dict[tuple, ErrorGroup] = {}
    for r, err in errors.items():
        g = groups.setdefault(_key(err), ErrorGroup([], err))
        g.ranks.append(r)
        g._numbers[r] = _NUMBER.findall(str(err.get("evalue") or ""))
    for g in groups.values():
        slots = g._slots()
        taken: set[str] = set()
        g.labels = [_label(str(g.error.get("evalue") or ""), s, taken) for s in slots]
        g.values = {r: [g._numbers[r][s] for s in slots] for r in g.ranks}
    return list(groups.values())


def _columns(g: ErrorGroup) -> list[tuple[str, int]]:
    """The table's columns as (label, slot): slots equal on every process share one.

    A message often names one value twice (JAX's ``device cpu:6144 ... id=6144``); the
    reader needs it once, under both its names.
    """
    names: dict[tuple[str, ...], list[str]] = {}
    first: dict[tuple[str, ...], int] = {}
    for i, label in enumerate(g.labels):
        key = tuple(g.values[r][i] for r in g.ranks)
        names.setdefault(key, []).append(label)
        first.setdefault(key, i)
    return [(_joined(labels), first[key]) for key, labels in names.items()]


def _joined(labels: list[str]) -> str:
    """One column's name from its values' names: ``cpu`` and ``id`` give ``cpu/id``; a name
    primed only to tell two places apart (``cpu``, ``cpu'``) is given once."""
    if len(labels) == 1:
        return labels[0]
    return "/".join(dict.fromkeys(label.rstrip("'") for label in labels))


def table(g: ErrorGroup) -> list[str]:
    """The differing values of a group: one line for a few processes, else one row each."""
    if not g.labels:
        return []
    columns = _columns(g)
    if len(g.ranks) <= INLINE_MAX:
        parts = []
        for label, i in columns:
            each = ", ".join(f"{g.values[r][i]} on {format_procs([r])}" for r in g.ranks)
            parts.append(f"{label}: {each}")
        return ["  " + "; ".join(parts)]
    head = ["process", *(label for label, _ in columns)]
    rows = [[format_procs([r]), *(g.values[r][i] for _, i in columns)] for r in g.ranks]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (head, *rows)
    ]


def renumber(lines: Sequence[str], cell_number: int | None) -> list[str]:
    """Give the running cell the notebook's number; call other cells "an earlier cell".

    The outermost cell frame of an engine's traceback is the cell being run; any other
    cell number is the engine's own count, which the notebook never showed.
    """
    if cell_number is None:
        return list(lines)
    text = "\n".join(lines)
    numbers = [m.group(1) for m in _CELL.finditer(strip_ansi(text))]
    if not numbers:
        return list(lines)
    running = numbers[0]

    def sub(m: re.Match) -> str:
        return f"In[{cell_number}]" if m.group(1) == running else "In[earlier cell]"

    return [_CELL.sub(sub, line) for line in lines]


# A frame of an IPython traceback starts with its location; JAX's and jaxlib's own frames
# are the ones JAX's traceback filtering hides from users.
_FRAME_START = re.compile(r"^(?:File (?P<file>.+?):\d+, in |Cell In\[)")
_JAX_FILE = re.compile(r"/(?:jax|jaxlib)/")
# Lines between tracebacks of a chain (or above one), never part of a frame.
_BETWEEN = re.compile(
    r"^(?:-{20,}|\S*(?:Error|Exception|Interrupt)\b.*Traceback \(most recent|"
    r"The above exception|During handling of the above)"
)


def hide_jax_frames(lines: Sequence[str]) -> list[str]:
    """Fold runs of JAX's internal frames as JAX's own traceback filtering does.

    JAX marks its frames hidden for IPython; a traceback that reaches the kernel without
    that filtering (an interrupt, an error re-raised by a guard) would bury the user's line
    under dozens of them. The innermost frame always stays: it is where the error was raised.
    """
    blocks: list[tuple[bool, list[str]]] = []  # (inside JAX, lines)
    for line in lines:
        plain = strip_ansi(line)
        start = _FRAME_START.match(plain)
        if start or _BETWEEN.match(plain) or not blocks:
            jax = bool(start and start.group("file") and _JAX_FILE.search(start.group("file")))
            blocks.append((jax, [line]))
        else:
            blocks[-1][1].append(line)
    out: list[str] = []
    hidden = 0
    for i, (jax, body) in enumerate(blocks):
        if jax and not _innermost(blocks, i):
            hidden += 1
            continue
        if hidden:
            out += [f"    [... {hidden} frame{'s' if hidden > 1 else ''} inside JAX hidden]", ""]
            hidden = 0
        out += body
    return out


def _innermost(blocks: list[tuple[bool, list[str]]], i: int) -> bool:
    """Whether block ``i`` is the last frame of its traceback (of a chain's several)."""
    for _, body in blocks[i + 1 :]:
        first = strip_ansi(body[0])
        if _BETWEEN.match(first):
            return True
        if _FRAME_START.match(first):
            return False
    return True


def render_group(g: ErrorGroup, cell_number: int | None = None) -> list[str]:
    """A group's heading, its table of differing values, and its one traceback."""
    lines = [f"[{format_procs(g.ranks)}] {g.ename}: {g.message()}", *table(g)]
    tb = lines_of(g.error.get("traceback"))
    if g.labels:
        tb = _with_message("\n".join(tb), g.error, g.message()).split("\n")
    return lines + renumber(hide_jax_frames(tb), cell_number)


def innermost_cell_line(tb) -> str | None:
    """``line 6: time.sleep(30)``: where in the cell a traceback was, or None."""
    line, source = None, ""
    # IPython sends one string per frame, several lines each.
    for text in "\n".join(lines_of(tb)).splitlines():
        plain = strip_ansi(text)
        m = re.match(r"\s*Cell In\[\d+\], line (\d+)", plain)
        if m:
            line, source = m.group(1), ""
            continue
        # IPython marks the frame's current line with an arrow padded to a fixed width:
        # "----> 6 source" in a short cell, "--> 543 source" in a long file.
        marked = re.match(r"\s*-+>\s*(\d+)\s?(.*)$", plain)
        if marked and line is not None and marked.group(1) == line and not source:
            source = marked.group(2).strip()
    if line is None:
        return None
    return f"line {line}: {source}" if source else f"line {line}"


def folded(g: ErrorGroup) -> str:
    """One line for the error of processes the hang doctor interrupted."""
    at = innermost_cell_line(g.error.get("traceback"))
    what = g.ename if g.ename == "KeyboardInterrupt" else f"then {g.ename}: {_first_line(g)}"
    where = f" at {at}" if at else ""
    return f"[{format_procs(g.ranks)}] interrupted{where} ({what})"


def _first_line(g: ErrorGroup) -> str:
    text = g.message().strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= 100 else first[:97] + "..."
