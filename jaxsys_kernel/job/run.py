"""Writing and running a job, and its output collated per cell as the notebook shows it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .._ranges import format_procs
from ..cells.collate import LineCollator
from .program import CELL_MARK, ERROR_MARK, Program

# What gloo prints (from C++, not from the cell) when a collective first connects, once
# per device: the threads of a process's devices may write its halves apart, even into
# each other ("[Gloo] Rank [Gloo] Rank 1 is connected ...", then "0 is connected ..."), or
# break one message over two lines ("1 is connected to ", then "7 peer ranks. ...").
_GLOO_TAIL = r"peer ranks\. Expected number of connected peer ranks is : \d+"
GLOO_CHATTER = (
    r"\[Gloo\] Rank (\d+\s*$)?"
    rf"|(\[Gloo\] Rank )?(\d+ )?is connected to( \d+ {_GLOO_TAIL})?"
    rf"|(\d+ )?{_GLOO_TAIL}"
)
# What a launcher writes into a process's output when it stops the others after one failed
# (Slurm's step daemon): the process's own output ends there, as it does under the local
# launcher, which says nothing.
LAUNCHER_CHATTER = r"^slurmstepd(-\S+)?: error: \*\*\* (STEP|JOB) \S+ ON \S+ CANCELLED AT .*$"
NOISE = re.compile(f"{GLOO_CHATTER}|{LAUNCHER_CHATTER}")


@dataclass
class JobResult:
    """What a job did: the collated log, and the cells that failed unexpectedly."""

    log: str
    failures: dict[int, list[int]] = field(default_factory=dict)
    exit_code: int = 0


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
        elif len(ran) < len(ranks) and cell.procs is None:
            head += f" (not reached on {format_procs(sorted(set(ranks) - set(ran)))})"
        chunks.append(head + " ---\n" + "".join(emitted))
    return JobResult("".join(chunks), failures)


def run_job(prog: Program, command: list[str], out_dir: Path, timeout: float) -> JobResult:
    """Run the job's command, then collate ``out_dir/p{i}.out`` into ``out_dir/job.log``."""
    r = subprocess.run(command, cwd=out_dir, timeout=timeout, check=False)
    outputs = {}
    for rank in range(prog.hosts):
        path = out_dir / f"p{rank}.out"
        outputs[rank] = path.read_text(errors="replace") if path.exists() else ""
    result = collate_outputs(prog, outputs)
    result.exit_code = r.returncode or (1 if result.failures else 0)
    (out_dir / "job.log").write_text(result.log)
    return result
