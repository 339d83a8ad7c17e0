"""``%jaxsys transfer-guard`` and ``%jaxsys barrier``: guards and barriers across the cluster.

The transfer guard is set on every process through :mod:`jaxsys_kernel.engine.guards`;
the barrier is JAX's coordination-service barrier, with jaxsys's own key-value entries
naming who has arrived (:mod:`jaxsys_kernel.engine.barrier`).
"""

from __future__ import annotations

import argparse

from IPython.core.magic_arguments import argument, magic_arguments

from .._ranges import format_procs
from .actions_cache import _ask

LEVELS = ("allow", "log", "disallow", "log_explicit", "disallow_explicit")
SHORT = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device"}


def _level(text: str) -> str:
    if text not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r}; choose one of {', '.join(LEVELS)}"
        )
    return text


def guard_settings(level: str | None, h2d: str | None, d2h: str | None, d2d: str | None) -> dict:
    """The per-direction levels a command line asks for: ``LEVEL`` first, then each ``--X``."""
    out = dict.fromkeys(SHORT, level) if level is not None else {}
    for short, value in (("h2d", h2d), ("d2h", d2h), ("d2d", d2d)):
        if value is not None:
            out[short] = value
    return out


def format_guard(answers: dict[int, dict]) -> str:
    """One line per group of processes with the same levels and transfer counts."""
    groups: dict[tuple, list[int]] = {}
    for r, a in sorted(answers.items()):
        levels = " ".join(f"{s}={a['levels'][s]}" for s in SHORT)
        counted = ", ".join(f"{a['counts'][SHORT[s]]} {s}" for s in SHORT)
        groups.setdefault((levels, counted), []).append(r)
    return "\n".join(
        f"[{format_procs(ranks)}] transfer guard {levels}; logged transfers: {counted}"
        for (levels, counted), ranks in groups.items()
    )


@magic_arguments("jaxsys transfer-guard")
@argument(
    "level",
    nargs="?",
    type=_level,
    metavar="LEVEL",
    help=f"one of {', '.join(LEVELS)}, for every direction",
)
@argument("--h2d", type=_level, metavar="L", help="level for host-to-device transfers")
@argument("--d2h", type=_level, metavar="L", help="level for device-to-host transfers")
@argument("--d2d", type=_level, metavar="L", help="level for device-to-device transfers")
@argument("--reset-counts", action="store_true", help="set the logged-transfer counts to 0")
def transfer_guard(session, args: argparse.Namespace) -> None:
    """Set JAX's transfer guard on every process, or show it with the transfers logged.

    ``allow`` lets every transfer happen; ``log`` lets it happen and logs it; ``disallow``
    refuses implicit transfers (a NumPy array passed to a jitted function, a sharded array
    read into NumPy); the ``_explicit`` levels treat ``jax.device_put`` and
    ``jax.device_get`` the same way. A refused transfer fails the cell on each process with
    an error naming the kind, shape, dtype and devices. In ``log`` mode JAX writes one native
    stderr line per transfer: they show under the cell per process, and jaxsys counts them
    by kind and process (shown here and in the dashboard). On CPU, a device-to-host read of
    an array on one device needs no copy, so JAX never guards it.

    Examples
    --------
    ::

        %jaxsys transfer-guard disallow
        %jaxsys transfer-guard log --d2h allow
        %jaxsys transfer-guard --h2d disallow_explicit
        %jaxsys transfer-guard
    """
    # Deferred: the engine module only names the functions shipped to the engines.
    from ..engine import guards

    cluster = session.require_cluster()
    settings = guard_settings(args.level, args.h2d, args.d2h, args.d2d)
    if settings:
        _ask(cluster, cluster.ranks, guards.set_transfer_guard, settings)
    answers = _ask(cluster, cluster.ranks, guards.state, bool(args.reset_counts))
    print(format_guard(answers))
