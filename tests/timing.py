"""Where the run's time went, by test file and by worker, printed at the end of a run.

``--durations`` names the slowest tests; the suite's length on a few cores is decided by
the files instead: pytest-xdist hands each worker whole files (``--dist loadfile``), so the
run lasts as long as its busiest worker, and one long file is a tail no other worker can
share. The summary gives both, from the reports every phase of every test sends.
"""

from __future__ import annotations

from collections import defaultdict

# Files named in the summary.
SHOWN = 12

_by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
_by_worker: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    spent = _by_file[path]
    spent[0] += report.duration
    if report.when == "call":
        spent[1] += 1
    # Under pytest-xdist the report says which worker ran it; without, one process ran all.
    worker = getattr(getattr(report, "node", None), "gateway", None)
    _by_worker[getattr(worker, "id", "main")] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _by_file:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"slowest {SHOWN} files (setup, call and teardown)")
    ranked = sorted(_by_file.items(), key=lambda kv: kv[1][0], reverse=True)
    for path, (seconds, tests) in ranked[:SHOWN]:
        write(f"{seconds:8.1f}s {tests:4d} tests  {path}")
    total = sum(seconds for seconds, _ in _by_file.values())
    workers = ", ".join(f"{w} {s:.0f}s" for w, s in sorted(_by_worker.items()))
    write(f"{total:8.1f}s in all; by worker: {workers}")
