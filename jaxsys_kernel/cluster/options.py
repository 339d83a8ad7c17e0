"""How a cluster option is declared once and reached from everywhere.

:class:`~jaxsys_kernel.cluster.config.ClusterConfig` declares each option as a dataclass
field made by :func:`option`: its default, its help and the :class:`Flag` (or flags) a user
types for it. From that one declaration come ``%jaxsys start``'s and ``jaxsys cluster
start``'s arguments (:func:`flag_arguments`), the options a parsed command line gave
(:func:`given_options`), the numpydoc of every option (:func:`parameters_doc`), and the
layers a cluster's settings resolve in (:func:`merge_layers`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import contract
from ..errors import ConfigError

# Options whose values are mappings: a higher layer adds to them key by key.
MERGED = ("env", "process_env", "launcher_options")


class UnknownOptionError(ConfigError, TypeError):
    """An option name the declaration does not have; a ``TypeError`` too, as Python raises
    for an unexpected keyword argument."""


# -- values typed on a command line ----------------------------------------------------------


def seconds(text: str) -> float:
    """A finite, positive number of seconds (an argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def hosts(text: str) -> int | list[str]:
    """``--hosts`` as typed: a whole number, or names separated by commas."""
    if text.isdigit():
        return int(text)
    names = [h for h in text.split(",") if h]
    if not names:
        raise argparse.ArgumentTypeError(f"give a number or host1,host2,...; got {text!r}")
    return names


def words(text: str) -> list[str]:
    """``a,b,c`` as ``["a", "b", "c"]`` (an argparse ``type``)."""
    return [w for w in text.split(",") if w]


def pairs(flag: str) -> Callable[[list[str]], dict[str, str]]:
    """Repeated ``KEY=VALUE`` words as a dict; a word without ``=`` is a ConfigError."""

    def convert(items: list[str]) -> dict[str, str]:
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"{flag} takes KEY=VALUE, got {item!r}")
            out[key] = value
        return out

    return convert


# -- the declaration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """How one option (or one key of a mapping option) is typed on a command line.

    Attributes
    ----------
    flag : str
        What the user types, e.g. ``--devices-per-host``.
    help : str
        One line for ``--help`` and ``%jaxsys help start``; left empty, the option's own
        help (:func:`option`) is shown, so that one text is not written twice.
    kwargs : mapping
        The rest of argparse's ``add_argument`` (``type``, ``metavar``, ``action``...).
    key : str, optional
        The key of the mapping option this flag sets (``--partition`` sets
        ``launcher_options["partition"]``); None for the option itself.
    convert : callable, optional
        Turns what argparse parsed into the option's value.
    """

    flag: str
    help: str = ""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    key: str | None = None
    convert: Callable[[Any], Any] | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under (``--cache-dir``: ``cache_dir``)."""
        return self.flag.lstrip("-").replace("-", "_")

    def argument(self) -> tuple[str, dict[str, Any]]:
        """``add_argument``'s arguments. Nothing given reads as None (or ``[]``), so that a
        command line is one layer that names only what it sets."""
        kwargs = dict(self.kwargs)
        choices = kwargs.get("choices")
        if callable(choices):
            kwargs["choices"] = choices()  # from the launcher registry, when the parser is made
        kwargs.setdefault("default", [] if kwargs.get("action") == "append" else None)
        return self.flag, {**kwargs, "help": self.help}


def option(
    default: Any,
    help: str,
    *flags: Flag,
    doc_type: str | None = None,
    gather: Callable[[], Sequence[Flag]] | None = None,
) -> Any:
    """A dataclass field that declares one cluster option.

    Parameters
    ----------
    default
        Its value when nobody gives one (immutable: None stands for an empty mapping).
    help : str
        What it means, for the documentation.
    *flags : Flag
        How it is typed on a command line; none for options only Python can give.
    doc_type : str, optional
        Its type as the documentation writes it.
    gather : callable, optional
        More flags of a mapping option, declared elsewhere and asked for when a command
        line is made (the launchers' flags for ``launcher_options``).
    """
    # A flag with no line of its own shows the option's help, and its default when one is set.
    shown = help if default is None or isinstance(default, bool) else f"{help} Default {default!r}."
    flags = tuple(f if f.help else dataclasses.replace(f, help=shown) for f in flags)
    return dataclasses.field(
        default=default,
        metadata={"help": help, "flags": flags, "doc_type": doc_type, "gather": gather},
    )


def declared(config_class: type) -> list[dataclasses.Field]:
    """The options of ``config_class``: its fields made by :func:`option`."""
    return [f for f in dataclasses.fields(config_class) if "flags" in f.metadata]


def flags_of(f: dataclasses.Field) -> tuple[Flag, ...]:
    """The flags of one declared option: its own, then those gathered for it."""
    gather = f.metadata.get("gather")
    return (*f.metadata["flags"], *(gather() if gather is not None else ()))


def flag_arguments(config_class: type) -> list[tuple[str, dict[str, Any]]]:
    """``(flag, add_argument kwargs)`` for every flag the declaration has, in its order."""
    return [fl.argument() for f in declared(config_class) for fl in flags_of(f)]


def given_options(config_class: type, args: argparse.Namespace) -> dict[str, Any]:
    """The options a parsed command line gave, by option name (flags left out: absent).

    Raises
    ------
    ConfigError
        When a value cannot be converted (``--env`` without ``=``).
    """
    out: dict[str, Any] = {}
    for f in declared(config_class):
        for fl in flags_of(f):
            value = getattr(args, fl.dest, None)
            if value is None or value == []:
                continue
            if fl.convert is not None:
                value = fl.convert(value)
            if fl.key is None:
                out[f.name] = value
            else:
                out.setdefault(f.name, {})[fl.key] = value
    return out


