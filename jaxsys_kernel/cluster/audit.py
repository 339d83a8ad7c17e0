"""Audit of every network endpoint a cluster uses, and what protects it.

The list comes from the operating system: every TCP socket that the controller (and its
scheduler processes), every JAX process (and its nanny) and the kernel itself listen on,
each named by what opened it and the protection that role has. A socket no role explains
is listed as unknown, never left out.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from ipykernel.connect import get_connection_file
from IPython import get_ipython

from .. import _compat
from .._ranges import format_procs
from ..engine.registry import engine_module
from ..engine.sockets import listening_sockets
from ..telemetry.refusals import explain_refusal
from .pki import peer_certificate_serial
from .profile import controller_file

# Explaining refusals belongs to telemetry; it is re-exported here, where it used to live.
__all__ = [
    "Endpoint",
    "audit",
    "explain_refusal",
    "format_audit",
    "format_refusals",
    "refusal_notice",
]

ADVICE_PLAINTEXT_DATA = (
    "JAX offers no protection here: keep these hosts on a private, trusted network "
    "(or a VPN / encrypted overlay between hosts)"
)
ADVICE_UNKNOWN = "not opened by jaxsys, JAX or Jupyter: find out what did (ss -ltnp)"
probes = engine_module("probes")
DATA_PLANE = "JAX data plane (gloo collectives) or a server a cell started"


@dataclass
class Endpoint:
    """One network endpoint of the cluster.

    Attributes
    ----------
    name : str
        What it is, e.g. ``coordination service``.
    address : str
        Where it listens (``host:port``).
    owner : str
        Which process listens (``kernel``, ``controller``, ``p0``...).
    protection : str
        ``mTLS``, ``CurveZMQ``, ``HMAC`` (signed, not encrypted), ``token``, ``nothing``
        or ``unknown``.
    advice : str
        What to do about it, for the unprotected ones.
    pid : int or None
        The process holding the socket, when known (a socket a process inherited is
        listed once, under the process that passed it on).
    """

    name: str
    address: str
    owner: str
    protection: str
    advice: str = ""
    pid: int | None = None

    @property
    def port(self) -> int | None:
        """The port, when ``address`` names exactly one."""
        tail = self.address.rsplit(":", 1)[-1]
        return int(tail) if tail.isascii() and tail.isdigit() else None

    def to_dict(self) -> dict:
        """The fields as a plain dict."""
        return asdict(self)


def _serving(cluster) -> str:
    """Which certificate the coordinator presents now, against the one on disk."""
    on_disk = cluster.pki.serial(0)
    try:
        served = peer_certificate_serial(
            cluster.coordinator_address, cluster.pki.credentials(0), timeout=2.0
        )
    except Exception as e:  # noqa: BLE001 - the audit reports, it does not fail
        return f"could not read the served certificate ({e})"
    if served == on_disk:
        return f"serving the current certificate (serial {on_disk:#x})"
    return f"serving serial {served:#x}; the rotated one on disk ({on_disk:#x}) is not in use yet"


def _controller_roles(ipp) -> tuple[dict[int, str], dict]:
    """The controller's ports by role, from its engine and client connection files."""
    roles: dict[int, str] = {}
    info: dict = {}
    for side in ("engine", "client"):
        try:
            data = json.loads(controller_file(ipp.profile_dir, ipp.cluster_id, side).read_text())
        except (OSError, ValueError):
            continue
        info = info or data
        # Registration is shared; every other client-facing socket has an engine twin.
        suffix = "" if side == "engine" else " (client-facing)"
        for key, value in data.items():
            for port in value if isinstance(value, list) else [value]:
                if isinstance(port, int) and not isinstance(port, bool):
                    role = f"ipyparallel {key.replace('_', ' ')}"
                    roles.setdefault(port, role if key == "registration" else role + suffix)
    return roles, info


