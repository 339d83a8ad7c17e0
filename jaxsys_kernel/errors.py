"""The one family of jaxsys's exceptions.

Every error jaxsys raises derives from :class:`JaxsysError`, grouped by where it arises.
Each family keeps the built-in base that its callers already catch (``RuntimeError``,
``ValueError``, ``TimeoutError``), so ``except ValueError`` still works where it did.
This module imports nothing from the package: the engines raise these errors too.

The one exception outside the family is
:class:`~jaxsys_kernel.cells.result.MultihostInterrupt`, a ``KeyboardInterrupt``: an
interrupted cell must not be caught by ``except Exception``.
"""

from __future__ import annotations

__all__ = [
    "CellError",
    "ClusterError",
    "ConfigError",
    "EngineError",
    "JaxsysError",
    "ProtocolError",
]


class JaxsysError(Exception):
    """The root of every error jaxsys raises."""


class ClusterError(JaxsysError, RuntimeError):
    """A cluster operation failed; the message names the processes involved."""

    def _render_traceback_(self) -> list[str]:
        # In a notebook the message is the whole story; the driver's frames are noise.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(JaxsysError, ValueError):
    """An option, file or setting is invalid; the message says which and what to do."""


class CellError(JaxsysError):
    """A cell failed on one or more processes."""


class ProtocolError(JaxsysError, ValueError):
    """A message between the kernel, its engines or the front end is malformed or unknown."""


class EngineError(JaxsysError, RuntimeError):
    """Raised on an engine, inside a JAX process, by jaxsys's engine-side code."""
