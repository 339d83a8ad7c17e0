"""The hang report: what every process of a stuck cell is doing, readable at a glance.

Stacks come from ``faulthandler`` dumps (``Cluster.dump_stacks``), which list every thread
innermost frame first. Only the thread that runs cells matters. Its frames are shown the way
a traceback reads: the cell's own line first, then inward, with each run of JAX's internal
frames collapsed into the public call the process waits in (``sync_global_devices``, a
jitted function, ``block_until_ready``). Processes in the same state with the same frames
share one entry, and one sentence names the divergence when some processes wait inside JAX
for others that went elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .._ranges import format_procs

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
# A cell's own code runs from a file ipykernel names after the cell's hash.
_CELL_FILE = re.compile(r"(?:/ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>)$")
_JAX_PATH = re.compile(r"/(?:jax|jaxlib|jax_plugins)/")
# Python's own library (contextlib, functools, ...): plumbing between the user's frames.
_STDLIB = re.compile(r"^<frozen |/lib/python3\.\d+/(?!.*site-packages/)")
# Frames that mean the process waits in JAX's dispatch or in a collective.
_JAX_WAIT = re.compile(
    r"/jax/|/jaxlib/|multihost_utils|block_until_ready|_value|psum|all_gather|process_allgather"
)
# Wrappers JAX puts around its API functions: the call they wrap is the one to name.
_WRAPPERS = {"reraise_with_filtered_traceback", "wrapper"}
_DUNDER = re.compile(r"^__\w+__$")
# The function jax.jit's wrapper calls: a frame here means "inside a jitted function".
_JIT_ENTRY = ("pjit.py", "cache_miss")
# Per group, at most this many lines of stack; a report over SCREEN lines shows one line
# per group instead.
MAX_FRAMES = 6
SCREEN = 30
LEGEND = "  (>> your code, ** the JAX call it waits in; outermost call first)"
NO_STACK = "(no stack: the process did not answer SIGUSR1)"


@dataclass(frozen=True)
class Frame:
    """One line of a faulthandler dump."""

    file: str
    line: int
    func: str

    @property
    def in_cell(self) -> bool:
        """Whether the frame is code from a notebook cell."""
        return bool(_CELL_FILE.search(self.file))

    @property
    def in_jax(self) -> bool:
        """Whether the frame is inside JAX or jaxlib."""
        return bool(_JAX_PATH.search(self.file))

    @property
    def in_stdlib(self) -> bool:
        """Whether the frame is in Python's standard library."""
        return bool(_STDLIB.search(self.file))


@dataclass
class Where:
    """Where one process is, described for the report.

    Attributes
    ----------
    lines : list of str
        The stack, outermost call first, marked ``>>`` (cell code) and ``**`` (a JAX call).
    call : str or None
        The innermost JAX call it waits in (``multihost_utils.sync_global_devices``).
    line : int or None
        The line of the running cell that the wait was reached from.
    """

    lines: list[str] = field(default_factory=list)
    call: str | None = None
    line: int | None = None


def main_frames(dump: str) -> list[Frame]:
    """The frames of the thread that runs cells (the one faulthandler calls current),
    innermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", "\n" + dump)
    block = next((b for b in blocks if b.startswith("Current thread")), blocks[-1])
    frames = []
    for ln in block.splitlines()[1:]:
        m = _FRAME.match(ln)
        if m:
            frames.append(Frame(m["file"], int(m["line"]), m["func"]))
    return frames


def waits_in_jax(frames: Sequence[Frame]) -> bool:
    """Whether the innermost frames are JAX's (dispatch, a blocking wait, a collective)."""
    return any(_JAX_WAIT.search(f"{f.file} in {f.func}") for f in frames[:3])


def waiting_in_jax(stacks: Mapping[int, str], ranks: Sequence[int]) -> list[bool]:
    """For each rank, whether it waits inside JAX; a missing stack counts as yes (be safe)."""
    out = []
    for r in ranks:
        frames = main_frames(stacks.get(r, ""))
        out.append(not frames or waits_in_jax(frames))
    return out


