"""The engine's state object: one place for what a JAX process keeps, empty until used."""

from __future__ import annotations

import re
from pathlib import Path

from jaxsys_kernel.engine import state


def test_a_new_state_is_fresh_and_a_used_one_is_not():
    s = state.EngineState()
    assert s.fresh()
    s.guards.counts["h2d"] += 1
    s.agent_pending.append(("event", {}))
    assert not s.fresh()
    assert s.agent_pending.maxlen == state.PENDING_EVENTS


def test_the_engine_modules_keep_no_state_of_their_own():
    # A module global assigned at run time belongs in the state object.
    engine = Path(state.__file__).parent
    for source in sorted(engine.glob("*.py")):
        assert not re.search(r"^\s+global ", source.read_text(), re.M), (
            f"engine/{source.name} assigns a module global; keep it in engine/state.py"
        )
