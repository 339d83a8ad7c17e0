"""``%jaxsys divergence``: the check that names a process running a different program."""

from __future__ import annotations

import argparse

from IPython.core.magic_arguments import argument, magic_arguments

__all__ = ["divergence"]


@magic_arguments("jaxsys divergence")
@argument(
    "mode", nargs="?", choices=("on", "off"), metavar="on|off", help="turn the check on or off"
)
def divergence(session, args: argparse.Namespace) -> None:
    """Turn the divergence check on or off for every later ``%%multihost`` cell.

    While a cell runs, each process reports the executables it dispatches that span
    processes (function, argument types, shardings, your line), and the kernel compares
    them as they arrive. The moment one process runs something else, skips one, or sits
    idle in Python while the others wait, the cell says so in one sentence, before the
    hang doctor's grace period. It is on by default; ``%%multihost --no-check`` turns it
    off for one cell. Without an argument, says whether it is on.

    Examples
    --------
    ::

        %jaxsys divergence off
        %jaxsys divergence on
        %jaxsys divergence
    """
    if args.mode is not None:
        session.divergence = args.mode == "on"
    state = "on" if session.divergence else "off"
    print(f"jaxsys: the divergence check is {state} (%%multihost --no-check skips one cell)")