def short_path(path: str) -> str:
    """A file's path as a reader needs it: from the package on, or just the file's name."""
    p = PurePosixPath(path)
    if "site-packages" in p.parts:
        return "/".join(p.parts[len(p.parts) - p.parts[::-1].index("site-packages") :])
    return "/".join(p.parts[-2:]) if p.name == "__init__.py" else p.name


def entry_frame(run: Sequence[Frame]) -> Frame:
    """The frame a run of JAX frames (outermost first) was entered by, past JAX's wrappers.

    A special method's name says nothing of the call (``live_devices`` is an object whose
    ``__call__`` runs), so the first named function inside it stands for the call.
    """
    named = (f for f in run if f.func not in _WRAPPERS and not _DUNDER.match(f.func))
    return next(named, run[0])


def public_call(entry: Frame) -> str:
    """The public JAX call that a run of JAX frames entered by ``entry`` stands for."""
    if PurePosixPath(entry.file).name == _JIT_ENTRY[0] and entry.func == _JIT_ENTRY[1]:
        return "a jitted function"
    stem = PurePosixPath(entry.file).stem
    prefix = {"api": "jax", "array": "Array"}.get(stem, stem)
    return f"{prefix}.{entry.func}"


def short_call(call: str) -> str:
    """``multihost_utils.sync_global_devices`` -> ``sync_global_devices``."""
    return call if call.startswith("a ") else call.rsplit(".", 1)[-1]


def _cell_text(f: Frame, this_cell: str | None, code: str | None) -> str:
    where = f"line {f.line}" + ("" if f.func == "<module>" else f" in {f.func}")
    if f.file != this_cell:
        return f"{where} (an earlier cell)"
    lines = (code or "").splitlines()
    if 0 < f.line <= len(lines) and lines[f.line - 1].strip():
        source = lines[f.line - 1].strip()
        return f"{where}: {source[:77] + '...' if len(source) > 80 else source}"
    return where


def describe(frames: Sequence[Frame], code: str | None = None, max_frames: int = MAX_FRAMES):
    """Describe a stack (innermost first) for the report.

    Frames outside the cell (the engine's machinery) and the standard library's frames
    between others are dropped; each run of JAX frames becomes one ``**`` line naming the
    public call it stands for.

    Returns
    -------
    Where
    """
    cells = [i for i, f in enumerate(frames) if f.in_cell]
    kept = list(frames[: cells[-1] + 1] if cells else frames[:max_frames])
    # The standard library's frames between two others (a with statement's __enter__)
    # are plumbing; the innermost ones, where the process actually waits, stay.
    inner = next((i for i, f in enumerate(kept) if not f.in_stdlib), len(kept))
    kept = kept[:inner] + [f for f in kept[inner:] if not f.in_stdlib]
    outward = kept[::-1]
    this_cell = outward[0].file if cells else None
    where = Where()
    i = 0
    while i < len(outward):
        f = outward[i]
        if f.in_jax:
            j = i
            while j < len(outward) and outward[j].in_jax:
                j += 1
            entry = entry_frame(outward[i:j])
            where.call = public_call(entry)
            where.lines.append(f"** {where.call} ({short_path(entry.file)}:{entry.line})")
            i = j
            continue
        if f.in_cell:
            where.lines.append(f">> {_cell_text(f, this_cell, code)}")
        else:
            where.lines.append(f"   {short_path(f.file)}:{f.line} in {f.func}")
        i += 1
    # Only the innermost JAX call is where it waits; one further out called back into code.
    if where.lines and not where.lines[-1].startswith("**"):
        where.call = None
    if cells:
        where.line = outward[0].line
    if len(where.lines) > max_frames:
        hidden = len(where.lines) - max_frames + 1
        where.lines = [where.lines[0], f"   ... {hidden} more", *where.lines[-(max_frames - 2) :]]
    return where


