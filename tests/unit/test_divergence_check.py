"""The kernel's divergence comparator, driven by synthetic records and a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsys_kernel.cells import divergence
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


# -- records from the engines are untrusted ------------------------------------------------

MALFORMED = [
    ("not a record", "the record is str, not an object"),
    ({**dispatch(), "args": [1, 2]}, "args holds int, not text"),
    ({**dispatch(), "args": [["f32[8]"]]}, "args holds list, not text"),
    ({**dispatch(), "args": "f32[8]"}, "args is str, not a list"),
    ({**dispatch(), "procs": 4}, "procs is int, not a list of processes"),
    ({**dispatch(), "procs": [0, "1"]}, "procs holds something that is not a process number"),
    ({**dispatch(), "procs": [0, True]}, "procs holds something that is not a process number"),
    ({k: v for k, v in dispatch().items() if k != "name"}, "name is NoneType, not text"),
    ({**dispatch(), "name": {"a": 1}}, "name is dict, not text"),
    ({**dispatch(), "name": "f" * 10_000_000}, "name is 10,000,000 characters, more than"),
    ({**dispatch(), "shardings": ["P"] * 1_000_000}, "shardings has 1,000,000 items"),
    ({**dispatch(), "procs": list(range(100_000))}, "procs has 100,000 items"),
    ({**dispatch(), "line": "4"}, "line is '4', not a line number"),
    ({**dispatch(), "fingerprint": 7}, "fingerprint is int, not text"),
    ({"kind": "where", "line": 3, "idle": "yes", "in_jax": False}, "idle and in_jax must be"),
]


@pytest.mark.parametrize(("bad", "said"), MALFORMED)
def test_a_malformed_record_is_refused_in_words_and_the_check_goes_on(bad, said):
    check, clock = make()
    refusal = check.feed(1, bad)
    assert refusal is not None and said in refusal, refusal
    assert refusal.startswith("p1 sent a divergence record the kernel refuses")
    assert refusal.endswith("p1 is left out of the divergence check for this cell")
    assert check.feed(1, bad) is None  # said once
    # The others are still compared: p3 runs another shape than p0 and p2.
    for r in ALL:
        check.feed(r, dispatch(args=("f32[16]",) if r == 3 else ("f32[8]",)))
    clock.now += check.settle
    found = check.poll()
    assert found is not None and found.ranks == (3,), found
    assert found.message.startswith("p3 ran f(f32[16]) at line 4 where p0,2 ran f(f32[8])")


def test_a_process_refused_after_it_differed_is_not_named():
    check, clock = make()
    for r in ALL:
        check.feed(r, dispatch(args=("f32[16]",) if r == 1 else ("f32[8]",)))
    assert check.poll() is None
    check.feed(1, {**dispatch(), "args": None})
    clock.now += check.settle
    assert check.poll() is None
    for r in ALL:
        check.finished(r)
    assert check.poll() is None


def test_a_flood_of_dispatch_records_is_refused(monkeypatch):
    monkeypatch.setattr(divergence, "MAX_ENTRIES", 50)
    check, clock = make()
    said = [check.feed(2, dispatch(f"f{i}")) for i in range(60)]
    assert said[:50] == [None] * 50
    assert "more than 50 dispatch records in one cell" in said[50]
    assert said[51:] == [None] * 9 and len(check.procs[2].entries[tuple(ALL)]) == 50


def test_the_watch_says_a_refusal_under_the_cell_once():
    check, clock = make()
    lines: list[str] = []
    watch = divergence.DivergenceWatch(check, lines.append, "application/x-test")

    def message(data):
        return {"header": {"msg_type": "display_data"}, "content": {"data": data}}

    bad = message({"application/x-test": {**dispatch(), "procs": None}})
    assert watch.intercept(1, "iopub", bad) and watch.intercept(1, "iopub", bad)
    assert not watch.intercept(1, "iopub", message("not a dict"))
    assert len(lines) == 1 and lines[0].startswith("jaxsys: p1 sent a divergence record")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
records = st.fixed_dictionaries(
    {"kind": st.sampled_from(["dispatch", "where", "other"])},
    optional={
        k: json_values
        for k in ("name", "args", "shardings", "procs", "line", "idle", "in_jax", "fingerprint")
    },
) | json_values


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ALL), records), max_size=12))
def test_any_records_never_raise_in_the_kernel(fed):
    check, clock = make()
    for rank, record in fed:
        said = check.feed(rank, record)
        assert said is None or said.startswith(f"p{rank} sent")
        clock.now += 0.3
        check.poll()
        check.next_deadline()
    for r in ALL:
        check.finished(r)
    clock.now += 5
    check.poll()
