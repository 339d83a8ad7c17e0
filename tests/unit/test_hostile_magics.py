"""The magics against any line: a UsageError or success, never another exception, and never
more than a second to answer. Lines are random text, long text, and lines built from the
magics' own actions and options with hostile values (non-finite and huge numbers, unicode
digits, unclosed quotes, expansions). No cluster: the session is a fake."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from jaxsys_kernel.magics import actions
from jaxsys_kernel.magics.actions_args import MAX_LINE
from jaxsys_kernel.magics.magics import JaxSysMagics

from ..fakes import AnySession, NotFaked

# Longest any magic may take to answer a line, valid or not.
ANSWER_WITHIN = 1.0

OPTIONS = sorted(
    {
        opt
        for act in actions.ACTIONS.values()
        for a in act.parser._actions
        for opt in a.option_strings
    }
    | {"--procs", "--timeout", "--grace", "--on-hang", "--no-collate", "--force", "--proc"}
)
VALUES = [
    "0", "1", "-1", "2", "p2", "p", "0,2-3", "3-1", "0-", ",", "nan", "inf", "-inf", "1e309",
    "1e-320", "0x10", "1_000", "\uff11", "\u00b2", "\u0663", "9" * 5000, "", '"', "'", '"a b',
    "'x", "$x", "$", "{x}", "{", "}", "{{", "{x!r}", "{0}", "\\", "\x00", "\n", "\t", "--",
    "-", "?", "??", "help", "-h", "--help", "KEY=VALUE", "=", "=x", "KILL", "SIGKILL", "INT",
    "report", "restart", "on", "off", "a" * 300,
]  # fmt: skip
words = st.sampled_from([*actions.ACTIONS, *OPTIONS, *VALUES]) | st.text(max_size=12)
built_lines = st.lists(words, max_size=8).map(" ".join)
random_lines = st.text(max_size=200)
long_lines = st.integers(MAX_LINE - 10, 20_000).map(lambda n: "x " * (n // 2))
any_line = st.one_of(built_lines, built_lines, random_lines, long_lines)

FUZZ = settings(
    max_examples=250,
    deadline=None,  # timed below, against ANSWER_WITHIN, with the reason in the message
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def shell():
    sh = globalipapp.start_ipython() or globalipapp.get_ipython()  # None once started
    sh.register_magics(JaxSysMagics(sh, AnySession()))
    # What $x / {x} expand to: the expansion runs, and its result is parsed again.
    sh.user_ns["x"] = "--hosts 2"
    return sh


def answers(call, line: str) -> None:
    t0 = time.monotonic()
    try:
        call()
    except (UsageError, NotFaked):
        pass
    took = time.monotonic() - t0
    assert took < ANSWER_WITHIN, f"{took:.2f} s to answer {line[:100]!r}"


@FUZZ
@given(any_line)
def test_any_jaxsys_line(shell, capsys, line):
    answers(lambda: shell.run_line_magic("jaxsys", line), line)


@FUZZ
@given(any_line)
def test_any_multihost_line_and_cell(shell, capsys, line):
    answers(lambda: shell.run_line_magic("multihost", line), line)
    answers(lambda: shell.run_cell_magic("multihost", line, "x_ = 1"), line)


@FUZZ
@given(any_line)
def test_any_pull_and_local_line(shell, capsys, line):
    answers(lambda: shell.run_line_magic("pull", line), line)
    answers(lambda: shell.run_cell_magic("local", line, "pass"), line)
