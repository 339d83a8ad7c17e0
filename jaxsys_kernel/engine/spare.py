"""The engine's side of a spare world: processes joined to a JAX world of their own ahead of
need, silent until the kernel swaps them in for the world it talks to.

A spare world's processes are launched without the telemetry hub's address, so that their
heartbeats do not mix with those of the world in use under the same ranks; the kernel hands
the address over when it swaps them in (:func:`swap_in`), and the agent starts then.
"""

from __future__ import annotations

import os

from .. import contract
from . import agent, bootstrap

# What a swap may set: the engine's own variables and where its telemetry goes.
SWAP_VARIABLES = contract.ENGINE_VARIABLES | {
    contract.TELEMETRY,
    contract.TELEMETRY_KEY,
    contract.HEARTBEAT_INTERVAL,
}


def swap_in(settings: dict[str, str]) -> dict:
    """Become a process of the world the kernel talks to: take ``settings`` into the
    environment, start the telemetry agent if they name a hub, and say who this is.

    Parameters
    ----------
    settings : dict of str to str
        Variables of :data:`SWAP_VARIABLES` to set.

    Returns
    -------
    dict
        What :func:`jaxsys_kernel.engine.bootstrap.describe_process` returns.

    Raises
    ------
    ValueError
        For a variable outside :data:`SWAP_VARIABLES`, which a stale kernel could send.
    """
    strangers = sorted(set(settings) - SWAP_VARIABLES)
    if strangers:
        raise ValueError(f"swap_in sets only the engine's own variables, not {strangers}")
    os.environ.update(settings)
    agent.start_from_env(bootstrap.process_rank())
    return bootstrap.describe_process()
