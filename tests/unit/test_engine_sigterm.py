"""An engine leaves SIGTERM to JAX's preemption notifier, whichever installs its handler first.

The engine registers with the hub while JAX is initialised in a thread; ipyparallel's
engine installs a SIGTERM handler (which stops the engine) when it has registered. Here the
"JAX handler" is a stand-in installed first, and the engine's signal set-up runs after it,
as it does when registration is the slower of the two.
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from ipyparallel.engine import app

from jaxsys_kernel.engine.preemption import leave_sigterm_to_jax

pytestmark = pytest.mark.unit


def test_the_engines_signal_set_up_leaves_sigterm_alone(monkeypatch):
    monkeypatch.setattr(app.IPEngine, "init_signal", app.IPEngine.init_signal)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def notifier(*_):  # stands for JAX's preemption notifier
        pass

    def on_sigint(*_):
        pass

    try:
        assert leave_sigterm_to_jax()
        signal.signal(signal.SIGTERM, notifier)
        app.IPEngine.init_signal(SimpleNamespace(_signal_sigint=on_sigint))
        assert signal.getsignal(signal.SIGTERM) is notifier
        assert signal.getsignal(signal.SIGINT) is on_sigint  # the engine's SIGINT stays
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
