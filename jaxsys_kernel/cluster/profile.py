"""The ipyparallel profile a jaxsys cluster runs in.

Each cluster gets a fresh profile directory. Its config files make every engine and the
controller die with the process that launched them (Linux ``PR_SET_PDEATHSIG``): the
launchers start them in new sessions, so without this a killed kernel orphans them all.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .. import contract
from .pids import pid_alive

# Runs inside ipengine / ipcontroller at start-up, before anything else. Kept free of
# jaxsys imports so it also works where only ipyparallel is installed.
_PDEATHSIG_SNIPPET = """\
import ctypes, os, signal, sys
# Engines started over ssh outlive the short-lived process that spawned them on purpose.
if sys.platform.startswith("linux") and not os.environ.get("{no_pdeathsig}"):
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(1, signal.{signal})  # PR_SET_PDEATHSIG
    # The parent may have died before prctl took effect.
    _expected = os.environ.get("{parent_pid}")
    if _expected and os.getppid() != int(_expected):
        os._exit(1)
"""

# `import jax` and `jax.distributed.initialize` take 1-3 s; starting them while the engine
# registers with the hub takes them off the critical path of cluster start-up.
_EARLY_INIT_SNIPPET = """\
if os.environ.get("{early_init}"):
    try:
        from jaxsys_kernel.engine.bootstrap import start_early_init
        start_early_init()
    except ImportError:
        pass