def divergence(run, wheres: Mapping[int, Where]) -> str | None:
    """One sentence naming who waits in which JAX call and who went elsewhere, or None
    when not every stuck process waits in JAX."""
    stuck = [r for r in run.procs if r in run.stuck]
    if not stuck or any(wheres[r].call is None for r in stuck):
        return None
    waits: dict[tuple, list[int]] = {}
    for r in stuck:
        waits.setdefault((wheres[r].call, wheres[r].line), []).append(r)
    parts = []
    for (call, line), ranks in waits.items():
        verb = "waits" if len(ranks) == 1 else "wait"
        at = f" (your line {line})" if line is not None else ""
        parts.append(f"{format_procs(ranks)} {verb} in {short_call(call)}{at}")
    sentence = ", ".join(parts)
    others: dict[str, list[int]] = {}
    for r in run.procs:
        if r not in run.stuck:
            others.setdefault(_what_it_did(run.results[r]), []).append(r)
    if others:
        did = " and ".join(f"{format_procs(rs)} {what}" for what, rs in others.items())
        sentence += f"; {did} without reaching {'it' if len(waits) == 1 else 'them'}"
    return sentence


def _what_it_did(res) -> str:
    if res.status == "ok":
        return "finished the cell"
    if res.status == "dead":
        return "lost its engine"
    if res.error:
        return f"raised {res.error.get('ename')}"
    return res.status


def _state(run, r: int) -> str:
    res = run.results[r]
    if r in run.stuck:
        return "still running"
    if res.status == "ok":
        return "finished"
    if res.error:
        return f"raised {res.error.get('ename')}: {res.error.get('evalue')}"
    return res.status


def _groups(run, wheres: Mapping[int, Where]) -> list[tuple[list[int], str, list[str]]]:
    groups: dict[tuple, tuple[list[int], str, list[str]]] = {}
    for r in run.procs:
        state = _state(run, r)
        body = (wheres[r].lines or [NO_STACK]) if r in run.stuck else []
        groups.setdefault((state, tuple(body)), ([], state, body))[0].append(r)
    return list(groups.values())


def report(
    run,
    stacks: Mapping[int, str],
    reason: str,
    code: str | None = None,
    max_frames: int = MAX_FRAMES,
) -> str:
    """Text of the diagnosis: what every process did, and where the stuck ones wait.

    Parameters
    ----------
    run : jaxsys_kernel.cells.CellRun
        The cell so far (``run.stuck`` names the processes still running).
    stacks : mapping of int to str
        faulthandler dumps by rank, from ``Cluster.dump_stacks``.
    reason : str
        Why the cell is judged hung, one sentence.
    code : str, optional
        The cell's source, to quote the lines the stuck processes are on.
    max_frames : int
        The most stack lines shown for one group of processes.

    Returns
    -------
    str
        The report; identical stacks are shown once, under all the processes that share it.
    """
    wheres = {r: describe(main_frames(stacks.get(r, "")), code, max_frames) for r in run.stuck}
    lines = [f"jaxsys hang doctor: {reason}"]
    sentence = divergence(run, wheres)
    if sentence:
        lines.append(f"  {sentence}")
    groups = _groups(run, wheres)
    body_lines = sum(1 + len(body) for _, _, body in groups)
    compact = len(lines) + body_lines + 1 > SCREEN
    for ranks, state, body in groups:
        if compact and body:
            lines.append(f"  {format_procs(ranks)}: {state}, {body[-1].lstrip('*> ').strip()}")
            continue
        lines.append(f"  {format_procs(ranks)}: {state}")
        lines.extend(f"      {b}" for b in body)
    if any(b.startswith((">>", "**")) for _, _, body in groups for b in body):
        lines.append(LEGEND)
    return "\n".join(lines)


def innermost(dump: str, code: str | None = None) -> str:
    """One line saying where a process is (the innermost line of its described stack)."""
    where = describe(main_frames(dump), code)
    return where.lines[-1].strip() if where.lines else "(no stack)"


IDLE = "idle, waiting for a cell"


def process_stack(dump: str, code: str | None = None, max_frames: int = 12) -> list[str]:
    """Where a process is, for a reader: its user-level stack, outermost call first, or idle.

    A process outside any cell waits in the engine's event loop for the next request; its
    frames there say nothing to a user, so it is said to be idle.
    """
    frames = main_frames(dump)
    if not frames:
        return ["(no stack: the process did not answer)"]
    if not any(f.in_cell for f in frames):
        return [IDLE]
    return describe(frames, code, max_frames).lines
