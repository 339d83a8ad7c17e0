"""The MPI launcher: every rank in one ``mpiexec`` job; ranks come from MPI's environment."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from ..allocation import MpiAllocation
from ..options import Flag
from ..records import ClusterStartError
from ..teardown import launcher_pids, pid_alive
from .base import Launcher

# What ipyparallel's launchers put into an engine's environment besides ours.
IPP_VARIABLES = ("IPP_CLUSTER_ID", "IPP_PROFILE_DIR")
# Open MPI's list of variables to export to every rank, wherever it runs (MPICH, which
# exports everything anyway, ignores it).
OMPI_EXPORTS = "OMPI_MCA_mca_base_env_list"
# mpiexec is started in a session of its own and would outlive a killed kernel, and with
# it every rank. This runs first, in its place: SIGKILL when the thread that launched it
# ends (the kernel's death), then mpiexec itself. The ranks die with mpiexec, their
# parent (engines arm the same signal, see profile.py). Standard library only: it runs
# before anything else.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
    "os.getppid() == 1 and os._exit(1); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


# Open MPI keeps a job's files in a session directory (``ompi.<host>.<uid>/pid.<mpiexec
# pid>/`` in /tmp, about 8 MB for two ranks) and one shared-memory segment per rank (in
# /dev/shm). mpiexec removes them when it ends, but it is SIGKILLed, so they outlived every
# world: these put them in the cluster's profile directory, which goes at stop (and at
# the next start, when the kernel was killed).
SESSION_DIR = "OMPI_MCA_orte_tmpdir_base"
SEGMENT_DIR = "OMPI_MCA_btl_vader_backing_directory"


def mpi_files(profile: Path, incarnation: int) -> Path:
    """Where Open MPI keeps the files of one world's ``mpiexec`` job on this machine."""
    return profile / "mpi" / str(incarnation)


def default_session_dirs(mpiexec: int) -> list[Path]:
    """The session directory of ``mpiexec`` (a pid) where Open MPI puts it by default: in
    ``ompi.<host>.<uid>`` of the first of TMPDIR, TEMP and TMP that is set, else /tmp."""
    base = next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")
    return list(Path(base).glob(f"ompi.*.{os.getuid()}/pid.{mpiexec}"))


