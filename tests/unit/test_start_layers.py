"""``%jaxsys start`` hands on only what its line gives: the layers below the line (the
kernelspec's) and the declared defaults decide the rest, ``init_timeout`` and ``secure`` too."""

from __future__ import annotations

import pytest

from jaxsys_kernel.cluster.config import ClusterConfig
from jaxsys_kernel.magics import actions, lifecycle
from jaxsys_kernel.magics.session import MultihostSession

pytestmark = pytest.mark.unit


class _Started(Exception):
    pass


class _Session(MultihostSession):
    below: dict = {}

    def defaults(self) -> dict:
        # What a kernelspec (or a settings file under the line) gives.
        return dict(self.below)


@pytest.fixture
def started(monkeypatch):
    seen: dict = {}

    def cluster(**kwargs):
        seen.update(kwargs)
        raise _Started

    monkeypatch.setattr(lifecycle, "Cluster", cluster)

    def start(line: str, below: dict) -> dict:
        session = _Session()
        session.below = below
        seen.clear()
        with pytest.raises(_Started):
            actions.dispatch(session, line)
        return dict(seen)

    return start


def test_a_lower_layers_init_timeout_and_secure_reach_start(started):
    got = started("start --hosts 2", {"init_timeout": 7.0, "secure": False})
    assert (got["init_timeout"], got["secure"]) == (7.0, False)


def test_the_line_still_wins_over_the_layers_below(started):
    below = {"init_timeout": 7.0, "secure": True}
    got = started("start --hosts 2 --init-timeout 30 --insecure", below)
    assert (got["init_timeout"], got["secure"]) == (30.0, False)


def test_without_any_layer_the_declared_defaults_decide(started):
    got = started("start --hosts 2", {})
    fields = ClusterConfig.__dataclass_fields__
    assert "init_timeout" not in got and "secure" not in got  # nothing set them
    config = ClusterConfig(**got)
    assert (config.init_timeout, config.secure) == (
        fields["init_timeout"].default,
        fields["secure"].default,
    )
