"""Output collation: properties over arbitrary chunkings and interleavings, and the cases seen
on real clusters (a fake clock stands in for time)."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsys_kernel._ranges import parse_procs
from jaxsys_kernel.cells.collate import DEFAULT_WINDOW, LineCollator

WINDOW = 1.0
LABELLED = re.compile(r"\[(p[0-9,\-]+)\] (.*)")
# Texts chosen to collide: repeats, an empty line, and one that looks like a label.
TEXTS = ["a", "b", "", "x y", "[p0] z", "a "]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(procs, **kw):
    out: list[str] = []
    clock = Clock()
    kw.setdefault("window", WINDOW)
    c = LineCollator(list(procs), out.append, clock=clock, **kw)
    return c, out, clock


def parse(out: list[str], nprocs: int) -> list[tuple[list[int], str]]:
    """Every emitted line as (processes, text); each chunk must be whole lines."""
    lines = []
    for chunk in out:
        assert chunk.endswith("\n"), chunk
        for ln in chunk[:-1].split("\n"):
            m = LABELLED.fullmatch(ln)
            assert m, ln
            lines.append((parse_procs(m.group(1)[1:], nprocs), m.group(2)))
    return lines


def per_process(lines, procs) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {p: [] for p in procs}
    for ps, text in lines:
        for p in ps:
            seen[p].append(text)
    return seen


def expected_lines(text: str) -> list[str]:
    """The lines a process printed: its text split at newlines, a final partial line kept."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


@st.composite
def outputs(draw, min_procs=1, max_procs=5):
    """Per-process output texts, each cut into chunks at arbitrary places."""
    n = draw(st.integers(min_procs, max_procs))
    texts, chunks = [], []
    for p in range(n):
        lines = draw(st.lists(st.sampled_from([*TEXTS, f"r{p}"]), max_size=8))
        text = "".join(ln + "\n" for ln in lines)
        if draw(st.booleans()):
            text += draw(st.sampled_from(["tail", "a", ""]))  # maybe an unterminated line
        texts.append(text)
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
        bounds = [0, *cuts, len(text)]
        chunks.append([text[i:j] for i, j in zip(bounds, bounds[1:], strict=False) if j > i])
    return texts, chunks


def play(data, c, clock, chunks, *, max_step=0.5, finish=True, pump=True, until=None):
    """Feed every chunk, processes interleaved at random, the clock moving by random steps.

    A process may be finished once all its chunks are in; ``until`` caps the clock.
    """
    left = {p: list(cs) for p, cs in enumerate(chunks)}
    done: set[int] = set()
    while any(left.values()) or (finish and len(done) < len(chunks)):
        dt = data.draw(st.floats(0, max_step))
        clock.t = min(clock.t + dt, until) if until is not None else clock.t + dt
        ready = [p for p, cs in left.items() if cs]
        if finish:
            ready += [p for p, cs in left.items() if not cs and p not in done]
        p = data.draw(st.sampled_from(ready))
        if left[p]:
            c.feed(p, left[p].pop(0))
        elif data.draw(st.booleans()):
            c.finish(p)
            done.add(p)
        elif not any(left.values()):
            # Nothing else can happen: finish it now so the loop ends.
            c.finish(p)
            done.add(p)
        if pump and data.draw(st.booleans()):
            c.pump()


@settings(max_examples=300, deadline=None)
@given(outputs(), st.data())
def test_every_process_keeps_its_own_lines_in_order(case, data):
    texts, chunks = case
    procs = range(len(texts))
    c, out, clock = make(procs)
    play(data, c, clock, chunks, finish=data.draw(st.booleans()))
    c.flush()
    assert not c.pending()
    assert c.next_deadline() is None
    got = per_process(parse(out, len(texts)), procs)
    # Nothing lost, nothing duplicated, nothing reordered within a process.
    assert got == {p: expected_lines(t) for p, t in zip(procs, texts, strict=True)}