"""

# The controller is the last of a cluster's processes to go when its owner dies (it gets
# SIGTERM from the kernel's death, see above). The profile holds the cluster's keys, and a
# kernel killed with SIGKILL (or a Lab whose Slurm job ended) never removes it, and no later
# start may ever run on that node to reap it: so the controller removes it on its way out,
# once the owner is gone. A normal stop removes it from the kernel as before.
_REAP_SNIPPET = """\
def _jaxsys_owner_gone(owner):
    # Reparented (the owner launched us), gone, or a zombie nobody has reaped yet.
    if os.getppid() != owner:
        return True
    try:
        with open(f"/proc/{{owner}}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _jaxsys_reap_profile(profile={profile!r}, owner={owner}):
    import shutil, time
    for _ in range(30):  # the owner may be dying at this moment (a job's end signals all)
        if _jaxsys_owner_gone(owner):
            shutil.rmtree(profile, ignore_errors=True)
            return
        time.sleep(0.1)


import atexit
atexit.register(_jaxsys_reap_profile)
"""

# The death signal armed above fires only for an owner that dies after it was armed. An
# owner killed between launching the controller and this file's run sends nothing, and the
# controller, reparented, would run with its schedulers for good (seen: an owner SIGTERMed
# as its cluster started left two). Its owner launched it, so another parent means the owner
# is gone: it leaves at once, taking the profile with it as it would on its way out.
_OWNER_CHECK_SNIPPET = """if sys.platform.startswith("linux") and not os.environ.get("{no_pdeathsig}"):
    if os.getppid() != {owner}:
        _jaxsys_reap_profile()
        os._exit(1)
"""

_NAMES = {
    "no_pdeathsig": contract.NO_PDEATHSIG,
    "parent_pid": contract.PARENT_PID,
    "early_init": contract.EARLY_INIT,
}

_HEADER = "# Written by jaxsys for one cluster; removed when the cluster stops.\n"


def make_profile(base: str | os.PathLike | None = None) -> Path:
    """Create a fresh ipyparallel profile directory with jaxsys's config files.

    Parameters
    ----------
    base : path-like, optional
        Directory to create the profile in; defaults to the system temp directory.

    Returns
    -------
    pathlib.Path
        The new profile directory (mode 0700).
    """
    remove_stale_profiles(base)
    # The owner's pid in the name lets a later start find profiles whose owner was killed.
    profile = Path(tempfile.mkdtemp(prefix=f"{contract.PROFILE_PREFIX}{os.getpid()}-", dir=base))
    os.chmod(profile, 0o700)
    for sub in ("security", "log", "startup", "pid"):
        (profile / sub).mkdir()
    # Engines swallow SIGTERM once JAX is initialised, so they get SIGKILL. The controller
    # gets SIGTERM so it can reap its scheduler subprocesses, which inherit no death signal.
    (profile / "ipengine_config.py").write_text(
        _HEADER
        + _PDEATHSIG_SNIPPET.format(signal="SIGKILL", **_NAMES)
        + _EARLY_INIT_SNIPPET.format(**_NAMES)
        + "c = get_config()  # noqa\n"
    )
    (profile / "ipcontroller_config.py").write_text(
        _HEADER
        + _PDEATHSIG_SNIPPET.format(signal="SIGTERM", **_NAMES)
        + _REAP_SNIPPET.format(profile=str(profile), owner=os.getpid())
        + _OWNER_CHECK_SNIPPET.format(owner=os.getpid(), **_NAMES)
        + "c = get_config()  # noqa\n"
    )
    return profile


def controller_file(profile: str | os.PathLike, cluster_id: str, kind: str) -> Path:
    """The controller's connection file for ``kind`` (``engine`` or ``client``)."""
    return Path(profile) / "security" / f"ipcontroller-{cluster_id}-{kind}.json"


def engine_file(profile: str | os.PathLike) -> Path:
    """Where local engines find the controller's engine connection file, once complete."""
    return Path(profile) / contract.ENGINE_CONNECTION_FILE


def remove_profile(profile: str | os.PathLike) -> None:
    """Delete a profile directory made by :func:`make_profile`.

    Parameters
    ----------
    profile : path-like
        The directory to remove; a missing directory is not an error.
    """
    shutil.rmtree(profile, ignore_errors=True)


def kept_logs(profile: str | os.PathLike) -> Path:
    """Where :func:`keep_logs` keeps the engine logs of ``profile``: beside it, under the
    same owner's pid, so that they outlive the profile."""
    profile = Path(profile)
    return profile.with_name(
        contract.START_LOGS_PREFIX + profile.name.removeprefix(contract.PROFILE_PREFIX)
    )


def keep_logs(profile: str | os.PathLike) -> Path | None:
    """Move the engine logs out of ``profile`` before it is removed (a failed start's
    error names them), replacing the owner's earlier ones; None if there were none.

    One set per owner is kept, and a later start removes those whose owner is gone
    (:func:`remove_stale_profiles`): the logs do not pile up.
    """
    dst = kept_logs(profile)
    owner = dst.name.removeprefix(contract.START_LOGS_PREFIX).split("-")[0]
    for old in dst.parent.glob(f"{contract.START_LOGS_PREFIX}{owner}-*"):
        if old != dst:
            shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(Path(profile) / "log", dst)
        os.chmod(dst, 0o700)  # what the engines printed is as private as the profile
    except OSError:
        return None
    return dst


def remove_stale_profiles(base: str | os.PathLike | None = None) -> list[Path]:
    """Delete profiles (and kept start logs) left by owners that died without cleaning up
    (e.g. SIGKILL).

    They hold the cluster's connection keys, so they should not linger.

    Parameters
    ----------
    base : path-like, optional
        Directory holding the profiles; the system temp directory by default.

    Returns
    -------
    list of pathlib.Path
        The directories removed.
    """
    base = base or tempfile.gettempdir()
    return [
        *remove_dead_owners(base, contract.PROFILE_PREFIX),
        *remove_dead_owners(base, contract.START_LOGS_PREFIX),
    ]


def remove_dead_owners(base: str | os.PathLike, prefix: str) -> list[Path]:
    """Delete this user's directories ``<base>/<prefix><pid>-*`` whose owner pid is gone.

    Parameters
    ----------
    base : path-like
        Where the directories are.
    prefix : str
        Their name up to the owner's pid.

    Returns
    -------
    list of pathlib.Path
        The directories removed.
    """
    removed = []
    for path in Path(base).glob(f"{prefix}*-*"):
        owner = path.name.removeprefix(prefix).split("-")[0]
        if not owner.isdigit() or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        if not pid_alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
