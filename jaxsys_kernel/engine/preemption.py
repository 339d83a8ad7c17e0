"""SIGTERM in an engine belongs to JAX's preemption notifier.

``jax.distributed.initialize`` (with ``jax_enable_preemption_service``, on by default)
installs a C-level SIGTERM handler that turns the signal into a preemption notice, which
``multihost_utils.reached_preemption_sync_point`` and Orbax act on. An ipyparallel engine
installs its own SIGTERM handler too (it stops the engine) when it finishes registering with
the hub. Both replace whatever was installed before them, and in a jaxsys engine they run at
the same time: JAX is initialised in a thread while the engine registers (early init). When
the engine's handler came second, SIGTERM stopped the engine instead of reaching JAX.

:func:`leave_sigterm_to_jax` removes the race from its source: the engine, when it installs
its handlers, leaves SIGTERM alone. Until JAX installs its handler, SIGTERM ends the engine by
its default action, as the engine's handler did; afterwards it is a preemption notice.
"""

from __future__ import annotations

import signal
import sys


def _init_signal_without_sigterm(engine) -> None:
    # What ipyparallel's IPEngine.init_signal does, less its SIGTERM handler.
    signal.signal(signal.SIGINT, engine._signal_sigint)


def leave_sigterm_to_jax() -> bool:
    """Make this process's ipyparallel engine install no SIGTERM handler of its own.

    Called at engine start-up, before the engine registers (from its config file), so that
    JAX's preemption notifier keeps SIGTERM whichever of the two starts first.

    Returns
    -------
    bool
        True when the engine class was changed, False when it is not loaded or has no
        ``init_signal`` (then nothing is changed).
    """
    app = sys.modules.get("ipyparallel.engine.app")
    engine = getattr(app, "IPEngine", None) if app is not None else None
    if engine is None or not hasattr(engine, "init_signal"):
        return False
    engine.init_signal = _init_signal_without_sigterm
    return True


__all__ = ["leave_sigterm_to_jax"]
