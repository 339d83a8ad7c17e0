"""The registration deadline grows with the number of processes unless one is given."""

import pytest

from jaxsys_kernel.cluster.config import (
    REGISTER_BASE_S,
    REGISTER_PER_PROCESS_S,
    ClusterConfig,
    default_register_timeout,
)
from jaxsys_kernel.errors import ConfigError


def test_default_deadline_grows_with_processes():
    small, large = ClusterConfig(hosts=4), ClusterConfig(hosts=64)
    assert small.register_timeout == REGISTER_BASE_S + 4 * REGISTER_PER_PROCESS_S
    assert large.register_timeout == default_register_timeout(64)
    assert large.register_timeout - small.register_timeout == 60 * REGISTER_PER_PROCESS_S
    # Never less than the fixed 60 s it replaces.
    assert small.register_timeout >= 60.0


def test_given_deadline_is_kept():
    assert ClusterConfig(hosts=64, register_timeout=12.5).register_timeout == 12.5


def test_non_positive_deadline_is_refused():
    with pytest.raises(ConfigError, match="register_timeout must be positive.*leave it unset"):
        ClusterConfig(hosts=2, register_timeout=0)
