"""How a ``%jaxsys`` action describes itself: its parser, usage line and numpydoc help."""

from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError

from .. import contract
from ..cluster.config import ClusterConfig
from .actions_args import count, did_you_mean, known_options, seconds


@dataclass(frozen=True)
class Action:
    """One ``%jaxsys`` action: its name and the function that carries it out."""

    name: str
    run: Callable[[Any, argparse.Namespace], Any]
    # The message when a required argument is left out (argparse's own names no example).
    missing: str | None = None

    @property
    def parser(self) -> argparse.ArgumentParser:
        return self.run.parser

    @property
    def summary(self) -> str:
        """The first line of the action's docstring, as plain text."""
        return plain_text(self.doc.splitlines()[0])

    @property
    def doc(self) -> str:
        # magic_arguments replaced __doc__ with argparse's help; the parser kept the original.
        return inspect.cleandoc(self.parser.description or "")

    def usage(self) -> str:
        """``%jaxsys NAME [options]`` on one line."""
        return " ".join(self.parser.format_usage().replace("::", "").split())

    def options(self) -> list[str]:
        """The options and positionals this action takes, as the user writes them."""
        return [a.option_strings[0] if a.option_strings else a.metavar for a in self._arguments()]

    def help(self) -> str:
        """The action's numpydoc help: usage, description, parameters, examples."""
        body, _, examples = self.doc.partition("Examples\n--------")
        lines = [*_wrap_usage(self.usage(), 88), "", body.rstrip(), "", "Parameters", "----------"]
        arguments = self._arguments()
        if not arguments:
            lines.append("None.")
        for a in arguments:
            name = a.option_strings[0] if a.option_strings else a.metavar
            kind = _describe(a)
            lines.append(f"{name} : {kind}" if kind else name)
            lines.append(textwrap.indent(textwrap.fill(a.help or "", 84), "    "))
        lines += ["", "Examples", "--------" + examples.rstrip()]
        return plain_text("\n".join(lines))

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """Parse this action's words; anything it does not take is a UsageError naming
        what it does take."""
        try:
            args, extra = self.parser.parse_known_args(argv)
        except UsageError as e:
            if self.missing and str(e).startswith("the following arguments are required"):
                raise UsageError(self.missing) from None
            raise
        if extra:
            word = extra[0]
            flag = word.split("=", 1)[0]
            bad = f"does not take {flag}" if flag.startswith("-") else f"got an extra {word!r}"
            if flag.startswith("-"):
                bad += did_you_mean(flag, known_options(self.parser))
            takes = ", ".join(self.options())
            raise UsageError(
                f"%jaxsys {self.name} {bad}; "
                + (f"it takes {takes}" if takes else "it takes no options")
                + f" (%jaxsys help {self.name})"
            )
        return args

    def _arguments(self) -> list[argparse.Action]:
        # The parsers are built without -h (IPython's magic parsers never add it).
        return list(self.parser._actions)


_TYPE_NAMES = {None: "str", str: "str", int: "int", seconds: "seconds", count: "int >= 1"}
_METAVAR_NAMES = {"P": "process"}


def _describe(a: argparse.Action) -> str:
    """The type part of a numpydoc parameter line: ``int, default 0``, ``flag``..."""
    if a.nargs == 0:
        return "flag"
    if a.choices:
        kind = "{" + ", ".join(a.choices) + "}"
    else:
        kind = _METAVAR_NAMES.get(a.metavar) or _TYPE_NAMES.get(a.type, "str")
    if not a.option_strings:
        return kind + (", optional" if a.nargs == "?" else "")
    if isinstance(a.default, list):
        return kind + ", repeatable"
    if a.default is not None:
        return (
            kind + f", default {a.default:g}"
            if isinstance(a.default, float)
            else kind + f", default {a.default}"
        )
    return kind


def _declared_defaults() -> str:
    """``4, 2 and local``: the declared defaults of hosts, devices per host and launcher."""
    fields = ClusterConfig.__dataclass_fields__
    hosts, devices, launcher = (
        fields[name].default for name in ("hosts", "devices_per_host", "launcher")
    )
    return f"{hosts}, {devices} and {launcher}"


def overview(actions: Iterable[Action]) -> str:
    """``%jaxsys?``: every action with its usage and one line, then examples."""
    lines = [
        "Start, stop, restart and describe the cluster of JAX processes.",
        "",
        textwrap.fill(
            "``%jaxsys ACTION [options]``: each action takes only its own options. "
            "``%jaxsys help ACTION`` (or ``%jaxsys ACTION?``, ``%jaxsys ACTION --help``) "
            "shows one action's options with examples. Options left out of ``start`` come "
            f"from ``${contract.HOSTS}``, ``${contract.DEVICES_PER_HOST}`` and "
            f"``${contract.LAUNCHER}`` (defaults {_declared_defaults()}).",
            88,
        ),
        "",
        "Actions",
        "-------",
    ]
    for a in actions:
        lines += _wrap_usage(a.usage(), 88)
        lines.append(f"    {a.summary}")
    lines += [
        "",
        "Examples",
        "--------",
        "::",
        "",
        "    %jaxsys start --hosts 4 --devices-per-host 2",
        "    %jaxsys status",
        "    %jaxsys dashboard",
        "    %jaxsys security",
        "    %jaxsys restart",
        "    %jaxsys kill 2",
        "    %jaxsys restart 2",
        "    %jaxsys logs 2 --tail 100",
        "    %jaxsys help start",
        "    %jaxsys stop",
    ]
    return plain_text("\n".join(lines))


# reST a reader should not see: ``code``, `code`, :role:`target`, and a "::" that
# announces a literal block.
_ROLE = re.compile(r":[\w:]+:`([^`]*)`")
_CODE = re.compile(r"``([^`]+)``|`([^`]+)`")


def plain_text(text: str) -> str:
    """Help as a notebook shows it: the docstrings' reST markup removed, layout kept."""
    text = _ROLE.sub(lambda m: m.group(1).split("<")[-1].rstrip(">").lstrip("~"), text)
    text = _CODE.sub(lambda m: m.group(1) or m.group(2), text)
    out: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "::":
            if i + 1 < len(lines) and not lines[i + 1].strip():
                lines[i + 1] = "\0"  # the blank line after it goes too
            continue
        if line == "\0":
            continue
        out.append(line[:-1] if line.endswith("::") else line)
    return "\n".join(out)


def _wrap_usage(usage: str, width: int) -> list[str]:
    """Wrap a usage line between options, never inside one (``[--ca-file PEM]``)."""
    lines: list[str] = []
    for part in re.findall(r"\[[^\]]*\]|\S+", usage):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += " " + part
        else:
            lines.append(part if not lines else "        " + part)
    return lines