def _controller_endpoints(cluster) -> list[Endpoint]:
    """Every socket the controller and its scheduler processes listen on."""
    ipp = cluster.world.ipp
    roles, info = _controller_roles(ipp)
    curve = bool(info.get("curve_serverkey"))
    protection = "CurveZMQ" if curve else "HMAC (signed, not encrypted)"
    advice = "" if curve else "start with security on (the default) to encrypt with CurveZMQ"
    ctl = getattr(ipp, "controller", None)
    pid = getattr(ctl, "pid", None)
    try:
        tree = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except (psutil.Error, ValueError, TypeError):
        tree = []
    out, seen = [], set()
    # Schedulers are forked: they hold the sockets their parent bound before the fork.
    for p in tree:
        for host, port in listening_sockets(p):
            if port in seen:
                continue
            seen.add(port)
            name = roles.get(port, "ipyparallel internal (scheduler tree, monitor)")
            where = advice or ("loopback only" if host.startswith("127.") else "")
            owner = "controller" if p == pid else "controller scheduler"
            out.append(Endpoint(name, f"{host}:{port}", owner, protection, where, pid=p))
    return out


def _kernel_roles(cluster) -> dict[int, tuple[str, str, str]]:
    """The kernel process's own ports: ``port -> (name, protection, advice)``."""
    roles: dict[int, tuple[str, str, str]] = {}
    hub = cluster.telemetry
    if hub is not None:
        port = int(hub.address.rsplit(":", 1)[1])
        if hub.public_key:
            roles[port] = ("jaxsys telemetry", "CurveZMQ", "")
        else:
            roles[port] = (
                "jaxsys telemetry",
                "nothing",
                "heartbeats, cache events and refusals travel in the clear: start with security on",
            )
    try:
        kernel = getattr(get_ipython(), "kernel", None)
        pipe = _compat.kernel_pipe_port(kernel) if kernel is not None else None
    except Exception:  # noqa: BLE001 - outside a kernel there is no pipe
        pipe = None
    if pipe:
        roles[pipe] = (
            "ipykernel IOPub pipe (output of forked subprocesses)",
            "nothing",
            "anyone on this machine can connect; messages without the kernel's random "
            "token are dropped (and logged)",
        )
    roles.update(_kernel_channel_roles())
    return roles


def _kernel_channel_roles() -> dict[int, tuple[str, str, str]]:
    try:
        info = json.loads(Path(get_connection_file()).read_text())
    except Exception:  # noqa: BLE001 - outside a kernel there are no kernel channels
        return {}
    curve = bool(info.get("curve_serverkey") or info.get("curve_publickey"))
    if curve:
        protection, advice = "CurveZMQ", ""
    elif info.get("key"):
        protection = f"HMAC ({info.get('signature_scheme', '')}; not encrypted)"
        advice = "signed, not encrypted: keep it on loopback or use transport_encryption"
    else:
        protection, advice = "nothing", "the connection file has no key: anyone can send"
    roles = {}
    for key in ("shell_port", "iopub_port", "stdin_port", "control_port"):
        if info.get(key):
            roles[info[key]] = (f"Jupyter kernel channels: {key[:-5]}", protection, advice)
    if info.get("hb_port"):
        # The heartbeat only echoes what it gets; it is never signed.
        roles[info["hb_port"]] = (
            "Jupyter kernel channels: heartbeat",
            "nothing",
            "echoes bytes back, nothing more; keep it on loopback",
        )
    return roles


def _kernel_endpoints(cluster) -> list[Endpoint]:
    """Every socket this (the kernel's) process listens on."""
    roles = _kernel_roles(cluster)
    out = []
    for host, port in listening_sockets():
        name, protection, advice = roles.get(
            port, ("unknown listener in the kernel process", "unknown", ADVICE_UNKNOWN)
        )
        out.append(Endpoint(name, f"{host}:{port}", "kernel", protection, advice, os.getpid()))
    return out


def _server_endpoints() -> list[Endpoint]:
    try:
        # Deferred: the server application takes seconds to import, and the kernel imports
        # this module at start (through the magics) for an audit it may never run.
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return []
    out = []
    for server in list_running_servers():
        url = server.get("url", "")
        secure = url.startswith("https")
        out.append(
            Endpoint(
                "Jupyter server",
                url.split("://", 1)[-1].rstrip("/"),
                f"pid {server.get('pid')}",
                "token over HTTPS" if secure else "token (HTTP, not encrypted)",
                "" if secure else "serve over HTTPS or keep it on loopback",
            )
        )
    return out


