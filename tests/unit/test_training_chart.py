"""The training chart: step and loss per process read from shown lines, faults, goodput,
the bounds on what processes print, the picture, and its drawing by ``--retries``."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

from jaxsys_kernel.cells import training_chart as tc
from jaxsys_kernel.cells.result import CellRun, MultihostError, ProcResult
from jaxsys_kernel.cells.training_svg import summary_text, training_svg
from jaxsys_kernel.magics import retries, training_watch

pytestmark = pytest.mark.unit
SVG = "{http://www.w3.org/2000/svg}"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def faulted_run() -> tuple[tc.TrainingLog, Clock]:
    """Steps 1-6 at 1 s each, process 1 dies, restore of step 4, steps 5-8 again at 1 s."""
    clock = Clock()
    log = tc.TrainingLog(clock=clock)
    for step in range(1, 7):
        clock.now += 1.0
        log.feed(f"[p0-1] step {step} loss {4.0 - step / 4:.4f}\n")
    clock.now += 0.5
    log.failed("process 1 died (SIGKILL)", "dead", [1])
    clock.now += 2.0
    log.restarted()
    log.attempt()
    clock.now += 1.0
    log.feed("[p0-1] restored step 4\n")
    for step in range(5, 9):
        clock.now += 1.0
        log.feed(f"[p0-1] step {step} loss {4.0 - step / 4:.4f}\n")
    log.finish()
    return log, clock


def test_steps_per_process_and_a_faults_phases_in_ms():
    log, _ = faulted_run()
    assert sorted(log.points) == [0, 1] and len(log.points[0]) == 10
    (r,) = log.recoveries
    assert (r.kind, r.who, r.restored_step) == ("dead", [1], 4)
    # From the last step shown (step 6, t=106): known 0.5 s later, restart 2 s, restore 1 s.
    assert r.phases_ms() == [
        ("detected", 500.0),
        ("world restarted", 2500.0),
        ("restored", 3500.0),
        ("first good step", 4500.0),
    ]
    assert log.outages() == [(106.0, 110.5)]
    assert log.last() == (8, 2.0)


def test_goodput_counts_kept_steps_only():
    log, _ = faulted_run()
    productive, wall, redone = log.goodput()
    # Kept: steps 2-4 of the first attempt (1 s each; step 1 carries the start) and steps
    # 6-8 of the second (step 5 is its first); steps 5 and 6 of the first were done again.
    assert (productive, wall, redone) == (6.0, 13.5, 2)
    text = summary_text(log)
    assert "goodput 0.44 (6.0 s productive of 13.5 s wall); 2 steps done again" in text
    assert "fault 1: process 1 died (SIGKILL) (dead: p1), detected +500 ms" in text
    assert "restored +3500 ms (step 4), first good step +4500 ms" in text


def test_lines_split_across_writes_and_other_lines_are_read_right():
    log = tc.TrainingLog(clock=Clock())
    assert not log.feed("[p0,2-3] st")
    assert log.feed("ep 7 loss 1.5e-01\n[p1] hello\n")
    assert not log.feed("[p0] step 8 loss banana\nstep 9 loss 1.0\n[p0] step 10 loss nan\n"[:-1])
    assert sorted(log.points) == [0, 2, 3]
    assert log.points[2] == [(100.0, 7, 0.15)]
    assert log.feed("\n") and log.points[0][-1][1] == 10  # nan is kept, not drawn


def test_what_processes_print_is_bounded():
    log = tc.TrainingLog(clock=Clock())
    log.feed("[p0] step 1 loss 1.0 " + "x" * tc.MAX_LINE + "\n")  # too long: ignored
    log.feed("x" * (10 * tc.MAX_LINE))  # an endless line is not kept
    assert len(log._partial) <= tc.MAX_LINE
    log.feed(f"[p{tc.MAX_PROCS}] step 1 loss 1.0\n[p0-99999] step 1 loss 1.0\n")
    assert not log.has_steps()
    for i in range(tc.MAX_POINTS // 2 + 10):
        log.feed(f"[p0-1] step {i} loss 1.0\n")
    assert sum(map(len, log.points.values())) == tc.MAX_POINTS and log.dropped == 20
    for _ in range(tc.MAX_FAULTS + 5):
        log.failed("x", "dead", [0])
    assert len(log.recoveries) == tc.MAX_FAULTS
    assert "points left out" in summary_text(log)


def test_the_picture_is_svg_with_a_line_per_process_the_outage_and_the_strip():
    log, _ = faulted_run()
    log.recoveries[0].what = "process <1> & co"
    svg = training_svg(log)
    root = ET.fromstring(svg)  # well-formed, text escaped
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 8  # loss and step, per process and attempt
    assert [p.find(f"{SVG}title").text for p in lines] == ["p0", "p0", "p1", "p1"] * 2
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert "outage 4.50 s" in titles
    assert {"detected +500 ms", "first good step +4500 ms"} <= set(titles)
    assert "process <1> & co" in "".join(root.itertext())


def test_a_run_without_faults_draws_no_strip():
    log = tc.TrainingLog(clock=Clock())
    log.feed("[p0] step 1 loss 2.0\n")
    root = ET.fromstring(training_svg(log))
    assert not [t for t in root.iter(f"{SVG}title") if "ms" in (t.text or "")]


class Session:
    """The first run prints steps 1-3 and loses process 1; the second restores and ends."""

    def __init__(self):
        self.sent = 0
        self.cluster = SimpleNamespace(processes=[SimpleNamespace(died=None)] * 2)

    def run_cell(self, code, procs, **options):
        self.sent += 1
        if self.sent == 1:
            print("[p0-1] step 1 loss 2.0\n[p0-1] step 2 loss 1.9")
            run = CellRun([0, 1], {0: ProcResult(0, "error"), 1: ProcResult(1, "dead")})
            raise MultihostError(run, "failed")
        print("[p0-1] restored step 2\n[p0-1] step 3 loss 1.8")
        return "value"

    def restart(self) -> float:
        return 0.1


def test_retries_draw_the_chart_in_place_and_give_stdout_back(monkeypatch):
    shown = []

    class Handle:
        def update(self, bundle, raw):
            shown.append(("update", bundle))

    def display(bundle, raw, display_id):
        shown.append(("display", bundle))
        return Handle()

    monkeypatch.setattr(training_watch, "display", display)
    stdout = sys.stdout
    assert retries.run_with_retries(Session(), "x", None, {}, 1) == "value"
    assert sys.stdout is stdout
    assert shown[0][0] == "display" and all(kind == "update" for kind, _ in shown[1:])
    last = shown[-1][1]
    assert "fault 1: process 1 died (dead: p1)" in last["text/plain"]
    assert "restored" in last["text/plain"] and "step 3" in last["text/plain"]
    ET.fromstring(last["image/svg+xml"])
    assert last["image/png"].startswith("iVBOR")  # base64 of a PNG signature


def test_a_cell_that_prints_no_steps_draws_nothing(monkeypatch):
    monkeypatch.setattr(training_watch, "display", lambda *a, **k: pytest.fail("drawn"))

    class Quiet(Session):
        def run_cell(self, code, procs, **options):
            return "value"

    assert retries.run_with_retries(Quiet(), "x", None, {}, 1) == "value"


def test_the_png_shows_the_outage_and_every_phase_colour():
    from jaxsys_kernel.cells.training_png import training_picture
    from jaxsys_kernel.cells.training_svg import OUTAGE, PHASE_COLOURS
    from jaxsys_kernel.widgets.raster import rgb

    log, _ = faulted_run()
    canvas = training_picture(log)
    assert canvas.png().startswith(b"\x89PNG")
    colours = {tuple(c) for c in canvas.pixels.reshape(-1, 3)}
    assert {rgb(c) for c in (OUTAGE, *PHASE_COLOURS)} <= colours
    quiet = tc.TrainingLog(clock=Clock())
    quiet.feed("[p0] step 1 loss 2.0\n")
    assert training_picture(quiet).height < canvas.height  # no strip without a fault


def test_losses_at_the_floats_limits_still_draw():
    from jaxsys_kernel.cells.training_png import training_picture

    log = tc.TrainingLog(clock=Clock())
    for step, loss in enumerate(["1e308", "-1.7e308", "inf", "-inf", "nan", "0"], 1):
        log.clock.now += 1.0
        log.feed(f"[p0] step {step} loss {loss}\n")
    svg = training_svg(log)
    assert "nan" not in svg.replace(">nan<", "") and "inf," not in svg
    ET.fromstring(svg)
    assert training_picture(log).png().startswith(b"\x89PNG")


def test_a_chart_that_fails_to_draw_says_so_once_and_the_cell_goes_on(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no display")

    monkeypatch.setattr(training_watch, "display", broken)
    assert retries.run_with_retries(Session(), "x", None, {}, 1) == "value"
    err = capsys.readouterr().err
    assert err.count("the training chart could not be drawn: RuntimeError('no display')") == 1
