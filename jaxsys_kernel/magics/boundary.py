"""The magic boundary: where jaxsys's own errors become IPython's ``UsageError``.

A ``UsageError`` prints as one line, without a traceback: right for a mistake the user can
fix (a cluster that is not running, a process that cannot rejoin, an invalid option). The
layers below raise errors of the :class:`~jaxsys_kernel.errors.JaxsysError` family; they
are converted here, once, for every entry point a user reaches: the session's public
methods and the ``%jaxsys`` dispatcher. A cell's own failure
(:class:`~jaxsys_kernel.errors.CellError`) keeps its grouped tracebacks and is not converted.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from ..errors import ClusterError, ConfigError

__all__ = ["USER_ERRORS", "usage_boundary", "usage_errors"]

# The families that describe something the user can act on.
USER_ERRORS = (ClusterError, ConfigError)



def usage_errors[F: Callable[..., Any]](fn: F) -> F:
    """Turn the user-facing jaxsys errors that ``fn`` raises into ``UsageError``."""
    if getattr(fn, "_jaxsys_boundary", False):
        return fn

    @functools.wraps(fn)
    def at_boundary(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            raise UsageError(str(e)) from None

    at_boundary._jaxsys_boundary = True  # type: ignore[attr-defined]
    return at_boundary  # type: ignore[return-value]


def usage_boundary[C: type](cls: C) -> C:
    """Apply :func:`usage_errors` to every public method of ``cls`` and its bases."""
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        for name, attr in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(attr):
                setattr(cls, name, usage_errors(getattr(cls, name)))
    return cls
