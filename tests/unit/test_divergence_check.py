"""The kernel's divergence comparator, driven by synthetic records and a fake clock."""

from __future__ import annotations

from jaxsys_kernel.cells.divergence import DivergenceCheck, call_text, entry_key

ALL = [0, 1, 2, 3]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def dispatch(name="f", args=("f32[8]",), line=4, procs=ALL, shardings=("P('x',)",)):
    return {
        "kind": "dispatch",
        "name": name,
        "args": list(args),
        "shardings": list(shardings),
        "procs": list(procs),
        "line": line,
        "fingerprint": "ab",
    }


def where(line, idle=True, in_jax=False):
    return {"kind": "where", "line": line, "idle": idle, "in_jax": in_jax}


def make(**kw):
    clock = Clock()
    return DivergenceCheck(ALL, clock, **kw), clock


def test_identical_sequences_find_nothing():
    check, clock = make()
    for r in ALL:
        check.feed(r, dispatch())
        check.feed(r, dispatch("g"))
    for r in ALL:
        check.finished(r)
    clock.now += 10
    assert check.poll() is None and check.next_deadline() is None


def test_a_different_shape_waiting_processes_are_named_in_one_sentence():
    check, clock = make()
    for r in ALL:
        check.feed(r, dispatch(args=("f32[16]",) if r == 1 else ("f32[8]",)))
    assert check.poll() is None  # waits to learn whether they finish
    assert check.next_deadline() == clock.now + check.settle
    clock.now += check.settle
    found = check.poll()
    assert found.kind == "diverged" and found.ranks == (1,)
    assert found.message == (
        "p1 ran f(f32[16]) at line 4 where p0,2-3 ran f(f32[8]) at line 4: "
        "these processes will wait for each other"
    )


def test_a_different_shape_that_finishes_is_a_wrong_result():
    check, clock = make()
    for r in ALL:
        check.feed(r, dispatch(args=("f32[12,4]",) if r == 1 else ("f32[8,4]",)))
    assert check.poll() is None
    for r in ALL:
        check.finished(r)
    found = check.poll()
    assert found.message.endswith("they finished, so the result is not what either computed")


def test_a_different_function_on_one_process():
    check, clock = make()
    for r in ALL:
        check.feed(r, dispatch("h" if r == 3 else "f", line=6 if r == 3 else 5))
    clock.now += 1
    msg = check.poll().message
    assert msg.startswith("p3 ran h(f32[8]) at line 6 where p0-2 ran f(f32[8]) at line 5")


def test_two_collectives_in_another_order():
    check, clock = make()
    for r in ALL:
        first, second = ("g", "f") if r == 2 else ("f", "g")
        check.feed(r, dispatch(first))
        check.feed(r, dispatch(second))
    clock.now += 1
    found = check.poll()
    assert found.ranks == (2,) and "p2 ran g(f32[8])" in found.message


def test_a_process_that_finishes_without_a_collective_is_named():
    check, clock = make()
    for r in (0, 1, 3):
        check.feed(r, dispatch(line=3))
    check.finished(2)
    found = check.poll()
    assert found.kind == "skipped"
    assert found.message == (
        "p2 finished the cell without running f(f32[8]) that p0-1,3 ran at line 3: "
        "p0-1,3 will wait for p2"
    )


def test_nobody_waiting_is_no_alarm():
    # A process that took the call from JAX's cache reports nothing; nobody hung.
    check, clock = make()
    for r in (0, 1, 3):
        check.feed(r, dispatch())
    for r in ALL:
        check.finished(r)
    assert check.poll() is None


def test_a_process_idle_in_python_is_stuck_after_the_window():
    check, clock = make(window=1.0)
    check.feed(1, where(3))
    for r in (0, 2, 3):
        check.feed(r, dispatch(line=4))
    clock.now += 0.9
    assert check.poll() is None
    assert check.next_deadline() == 101.0
    clock.now += 0.1
    found = check.poll()
    assert found.kind == "stuck" and found.ranks == (1,)
    assert found.message == (
        "p1 sits idle in Python at line 3, not in JAX, while p0,2-3 wait in f(f32[8]) at "
        "line 4: p1 is stuck, not diverged"
    )


def test_a_process_busy_or_compiling_is_not_called_stuck():
    check, clock = make(window=1.0)
    check.feed(1, where(3, idle=False))
    check.feed(2, where(3, idle=True, in_jax=True))
    check.feed(0, dispatch())
    check.feed(3, dispatch())
    clock.now += 5
    assert check.poll() is None


def test_executables_over_a_subset_are_compared_within_it():
    check, clock = make()
    check.feed(0, dispatch(procs=[0, 1]))
    check.feed(1, dispatch(procs=[0, 1]))
    for r in ALL:
        check.finished(r)
    clock.now += 5
    assert check.poll() is None


def test_single_process_and_unknown_records_are_ignored():
    check, clock = make()
    check.feed(0, dispatch(procs=[0]))
    check.feed(9, dispatch())
    check.feed(1, {"kind": "other"})
    check.feed(1, "not a dict")
    check.finished(1)
    assert check.poll() is None


def test_entries_seen_in_earlier_cells_are_left_out():
    known = {entry_key(dispatch("f"))}
    check, clock = make(known=known)
    check.feed(2, dispatch("f"))  # a restarted process compiles what the others cached
    for r in ALL:
        check.feed(r, dispatch("g"))
    clock.now += 1
    assert check.poll() is None
    assert entry_key(dispatch("g")) in check.seen


def test_the_first_finding_stays():
    check, clock = make()
    for r in (0, 1, 3):
        check.feed(r, dispatch())
    check.finished(2)
    first = check.poll()
    check.feed(0, dispatch("zzz"))
    assert check.poll() is first


def test_call_text():
    assert call_text({"name": "sum", "args": ["f32[8,4]", "i32[]"]}) == "sum(f32[8,4], i32[])"


def test_a_skip_waits_briefly_for_the_others_to_report():
    check, clock = make()
    check.feed(3, dispatch())
    check.finished(2)
    assert check.poll() is None
    check.feed(0, dispatch())
    check.feed(1, dispatch())
    assert "that p0-1,3 ran" in check.poll().message


def test_a_skip_is_named_after_the_settle_time_even_if_some_never_report():
    check, clock = make()
    check.feed(3, dispatch())
    check.finished(2)
    clock.now += check.settle
    assert check.poll().message.endswith("that p3 ran at line 4: p0-1,3 will wait for p2")


def test_late_reporters_join_their_group_before_the_sentence():
    check, clock = make()
    check.feed(2, dispatch("g"))
    check.feed(3, dispatch("f"))
    assert check.poll() is None
    check.feed(0, dispatch("f"))
    check.feed(1, dispatch("f"))
    clock.now += check.settle
    assert check.poll().message.startswith("p2 ran g(f32[8]) at line 4 where p0-1,3 ran f(f32[8])")


def test_a_process_that_failed_is_left_to_the_hang_doctor():
    check, clock = make()
    for r in (0, 1, 3):
        check.feed(r, dispatch())
    check.finished(2, failed=True)
    clock.now += 5
    assert check.poll() is None
