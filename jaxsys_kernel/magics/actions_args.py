"""Argument handling shared by the jaxsys magics: splitting, bounds, typed option values.

Every failure here is a :class:`~IPython.core.error.UsageError` (or an
``argparse.ArgumentTypeError``, which the magic's parser turns into one), so a mistyped
line never surfaces as a ``ValueError`` from deep inside the standard library.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from collections.abc import Callable, Iterable, Sequence

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument
from IPython.utils.process import arg_split
from IPython.utils.text import DollarFormatter

from .._ranges import parse_procs
from ..cluster.config import CORE_FLAGS, ClusterConfig
from ..cluster.options import flag_arguments, pairs
from ..cluster.options import seconds as seconds  # the magics' seconds are the options' own
from ..errors import ConfigError

log = logging.getLogger("jaxsys.magics")

# Longest magic line accepted. A real line is a few hundred characters (a long ssh host
# list is under 2 KB); IPython's ``$var`` / ``{expr}`` expansion is quadratic in the
# line's length, so an unbounded line could block the kernel for many seconds.
MAX_LINE = 4096

_formatter = DollarFormatter()


def bounded(line: str, magic: str, limit: int = MAX_LINE) -> str:
    """Return ``line`` if it is at most ``limit`` characters long.

    Raises
    ------
    UsageError
        Naming the magic, the length and the limit.
    """
    if len(line) > limit:
        raise UsageError(
            f"{magic}: the line is {len(line)} characters long; at most {limit} are accepted"
        )
    return line


def expand(line: str, namespace: dict) -> str:
    """Expand ``$name`` and ``{expression}`` in ``line`` as IPython does for magic lines.

    The magics opt out of IPython's own expansion (it runs before any length check) and
    call this on the bounded line instead, so that lines such as
    ``%jaxsys start --cache-dir {cache_dir}`` keep working. As in IPython, a line that
    cannot be expanded is used as it is.
    """
    if "$" not in line and "{" not in line:
        return line
    try:
        return _formatter.vformat(line, args=[], kwargs=dict(namespace))
    except Exception:  # noqa: BLE001 - IPython's rule: an unexpandable line stays as written
        return line


def split(line: str) -> list[str]:
    """Split a magic line into words the way IPython's magics always have.

    Quotes are kept in the words (IPython's ``arg_split`` with ``posix=False``), so every
    line that parsed before parses the same way.

    Raises
    ------
    UsageError
        If the line cannot be split, e.g. a quotation is not closed.
    """
    try:
        return arg_split(line, strict=True)
    except ValueError as e:
        raise UsageError(f"cannot read the options: {e} in {line.strip()!r}") from None


def count(text: str) -> int:
    """A whole number of at least 1 (an argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def env_pairs(items: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` from repeated ``--env`` options as a dict (the options' own
    parsing, :func:`~jaxsys_kernel.cluster.options.pairs`).

    Raises
    ------
    UsageError
        If an item has no ``=`` or no key.
    """
    try:
        return pairs("--env")(items)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def rank(text: str) -> int:
    """A process number, written ``2`` or ``p2``.

    Raises
    ------
    UsageError
        If ``text`` is neither.
    """
    try:
        return int(text.removeprefix("p"))
    except ValueError:
        raise UsageError(f"expected a process number such as 2, got {text!r}") from None


def processes(session, process: str | None, procs: str | None, magic: str) -> list[int] | None:
    """The processes a line names, as ``P`` (``2``, ``p2``) or as ``--procs 1,3-4``; None
    when it names none.

    Raises
    ------
    UsageError
        When it names them both ways, or ``--procs`` is no selection of this cluster's.
    """
    if process is not None and procs is not None:
        raise UsageError(f"{magic}: name the processes as P or with --procs, not both")
    if procs is None:
        return None if process is None else [rank(process)]
    cluster = session.cluster if session.cluster is not None else session.require_cluster()
    try:
        return parse_procs(procs, cluster.nprocs)
    except ValueError as e:
        raise UsageError(f"{magic} --procs: {e}") from None


def cluster_arguments(func: Callable) -> Callable:
    """Add a flag for every cluster option :class:`ClusterConfig` declares to a
    ``magic_arguments`` function (place it first among its ``@argument`` lines); a
    launcher's flag that the magic has already is left out, with a warning."""
    own = {a for d in getattr(func, "decorators", ()) for a in getattr(d, "args", ())}
    for flag, kwargs in reversed(flag_arguments(ClusterConfig)):
        if flag in own and flag not in CORE_FLAGS:
            # A plug-in launcher's flag must not break the magic.
            log.warning("the launcher flag %s is left out: the magic has its own", flag)
            continue
        func = argument(flag, **kwargs)(func)
    return func


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'status'?`` for the closest of ``choices`` to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def known_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string ``parser`` takes (``--timeout``, ``--procs``, ...)."""
    return [s for a in parser._actions for s in a.option_strings]


def check_options(parser: argparse.ArgumentParser, words: Sequence[str], magic: str) -> None:
    """Refuse an option ``parser`` does not take before argparse reads the line.

    argparse would otherwise take the mistyped option's value for a positional argument
    and complain about that (``--timout 5``: "invalid choice: '5'"), which hides the typo.
    A unique prefix of an option (``--time``) is still accepted, as argparse accepts it.

    Raises
    ------
    UsageError
        Naming the option, the closest one the magic takes, and where the options are listed.
    """
    options = known_options(parser)
    for word in words:
        if word == "--":
            return
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        starting = [o for o in options if o.startswith(flag)]
        if flag in options or len(starting) == 1:
            continue
        if starting:
            raise UsageError(
                f"{magic}: {flag} could be {' or '.join(starting)}; write the option in full"
            )
        raise UsageError(
            f"{magic} has no option {flag}{did_you_mean(flag, options)} "
            f"({magic}? lists its options)"
        )


def parse(parser: argparse.ArgumentParser, words: list[str], magic: str) -> argparse.Namespace:
    """Parse a magic's words, with a did-you-mean for a mistyped option."""
    check_options(parser, words, magic)
    return parser.parse_args(words)
