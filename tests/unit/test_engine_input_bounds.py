"""What the kernel reads of an engine's stack file and cell values is bounded or checked: a
flood written into the stack file, a value whose text is not text."""

from __future__ import annotations

from jaxsys_kernel.cluster import stacks


def test_a_stack_file_flooded_after_the_dump_is_read_up_to_the_bound(tmp_path):
    path = tmp_path / "stacks-0.txt"
    path.write_bytes(b"an earlier dump\n" * 1000)

    def flood(ranks, signum):
        with open(path, "ab") as f:
            f.write(b'Current thread 0x1 (most recent call first):\n  File "x.py", line 1\n')
            f.write(b"x" * (20 << 20))

    got = stacks.local_stacks({0: path}, flood, timeout=5.0)
    assert got[0].startswith("Current thread 0x1")
    assert len(got[0]) == stacks.MAX_DUMP_BYTES
    assert stacks.read_from(path, 0, limit=16) == "an earlier dump\n"


def test_a_cell_value_whose_text_is_not_text_is_shown_not_raised():
    from jaxsys_kernel.cells.result import CellRun, ProcResult, cell_result

    run = CellRun([0, 1, 2])
    run.results = {
        0: ProcResult(0, "ok", result={"text/plain": ["a", "list"]}),
        1: ProcResult(1, "ok", result={"text/plain": "7"}),
        2: ProcResult(2, "ok", result=["not", "a", "bundle"]),
    }
    shown = repr(cell_result(run))
    assert shown == "[p0] <list sent as text>\n[p1] 7", shown
