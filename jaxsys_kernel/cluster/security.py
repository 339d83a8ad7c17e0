"""A cluster's security: the certificates it uses, the watch after a rotation, and the
handshakes its coordination service refused (see docs/security.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from traitlets.log import get_logger

from .. import contract
from .pki import ClusterPKI, peer_certificate_serial
from .records import ClusterError

# After a rotation, how often the served certificate is checked, and for how long: JAX 0.12
# re-reads certificate files about every 10 minutes, so twice that means something is wrong.
ROTATION_POLL_S = 15.0
ROTATION_GIVE_UP_S = 20 * 60.0
# gRPC prints its handshake trace at INFO; at a quieter verbosity refusals go unseen.
_TRACE_VERBOSITIES = ("INFO", "DEBUG")


def make_pki(
    profile: Path,
    cluster_id: str,
    nprocs: int,
    hosts: list[str] | None,
    ca_file: str | None = None,
    cert_dir: str | None = None,
):
    """The cluster's certificates: the user's CA and files, or a new per-cluster CA.

    Parameters
    ----------
    profile : Path
        The cluster's profile directory (a new CA goes into its ``pki`` folder).
    cluster_id : str
        Goes into every certificate's identity.
    nprocs : int
        Number of processes.
    hosts : list of str or None
        Each process's host, written into its certificate.
    ca_file, cert_dir : str, optional
        The user's CA and certificate directory, when they bring their own.
    """
    if ca_file is not None:
        return ClusterPKI.from_user(ca_file, cert_dir, cluster_id, nprocs)
    return ClusterPKI.create(profile / "pki", cluster_id, nprocs, hosts)


def describe(secure: bool, ca_file: str | None) -> str:
    """One line saying how a cluster's links are protected."""
    if not secure:
        return "INSECURE: no mTLS on the coordination service, no CurveZMQ on the control channel"
    origin = "your CA" if ca_file else "a per-cluster CA"
    return f"mTLS on the coordination service ({origin}), CurveZMQ on the control channel"


def handshake_trace_env(user_env: Mapping[str, str]) -> dict[str, str]:
    """gRPC settings that make process 0 log each refused handshake, for the kernel.

    Parameters
    ----------
    user_env : mapping
        The environment process 0 gets from the user (see ``ClusterConfig.user_env``).
    """
    env = {contract.WATCH_HANDSHAKES: "1"}
    tracers = [t for t in user_env.get("GRPC_TRACE", "").split(",") if t]
    env["GRPC_TRACE"] = ",".join(
        [*tracers, "handshaker"] if "handshaker" not in tracers else tracers
    )
    if "GRPC_VERBOSITY" not in user_env:
        # gRPC traces at INFO. The INFO records this adds are dropped in the process;
        # a user who chose a verbosity gets to see what it shows.
        env["GRPC_VERBOSITY"] = "INFO"
        env[contract.DROP_NATIVE_INFO] = "1"
    return env


def reports_refusals(secure: bool, pki, telemetry: bool, user_env0: Mapping[str, str]) -> bool:
    """Whether refused handshakes can be reported: mTLS, telemetry, and a gRPC verbosity
    (if the user chose one, in process 0's environment ``user_env0``) at which its
    handshake trace is printed."""
    if pki is None and not secure:
        return False
    if not telemetry:
        return False
    return user_env0.get("GRPC_VERBOSITY", "INFO").upper() in _TRACE_VERBOSITIES


def refusals_since(records: list, t: float) -> list[str]:
    """Why a process that never joined may have been turned away: the refusals since ``t``.

    Parameters
    ----------
    records : list of jaxsys_kernel.telemetry.schema.Refusal
    t : float
        Wall-clock time.
    """
    return [
        f"meanwhile the coordination service refused {r.attempts} connection(s) "
        f"from {r.host}: {r.reason}"
        for r in records
        if r.last >= t
    ]