@settings(max_examples=300, deadline=None)
@given(outputs(), st.data())
def test_no_complete_line_is_held_longer_than_the_window(case, data):
    texts, chunks = case
    procs = range(len(texts))
    c, out, clock = make(procs)
    fed = dict.fromkeys(procs, "")
    arrivals: dict[int, list[float]] = {p: [] for p in procs}
    left = {p: list(cs) for p, cs in enumerate(chunks)}
    while any(left.values()):
        clock.t += data.draw(st.floats(0, 0.5))
        p = data.draw(st.sampled_from([p for p, cs in left.items() if cs]))
        chunk = left[p].pop(0)
        c.feed(p, chunk)
        fed[p] += chunk
        arrivals[p] += [clock.t] * (fed[p].count("\n") - len(arrivals[p]))
    clock.t += data.draw(st.floats(0, 2 * WINDOW))
    c.pump()
    shown = per_process(parse(out, len(texts)), procs)
    for p in procs:
        overdue = sum(1 for t in arrivals[p] if clock.t >= t + WINDOW)
        assert len(shown[p]) >= overdue, (p, arrivals[p], clock.t, shown[p])
    deadline = c.next_deadline()
    assert (deadline is None) == (not c.pending())
    if deadline is not None:
        assert deadline > clock.t


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 6),
    st.lists(st.sampled_from(TEXTS), min_size=1, max_size=6),
    st.booleans(),
    st.data(),
)
def test_lines_every_process_prints_within_the_window_show_once(n, lines, tail, data):
    text = "".join(ln + "\n" for ln in lines) + ("end" if tail else "")
    chunks = []
    for _ in range(n):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=4)))
        bounds = [0, *cuts, len(text)]
        chunks.append([text[i:j] for i, j in zip(bounds, bounds[1:], strict=False) if j > i])
    c, out, clock = make(range(n))
    # However spread out and cut up, all arrives before the first copy's window ends.
    play(data, c, clock, chunks, max_step=0.2, until=0.99 * WINDOW, finish=data.draw(st.booleans()))
    c.flush()
    label = f"p0-{n - 1}"
    assert "".join(out) == "".join(f"[{label}] {ln}\n" for ln in expected_lines(text))


@settings(max_examples=200, deadline=None)
@given(outputs(), st.data())
def test_without_collation_every_line_is_labelled_at_once(case, data):
    texts, chunks = case
    procs = range(len(texts))
    c, out, clock = make(procs, collate=False)
    fed = dict.fromkeys(procs, "")
    left = {p: list(cs) for p, cs in enumerate(chunks)}
    while any(left.values()):
        p = data.draw(st.sampled_from([p for p, cs in left.items() if cs]))
        chunk = left[p].pop(0)
        before = len(out)
        complete = fed[p].count("\n")
        c.feed(p, chunk)
        fed[p] += chunk
        # Exactly the lines this chunk completed, each under its own process's label.
        assert parse(out[before:], len(texts)) == [
            ([p], ln) for ln in fed[p].split("\n")[complete:-1]
        ]
    c.flush()
    lines = parse(out, len(texts))
    assert all(len(ps) == 1 for ps, _ in lines)
    got = per_process(lines, procs)
    assert got == {p: expected_lines(t) for p, t in zip(procs, texts, strict=True)}


# -- the cases seen on clusters ---------------------------------------------------------------


def arrive_spread(c, clock, procs, text, spread, seed=0):
    """Each process prints ``text`` at a random moment within ``spread`` seconds."""
    rng = random.Random(seed)
    times = sorted((rng.uniform(0, spread), p) for p in procs)
    times[0] = (0.0, times[0][1])
    times[-1] = (spread, times[-1][1])
    start = clock.t
    for t, p in times:
        clock.t = start + t
        c.pump()
        c.feed(p, text)


def test_sixteen_processes_spread_over_600_ms_show_one_line():
    c, out, clock = make(range(16))
    rng = random.Random(1)
    order = rng.sample(range(16), 16)
    for i, p in enumerate(order):
        clock.t = 0.6 * i / 15
        c.pump()
        if i < 15:
            assert out == []  # still waiting for the others
        c.feed(p, "n 16\n")
    assert out == ["[p0-15] n 16\n"]


def test_default_window_covers_the_spread_seen_at_sixteen_processes():
    assert 0.6 < DEFAULT_WINDOW <= 1.0
    c, out, clock = make(range(16), window=DEFAULT_WINDOW)
    arrive_spread(c, clock, range(16), "n 16\n", 0.6)
    assert out == ["[p0-15] n 16\n"]


def test_identical_then_differing_lines_after_a_collective():
    c, out, clock = make(range(16))
    for i, p in enumerate(random.Random(2).sample(range(16), 16)):
        clock.t = 0.04 * i
        c.feed(p, f"n 16\nrank {p}\n")
    assert "".join(out) == "[p0-15] n 16\n" + "".join(f"[p{p}] rank {p}\n" for p in range(16))


def test_a_line_only_process_0_prints_does_not_break_the_merge():
    c, out, clock = make(range(4))
    c.feed(2, "sum 6.0\n")
    c.feed(0, "compiling\nsum 6.0\n")
    c.feed(1, "sum 6.0\n")
    clock.t = 0.3
    c.feed(3, "sum 6.0\ndone\n")
    for p in range(3):
        c.feed(p, "done\n")
    assert "".join(out) == "[p0] compiling\n[p0-3] sum 6.0\n[p0-3] done\n"


