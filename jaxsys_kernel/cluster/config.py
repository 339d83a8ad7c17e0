"""What a cluster is asked to be: its options, validated once, before anything starts."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .. import contract
from ..errors import ConfigError
from . import options as opts
from .launchers import DEFAULT, launcher_class, launcher_names
from .launchers.registry import describe, launcher_flags, names_where
from .options import Flag, option
from .standby import standby_size

log = logging.getLogger("jaxsys.cluster")

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


# Read when no standby size is given (the kernelspec may set it).
STANDBY_VARIABLE = "JAXSYS_STANDBY"

# A cluster's size when nothing sets it: the one place these numbers are written (the
# kernelspec, the job runner and the help text read them from here).
DEFAULT_HOSTS = 4
DEFAULT_DEVICES_PER_HOST = 2


@dataclass
class ClusterConfig:
    """The options of a :class:`~jaxsys_kernel.cluster.Cluster`: the one place each is
    declared, with its type, default, meaning and flag, and checked in ``__post_init__``.

    ``%jaxsys start``, ``jaxsys cluster start``, ``jaxsys run`` and ``jaxsys job`` take
    their flags from here (:meth:`add_arguments`); :meth:`to_file` and :meth:`from_file`
    keep options in a JSON file. The containers are copied into plain dicts and lists, and
    ``nprocs`` and ``host_names`` are derived from ``hosts``.
    """

    hosts: int | Sequence[str] = option(
        DEFAULT_HOSTS,
        "Number of processes, or host names (one process each) for launchers that place "
        "processes on named hosts.",
        Flag(
            "--hosts",
            f"number of processes, or host1,host2,... for ssh (default ${contract.HOSTS}, "
            f"else {DEFAULT_HOSTS})",
            {"type": opts.hosts, "metavar": "HOSTS"},
        ),
        doc_type="int or sequence of str",
    )
    devices_per_host: int = option(
        DEFAULT_DEVICES_PER_HOST,
        "CPU devices each process simulates (--xla_force_host_platform_device_count); "
        "ignored on accelerator hosts, where the hardware decides.",
        Flag(
            "--devices-per-host",
            f"CPU devices per process (default ${contract.DEVICES_PER_HOST}, "
            f"else {DEFAULT_DEVICES_PER_HOST})",
            {"type": int, "metavar": "D"},
        ),
        doc_type="int",
    )
    launcher: str = option(
        DEFAULT,
        "How processes are started: a name from launcher_names(); the default starts them "
        "on this machine.",
        Flag(
            "--launcher",
            f"how processes are started (default ${contract.LAUNCHER}, else {DEFAULT})",
            {"choices": launcher_names},
        ),
        doc_type="str",
    )
    cache_dir: str | None = option(
        None,
        "Persistent compilation cache directory of every process; by default "
        "$JAX_COMPILATION_CACHE_DIR or one per user and jaxlib version (default_cache_dir()); "
        '"none" for no cache.',
        Flag(
            "--cache-dir",
            "persistent compilation cache directory (default: one per user and jaxlib; none: off)",
            {"metavar": "DIR"},
        ),
        doc_type="str",
    )
    register_timeout: float | None = option(
        None,
        "Seconds allowed for every engine to register; by default it grows with the number "
        "of processes (default_register_timeout()).",
        Flag(
            "--register-timeout",
            "seconds allowed for every process to register (default: 60 + 0.5 per process)",
            {"type": opts.seconds, "metavar": "SECONDS"},
        ),
        doc_type="float",
    )
    init_timeout: float = option(
        60.0,
        "Seconds allowed for jax.distributed.initialize.",
        Flag(
            "--init-timeout",
            "seconds allowed for jax.distributed.initialize (default 60)",
            {"type": opts.seconds, "metavar": "SECONDS"},
        ),
        doc_type="float",
    )
    env: Mapping[str, str] | None = option(
        None,
        "Extra environment variables for every process.",
        Flag(
            "--env",
            "an environment variable for every process",
            {"action": "append", "metavar": "KEY=VALUE"},
            convert=opts.pairs("--env"),
        ),
        doc_type="mapping of str to str",
    )
    process_env: Mapping[int, Mapping[str, str]] | None = option(
        None,
        "Extra environment variables for single processes, by rank.",
        doc_type="mapping of int to mapping",
    )
    heartbeat_timeout: float | None = option(
        10.0,
        "Seconds without heartbeats after which JAX declares a process dead (JAX's own "
        "default is 100); None for JAX's default.",
        Flag("--heartbeat", kwargs={"type": opts.seconds, "metavar": "SECONDS"}),
        doc_type="float",
    )
    recoverable: bool = option(
        True,
        "Run JAX with jax_enable_recoverability: when a process dies the others keep "
        "running, and a restarted process can rejoin. Without it, one death takes every "
        "process down.",
        Flag(
            "--no-recoverability",
            "JAX without recoverability: when one process dies the others are stopped too",
            {"action": "store_false"},
        ),
        doc_type="bool",
    )
    secure: bool = option(
        True,
        "Mutual TLS for JAX's coordination service (certificates from a per-cluster CA) and "
        "CurveZMQ for ipyparallel's control channel.",
        Flag("--insecure", "no mTLS, no CurveZMQ (not recommended)", {"action": "store_false"}),
        doc_type="bool",
    )
    ca_file: str | None = option(
        None,
        "Your own CA certificate, which signed the certificates in cert_dir.",
        Flag("--ca-file", "your own CA certificate, with --cert-dir", {"metavar": "PEM"}),
        doc_type="str",
    )
    cert_dir: str | None = option(
        None,
        "A directory with process-<i>.pem and process-<i>.key for every process, signed by "
        "ca_file.",
        Flag(
            "--cert-dir",
            "directory with process-<i>.pem/.key signed by --ca-file",
            {"metavar": "DIR"},
        ),
        doc_type="str",
    )
    addresses: Sequence[str] | None = option(
        None,
        "The network address of each process's host, for launchers that place processes "
        "(loopback by default); process 0's carries the coordination service, and each goes "
        "into that process's certificate.",
        Flag(
            "--addresses",
            "each process's network address, A0,A1,... (default: loopback)",
            {"type": opts.words, "metavar": "A0,A1,..."},
        ),
        doc_type="sequence of str",
    )
    controller_ip: str | None = option(
        None,
        "Where the ipyparallel controller listens (loopback for local clusters).",
        Flag("--controller-ip", kwargs={"metavar": "IP"}),
        doc_type="str",
    )
    process_prefix: Mapping[int, Sequence[str]] | None = option(
        None,
        "For launchers that place processes: a command prefix per process, by rank, e.g. "
        '["taskset", "-c", "0"].',
        doc_type="mapping of int to sequence of str",
    )
    telemetry: bool = option(
        True,
        "Run an agent in every process that streams heartbeats and compilation-cache events "
        "to the kernel.",
        Flag("--no-telemetry", "no telemetry agent in the processes", {"action": "store_false"}),
        doc_type="bool",
    )
    launcher_options: Mapping[str, Any] | None = option(
        None,
        'Settings of the launcher, by name, e.g. {"ssh_args": ["-i", "key"]}; for '
        "ssh, remote_python defaults to this Python's path. Each launcher declares its "
        "settings and the flags that type them (--partition, --ssh-arg, --hostfile...).",
        doc_type="mapping",
        gather=lambda: launcher_flags(CORE_FLAGS),
    )
    standby: int | None = option(
        None,
        "Processes kept booted (Python, IPython, ipyparallel and JAX imported) to replace the "
        "world's at a restart; default: one world's worth when processes run on this machine "
        "and memory allows, one per pod on Kubernetes (where any N but 0 means one per "
        f"pod), 0 for other remote launchers. ${STANDBY_VARIABLE} gives it when unset.",
        Flag("--standby", kwargs={"type": int, "metavar": "N"}),
        doc_type="int",
    )
    fork_server: bool = option(
        True,
        "Local processes are forked from one process that has imported Python, IPython, "
        "ipyparallel and JAX once (docs/scale.md), instead of each importing them.",
        Flag("--no-fork-server", "start each local process on its own, importing everything",
             {"action": "store_false"}),  # fmt: skip
        doc_type="bool",
    )
    spare_world: bool = option(
        False,
        "Keep a whole next world of processes already joined to a JAX world of their own, "
        "so that a world restart only swaps it in (local processes, memory allowing).",
        Flag("--spare-world", "keep a next world already joined to JAX for restarts",
             {"action": "store_true"}),  # fmt: skip
        doc_type="bool",
    )
    nprocs: int = field(init=False)
    host_names: list[str] | None = field(init=False)
    kind: type = field(init=False, repr=False, compare=False)
    # The options as they were given, before any default was filled in (see to_dict).
    _given: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._given = {f.name: getattr(self, f.name) for f in opts.declared(type(self))}
        self.kind = launcher_class(self.launcher)
        self.standby = standby_size(self.standby, STANDBY_VARIABLE)
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

    # -- the other forms of the options --------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The options as they were given, in JSON's types, without those left at their
        declared default.

        What is derived (the default cache directory, the registration deadline that grows
        with ``hosts``) is derived again on loading, so a saved file is one layer of
        settings: what it names wins over the layers below, the rest stays theirs.
        """
        return opts.to_dict(self)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any], where: str = "the options") -> ClusterConfig:
        """The config of ``options`` (as :meth:`to_dict` writes them), checked name by name
        and value by value; ``where`` names their source in errors.

        Raises
        ------
        ConfigError
            For an unknown option (naming it, the closest known one and ``where``), a value
            of the wrong type, or an option that cannot work.
        """
        return cls(**opts.checked(cls, options, where))

    def to_file(self, path: str | os.PathLike) -> None:
        """Save :meth:`to_dict` as JSON in ``path``."""
        opts.write_file(path, self.to_dict())

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ClusterConfig:
        """The config saved by :meth:`to_file`.

        Raises
        ------
        ConfigError
            Naming the file, for one that cannot be read, is not a JSON object, or names an
            unknown option (and the option).
        """
        return cls.from_dict(opts.read_file(path), where=os.fspath(path))

    @classmethod
    def of(cls, config: ClusterConfig | None, options: Mapping[str, Any], where: str):
        """``config`` with ``options`` replacing its own, or ``options`` alone.

        Raises
        ------
        UnknownOptionError
            A ``TypeError`` (and a ConfigError) naming the unknown name and the known ones.
        """
        opts.check_names(options, [f.name for f in opts.declared(cls)], where)
        if config is None:
            return cls(**options)
        return cls(**{**config._given, **options})

    @classmethod
    def layered(cls, *layers: Mapping[str, Any] | None, environ=None) -> dict[str, Any]:
        """``layers`` (lowest first, see :func:`~.options.merge_layers`) under the override
        that ``jaxsys run`` hands its kernel in ``$JAXSYS_OVERRIDES``."""
        top = opts.overrides_from(os.environ if environ is None else environ, cls)
        return opts.merge_layers(*layers, top)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add a flag for every option typed on command lines to ``parser``; a launcher's
        flag that the command has already (for itself) is left out, with a warning."""
        for flag, kwargs in opts.flag_arguments(cls):
            if flag not in CORE_FLAGS and flag in parser._option_string_actions:
                log.warning("the launcher flag %s is left out: %s has its own", flag, parser.prog)
                continue
            parser.add_argument(flag, **kwargs)

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The options a command line parsed by :meth:`add_arguments`'s flags gave."""
        return opts.given_options(cls, args)


# The flags of the options declared above: a launcher may not declare one of them again.
CORE_FLAGS = frozenset(fl.flag for f in opts.declared(ClusterConfig) for fl in f.metadata["flags"])

ClusterConfig.__doc__ += textwrap.indent(
    f"\n{opts.parameters_doc(ClusterConfig)}\n\nRaises\n------\nConfigError\n"
    "    For any option that cannot work, with what to give instead.\n",
    "    ",
)


def default_cache_dir() -> str:
    """The default cache directory: one per user and per jaxlib version.

    ``$XDG_CACHE_HOME/jaxsys/compilation-cache/jaxlib-<version>`` (``~/.cache`` by
    default); a temporary directory of the user's own when that cannot be written. Entries
    of one jaxlib can never hit in another (the version is part of every key), so keeping
    them apart costs nothing and keeps each directory's size honest.
    """
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
