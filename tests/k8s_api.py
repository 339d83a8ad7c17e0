"""A Kubernetes API for tests: objects in memory, served over TLS on loopback.

It serves the REST paths the Kubernetes client, JAX's detection and ``kubectl`` use for the
kinds a jaxsys world is made of (Pods, Services, Secrets, Jobs, JobSets): create, get, list
(with label and field selectors), replace (refused with 409 when the ``resourceVersion``
given is not the object's), patch (JSON patch ``add``/``replace``/``remove``, or a merge
patch), delete, and a pod's log. A bearer token is required, as a
real API server's authentication does, and a token given rules (:meth:`ApiServer.grant`, the
Roles of docs/clusters.md: tests/k8s_rbac.py) may do only what they allow, as RBAC would
refuse it (403). There are no controllers here:
:mod:`tests.k8s_kubelet` subscribes to changes and plays the Job and JobSet controllers and
the kubelet.

This is a test fixture, not a Kubernetes: it keeps no history (every object's
``resourceVersion`` is one counter), has no watch, no admission and no validation.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import ipaddress
import itertools
import json
import secrets
import socket
import ssl
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.k8s_rbac import allows

# (group/version, plural) -> kind, for the resources served.
RESOURCES = {
    ("v1", "pods"): "Pod",
    ("v1", "services"): "Service",
    ("v1", "secrets"): "Secret",
    ("batch/v1", "jobs"): "Job",
    ("jobset.x-k8s.io/v1alpha2", "jobsets"): "JobSet",
}
_START_TIMEOUT = 10.0


def _verb(request: web.Request) -> str:
    """The RBAC verb of a request."""
    named = "name" in request.match_info
    if request.method == "GET":
        if named:
            return "get"
        return "watch" if request.query.get("watch") in ("1", "true") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        request.method, request.method.lower()
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1: (ca.crt, server.crt, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-kubernetes-ca")])

    def cert(subject, pub, ca: bool, sans=None):
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(pub)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256())

    ca = cert(ca_name, ca_key.public_key(), True)
    sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    leaf = cert(server_name, key.public_key(), False, sans)
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return web.json_response({**body, "reason": reason, "code": code}, status=code)


def _selector_matches(selector: str, values: Callable[[str], str | None]) -> bool:
    """``a=b,c!=d,e`` against ``values(key)``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if values(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if values(k.strip()) != v.strip():
                return False
        elif values(term) is None:
            return False
    return True


def _json_patch(obj: dict[str, Any], op: dict[str, Any]) -> None:
    """One JSON patch (RFC 6902) operation of ``add``, ``replace`` or ``remove``."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = obj
    for p in parts[:-1]:
        parent = parent[p]
    if op["op"] in ("add", "replace"):
        parent[parts[-1]] = op["value"]
    elif op["op"] == "remove":
        del parent[parts[-1]]
    else:
        raise ValueError(f"JSON patch operation {op['op']!r} is not served here")


def _merge(obj: dict[str, Any], patch: dict[str, Any]) -> None:
    """A merge patch (RFC 7386): null removes a key, dicts merge, the rest replaces."""
    for k, v in patch.items():
        if v is None:
            obj.pop(k, None)
        elif isinstance(v, dict) and isinstance(obj.get(k), dict):
            _merge(obj[k], v)
        else:
            obj[k] = copy.deepcopy(v)


def _field(obj: dict[str, Any], path: str) -> str | None:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return None if cur is None else str(cur)


class ApiServer:
    """The objects, the HTTPS server in its own thread, and the change subscribers.

    Parameters
    ----------
    directory
        Where the TLS files are written.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.ca, self._cert, self._key = make_tls(directory)
        #: The administrator's token: every request (the tests' own, kubectl's).
        self.token = secrets.token_urlsafe(24)
        #: Token -> its Role's rules (None: everything).
        self.grants: dict[str, list[dict[str, Any]] | None] = {self.token: None}
        #: The token of the kubeconfigs :meth:`kubeconfig` writes unless told otherwise.
        self.default_token = self.token
        #: Requests refused for want of a right: (token's rules' name, verb, resource).
        self.forbidden: list[tuple[str, str, str]] = []
        self.port = _free_port()
        self.host = "127.0.0.1"
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []
        #: Called as ``fn(verb, obj)`` after every create and delete, under the lock.
        self.subscribers: list[Callable[[str, dict[str, Any]], None]] = []
        #: Pod name -> a callable giving its log text.
        self.logs: dict[str, Callable[[], str]] = {}
        self._rv = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    # -- the store, for the controllers and tests --------------------------------------------

    def create(self, obj: dict[str, Any], *, notify: bool = True) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._rv)),
            creationTimestamp=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        with self.lock:
            key = (obj["kind"], meta["namespace"], meta["name"])
            if key in self.objects:
                raise KeyError(f'{obj["kind"]} "{meta["name"]}" already exists')
            self.objects[key] = obj
            if notify:
                for fn in self.subscribers:
                    fn("create", obj)
        return obj

    def delete(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete one object and, as the garbage collector does, what it owns."""
        with self.lock:
            obj = self.objects.pop((kind, namespace, name), None)
            if obj is None:
                return None
            uid = obj["metadata"]["uid"]
            owned = [
                k
                for k, o in self.objects.items()
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
            ]
            for k in owned:
                self.delete(*k)
            for fn in self.subscribers:
                fn("delete", obj)
            return obj

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace an object whole, as a PUT does: ``KeyError`` when there is none,
        ``ValueError`` when its ``resourceVersion`` is given and is not the stored one."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        with self.lock:
            key = (obj["kind"], meta["namespace"], meta["name"])
            old = self.objects[key]
            given = meta.get("resourceVersion")
            if given and given != old["metadata"]["resourceVersion"]:
                raise ValueError(f"the object has been modified (resourceVersion {given})")
            for k in ("uid", "creationTimestamp"):
                meta[k] = old["metadata"][k]
            meta["resourceVersion"] = str(next(self._rv))
            self.objects[key] = obj
            for fn in self.subscribers:
                fn("update", obj)
        return copy.deepcopy(obj)

    def patch(self, kind: str, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        """Apply a JSON patch (a list of operations) or a merge patch (a dict)."""
        with self.lock:
            obj = copy.deepcopy(self.objects[(kind, namespace, name)])
            if isinstance(patch, list):
                for op in patch:
                    try:
                        _json_patch(obj, op)
                    except KeyError as e:
                        raise ValueError(f"no {e} on the path {op['path']}") from None
            else:
                _merge(obj, patch)
            obj["metadata"].pop("resourceVersion", None)
            return self.replace(obj)

    def list(self, kind: str, namespace: str | None = None, labels: str = "", fields: str = ""):
        with self.lock:
            found = [
                copy.deepcopy(o)
                for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and (namespace is None or ns == namespace)
            ]
        return [
            o
            for o in found
            if _selector_matches(labels, lambda k, o=o: o["metadata"].get("labels", {}).get(k))
            and _selector_matches(fields, lambda k, o=o: _field(o, k))
        ]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def update_status(self, kind: str, namespace: str, name: str, **status: Any) -> None:
        with self.lock:
            obj = self.objects.get((kind, namespace, name))
            if obj is not None:
                obj.setdefault("status", {}).update(status)
                obj["metadata"]["resourceVersion"] = str(next(self._rv))

    # -- HTTP --------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api", self._versions)
        app.router.add_get("/apis", self._groups)
        app.router.add_get("/api/{version}", self._resources)
        app.router.add_get("/apis/{group}/{version}", self._resources)
        core = "/api/{version}/namespaces/{ns}/{plural}"
        group = "/apis/{group}/{version}/namespaces/{ns}/{plural}"
        for base in (core, group):
            app.router.add_get(base, self._list)
            app.router.add_post(base, self._create)
            app.router.add_get(base + "/{name}", self._get)
            app.router.add_put(base + "/{name}", self._replace)
            app.router.add_patch(base + "/{name}", self._patch)
            app.router.add_delete(base + "/{name}", self._delete)
            app.router.add_get(base + "/{name}/log", self._log)
        return app

    # -- discovery, as kubectl asks for it ---------------------------------------------------

    async def _versions(self, request: web.Request) -> web.Response:
        cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]
        return web.json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr}
        )

    async def _groups(self, request: web.Request) -> web.Response:
        groups = []
        for gv in sorted({g for g, _ in RESOURCES if "/" in g}):
            group, version = gv.split("/")
            ver = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [ver], "preferredVersion": ver})
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _resources(self, request: web.Request) -> web.Response:
        info = request.match_info
        gv = f"{info['group']}/{info['version']}" if "group" in info else info["version"]
        verbs = ["create", "delete", "get", "list", "patch", "update"]
        resources = [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": True,
                "kind": kind,
                "verbs": verbs,
            }
            for (g, plural), kind in RESOURCES.items()
            if g == gv
        ]
        if not resources:
            return _status(404, "NotFound", f"no API group version {gv}")
        if gv == "v1":
            resources.append(
                {"name": "pods/log", "namespaced": True, "kind": "Pod", "verbs": ["get"]}
            )
        body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv}
        return web.json_response({**body, "resources": resources})

    def grant(self, rules: list[dict[str, Any]]) -> str:
        """A new token that may do what ``rules`` (a Role's) allow; the token."""
        token = secrets.token_urlsafe(24)
        self.grants[token] = rules
        return token

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        self.requests.append((request.method, request.path_qs))
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        # The scheme is case-insensitive (the in-cluster client sends "bearer").
        found = [t for t in self.grants if secrets.compare_digest(token.encode(), t.encode())]
        if scheme.lower() != "bearer" or not found:
            return _status(401, "Unauthorized", "Unauthorized")
        rules, info = self.grants[found[0]], request.match_info
        if rules is not None and "plural" in info:  # discovery is every user's
            verb = _verb(request)
            group, resource = info.get("group", ""), info["plural"]
            if request.path.endswith("/log"):
                resource += "/log"
            if not allows(rules, verb, group, resource):
                self.forbidden.append((verb, group, resource))
                return _status(
                    403,
                    "Forbidden",
                    f'{resource} is forbidden: the Role of this token cannot "{verb}" '
                    f'resource "{resource}" in API group "{group}"',
                )
        return await handler(request)

    def _kind(self, request: web.Request) -> str | None:
        info = request.match_info
        gv = f"{info['group']}/{info['version']}" if "group" in info else info["version"]
        return RESOURCES.get((gv, info["plural"]))

    async def _list(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        if kind is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        items = self.list(
            kind, request.match_info["ns"], q.get("labelSelector", ""), q.get("fieldSelector", "")
        )
        gv = next(g for (g, _), k in RESOURCES.items() if k == kind)
        body = {"kind": f"{kind}List", "apiVersion": gv, "metadata": {"resourceVersion": "1"}}
        return web.json_response({**body, "items": items})

    async def _create(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        try:
            obj = json.loads(await request.read())
        except ValueError as e:
            return _status(400, "BadRequest", f"not JSON: {e}")
        if kind is None or obj.get("kind") != kind:
            return _status(400, "BadRequest", f"cannot create {obj.get('kind')!r} here")
        obj.setdefault("metadata", {})["namespace"] = request.match_info["ns"]
        try:
            made = self.create(obj)
        except KeyError as e:
            return _status(409, "AlreadyExists", str(e.args[0]))
        return web.json_response(made, status=201)

    async def _get(self, request: web.Request) -> web.Response:
        kind, info = self._kind(request), request.match_info
        obj = kind and self.get(kind, info["ns"], info["name"])
        if not obj:
            return _status(404, "NotFound", f'{kind or "resource"} "{info["name"]}" not found')
        return web.json_response(obj)

    async def _replace(self, request: web.Request) -> web.Response:
        kind, info = self._kind(request), request.match_info
        try:
            obj = json.loads(await request.read())
        except ValueError as e:
            return _status(400, "BadRequest", f"not JSON: {e}")
        if kind is None or obj.get("kind") != kind:
            return _status(400, "BadRequest", f"cannot replace {obj.get('kind')!r} here")
        obj.setdefault("metadata", {}).update(namespace=info["ns"], name=info["name"])
        try:
            return web.json_response(self.replace(obj))
        except KeyError:
            return _status(404, "NotFound", f'{kind} "{info["name"]}" not found')
        except ValueError as e:
            return _status(409, "Conflict", str(e))

    async def _patch(self, request: web.Request) -> web.Response:
        kind, info = self._kind(request), request.match_info
        try:
            patch = json.loads(await request.read())
        except ValueError as e:
            return _status(400, "BadRequest", f"not JSON: {e}")
        if kind is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        try:
            return web.json_response(self.patch(kind, info["ns"], info["name"], patch))
        except KeyError:
            return _status(404, "NotFound", f'{kind} "{info["name"]}" not found')
        except (ValueError, TypeError, IndexError) as e:
            return _status(422, "Invalid", f"the patch does not apply: {e}")

    async def _delete(self, request: web.Request) -> web.Response:
        kind, info = self._kind(request), request.match_info
        obj = kind and self.delete(kind, info["ns"], info["name"])
        if not obj:
            return _status(404, "NotFound", f'{kind or "resource"} "{info["name"]}" not found')
        return web.json_response(obj)

    async def _log(self, request: web.Request) -> web.Response:
        log = self.logs.get(request.match_info["name"])
        if log is None:
            return _status(404, "NotFound", f'pod "{request.match_info["name"]}" has no log')
        return web.Response(text=log())

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> ApiServer:
        started = threading.Event()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self._cert, self._key)

        async def serve():
            self._runner = web.AppRunner(self._app(), access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port, ssl_context=ctx).start()
            started.set()

        def run():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(serve())
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="k8s-api", daemon=True)
        self._thread.start()
        if not started.wait(_START_TIMEOUT):
            raise RuntimeError(f"the test API server did not start in {_START_TIMEOUT} s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_START_TIMEOUT)

    def kubeconfig(self, path: Path, namespace: str = "default", token: str | None = None) -> Path:
        """A kubeconfig for this server (for ``kubectl`` and the client outside pods),
        with ``token`` (else :attr:`default_token`)."""
        conf = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": "test", "user": {"token": token or self.default_token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "test", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
        path.write_text(json.dumps(conf))
        return path
