"""Audit of every network endpoint a cluster uses, and what protects it."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .._ranges import format_procs
from ..telemetry.refusals import explain_refusal
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


@dataclass
class Endpoint:
    """One network endpoint of the cluster.

    Attributes
    ----------
    name : str
        What it is, e.g. ``coordination service``.
    address : str
        Where it listens (``host:port``; ports may be several).
    owner : str
        Which process listens (``kernel``, ``controller``, ``p0``...).
    protection : str
        ``mTLS``, ``CurveZMQ``, ``HMAC`` (signed, not encrypted), ``token`` or ``nothing``.
    advice : str
        What to do about it, for the unprotected ones.
    """

    name: str
    address: str
    owner: str
    protection: str
    advice: str = ""

    def to_dict(self) -> dict:
        """The fields as a plain dict."""
        return asdict(self)


def _serving(cluster) -> str:
    """Which certificate the coordinator presents now, against the one on disk."""
    from .pki import peer_certificate_serial

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


def _ipp_endpoints(cluster) -> list[Endpoint]:
    ipp = cluster._ipp
    path = controller_file(ipp.profile_dir, ipp.cluster_id, "engine")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    host = info["interface"].removeprefix("tcp://")
    ports = {
        k: info[k]
        for k in ("registration", "control", "mux", "task", "iopub", "hb_ping", "hb_pong")
    }
    ports["broadcast"] = ",".join(map(str, info.get("broadcast", [])))
    curve = bool(info.get("curve_serverkey"))
    protection = (
        "CurveZMQ"
        if curve
        else f"HMAC ({info.get('signature_scheme', 'hmac-sha256')}; not encrypted)"
    )
    advice = "" if curve else "start with security on (the default) to encrypt with CurveZMQ"
    if host in ("127.0.0.1", "localhost"):
        advice = advice or "loopback only"
    return [
        Endpoint(f"ipyparallel {name}", f"{host}:{port}", "controller", protection, advice)
        for name, port in ports.items()
    ]


def _telemetry_endpoint(cluster) -> list[Endpoint]:
    hub = cluster.telemetry
    if hub is None:
        return []
    address = hub.address.removeprefix("tcp://")
    if hub.public_key:
        advice = "loopback only" if address.startswith("127.") else ""
        return [Endpoint("jaxsys telemetry", address, "kernel", "CurveZMQ", advice)]
    return [
        Endpoint(
            "jaxsys telemetry",
            address,
            "kernel",
            "nothing",
            "heartbeats, cache events and refusals travel in the clear: start with security on",
        )
    ]


def _kernel_endpoint() -> list[Endpoint]:
    try:
        from ipykernel.connect import get_connection_file

        info = json.loads(Path(get_connection_file()).read_text())
    except Exception:  # noqa: BLE001 - outside a kernel there is no kernel endpoint
        return []
    ports = ",".join(
        str(info[k])
        for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
        if k in info
    )
    curve = bool(info.get("curve_serverkey") or info.get("curve_publickey"))
    protection = (
        "CurveZMQ" if curve else f"HMAC ({info.get('signature_scheme', '')}; not encrypted)"
    )
    advice = (
        ""
        if curve
        else "kernel traffic is signed, not encrypted: keep it on loopback or use transport_encryption"
    )
    return [
        Endpoint(
            "Jupyter kernel channels", f"{info.get('ip')}:{ports}", "kernel", protection, advice
        )
    ]


def _server_endpoints() -> list[Endpoint]:
    try:
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
    """What the processes listen on besides the coordinator: JAX's unprotected data plane."""
    out: list[Endpoint] = []
    coord = cluster.coordinator_address or ""
    coord_port = int(coord.rsplit(":", 1)[1]) if ":" in coord else None
    data_plane: dict[str, list[int]] = {}
    for rank, rep in zip(cluster.ranks, reports, strict=True):
        for host, port in rep["listening"]:
            if rank == 0 and port == coord_port:
                continue
            data_plane.setdefault(f"{host}:{port}", []).append(rank)
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
    for address, ranks in sorted(data_plane.items()):
        out.append(
            Endpoint(
                "JAX data plane (gloo collectives)",
                address,
                format_procs(ranks),
                "nothing",
                ADVICE_PLAINTEXT_DATA,
            )
        )
    return out


def audit(cluster) -> list[Endpoint]:
    """Every endpoint of a running cluster with its protection, as measured now.

    Asks every JAX process which TCP ports it listens on; ports that are neither the
    coordination service nor a known ipyparallel socket are JAX's data plane (gloo
    collectives, transfer servers), which JAX does not protect.

    Parameters
    ----------
    cluster : jaxsys_kernel.Cluster
        A ready cluster.

    Returns
    -------
    list of Endpoint
    """
    from ..engine import probes

    cluster._require_ready()
    out = [_coordinator_endpoint(cluster)]
    out.extend(_ipp_endpoints(cluster))
    out.extend(_telemetry_endpoint(cluster))
    out.extend(_process_endpoints(cluster, cluster.view.apply_sync(probes.network_endpoints)))
    out.extend(_kernel_endpoint())
    out.extend(_server_endpoints())
    return out


def format_audit(endpoints: list[Endpoint]) -> str:
    """Render the audit as an aligned text table."""
    header = ["endpoint", "address", "owner", "protected by", "advice"]
    rows = [[e.name, e.address, e.owner, e.protection, e.advice] for e in endpoints]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = []
    for r in [header, *rows]:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        )
    return "\n".join(line.rstrip() for line in lines) + "\n" + _footer(endpoints)


def _footer(endpoints: list[Endpoint]) -> str:
    bare = [e for e in endpoints if e.protection == "nothing"]
    if not bare:
        return "every endpoint is protected"
    return f"{len(bare)} endpoint(s) with no protection: see the advice column and docs/security.md"


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
