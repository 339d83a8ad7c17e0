"""The engines' first answers at bring-up, and the error that names the engines that gave none.

An engine that registered but never answers (stuck before its first request, or starved on a
loaded machine) would otherwise end the start with a bare ``TimeoutError``, naming nobody.
"""

from __future__ import annotations

import asyncio

from .profile import kept_logs
from .records import ClusterStartError


async def answers(world, ar, engine_ids: list[int], timeout: float) -> list:
    """The replies to ``ar``, sent to ``engine_ids`` in that order.

    Raises
    ------
    ClusterStartError
        Naming the engines that had not answered within ``timeout`` seconds, and where their
        logs are kept.
    """
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ar), timeout=timeout)
    except TimeoutError:
        outstanding = world.client.outstanding
        silent = [e for e, m in zip(engine_ids, ar.msg_ids, strict=False) if m in outstanding]
        # The teardown that follows keeps the logs where the message says.
        world.keep_logs = True
        names = ", ".join(str(e) for e in (silent or engine_ids))
        raise ClusterStartError(
            f"engine(s) {names} registered but did not answer within {timeout:g} s (busy or "
            f"stuck before their first request); the engine logs are kept in "
            f"{kept_logs(world.profile)}. On a loaded machine, start again with fewer processes."
        ) from None
