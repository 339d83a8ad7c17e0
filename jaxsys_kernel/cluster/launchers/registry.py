"""The one place launchers are found: the built-in ones, then those other packages declare.

A package adds a launcher by declaring a :class:`~.base.Launcher` subclass in the
``jaxsys.launchers`` entry-point group (docs/launchers.md shows one in full)::

    [project.entry-points."jaxsys.launchers"]
    pbs = "mypkg.pbs:PbsLauncher"

Everything that offers, checks or describes launcher names (``%jaxsys start --launcher``,
``jaxsys cluster start --launcher``, ``ClusterConfig``'s messages) asks this module, and so
does everything that reads what launchers declare (:mod:`.kind`): their flags, which every
command that starts a cluster offers, and their rank and size variables.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

from ... import contract
from ...errors import ConfigError
from ..options import Flag
from .base import Launcher
from .local import LocalLauncher
from .mpi import MpiLauncher
from .remote import SshLauncher
from .slurm import SlurmLauncher

log = logging.getLogger("jaxsys.cluster")

ENTRY_POINT_GROUP = "jaxsys.launchers"
BUILTIN: tuple[type[Launcher], ...] = (LocalLauncher, SshLauncher, MpiLauncher, SlurmLauncher)
#: The launcher a cluster uses when nobody names one.
DEFAULT = LocalLauncher.name


class UnknownLauncherError(ConfigError):
    """A launcher name no installed package provides."""


def _entry_points() -> list:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def _load(ep) -> type[Launcher] | None:
    try:
        cls = ep.load()
    except Exception as e:  # noqa: BLE001 - a broken plug-in must not take the others down
        log.warning("launcher %r (%s) could not be loaded: %s", ep.name, ep.value, e)
        return None
    if not (isinstance(cls, type) and issubclass(cls, Launcher)):
        log.warning("launcher %r (%s) is not a jaxsys Launcher subclass", ep.name, ep.value)
        return None
    return cls


@functools.cache
def launcher_classes() -> Mapping[str, type[Launcher]]:
    """Every launcher by name: the built-in ones first, then the entry points'.

    An entry point may not replace a built-in launcher with another class (it is skipped,
    with a warning); declaring the same class again is harmless.
    """
    found: dict[str, type[Launcher]] = {cls.name: cls for cls in BUILTIN}
    for ep in _entry_points():
        cls = _load(ep)
        if cls is None:
            continue
        if ep.name in found and found[ep.name] is not cls:
            log.warning(
                "launcher %r (%s) is ignored: the name belongs to %s",
                ep.name,
                ep.value,
                found[ep.name].__qualname__,
            )
            continue
        found[ep.name] = cls
    return found


def launcher_names() -> tuple[str, ...]:
    """The names ``--launcher`` accepts, built-in ones first."""
    return tuple(launcher_classes())


def launcher_class(name: str) -> type[Launcher]:
    """The launcher class of ``name``.

    Raises
    ------
    UnknownLauncherError
        Listing the names there are.
    """
    try:
        return launcher_classes()[name]
    except KeyError:
        raise UnknownLauncherError(
            f"unknown launcher {name!r}; choose one of {', '.join(launcher_names())} "
            f"(other packages add launchers through the {ENTRY_POINT_GROUP!r} entry points)"
        ) from None


def names_where(test: Callable[[type[Launcher]], bool]) -> list[str]:
    """The names of the launchers whose class passes ``test``, for messages."""
    return [name for name, cls in launcher_classes().items() if test(cls)]


def describe(names: list[str], conjunction: str = "or") -> str:
    """``["a", "b", "c"]`` -> ``"the a, b or c launcher"`` (``"and"``: ``launchers``)."""
    if not names:
        return "no launcher"
    if len(names) == 1:
        return f"the {names[0]} launcher"
    plural = "s" if conjunction == "and" else ""
    return f"the {', '.join(names[:-1])} {conjunction} {names[-1]} launcher{plural}"


@functools.cache
def launcher_flags(reserved: frozenset[str] = frozenset()) -> tuple[Flag, ...]:
    """The flags every launcher declares for its ``launcher_options``, each once.

    Two launchers may share a flag that sets the same option (the first one's help is
    shown); a flag that sets another option than an earlier launcher's, one that names no
    option, or one in ``reserved`` (ClusterConfig's own) is left out with a warning.
    """
    found: dict[str, tuple[str, Flag]] = {}
    for name, cls in launcher_classes().items():
        for fl in cls.flags:
            earlier = found.get(fl.flag)
            if fl.key is None or fl.flag in reserved:
                why = "it sets no launcher option" if fl.key is None else "jaxsys has it"
            elif earlier is not None and earlier[1].key != fl.key:
                why = f"the {earlier[0]} launcher's sets {earlier[1].key!r}"
            else:
                found.setdefault(fl.flag, (name, fl))
                continue
            log.warning("the %s launcher's flag %s is left out: %s", name, fl.flag, why)
    return tuple(fl for _, fl in found.values())


def _variables(first: str, attribute: str) -> tuple[str, ...]:
    names = [first]
    for cls in launcher_classes().values():
        names += [n for n in getattr(cls, attribute) if n not in names]
    return tuple(names)


def rank_variables() -> tuple[str, ...]:
    """Every variable a process may find its rank in: jaxsys's own, then each launcher's
    :attr:`~.kind.LauncherKind.rank_variables` (for a program that runs under any)."""
    return _variables(contract.PROCESS_ID, "rank_variables")


def size_variables() -> tuple[str, ...]:
    """Every variable a process may find the number of processes in, as
    :func:`rank_variables`."""
    return _variables(contract.NUM_PROCESSES, "size_variables")