def _coordinator_endpoint(cluster) -> Endpoint:
    coord = cluster.coordinator_address or ""
    if cluster.pki is not None:
        return Endpoint(
            "JAX coordination service",
            coord,
            "p0",
            "mTLS",
            f"peers need a certificate from the cluster CA under {cluster.pki.peer_uri_prefix}; "
            + _serving(cluster),
        )
    return Endpoint(
        "JAX coordination service",
        coord,
        "p0",
        "nothing",
        "anyone who reaches it can join or disrupt the cluster: restart with security on",
    )


def _process_endpoints(cluster, reports: list[dict]) -> list[Endpoint]:
    """What the JAX processes and their nannies listen on besides the coordinator."""
    out: list[Endpoint] = []
    coord = cluster.coordinator_address or ""
    coord_port = int(coord.rsplit(":", 1)[1]) if ":" in coord else None
    curve = cluster.secure
    zmq_protection = "CurveZMQ" if curve else "nothing"
    procs = {p.rank: p for p in cluster.processes}
    for rank, rep in zip(cluster.ranks, reports, strict=True):
        owner, pid = format_procs([rank]), getattr(procs.get(rank), "pid", None)
        for host, port in rep["listening"]:
            if rank == 0 and port == coord_port:
                continue
            if port == rep.get("heartbeat_monitor"):
                out.append(
                    Endpoint(
                        "ipyparallel engine heartbeat monitor",
                        f"{host}:{port}",
                        owner,
                        zmq_protection,
                        "loopback only" if host.startswith("127.") else "",
                        pid,
                    )
                )
            else:
                out.append(
                    Endpoint(
                        DATA_PLANE, f"{host}:{port}", owner, "nothing", ADVICE_PLAINTEXT_DATA, pid
                    )
                )
        nanny = rep.get("nanny")
        for host, port in (nanny or {}).get("listening", []):
            out.append(
                Endpoint(
                    "ipyparallel nanny (relays the engine's control channel)",
                    f"{host}:{port}",
                    f"{owner} nanny",
                    zmq_protection,
                    "loopback only" if host.startswith("127.") else "",
                    nanny["pid"],
                )
            )
        out.extend(_jax_servers(rank, rep))
    return out


def _jax_servers(rank: int, rep: dict) -> list[Endpoint]:
    """Servers JAX was configured to open (their ports are among the listening ones)."""
    out = []
    if rep["cross_host_transfer"]:
        out.append(
            Endpoint(
                "JAX cross-host transfers",
                rep["cross_host_transfer"],
                format_procs([rank]),
                "nothing",
                ADVICE_PLAINTEXT_DATA,
            )
        )
    if rep["profiler"]:
        out.append(
            Endpoint(
                "JAX profiler server",
                "(see listening ports)",
                format_procs([rank]),
                "nothing",
                "stop it when done (jax.profiler.stop_server); anyone who reaches it can trace",
            )
        )
    return out


def audit(cluster) -> list[Endpoint]:
    """Every endpoint of a running cluster with its protection, as measured now.

    The sockets come from the operating system: those of the controller and its
    scheduler processes, of every JAX process (each lists its own, and its nanny's) and
    of the kernel's process. Each is named by the role that explains it; in a JAX process
    a port that is neither the coordination service nor ipyparallel's is JAX's data plane
    (or a server a cell started), which JAX does not protect. The Jupyter servers running
    on this machine are listed last.

    Parameters
    ----------
    cluster : jaxsys_kernel.Cluster
        A ready cluster.

    Returns
    -------
    list of Endpoint
        The coordination service first.
    """
    # Rank order: the reports are read by position.
    reports = list(cluster.call(None, probes.network_endpoints, timeout=30.0).values().values())
    out = [_coordinator_endpoint(cluster)]
    procs = {p.rank: p for p in cluster.processes}
    out[0].pid = getattr(procs.get(0), "pid", None)
    out.extend(_controller_endpoints(cluster))
    out.extend(_process_endpoints(cluster, reports))
    out.extend(_kernel_endpoints(cluster))
    out.extend(_fork_server_endpoints(cluster))
    out.extend(_server_endpoints())
    return out


