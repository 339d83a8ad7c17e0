"""What a launcher declares about itself: everything read before, or without, a cluster.

A launcher is one module: a :class:`~.base.Launcher` subclass whose class attributes and
class methods (defined here) say which ``launcher_options`` it takes and the flags that
type them, the variables its processes find their rank and size in, the allocation it can
attach to, and how ``jaxsys job`` runs a program with it. The launcher registry
(:mod:`.registry`) reads these for ``ClusterConfig``'s flags, the generated job program,
``%jaxsys attach`` and ``stop --keep-allocation``; nothing else names a launcher.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import ConfigError
from ..allocation import Allocation
from ..options import Flag


class LauncherKind:
    """The declarations of one kind of launcher (see :class:`~.base.Launcher`).

    Subclasses set the class attributes below; none of them needs a running cluster.
    """

    #: The name users give (``Cluster(launcher=...)``).
    name: ClassVar[str]
    #: Processes are named by host (``hosts=[...]``), not counted.
    needs_host_names: ClassVar[bool] = False
    #: ``addresses`` and ``process_prefix`` place processes (network namespaces, taskset).
    places_processes: ClassVar[bool] = False
    #: ``launcher_options`` are accepted (the names of :meth:`option_names`).
    takes_options: ClassVar[bool] = True
    #: Engine (and nanny) pids are pids on this machine.
    engine_pids_here: ClassVar[bool] = False
    #: Launcher processes (mpiexec, sbatch...) run on this machine.
    launcher_pids_here: ClassVar[bool] = True
    #: A single process can be restarted into the running world (and so processes can be
    #: launched one by one, which a standby needs).
    restarts_one_process: ClassVar[bool] = False
    #: Keeps a standby for world restarts only, taken whole or not at all: each host runs
    #: its rank's standby engine beside the world's (pods), but cannot start one rank alone.
    standby_whole_world: ClassVar[bool] = False
    #: Keeps a standby (see cluster/standby.py) when the user asks for none.
    standby_by_default: ClassVar[bool] = False
    #: Engines read a complete copy of the controller's engine file (see bringup.py).
    uses_engine_file_copy: ClassVar[bool] = False
    #: With no ``controller_ip``, everything listens on loopback.
    loopback_only: ClassVar[bool] = False
    #: ``JAX_PLATFORMS`` when the user sets none; "" lets JAX pick (accelerators if any).
    default_platforms: ClassVar[str] = ""
    #: The ipyparallel engine launcher that starts this kind's engines (by its name); its
    #: settings are ``launcher_options`` too.
    ipp_launcher: ClassVar[str | None] = None

    #: This launcher's own ``launcher_options``: name -> what it means.
    options: ClassVar[Mapping[str, str]] = {}
    #: The command-line flags of its options, each with the option's name as its ``key``
    #: (``Flag("--partition", "Slurm: ...", {"metavar": "NAME"}, "partition")``); every
    #: command that starts a cluster offers them (ClusterConfig gathers them).
    flags: ClassVar[tuple[Flag, ...]] = ()
    #: The variables its processes find their rank and their count in, when one command
    #: starts them all with one environment (``SLURM_PROCID``, ``SLURM_NTASKS``).
    rank_variables: ClassVar[tuple[str, ...]] = ()
    size_variables: ClassVar[tuple[str, ...]] = ()
    #: What a running job of this launcher is, for ``%jaxsys attach JOB``; None: it has no
    #: job a cluster can attach to.
    allocation_kind: ClassVar[type[Allocation] | None] = None

    @classmethod
    def default_options(cls) -> dict[str, Any]:
        """``launcher_options`` that apply when the user does not give them."""
        return {}

    @classmethod
    def option_names(cls) -> tuple[str, set[str]]:
        """What ``launcher_options`` may name, and whose settings they are: :attr:`options`,
        and the settings of ipyparallel's engine launcher :attr:`ipp_launcher`."""
        names = set(cls.options)
        if cls.ipp_launcher is None:
            return f"the {cls.name} launcher", names
        # Deferred: ipyparallel's launchers take a while to import and only this check
        # needs them before a cluster starts.
        from ipyparallel.cluster.launcher import find_launcher_class

        ipp_cls = find_launcher_class(cls.ipp_launcher, "engine")
        owner = f"ipyparallel's {ipp_cls.__name__}"
        if names:
            owner += f" (and {', '.join(sorted(names))})"
        return owner, names | set(ipp_cls.class_trait_names(config=True))

    @classmethod
    def check_options(cls, options) -> None:
        """Refuse names this launcher does not have: traitlets would ignore them silently.

        Raises
        ------
        ValueError
            Naming the unknown settings and listing the known ones.
        """
        owner, known = cls.option_names()
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"launcher_options: {', '.join(unknown)} is not a setting of {owner}; "
                f"it has {', '.join(sorted(known))}"
            )

    @classmethod
    def batch_job(
        cls, program: Path, nprocs: int, out_dir: Path, options: dict[str, Any]
    ) -> tuple[dict[str, str], list[str]]:
        """How ``jaxsys job`` runs ``program`` as ``nprocs`` processes of one job, each
        writing its output to ``out_dir/p{rank}.out``.

        Returns
        -------
        tuple
            Files to write into ``out_dir`` (name to text), and the command, run there.
        """
        raise NotImplementedError(f"jaxsys job cannot run a program with the {cls.name} launcher")

    @classmethod
    def job_allocation(
        cls, job_id: str, ntasks: int = 1, options: Mapping[str, Any] | None = None
    ) -> Allocation:
        """The allocation of the job ``job_id`` (of :attr:`allocation_kind`), for
        ``%jaxsys attach JOB``: ``ntasks`` processes run in it, with the cluster's
        ``launcher_options`` (a Kubernetes world's kubeconfig and namespace).

        Raises
        ------
        ConfigError
            When ``job_id`` cannot name such a job, or this launcher has none.
        """
        raise ConfigError(f"the {cls.name} launcher has no job to attach to")

    @classmethod
    def attached_stop_note(cls, job_id: str) -> str | None:
        """After a plain stop of a cluster attached to ``job_id``: what became of the job
        (None: nothing to say)."""
        return None

    @classmethod
    def attach_refusal(cls, job_id: str) -> str | None:
        """Why this kernel may not attach to ``job_id`` now (another live kernel holds
        it, and which), or None when it may."""
        return None
