"""``jaxsys job --preemption``: what the program does with SIGTERM, and what the log drops."""

from __future__ import annotations

import ast

import pytest

from jaxsys_kernel.job import preempt
from jaxsys_kernel.job.program import Cell, JobSetup, Program, render
from jaxsys_kernel.job.run import NOISE

pytestmark = pytest.mark.unit

RESET = "signal.signal(signal.SIGTERM, signal.SIG_DFL)"


def _program(**setup) -> str:
    text = render(Program(cells=[Cell(1, "x = 1")]), "nb.ipynb", JobSetup(**setup))
    ast.parse(text)  # it is Python
    return text


def test_by_default_sigterm_stays_jaxs_and_a_notice_has_a_bounded_grace():
    text = _program()
    assert (
        "PREEMPTION = 'jax'" in text and f"PREEMPTION_GRACE_S = {preempt.DEFAULT_GRACE_S!r}" in text
    )
    assert "PREEMPTION_WATCH.start()" in text and repr(preempt.NOTICE_KEY) in text
    # The watch ends before the program's end, where JAX shuts down.
    assert text.index("PREEMPTION_ENDED.set()") < text.index("jax_enable_recoverability and")


def test_preemption_kill_puts_sigterm_back_to_its_default():
    text = _program(preemption="kill", preemption_grace=5.0)
    assert "PREEMPTION = 'kill'" in text and "PREEMPTION_GRACE_S = 5.0" in text
    assert 'if PREEMPTION == "kill":\n    # ' in text and RESET in text


def test_the_notifiers_line_is_left_out_of_the_jobs_log():
    line = (
        "W1205 06:04:16.286616   14688 preemption_notifier.cc:94] SIGTERM caught at "
        "2026-12-05T06:04:16.286615371+00:00"
    )
    assert NOISE.sub("", line) == ""
    assert NOISE.sub("", "preempted: saved step 6") == "preempted: saved step 6"
