"""Output collation: properties over arbitrary chunkings and interleavings (a fake clock
stands in for time). Pure logic, but a search of a minute: it runs with the live tests."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsys_kernel._ranges import parse_procs

from ..unit.test_collate import WINDOW, make

LABELLED = re.compile(r"\[(p[0-9,\-]+)\] (.*)")

# Texts chosen to collide: repeats, an empty line, and one that looks like a label.
TEXTS = ["a", "b", "", "x y", "[p0] z", "a "]


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

