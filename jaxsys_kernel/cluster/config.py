"""What a cluster is asked to be: its options, validated once, before anything starts."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import contract
from ..errors import ConfigError
from .launchers import DEFAULT, launcher_class
from .launchers.registry import describe, names_where

# Why jaxsys_kernel refuses JAX's share flag on CPU (measured; docs/compilation-cache.md).
SHARE_FLAG = "JAX_SHARE_BINARY_BETWEEN_HOSTS"
SHARE_REFUSED = (
    "jax_share_binary_between_hosts is refused on CPU clusters: in JAX 0.12 each CPU process "
    "computes a different cache key, so process 1 waits for an executable that process 0 "
    "publishes under another key, and the first collective would hang, failing after 30 s "
    "(gloo) while the others wait up to 20 min. Leave it unset: processes other than 0 then "
    "compile for themselves. See docs/compilation-cache.md."
)

# The registration deadline when none is given: engines boot one after another on a busy
# machine (on 2 cores the first of 64 registers after 9-12 s and the last after about
# 25 s), so a fixed deadline that suits 4 processes fails at 64. See docs/scale.md.
REGISTER_BASE_S = 60.0
REGISTER_PER_PROCESS_S = 0.5


def default_register_timeout(nprocs: int) -> float:
    """Seconds allowed for ``nprocs`` engines to register: 60 s plus 0.5 s per process."""
    return REGISTER_BASE_S + REGISTER_PER_PROCESS_S * nprocs


@dataclass
class ClusterConfig:
    """The options of a :class:`~jaxsys_kernel.cluster.Cluster`, checked in ``__post_init__``.

    The parameters are those of ``Cluster`` (see its docstring); the containers are copied
    into plain dicts and lists, and ``nprocs`` and ``host_names`` are derived from ``hosts``.

    Raises
    ------
    ConfigError
        For any option that cannot work, with what to give instead.
    """

    hosts: int | Sequence[str] = 4
    devices_per_host: int = 2
    launcher: str = DEFAULT
    cache_dir: str | None = None
    register_timeout: float | None = None
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
    kind: type = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.kind = launcher_class(self.launcher)
        self._check_hosts()
        if self.register_timeout is None:
            self.register_timeout = default_register_timeout(self.nprocs)
        elif self.register_timeout <= 0:
            raise ConfigError(
                f"register_timeout must be positive seconds, got {self.register_timeout}; "
                "leave it unset to let it grow with the number of processes"
            )
        if self.devices_per_host < 1:
            raise ConfigError(f"devices_per_host must be at least 1, got {self.devices_per_host}")
        self.env = dict(self.env or {})
        self.process_env = {int(k): dict(v) for k, v in (self.process_env or {}).items()}
        for rank in self.process_env:
            if not 0 <= rank < self.nprocs:
                raise ConfigError(f"process_env names process {rank}, outside 0-{self.nprocs - 1}")
        self._check_certificates()
        self._resolve_cache()
        self._check_placement()
        self._check_launcher_options()
        self.process_prefix = {int(k): list(v) for k, v in (self.process_prefix or {}).items()}

    def _check_hosts(self) -> None:
        if isinstance(self.hosts, int):
            if self.hosts < 1:
                raise ConfigError(f"hosts must be at least 1, got {self.hosts}")
            self.host_names = None
            self.nprocs = self.hosts
        else:
            self.host_names = list(self.hosts)
            if not self.host_names:
                raise ConfigError("hosts is an empty list; give at least one host name")
            self.nprocs = len(self.host_names)
        if self.kind.needs_host_names and self.host_names is None:
            raise ConfigError(
                f"the {self.launcher} launcher needs host names: hosts=['node1', 'node2', ...]"
            )

    def _resolve_cache(self) -> None:
        """One cache directory per cluster: the one given, the user's, or a default."""
        if self.cache_dir == contract.NO_CACHE:
            self.cache_dir = None
        elif self.cache_dir is None:
            given = self.env.get("JAX_COMPILATION_CACHE_DIR") or os.environ.get(
                "JAX_COMPILATION_CACHE_DIR"
            )
            self.cache_dir = given or default_cache_dir()
        else:
            self.cache_dir = os.path.expanduser(os.fspath(self.cache_dir))
        for rank in self.ranks:
            env = self.user_env(rank)
            share = env.get(SHARE_FLAG, "").strip().lower() in ("1", "true", "yes", "on")
            platforms = env.get("JAX_PLATFORMS") or self.kind.default_platforms
            if share and platforms.split(",")[0].strip() == "cpu":
                raise ConfigError(SHARE_REFUSED)

    def _check_certificates(self) -> None:
        if (self.ca_file is None) != (self.cert_dir is None):
            raise ConfigError("give both ca_file and cert_dir to bring your own certificates")
        if not self.secure and self.ca_file is not None:
            raise ConfigError("ca_file/cert_dir make no sense with secure=False")

    def _check_placement(self) -> None:
        if (self.addresses is not None or self.process_prefix) and not self.kind.places_processes:
            where = describe(names_where(lambda k: k.places_processes))
            raise ConfigError(f"addresses and process_prefix apply to {where} only")
        if self.addresses is not None and len(self.addresses) != self.nprocs:
            raise ConfigError(
                f"addresses has {len(self.addresses)} entries for {self.nprocs} processes"
            )
        self.addresses = (
            list(self.addresses) if self.addresses is not None else ["127.0.0.1"] * self.nprocs
        )

    def _check_launcher_options(self) -> None:
        kind = self.kind
        if self.launcher_options and not kind.takes_options:
            where = describe(names_where(lambda k: k.takes_options), "and")
            raise ConfigError(f"launcher_options apply to {where}")
        self.launcher_options = dict(self.launcher_options or {})
        if self.launcher_options:
            kind.check_options(self.launcher_options)
        self.launcher_options = {**kind.default_options(), **self.launcher_options}

    @property
    def ranks(self) -> list[int]:
        """All process indices, ``0..N-1``."""
        return list(range(self.nprocs))

    def user_env(self, rank: int) -> dict[str, str]:
        """The environment process ``rank`` would see from the user's side: this process's
        own, then ``env``, then its ``process_env``."""
        return {**os.environ, **self.env, **self.process_env.get(rank, {})}


def default_cache_dir() -> str:
    """The default cache directory: one per user and per jaxlib version.

    ``$XDG_CACHE_HOME/jaxsys/compilation-cache/jaxlib-<version>`` (``~/.cache`` by
    default); a temporary directory of the user's own when that cannot be written. Entries
    of one jaxlib can never hit in another (the version is part of every key), so keeping
    them apart costs nothing and keeps each directory's size honest.
    """
    import getpass
    import tempfile
    from importlib.metadata import PackageNotFoundError, version

    try:
        jaxlib = version("jaxlib")
    except PackageNotFoundError:
        jaxlib = "unknown"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "jaxsys", "compilation-cache", f"jaxlib-{jaxlib}")
    try:
        os.makedirs(path, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    path = os.path.join(
        tempfile.gettempdir(), f"jaxsys-cache-{getpass.getuser()}", f"jaxlib-{jaxlib}"
    )
    os.makedirs(path, exist_ok=True)
    return path


def check_launcher_options(launcher: str, options: Mapping[str, Any]) -> None:
    """Refuse option names the launcher does not have (see ``Launcher.check_options``).

    Raises
    ------
    ConfigError
        Naming the unknown settings and listing the known ones.
    """
    launcher_class(launcher).check_options(options)
