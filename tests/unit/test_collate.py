"""Output collation: the cases seen on real clusters (a fake clock stands in for time).

The properties over arbitrary chunkings and interleavings are in ``live/test_collate_properties``.
"""

from __future__ import annotations

import random

from jaxsys_kernel.cells.collate import DEFAULT_WINDOW, LineCollator

WINDOW = 1.0


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