def _fork_server_endpoints(cluster) -> list[Endpoint]:
    """The fork server's Unix socket, when the cluster's engines are forked from one."""
    server = getattr(getattr(cluster.world, "launcher", None), "forks", None)
    if server is None:
        return []
    return [
        Endpoint(
            "jaxsys fork server (Unix socket)",
            server.socket_path,
            "fork server",
            "owner-only directory; peer check",
            "serves only this user's kernel and the processes it started",
            server.pid,
        )
    ]


def format_audit(endpoints: list[Endpoint]) -> str:
    """Render the audit as an aligned text table, one row per role, owner and host."""
    groups: dict[tuple, list[str]] = {}
    for e in endpoints:
        host, sep, port = e.address.rpartition(":")
        if not sep or not port.isdigit():
            host, port = e.address, ""
        key = (e.name, host, e.owner, e.protection, e.advice)
        groups.setdefault(key, [])
        if port:
            groups[key].append(port)
    header = ["endpoint", "address", "owner", "protected by", "advice"]
    rows = [
        [name, f"{host}:{','.join(ports)}" if ports else host, owner, protection, advice]
        for (name, host, owner, protection, advice), ports in groups.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = []
    for r in [header, *rows]:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        )
    return "\n".join(line.rstrip() for line in lines) + "\n" + _footer(endpoints)


def _footer(endpoints: list[Endpoint]) -> str:
    bare = [e for e in endpoints if e.protection == "nothing"]
    unknown = [e for e in endpoints if e.protection == "unknown"]
    lines = [f"{len(endpoints)} listening socket(s)"]
    if not bare and not unknown:
        lines.append("every endpoint is protected")
    if bare:
        lines.append(f"{len(bare)} with no protection: see the advice column and docs/security.md")
    if unknown:
        lines.append(f"{len(unknown)} not explained by any role: see the advice column")
    return "; ".join(lines)


def format_refusals(refusals: list, reporting: bool = True) -> str:
    """Render refused handshakes as a text table, or say that there were none.

    Parameters
    ----------
    refusals : list of jaxsys_kernel.telemetry.schema.Refusal
    reporting : bool
        False when refusals cannot be seen (see ``Cluster.reports_refusals``).
    """
    if not refusals and not reporting:
        return (
            "refused connections: not reported on this cluster (it needs telemetry and "
            "GRPC_VERBOSITY unset, INFO or DEBUG for process 0)"
        )
    if not refusals:
        return "refused connections: none so far"
    header = ["from", "attempts", "first", "last", "why"]
    rows = [
        [
            r.host,
            str(r.attempts),
            time.strftime("%H:%M:%S", time.localtime(r.first)),
            time.strftime("%H:%M:%S", time.localtime(r.last)),
            r.reason + (f"; it claimed {r.identity}" if r.identity else ""),
        ]
        for r in refusals
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    total = sum(r.attempts for r in refusals)
    lines = [
        f"refused connections to the JAX coordination service: {total} attempt(s) from "
        f"{len({r.host for r in refusals})} address(es); the cluster was not affected"
    ]
    for row in [header, *rows]:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        )
    return "\n".join(line.rstrip() for line in lines)


def refusal_notice(before: dict[tuple[str, str], int], refusals: list) -> list[str]:
    """One line per address and reason with attempts that are new since ``before``.

    Parameters
    ----------
    before : dict
        Attempts already reported, by ``(host, error)``; updated in place.
    refusals : list of jaxsys_kernel.telemetry.schema.Refusal
        The hub's current refusals.

    Returns
    -------
    list of str
        Lines to show the user; empty when nothing is new.
    """
    lines = []
    for r in refusals:
        key = (r.host, r.error)
        new = r.attempts - before.get(key, 0)
        if new <= 0:
            continue
        before[key] = r.attempts
        who = f" claiming {r.identity}" if r.identity else ""
        lines.append(
            f"jaxsys: the coordination service refused {new} connection(s) from {r.host}{who}: "
            f"{r.reason}. The cluster is unaffected; %jaxsys security lists every refusal."
        )
    return lines
