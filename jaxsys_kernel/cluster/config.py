"""What a cluster is asked to be: its options, validated once, before anything starts."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .launchers import LAUNCHER_CLASSES, LAUNCHERS


@dataclass
class ClusterConfig:
    """The options of a :class:`~jaxsys_kernel.cluster.Cluster`, checked in ``__post_init__``.

    The parameters are those of ``Cluster`` (see its docstring); the containers are copied
    into plain dicts and lists, and ``nprocs`` and ``host_names`` are derived from ``hosts``.

    Raises
    ------
    ValueError
        For any option that cannot work, with what to give instead.
    """

    hosts: int | Sequence[str] = 4
    devices_per_host: int = 2
    launcher: str = "local"
    cache_dir: str | None = None
    register_timeout: float = 60.0
    init_timeout: float = 60.0
    env: Mapping[str, str] | None = None
    process_env: Mapping[int, Mapping[str, str]] | None = None
    heartbeat_timeout: float | None = 10.0
    recoverable: bool = True
    secure: bool = True
    ca_file: str | None = None
    cert_dir: str | None = None
    addresses: Sequence[str] | None = None
    controller_ip: str | None = None
    process_prefix: Mapping[int, Sequence[str]] | None = None
    telemetry: bool = True
    launcher_options: Mapping[str, Any] | None = None
    nprocs: int = field(init=False)
    host_names: list[str] | None = field(init=False)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"unknown launcher {self.launcher!r}; choose one of {', '.join(LAUNCHERS)}"
            )
        self._check_hosts()
        if self.devices_per_host < 1:
            raise ValueError(f"devices_per_host must be at least 1, got {self.devices_per_host}")
        self.env = dict(self.env or {})
        self.process_env = {int(k): dict(v) for k, v in (self.process_env or {}).items()}
        for rank in self.process_env:
            if not 0 <= rank < self.nprocs:
                raise ValueError(f"process_env names process {rank}, outside 0-{self.nprocs - 1}")
        self._check_certificates()
        self._check_placement()
        self._check_launcher_options()
        self.process_prefix = {int(k): list(v) for k, v in (self.process_prefix or {}).items()}

    def _check_hosts(self) -> None:
        if isinstance(self.hosts, int):
            if self.hosts < 1:
                raise ValueError(f"hosts must be at least 1, got {self.hosts}")
            self.host_names = None
            self.nprocs = self.hosts
        else:
            self.host_names = list(self.hosts)
            if not self.host_names:
                raise ValueError("hosts is an empty list; give at least one host name")
            self.nprocs = len(self.host_names)
        if LAUNCHER_CLASSES[self.launcher].needs_host_names and self.host_names is None:
            raise ValueError("the ssh launcher needs host names: hosts=['node1', 'node2', ...]")

    def _check_certificates(self) -> None:
        if (self.ca_file is None) != (self.cert_dir is None):
            raise ValueError("give both ca_file and cert_dir to bring your own certificates")
        if not self.secure and self.ca_file is not None:
            raise ValueError("ca_file/cert_dir make no sense with secure=False")

    def _check_placement(self) -> None:
        places = LAUNCHER_CLASSES[self.launcher].places_processes
        if (self.addresses is not None or self.process_prefix) and not places:
            raise ValueError("addresses and process_prefix apply to the local launcher only")
        if self.addresses is not None and len(self.addresses) != self.nprocs:
            raise ValueError(
                f"addresses has {len(self.addresses)} entries for {self.nprocs} processes"
            )
        self.addresses = (
            list(self.addresses) if self.addresses is not None else ["127.0.0.1"] * self.nprocs
        )

    def _check_launcher_options(self) -> None:
        kind = LAUNCHER_CLASSES[self.launcher]
        if self.launcher_options and not kind.takes_options:
            raise ValueError("launcher_options apply to the ssh, mpi and slurm launchers")
        self.launcher_options = dict(self.launcher_options or {})
        if self.launcher_options:
            check_launcher_options(self.launcher, self.launcher_options)
        self.launcher_options = {**kind.default_options(), **self.launcher_options}

    @property
    def ranks(self) -> list[int]:
        """All process indices, ``0..N-1``."""
        return list(range(self.nprocs))

    def user_env(self, rank: int) -> dict[str, str]:
        """The environment process ``rank`` would see from the user's side: this process's
        own, then ``env``, then its ``process_env``."""
        return {**os.environ, **self.env, **self.process_env.get(rank, {})}


def check_launcher_options(launcher: str, options: Mapping[str, Any]) -> None:
    """Refuse names the launcher does not have: traitlets would ignore them silently.

    Raises
    ------
    ValueError
        Naming the unknown settings and listing the known ones.
    """
    # Imported here: ipyparallel's launchers take a while to import and only this check
    # needs them before a cluster starts.
    from ipyparallel.cluster.launcher import find_launcher_class

    cls = find_launcher_class(launcher, "engine")
    known = set(cls.class_trait_names(config=True))
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"launcher_options: {', '.join(unknown)} is not a setting of ipyparallel's "
            f"{cls.__name__}; it has {', '.join(sorted(known))}"
        )
