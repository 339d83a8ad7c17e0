"""Messages that help: did-you-mean for mistyped options and actions, help as plain text."""

from __future__ import annotations

import argparse

import pytest
from IPython.core.error import UsageError

from jaxsys_kernel.magics import actions
from jaxsys_kernel.magics.actions_args import check_options, did_you_mean
from jaxsys_kernel.magics.actions_help import plain_text

# Built from MultihostSession's signatures (tests/unit/test_fakes.py checks it): it records
# the calls the magics make, none when a line is refused.


def test_a_mistyped_cell_option_suggests_the_right_one(shell, session):
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("multihost", "--timout 5", "x = 1")
    message = str(info.value)
    assert "--timout" in message and "did you mean '--timeout'?" in message
    assert "invalid choice" not in message
    assert session.calls == []


def test_a_prefix_of_an_option_still_works(shell, session):
    parser = shell.magics_manager.registry["JaxSysMagics"].multihost.parser
    check_options(parser, ["--time", "5"], "%%multihost")  # argparse accepts unique prefixes
    with pytest.raises(UsageError, match="--t could be --timeout or --thread-guard"):
        check_options(parser, ["--t", "5"], "%%multihost")  # ambiguous: --timeout, --thread-guard


def test_pull_suggests_its_option(shell, session):
    with pytest.raises(UsageError, match="did you mean '--proc'"):
        shell.run_line_magic("pull", "x --prc 1")


def test_a_mistyped_action_suggests_the_right_one(shell, session):
    with pytest.raises(UsageError, match="did you mean 'status'"):
        shell.run_line_magic("jaxsys", "stauts")
    assert session.calls == []


def test_a_mistyped_action_option_suggests_the_right_one(shell, session):
    with pytest.raises(UsageError, match="does not take --tial; did you mean '--tail'"):
        shell.run_line_magic("jaxsys", "logs 0 --tial 5")


def test_no_suggestion_for_a_word_like_nothing():
    assert did_you_mean("xyzzy", ["status", "start"]) == ""


def test_help_is_plain_text(shell, session, capsys):
    shell.run_line_magic("jaxsys", "help")
    overview = capsys.readouterr().out
    for name in actions.ACTIONS:
        shell.run_line_magic("jaxsys", f"help {name}")
        text = capsys.readouterr().out
        assert "``" not in text and "::" not in text and ":func:" not in text, name
    assert "``" not in overview and "::" not in overview
    assert "%jaxsys ACTION [options]: each action" in overview


def test_plain_text_keeps_examples_and_names():
    doc = (
        "Run ``x``, see :func:`jax.jit` and `y`.\n\nExamples\n--------\n::\n\n    %jaxsys status\n"
    )
    assert (
        plain_text(doc) == "Run x, see jax.jit and y.\n\nExamples\n--------\n    %jaxsys status\n"
    )
    assert plain_text("as shown here::\n\n    code") == "as shown here:\n\n    code"


def test_check_options_stops_at_a_double_dash():
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs")
    check_options(parser, ["--procs", "1", "--", "--anything"], "%x")