class RotationWatch:
    """After a certificate rotation, a thread that asks the coordination service which
    certificate it presents until it is the new one (or gives up after 20 minutes).

    Parameters
    ----------
    poll : callable
        Returns the seconds between checks (read before each one).
    """

    def __init__(self, poll: Callable[[], float]):
        self._poll = poll
        self._stop = threading.Event()
        self._state: dict | None = None

    def state(self) -> dict | None:
        """``rotated_at``, ``serial``, ``in_use_at`` and ``gave_up``; None before a rotation."""
        return None if self._state is None else dict(self._state)

    def stop(self) -> None:
        """Stop watching (the last state stays readable)."""
        self._stop.set()

    def start(self, serial: int, running: Callable[[], bool], served: Callable[[], int]) -> None:
        """Watch for ``serial`` while ``running()``; ``served()`` returns the serial the
        service presents now, and raises when it cannot be asked."""
        self._stop.set()
        stop = self._stop = threading.Event()
        state = self._state = {
            "rotated_at": time.time(),
            "serial": serial,
            "in_use_at": None,
            "gave_up": False,
        }
        deadline = time.monotonic() + ROTATION_GIVE_UP_S

        def watch() -> None:
            while not stop.wait(self._poll()):
                if not running():
                    return
                if time.monotonic() > deadline:
                    state["gave_up"] = True
                    return
                try:
                    now_served = served()
                except Exception:  # noqa: BLE001 - mid-restart the service may be away
                    continue
                if now_served == serial:
                    state["in_use_at"] = time.time()
                    return

        threading.Thread(target=watch, name="jaxsys-rotation", daemon=True).start()


class _CurveSigningFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Message signing is disabled")


_curve_filter = _CurveSigningFilter()


def quiet_curve_signing_warning() -> None:
    """Silence jupyter_client's "signing is disabled" warning on Curve-protected sessions."""
    # With CurveZMQ, ipyparallel gives its sessions an empty HMAC key (Curve authenticates
    # and encrypts instead), and jupyter_client then warns that signing is disabled: on a
    # secure cluster that warning says the opposite of the truth.
    logger = get_logger()
    if _curve_filter not in logger.filters:
        logger.addFilter(_curve_filter)


class ClusterSecurity:
    """The mixin that gives :class:`~jaxsys_kernel.cluster.Cluster` its security methods:
    the description of its links, certificate rotation and the refused handshakes."""

    @property
    def security(self) -> str:
        """One line saying how the cluster's links are protected."""
        return describe(self.secure, self.ca_file)

    @property
    def reports_refusals(self) -> bool:
        """Whether refused handshakes can be reported: mTLS, telemetry, and a gRPC
        verbosity (if the user chose one) at which its handshake trace is printed."""
        return reports_refusals(
            self.secure, self.pki, self.telemetry_enabled, self.config.user_env(0)
        )

    def rotate_certs(self) -> list[int]:
        """Issue new certificates for every process in place, signed by the same CA.

        JAX re-reads certificate files periodically (every 10 minutes in 0.12), so running
        processes switch to the new ones without a restart.

        Returns
        -------
        list of int
            The serial numbers of the new certificates, by process.
        """
        self._require_ready()
        if self.pki is None:
            raise ClusterError(
                "this cluster runs without mTLS; there are no certificates to rotate"
            )
        if not self.pki.can_rotate:
            raise ClusterError(
                "this cluster uses your CA, and jaxsys holds no CA key: issue new certificates "
                "with your CA and replace the files in the certificate directory in place"
            )
        serials = self.pki.rotate()
        self._rotation.start(serials[0], self._serving_certificates, self._served_serial)
        return serials

    def rotation(self) -> dict | None:
        """Where the latest certificate rotation stands, or None if there was none.

        After :meth:`rotate_certs` a background thread asks the coordination service every
        ``rotation_poll`` seconds which certificate it presents, until it is the new one
        (or for at most 20 minutes). Only process 0's certificate can be observed this way:
        it is the one the service presents; the others switch on the same schedule.

        Returns
        -------
        dict or None
            ``rotated_at`` (wall-clock time), ``serial`` (process 0's new serial),
            ``in_use_at`` (when the service was first seen presenting it, or None) and
            ``gave_up`` (True if it never did within 20 minutes).
        """
        return self._rotation.state()

    def refusals(self) -> list[dict]:
        """Connections the coordination service refused, by address and reason.

        Process 0 reports each refused TLS handshake (no certificate, another CA, an
        identity outside the cluster's prefix...) to the kernel as it happens. The list
        survives world restarts.

        Returns
        -------
        list of dict
            ``host``, ``reason``, ``identity``, ``error``, ``attempts``, ``first``, ``last``
            and ``last_port`` for each address and reason, oldest first; empty for clusters
            without mTLS or telemetry.
        """
        return [r.to_dict() for r in self.refusal_records()]

    def refusal_records(self) -> list:
        """:meth:`refusals` as :class:`~jaxsys_kernel.telemetry.schema.Refusal` records."""
        return self.world.refusal_records()

    def _serving_certificates(self) -> bool:
        return self.state != "stopped" and self.pki is not None

    def _served_serial(self) -> int:

        return peer_certificate_serial(
            self.coordinator_address, self.pki.credentials(0), timeout=2.0
        )