def check_names(names: Iterable[str], known: Sequence[str], where: str) -> None:
    """Refuse option names ``known`` does not have.

    Raises
    ------
    UnknownOptionError
        Naming the first unknown name, the closest known one, ``where`` and every known one.
    """
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownOptionError(
                f"{where} has no option {name!r}{hint} (the options: {', '.join(known)})"
            )


def merge_layers(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Settings resolved over layers, lowest first: a later layer's option wins.

    The layers are, in order: the kernelspec (``JAXSYS_*`` variables), a saved file, the
    notebook's ``%jaxsys start`` line, an override given to ``jaxsys job`` or ``jaxsys
    run``. An option a layer leaves out, or gives as None, is left to the layers below (and
    finally to the declared default). Mapping options (``env``, ``launcher_options``...) are
    merged key by key, so ``--partition`` above a file's ``--time`` keeps both.
    """
    out: dict[str, Any] = {}
    for layer in layers:
        for name, value in (layer or {}).items():
            if value is None:
                continue
            if name in MERGED and isinstance(out.get(name), Mapping):
                out[name] = {**out[name], **value}
            else:
                out[name] = value
    return out


def parameters_doc(config_class: type) -> str:
    """A numpydoc ``Parameters`` section for every declared option."""
    lines = ["Parameters", "----------"]
    for f in declared(config_class):
        kind = f.metadata["doc_type"] or str(f.type).replace(" | None", "")
        default = "" if f.default is None else f", default {f.default!r}"
        optional = ", optional" if f.default is None else ""
        lines.append(f"{f.name} : {kind}{default}{optional}")
        text = f.metadata["help"]
        flags = [fl.flag for fl in f.metadata["flags"]]
        if flags:
            text += f" Typed as {', '.join(flags)}."
        lines += _wrap(text)
    return "\n".join(lines)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, 84, initial_indent="    ", subsequent_indent="    ")


# -- the saved form, and the layers below and above a magic line -----------------------------


def jsonable(value: Any) -> Any:
    """``value`` in JSON's types: mappings with str keys, sequences as lists, paths as str."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [jsonable(v) for v in value]
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """The options ``config`` was given, without those at their declared default."""
    given = config._given
    return {
        f.name: jsonable(given[f.name])
        for f in declared(type(config))
        if given[f.name] != f.default
    }


# What each part of an annotation accepts in a dict or a file (bool is no int here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "Sequence": (list, tuple),
    "Mapping": (dict,),
    "None": (type(None),),
}


def _accepts(annotation: str, value: Any) -> bool:
    for part in annotation.split(" | "):
        kinds = _JSON_TYPES.get(part.split("[", 1)[0], (object,))
        if isinstance(value, bool) and bool not in kinds and object not in kinds:
            continue
        if isinstance(value, kinds):
            return True
    return False


def checked(config_class: type, options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``options`` if every name is declared and every value has its option's type.

    Raises
    ------
    UnknownOptionError
        For a name the declaration does not have.
    ConfigError
        For a value of the wrong type, naming the option, the type and ``where``.
    """
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: expected options by name (a JSON object), got {options!r}")
    fields = {f.name: f for f in declared(config_class)}
    check_names(options, list(fields), where)
    for name, value in options.items():
        if not _accepts(str(fields[name].type), value):
            raise ConfigError(f"{where}: option {name!r} takes {fields[name].type}, got {value!r}")
    return dict(options)


def write_file(path: Any, options: Mapping[str, Any]) -> None:
    """Write ``options`` as indented JSON."""
    Path(path).write_text(json.dumps(options, indent=2, sort_keys=True) + "\n")


def read_file(path: Any) -> Any:
    """The JSON in ``path``.

    Raises
    ------
    ConfigError
        Naming the file, when it cannot be read or is not JSON.
    """
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the cluster options in {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not JSON: {e}") from None


def kernelspec_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """The options the kernelspec's ``JAXSYS_*`` variables give (only those set).

    Raises
    ------
    ConfigError
        Naming the variable, for a count that is no whole number of at least 1.
    """
    layer: dict[str, Any] = {}
    for name, variable in (
        ("hosts", contract.HOSTS),
        ("devices_per_host", contract.DEVICES_PER_HOST),
    ):
        raw = environ.get(variable, "").strip()
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"${variable}={raw!r} is not a whole number of at least 1")
            layer[name] = int(raw)
    if environ.get(contract.LAUNCHER):
        layer["launcher"] = environ[contract.LAUNCHER]
    return layer


#: Options given to ``jaxsys run`` above the notebook's own ``%jaxsys start`` line, as JSON.
OVERRIDES_VARIABLE = "JAXSYS_OVERRIDES"


def overrides_from(environ: Mapping[str, str], config_class: type) -> dict[str, Any]:
    """The override layer ``jaxsys run`` hands its kernel (empty when there is none).

    Raises
    ------
    ConfigError
        Naming the variable, when it holds no valid options.
    """
    raw = environ.get(OVERRIDES_VARIABLE)
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"${OVERRIDES_VARIABLE} is not JSON: {e}") from None
    return checked(config_class, options, f"${OVERRIDES_VARIABLE}")
