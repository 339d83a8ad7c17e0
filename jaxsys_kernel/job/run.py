"""Writing and running a job, and its output collated per cell as the notebook shows it."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from .._ranges import format_procs
from ..cells.collate import LineCollator
from .owner import run_owned
from .program import CELL_MARK, ERROR_MARK, EXIT_CODES, STOP_MARK, Program

# What gloo prints (from C++, not from the cell) when a collective first connects, once
# per device: the threads of a process's devices may write its halves apart, even into
# each other ("[Gloo] Rank [Gloo] Rank 1 is connected ...", then "0 is connected ..."), or
# break one message over two lines ("1 is connected to ", then "7 peer ranks. ...", or
# " 7 peer ranks. ", then "Expected number ..."), or write one message's end into the
# other's ("Rank 4 is connected to 7 peer ranks. [Gloo] Rank 5 ... is : 7"). A piece that
# could be a user's words is dropped only when it is a whole line or follows gloo's words.
_GLOO_EXPECTED = r"Expected number of connected peer ranks is : \d+"
_GLOO_TAIL = rf"peer ranks\. {_GLOO_EXPECTED}"
GLOO_CHATTER = (
    r"\[Gloo\] Rank (\d+\s*$)?"
    rf"|(\[Gloo\] Rank )?(\d+ )?is connected to( \d+ peer ranks\.( {_GLOO_EXPECTED})?)?"
    rf"|(\d+ )?{_GLOO_TAIL}"
    r"|^\s*\d+ peer ranks\.\s*$"
    rf"|^{_GLOO_EXPECTED}\s*$"
)
# What a launcher writes into a process's output when it stops the others after one failed
# (Slurm's step daemon): the process's own output ends there, as it does under the local
# launcher, which says nothing.
LAUNCHER_CHATTER = r"^slurmstepd(-\S+)?: error: \*\*\* (STEP|JOB) \S+ ON \S+ CANCELLED AT .*$"
# What JAX's preemption notifier logs (from C++) when a process gets SIGTERM: a launcher
# stopping it after another one failed, or a notice the program's own output tells of.
# Each process's pN.out keeps it.
NOTIFIER_CHATTER = r"^W\d{4} [\d:.]+ +\d+ preemption_notifier\.cc:\d+\] SIGTERM caught at \S+$"
NOISE = re.compile(f"{GLOO_CHATTER}|{LAUNCHER_CHATTER}|{NOTIFIER_CHATTER}")


@dataclass
class JobResult:
    """What a job did: the collated log, the cells that failed unexpectedly, and why the
    job ended (the log's last line says it too)."""

    log: str
    failures: dict[int, list[int]] = field(default_factory=dict)
    exit_code: int = 0
    ending: str = ""


def split_cells(text: str) -> tuple[dict[int, str], set[int]]:
    """One process's output by cell index, and the cells that failed in it."""
    sections: dict[int, str] = {}
    failed: set[int] = set()
    current = None
    # Not splitlines(): it also splits at the marks' own record separator.
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    for stripped in pieces:
        line = stripped + "\n"
        if stripped.startswith(CELL_MARK):
            current = int(stripped[len(CELL_MARK) :])
            sections[current] = ""
        elif stripped.startswith(ERROR_MARK):
            failed.add(int(stripped[len(ERROR_MARK) :]))
        elif stripped.startswith(STOP_MARK):
            pass  # why this process stopped: for the job's last line (stopped_at)
        elif current is not None:
            sections[current] += line
    return sections, failed


def collate_outputs(prog: Program, outputs: dict[int, str]) -> JobResult:
    """The job's log: each cell's output collated over the processes (``[p0-3] line``),
    and the cells that failed on some process although not tagged ``raises-exception``."""
    split = {rank: split_cells(text) for rank, text in outputs.items()}
    ranks = sorted(outputs)
    chunks = []
    failures: dict[int, list[int]] = {}
    for cell in prog.cells:
        emitted: list[str] = []
        collator = LineCollator(ranks, emitted.append, drop=NOISE)
        for rank in ranks:
            collator.feed(rank, split[rank][0].get(cell.index, ""))
        for rank in ranks:
            collator.finish(rank)
        failed = [r for r in ranks if cell.index in split[r][1]]
        ran = [r for r in ranks if cell.index in split[r][0]]
        head = f"--- cell {cell.index}"
        if failed:
            head += f" (failed on {format_procs(failed)}"
            head += ", as expected)" if cell.expect_error else ")"
            if not cell.expect_error:
                failures[cell.index] = failed
        elif failures and not ran:
            head += f" (not run: the job stopped at cell {min(failures)})"
        elif len(ran) < len(ranks) and cell.procs is None:
            head += f" (not reached on {format_procs(sorted(set(ranks) - set(ran)))})"
        chunks.append(head + " ---\n" + "".join(emitted))
    return JobResult("".join(chunks), failures)


def run_job(
    prog: Program,
    command: list[str],
    out_dir: Path,
    timeout: float,
    cancel: list[str] | None = None,
) -> JobResult:
    """Run the job's command (as :func:`~jaxsys_kernel.job.owner.run_owned` does), then
    collate ``out_dir/p{i}.out`` into ``out_dir/job.log``, whose last line says why the job
    ended: finished, a failed cell, a process that died, the timeout, a signal."""
    for stale in ("job.log", EXIT_CODES, *(f"p{r}.out" for r in range(prog.hosts))):
        (out_dir / stale).unlink(missing_ok=True)
    ended = run_owned(command, out_dir, timeout, cancel)
    outputs = {}
    for rank in range(prog.hosts):
        path = out_dir / f"p{rank}.out"
        outputs[rank] = path.read_text(errors="replace") if path.exists() else ""
    result = collate_outputs(prog, outputs)
    result.exit_code = ended.code or (1 if result.failures else 0)
    result.ending = ended.stopped or _why(prog, result, outputs, _exit_codes(out_dir), ended.code)
    result.log += f"jaxsys job: ended: {result.ending}\n"
    (out_dir / "job.log").write_text(result.log)
    return result


def _exit_codes(out_dir: Path) -> list[tuple[int, int]]:
    """The processes that exited non-zero and their codes, the first to fail first, as the
    runners write them (none from other launchers)."""
    try:
        said = json.loads((out_dir / EXIT_CODES).read_text())
        codes, first = list(said["codes"]), said["first"]
    except (OSError, ValueError, TypeError, KeyError):
        return []
    bad = [(r, c) for r, c in enumerate(codes) if isinstance(c, int) and c]
    return sorted(bad, key=lambda rc: rc[0] != first)


def _last_cell(text: str) -> int | None:
    marks = [line for line in text.split("\n") if line.startswith(CELL_MARK)]
    return int(marks[-1][len(CELL_MARK) :]) if marks else None


def _why(prog: Program, result: JobResult, outputs: dict[int, str], codes, code: int) -> str:
    """The job's ending, in words, when it was not stopped from outside."""
    if result.failures:
        first = min(result.failures)
        return f"cell {first} failed on {format_procs(result.failures[first])}"
    for rank, rc in codes:
        if STOP_MARK in outputs.get(rank, ""):
            continue
        cell = _last_cell(outputs.get(rank, ""))
        where = f"in cell {cell}" if cell is not None else "before its first cell"
        how = f"died of {signal.Signals(-rc).name}" if rc < 0 and -rc in _SIGNUMS else ""
        return f"p{rank} {how or f'exited with code {rc}'} {where}"
    if code:
        return f"the job's command exited with code {code}"
    return f"finished: {len(prog.cells)} cells on {prog.hosts} processes"


_SIGNUMS = {s.value for s in signal.Signals}
