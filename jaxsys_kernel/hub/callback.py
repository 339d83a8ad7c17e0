"""A batchspawner callback that accepts a port and nothing else.

A single-user server started by batchspawner tells the hub which port it listens on with
``POST /hub/api/batchspawner`` and its own token. batchspawner's handler sets every spawner
attribute the request names, so a user who reads her server's token (it is in her job's
environment) can set ``batch_query_cmd`` or ``exec_prefix`` and have the hub run her shell
as the hub's account at the next poll. :class:`PortOnlyCallbackHandler` takes only what a
starting server legitimately reports: an integer ``port``, once, while the hub waits for it,
from that server's own token. :func:`install` routes the callback to it.
"""

from __future__ import annotations

import hmac
import json

import batchspawner  # noqa: F401  (importing it adds its own handler, which install() replaces)
from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web

ROUTE = r"/api/batchspawner"
ACCEPTED = frozenset({"port"})
# At most this many refused keys are named back, each cut to this many characters.
_NAMED_KEYS = 5
_KEY_CHARS = 40


def _own_spawner(user, token: str):
    """The spawner of ``user`` whose server token is ``token``, or None."""
    for spawner in getattr(user, "spawners", {}).values():
        own = spawner.api_token
        if own and token and hmac.compare_digest(own.encode(), token.encode()):
            return spawner
    return None


def check_report(data, spawner) -> int:
    """The port a server reported, or an HTTP error saying what is refused and why.

    Parameters
    ----------
    data : object
        The request's JSON body.
    spawner : Spawner or None
        The spawner whose own token made the request.

    Returns
    -------
    int
        The port, 1-65535.

    Raises
    ------
    tornado.web.HTTPError
        403 when the token is no running server's own, 400 for any key but ``port`` or a
        port that is not an integer in range, 409 when the server is not starting or has
        reported its port already.

    Examples
    --------
    >>> check_report({"port": 8888}, starting_spawner)  # doctest: +SKIP
    8888
    """
    if spawner is None:
        raise web.HTTPError(403, "only a starting server's own token may report its port")
    if not isinstance(data, dict):
        raise web.HTTPError(400, 'the body must be a JSON object such as {"port": 8888}')
    refused = sorted(str(k)[:_KEY_CHARS] for k in set(data) - ACCEPTED)
    if refused:
        named = ", ".join(repr(k) for k in refused[:_NAMED_KEYS])
        raise web.HTTPError(400, f"only 'port' may be reported; refused: {named}")
    port = data.get("port")
    if type(port) is not int or not 1 <= port <= 65535:
        raise web.HTTPError(400, "'port' must be an integer from 1 to 65535")
    if spawner.pending != "spawn" or spawner.port:
        raise web.HTTPError(409, "this server is not starting, or reported its port already")
    return port


class PortOnlyCallbackHandler(APIHandler):
    """``POST /hub/api/batchspawner``: record a starting server's port, once.

    Every other key is refused with 400 and nothing is set, so a request such as
    ``{"batch_query_cmd": "..."}`` changes no command the hub runs.
    """

    @web.authenticated
    def post(self):
        spawner = _own_spawner(self.current_user, self.get_auth_token() or "")
        port = check_report(self.get_json_body(), spawner)
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": f"port {port} recorded"}))


def install() -> None:
    """Route the batchspawner callback to :class:`PortOnlyCallbackHandler`.

    Call it from ``jupyterhub_config.py``: importing batchspawner adds its own handler to
    the hub's API routes, which this replaces before the hub builds its application.

    Examples
    --------
    >>> from jaxsys_kernel.hub.callback import install
    >>> install()  # doctest: +SKIP
    """
    default_handlers[:] = [h for h in default_handlers if h[0] != ROUTE]
    default_handlers.append((ROUTE, PortOnlyCallbackHandler))
