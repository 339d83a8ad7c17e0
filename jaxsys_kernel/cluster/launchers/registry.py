"""The one place launchers are found: the built-in ones, then those other packages declare.

A package adds a launcher by declaring a :class:`~.base.Launcher` subclass in the
``jaxsys.launchers`` entry-point group::

    [project.entry-points."jaxsys.launchers"]
    pbs = "mypkg.pbs:PbsLauncher"

Everything that offers, checks or describes launcher names (``%jaxsys start --launcher``,
``jaxsys cluster start --launcher``, ``ClusterConfig``'s messages) asks this module.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

from ...errors import ConfigError
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
