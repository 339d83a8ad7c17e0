"""The dashboard's straggler view through a real kernel and a 2-process cluster: it says how
to start recording, follows ``%jaxsys where on|off``, and after a cell of collective steps
with ``%jaxsys slow 1 --ms 200`` names p1 and the category, without ``%jaxsys where``."""

from __future__ import annotations

import ast

from ..harness import kernel_with_cluster
from .test_stragglers_live import SETUP, START, STEPS

# The kernel's own view of its dashboard's straggler part, printed as a Python literal.
SHOW = (
    "v = get_ipython().kernel.jaxsys.dashboard.stragglers\n"
    "print(repr({'recording': v.recording, 'named': v.info.get('named'),"
    " 'steps': v.info.get('steps_total'), 'rows': [r['rank'] for r in v.info.get('rows', [])],"
    " 'note': v.note}))"
)


def view_state(kernel) -> dict:
    return ast.literal_eval(kernel.ok(SHOW).stdout.strip().splitlines()[-1])


def test_the_dashboard_names_the_delayed_process_after_each_cell(tag):
    with kernel_with_cluster(tag, START) as k:
        k.ok(SETUP, timeout=120)
        k.ok("%jaxsys dashboard")
        assert view_state(k)["recording"] is False
        k.ok("%jaxsys where on")
        assert view_state(k)["recording"] is True
        k.ok(STEPS)  # compiles the step before the measured cells
        k.ok("%jaxsys slow 1 --ms 200")
        try:
            assert "total 128.0" in k.ok(STEPS).stdout
        finally:
            k.ok("%jaxsys slow 1 --off")
        state = view_state(k)
        assert state["named"] == {"rank": 1, "category": "host"}, state
        assert state["steps"] == 5 and sorted(state["rows"]) == [0, 1], state
        assert state["note"].startswith("as of "), state
        # A cell on one process leaves the other's records of the older cell: not shown.
        k.ok("%%multihost --procs 0\nprint('one')")
        assert view_state(k)["named"] == {"rank": 1, "category": "host"}
        k.ok("%jaxsys where off")
        assert view_state(k)["recording"] is False
        # A cell after recording stopped leaves the last summary as it was.
        k.ok("%%multihost\nprint('after')")
        assert view_state(k)["named"] == {"rank": 1, "category": "host"}