class MpiLauncher(Launcher):
    """Every rank in one ``mpiexec`` job; ranks come from MPI's environment.

    ipyparallel's engines take their id from ``mpi4py`` (``--mpi``), so both ``mpiexec``
    and ``mpi4py`` must be here; both are checked before anything starts.
    ``launcher_options`` take the settings of ipyparallel's ``MPIEngineSetLauncher``
    (``mpi_args``, ``mpi_cmd``) and ``hostfile``, which spreads the ranks over the hosts
    an Open MPI hostfile names.
    """

    name = "mpi"
    ipp_launcher = "mpi"
    options = {"hostfile": "an Open MPI hostfile: the ranks are spread over the hosts it names"}
    flags = (
        Flag(
            "--hostfile",
            "MPI: spread the ranks over the hosts F names",
            {"metavar": "F"},
            "hostfile",
        ),
    )
    rank_variables = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
    size_variables = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

    def __init__(self, config):
        super().__init__(config)
        self._mpiexecs: set[int] = set()  # killed by a teardown, files not yet removed

    @classmethod
    def batch_job(cls, program, nprocs, out_dir, options):
        # mpiexec stops every rank when one exits non-zero; JAX finds its coordinator
        # from Open MPI's environment.
        env = [f"{k}={v}" for k, v in cls.mpiexec_env().items()]
        run = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(program))}"
        redirect = " > p$OMPI_COMM_WORLD_RANK.out 2>&1"
        return {}, ["env", *env, "mpiexec", "-n", str(nprocs), "sh", "-c", run + redirect]

    def make_allocation(self) -> MpiAllocation:
        """The mpiexec job's hosts: those of ``--hostfile``, else this machine."""
        return MpiAllocation(self.config.launcher_options.get("hostfile"))

    def _mpiexec(self) -> str:
        return (self.config.launcher_options.get("mpi_cmd") or ["mpiexec"])[0]

    def check_tools(self) -> None:
        """Refuse to start without ``mpiexec`` or ``mpi4py``, or with a missing hostfile.

        Raises
        ------
        ClusterStartError
            Saying what to install.
        """
        if shutil.which(self._mpiexec()) is None:
            raise ClusterStartError(
                f"the {self.name} launcher needs {self._mpiexec()} on PATH: install an MPI "
                "(Debian: apt-get install openmpi-bin)"
            )
        if importlib.util.find_spec("mpi4py") is None:
            raise ClusterStartError(
                f"the {self.name} launcher needs mpi4py, for each engine to learn its rank: "
                "pip install 'jaxsys[mpi]' (or pip install mpi4py)"
            )
        hostfile = self.config.launcher_options.get("hostfile")
        if hostfile and not Path(hostfile).is_file():
            raise ClusterStartError(f"hostfile {hostfile} does not exist")

    def make_ipp_cluster(self, profile: Path, secure: bool):
        # Before the controller starts: without either tool every engine dies at once
        # and the start would only time out.
        self.check_tools()
        return super().make_ipp_cluster(profile, secure)

    @staticmethod
    def mpiexec_env() -> dict[str, str]:
        """What Open MPI needs to run here: as root it refuses without the first two, and
        it refuses more ranks than cores without oversubscription."""
        env = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return {k: v for k, v in env.items() if k not in os.environ}

    def launch_options(self) -> dict:
        opts = dict(self.config.launcher_options)
        hostfile = opts.pop("hostfile", None)
        if hostfile:
            opts["mpi_args"] = ["--hostfile", os.fspath(hostfile), *opts.get("mpi_args", [])]
        if sys.platform.startswith("linux"):
            mpiexec = list(opts.get("mpi_cmd") or ["mpiexec"])
            opts["mpi_cmd"] = [sys.executable, "-c", DIE_WITH_PARENT, *mpiexec]
        return opts

    def exports(self, env: dict[str, str]) -> dict[str, str]:
        """The variable that has Open MPI export every variable of the engines'
        environment: the ranks it starts on other hosts (over ssh) see only those it is
        told to export."""
        names = sorted({*env, *IPP_VARIABLES} - {OMPI_EXPORTS})
        # A list the user gave is kept, ahead of ours.
        given = env.get(OMPI_EXPORTS) or os.environ.get(OMPI_EXPORTS)
        return {OMPI_EXPORTS: ";".join([*([given] if given else []), *names])}

    def one_job_env(self, ctx):
        """Every rank's environment, with the variable that has ``mpiexec`` export it."""
        env = super().one_job_env(ctx)
        env.update(self.exports(env))
        return env

    def local_engines(self, processes):
        # Without a hostfile the ranks run on this machine (mpi_args may name other hosts:
        # the host each reported decides). Open MPI makes each rank the leader of a
        # process group, which mpiexec's death does not end: what a cell started would
        # outlive the world.
        if self.config.launcher_options.get("hostfile"):
            return super().local_engines(processes)
        here = socket.gethostname()
        return [p for p in processes if p.pid and p.host == here]

    def file_env(self, ctx) -> dict[str, str]:
        """Where Open MPI puts the job's files: in :func:`mpi_files` (unless the user set
        their own place). Not with a hostfile: the directory exists on this machine alone,
        and Open MPI refuses a place for mpiexec's files beside the default for the ranks'."""
        if ctx.profile is None or self.config.launcher_options.get("hostfile"):
            return {}
        where = os.fspath(mpi_files(Path(ctx.profile), ctx.incarnation))
        env = {SESSION_DIR: where, SEGMENT_DIR: where}
        return {k: v for k, v in env.items() if k not in os.environ}

    async def acquire(self, ctx, report):
        # Right before a launch, when the worlds before this one are killed already: their
        # files go now, not only at stop, so restarts do not pile them up.
        if ctx.profile is not None:
            here = mpi_files(Path(ctx.profile), ctx.incarnation)
            for old in here.parent.glob("*"):
                if old != here:
                    shutil.rmtree(old, ignore_errors=True)

    # With a hostfile mpiexec's session directory is where Open MPI puts it (see file_env):
    # once mpiexec has ended, at a world restart or at stop, it goes too.

    def kill_remote(self, engine_sets, processes=()):
        # Noted here, before the kill: a teardown forgets the engine sets before release().
        self._mpiexecs.update(pid for es in engine_sets for pid in launcher_pids(es))
        super().kill_remote(engine_sets, processes)

    def kill_engines(self, engine_sets, processes=()):
        super().kill_engines(engine_sets, processes)
        self._remove_session_dirs()

    def release(self):
        super().release()
        self._remove_session_dirs()

    def _remove_session_dirs(self) -> None:
        # Only for an mpiexec seen ended (a zombie counts): unreaped, its pid is its own.
        for pid in [pid for pid in self._mpiexecs if not pid_alive(pid)]:
            self._mpiexecs.discard(pid)
            for where in default_session_dirs(pid):
                shutil.rmtree(where, ignore_errors=True)
                # Open MPI's per-user directory goes too once empty, as mpiexec would remove
                # it; another job's directory in it keeps it (rmdir fails).
                with contextlib.suppress(OSError):
                    where.parent.rmdir()

    def engine_env(self, rank, ctx):
        return {**self.mpiexec_env(), **self.file_env(ctx), **super().engine_env(rank, ctx)}