def test_an_extra_line_arriving_alone_goes_first_and_the_common_line_waits():
    c, out, clock = make(range(4))
    c.feed(3, "compiling\n")
    for p in range(3):
        c.feed(p, "sum 6.0\n")
    # Process 3's next line is not in yet: its extra line is shown, the common one waits.
    assert "".join(out) == "[p3] compiling\n"
    clock.t = 0.2
    c.feed(3, "sum 6.0\n")
    assert "".join(out) == "[p3] compiling\n[p0-3] sum 6.0\n"


def test_laggards_past_the_window_merge_among_themselves():
    c, out, clock = make(range(16))
    for p in range(13):
        c.feed(p, "n 16\n")
    clock.t = WINDOW
    c.pump()
    assert out == ["[p0-12] n 16\n"]
    for p in range(13):
        c.feed(p, "next\n")  # the early ones go on; the next line waits for the laggards
    clock.t = 1.4
    c.feed(13, "n 16\nnext\n")
    c.feed(15, "n 16\n")
    c.feed(14, "n 16\nnext\n")
    c.feed(15, "next\n")
    assert "".join(out) == "[p0-12] n 16\n[p13-15] n 16\n[p0-15] next\n"


def test_a_line_from_one_process_streams_after_the_window():
    c, out, clock = make(range(4))
    clock.t = 10.0
    c.feed(0, "step 1\n")
    assert c.next_deadline() == 10.0 + WINDOW
    clock.t = 10.0 + WINDOW - 0.01
    c.pump()
    assert out == []
    clock.t = c.next_deadline()
    c.pump()
    assert out == ["[p0] step 1\n"]
    assert c.next_deadline() is None


def test_the_window_starts_at_the_first_copy():
    c, out, clock = make(range(3))
    c.feed(0, "x\n")
    clock.t = 0.8
    c.feed(1, "x\n")
    assert c.next_deadline() == WINDOW
    clock.t = WINDOW
    c.pump()
    assert out == ["[p0-1] x\n"]
    clock.t = 1.1
    c.feed(2, "x\n")
    assert out == ["[p0-1] x\n", "[p2] x\n"]


def test_finished_processes_are_not_waited_for():
    c, out, _ = make(range(4))
    c.finish(3)
    for p in range(3):
        c.feed(p, "x\n")
    assert out == ["[p0-2] x\n"]
    c.finish(2)
    c.feed(0, "y\n")
    c.feed(1, "y\n")
    assert out[-1] == "[p0-1] y\n"


def test_lines_printed_in_crossed_orders_do_not_wait():
    c, out, _ = make(range(2))
    c.feed(0, "x\ny\n")
    c.feed(1, "y\nx\n")
    assert "".join(out) == "[p0] x\n[p0-1] y\n[p1] x\n"


def test_repeated_lines_are_matched_by_occurrence():
    c, out, _ = make(range(2))
    c.feed(0, "\n\nx\n")
    c.feed(1, "\nx\n")
    c.finish(0)
    c.finish(1)
    assert "".join(out) == "[p0-1] \n[p0] \n[p0-1] x\n"


def test_flush_shows_everything_held():
    c, out, _ = make(range(3))
    c.feed(0, "a\nb")
    c.feed(1, "a\n")
    c.flush()
    assert "".join(out) == "[p0-1] a\n[p0] b\n"
    assert not c.pending()


def test_many_processes_and_lines_stay_cheap():
    c, out, clock = make(range(16))
    text = "".join(f"line {i}\n" for i in range(2000))
    for p in range(16):
        for i in range(0, len(text), 997):
            c.feed(p, text[i : i + 997])
    c.flush()
    assert "".join(out) == "".join(f"[p0-15] line {i}\n" for i in range(2000))


def test_a_process_that_moved_on_is_not_waited_for():
    c, out, _ = make(range(3))
    c.feed(0, "a\nb\n")
    c.feed(1, "a\nb\n")
    c.feed(2, "c\nb\n")
    # Process 2 printed b, which comes after a elsewhere: it skipped a. Process order holds.
    assert "".join(out) == "[p0-1] a\n[p2] c\n[p0-2] b\n"


def test_differing_lines_keep_process_order_when_a_later_process_is_ready_first():
    # p0 and p2 finished with their lines held; p1's line is then the only one nobody else
    # can still print, so it is ready first, yet it must not jump ahead of p0's.
    c, out, _ = make(range(3))
    c.feed(0, "0 3\n")
    c.finish(0)
    c.feed(2, "2 3\n")
    c.finish(2)
    c.feed(1, "1 3\n")
    c.finish(1)
    assert "".join(out) == "[p0] 0 3\n[p1] 1 3\n[p2] 2 3\n"


def test_differing_lines_keep_process_order_when_a_window_expires():
    c, out, clock = make(range(3))
    c.feed(1, "b\n")
    clock.t = WINDOW / 2
    c.feed(0, "a\n")
    clock.t = WINDOW
    c.pump()
    assert "".join(out) == "[p0] a\n[p1] b\n"
