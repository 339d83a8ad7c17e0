"""An OpenSSH server inside each network namespace made by :class:`netns.TestHosts`.

A test that starts processes on other "hosts" over SSH (for instance ipyparallel's SSH
launchers) needs a real ``sshd`` on every host. :class:`SSHServers` runs one per namespace,
each listening only on that host's bridge address and accepting only a key pair made for
the run, and gives the ``ssh``/``scp`` options that reach them without any prompt and
without touching the user's SSH configuration, agent or known-hosts file.

The namespaces share this machine's filesystem, so what a command run over SSH sees (the
virtual environment, the work folder) is the same as here; only the network differs, and
root's shell startup files, which the servers hide (see :func:`_hiding_startup_files`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from . import netns

SSHD = Path("/usr/sbin/sshd")

# sshd refuses to start without its privilege-separation folder, which Debian's init
# scripts create at boot and a container never does.
PRIVSEP_DIR = Path("/run/sshd")

# Bounds for the commands and waits below; every wait in this module is finite.
_COMMAND_TIMEOUT = 15.0
# A first login on a loaded 2-core machine (three test workers, a browser) has taken over
# 8 s: the wait allows several probes of that length.
_READY_TIMEOUT = 45.0
_PROBE_TIMEOUT = 15.0
_STOP_TIMEOUT = 5.0
_LOG_TAIL = 2000


def available() -> str | None:
    """Whether SSH servers can run inside network namespaces here.

    Returns
    -------
    str or None
        None when ``sshd``, ``ssh``, ``scp`` and ``ssh-keygen`` are installed and
        :func:`netns.available` is None, else a reason fit for ``pytest.skip``.
    """
    if not (SSHD.is_file() and os.access(SSHD, os.X_OK)):
        return f"{SSHD} is not installed (Debian: openssh-server)"
    for tool in ("ssh", "scp", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (Debian: openssh-client)"
    return netns.available()


class SSHServers:
    """One ``sshd`` per host of a :class:`netns.TestHosts`, reachable as ``root``.

    On entry this makes a private folder under ``workdir`` holding a host key, a client
    key (both ed25519, without passphrase), an ``authorized_keys`` file, one
    ``sshd_config`` per host and the servers' logs; starts ``sshd`` inside every
    namespace, listening on port 22 of that host's address only; and waits until an
    ``ssh ... true`` to every host succeeds. On exit, or on :meth:`close`, it kills every
    ``sshd`` process it started, including those serving connections still open. Commands
    started over SSH that outlive their connection are left to :meth:`TestHosts.close`.

    Parameters
    ----------
    hosts
        The hosts, already entered.
    workdir
        An existing folder for the keys, configurations and logs.
    timeout
        Seconds each server may run before it is terminated, then killed.

    Attributes
    ----------
    dir : pathlib.Path
        The private folder, set on entry.
    client_key : pathlib.Path
        The client's private key, set on entry.
    configs : list of pathlib.Path
        ``sshd_config`` of host ``i``, set on entry.
    logs : list of pathlib.Path
        Where host ``i``'s server writes its messages, set on entry.
    """

    user = "root"

    def __init__(
        self, hosts: netns.TestHosts, workdir: Path, *, timeout: float = 900, own_tmp: bool = False
    ) -> None:
        self.hosts = hosts
        self.workdir = Path(workdir)
        self.timeout = timeout
        # Each host's sessions get a TMPDIR of their own (see _setup), as each real machine
        # has its own /tmp.
        self.own_tmp = own_tmp
        self.tmpdirs: list[Path] = []
        self.dir = Path()
        self.client_key = Path()
        self.configs: list[Path] = []
        self.logs: list[Path] = []
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> SSHServers:
        if not self.hosts.host_addresses:
            raise RuntimeError("SSHServers needs a TestHosts that has been entered")
        try:
            self._setup()
            self._start()
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ssh_args(self) -> list[str]:
        """Options for every ``ssh`` or ``scp`` call to these servers.

        ``-F /dev/null`` keeps the user's and the system's client configuration (proxies,
        control masters, other identities) out, so connections go straight to the
        namespace addresses; ``IdentitiesOnly`` keeps an agent's keys from using up the
        server's authentication attempts.

        Returns
        -------
        list of str
            Options understood by both ``ssh`` and ``scp``, before the destination.
        """
        return [
            "-F",
            "/dev/null",
            "-i",
            str(self.client_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=5",
        ]

    def destination(self, i: int) -> str:
        """``user@address`` of host ``i``.

        Parameters
        ----------
        i
            Host index.

        Returns
        -------
        str
            For example ``"root@10.231.77.10"``.
        """
        return f"{self.user}@{self.hosts.host_addresses[i]}"

    def run(self, i: int, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on host ``i`` over SSH, from the root namespace.

        Parameters
        ----------
        i
            Host index.
        command
            A shell command line, run by root's login shell on that host.
        timeout
            Seconds before ``ssh`` is killed and :class:`subprocess.TimeoutExpired` raised.

        Returns
        -------
        subprocess.CompletedProcess
            With text ``stdout`` and ``stderr``; not checked.
        """
        # Without a stdin of its own, ssh would forward the test's stdin to the command.
        return subprocess.run(
            ["ssh", *self.ssh_args, self.destination(i), command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _setup(self) -> None:
        # mkdtemp makes it 0700, so only root can read the private keys inside.
        self.dir = Path(tempfile.mkdtemp(prefix="sshd-", dir=self.workdir))
        self.configs, self.logs = [], []
        host_key = self.dir / "host_ed25519"
        self.client_key = self.dir / "client_ed25519"
        for key in (host_key, self.client_key):
            _keygen(key)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        PRIVSEP_DIR.chmod(0o755)  # sshd insists it is root-owned and not group-writable
        self.tmpdirs = []
        for i, addr in enumerate(self.hosts.host_addresses):
            config = self.dir / f"sshd_config.{i}"
            tmpdir = None
            if self.own_tmp:
                # The hosts share this machine's /tmp and its host name, so a program that
                # names its files there after the host (Open MPI's daemons do:
                # ompi.<host>.<uid>) would share them between hosts.
                tmpdir = self.dir / f"tmp.{i}"
                tmpdir.mkdir(mode=0o700)
                self.tmpdirs.append(tmpdir)
            config.write_text(
                _config(
                    addr,
                    host_key=host_key,
                    authorized_keys=authorized,
                    pid_file=self.dir / f"sshd.{i}.pid",
                    tmpdir=tmpdir,
                )
            )
            self.configs.append(config)
            self.logs.append(self.dir / f"sshd.{i}.log")
        # A bad configuration is reported here, with sshd's reason, rather than as a
        # server that never answers.
        _checked([str(SSHD), "-t", "-f", str(self.configs[0])], "sshd rejects its configuration")

    def _start(self) -> None:
        for i, (config, log) in enumerate(zip(self.configs, self.logs, strict=True)):
            with open(log, "wb") as out:
                # sshd re-executes itself for every connection, so it needs its absolute
                # path; -D keeps it in the foreground, where kill_group can reach it.
                self._procs.append(
                    self.hosts.popen(
                        i,
                        _hiding_startup_files(
                            [str(SSHD), "-D", "-e", "-f", str(config)], self.user, self.dir
                        ),
                        timeout=self.timeout,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def _wait_ready(self, timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        pending = list(range(len(self.configs)))
        last: dict[int, str] = {}
        while pending:
            for i in list(pending):
                if self._procs[i].poll() is not None:
                    raise RuntimeError(
                        f"sshd on {self.destination(i)} exited with "
                        f"{self._procs[i].returncode}: {self._log_tail(i)}"
                    )
                try:
                    probe = self.run(i, "true", timeout=_PROBE_TIMEOUT)
                    ok, last[i] = probe.returncode == 0, probe.stderr.strip()
                except subprocess.TimeoutExpired:
                    ok, last[i] = False, f"ssh took over {_PROBE_TIMEOUT:g} s"
                if ok:
                    pending.remove(i)
            if pending and time.monotonic() > deadline:
                i = pending[0]
                raise RuntimeError(
                    f"sshd on {self.destination(i)} did not accept a login within "
                    f"{timeout:g} s; ssh said {last.get(i)!r}; sshd log: {self._log_tail(i)}"
                )
            if pending:
                time.sleep(0.1)

    def _log_tail(self, i: int) -> str:
        with contextlib.suppress(OSError):
            return self.logs[i].read_text(errors="replace")[-_LOG_TAIL:].strip() or "(empty)"
        return "(missing)"

    def close(self) -> None:
        """Stop every server and its connections; safe to call again."""
        procs, self._procs = self._procs, []
        if not procs:
            return
        # Stopped from the leaves up, each while its parent still lives to reap it: a
        # process whose parent dies first lingers as a zombie "sshd" until init reaps it,
        # which looks like a leak to a later check. Each connection's sshd leads a session
        # of its own, out of reach of kill_group, so those are found by executable.
        ours = {proc.pid for proc in procs}
        for ns in self.hosts.namespaces:
            _stop(lambda ns=ns: [p for p in _sshd_pids(ns) if _parent(p) not in ours])
        # SIGTERM to ``timeout`` is passed on to sshd, which it then reaps.
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + _STOP_TIMEOUT
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            netns.kill_group(proc)
        left = [p for ns in self.hosts.namespaces for p in _stop(lambda ns=ns: _sshd_pids(ns))]
        if left:
            warnings.warn(f"sshd processes survive: {left}", stacklevel=2)

    def leftovers(self) -> list[int]:
        """Process ids of ``sshd`` processes still running inside the hosts.

        Returns
        -------
        list of int
            Empty after a clean :meth:`close`.
        """
        return [pid for ns in self.hosts.namespaces for pid in _sshd_pids(ns)]


# The files bash reads as it starts for a command run over SSH, or for a login.
_STARTUP_FILES = (".bashrc", ".bash_profile", ".bash_login", ".profile")


def _hiding_startup_files(argv: list[str], user: str, workdir: Path) -> list[str]:
    """``argv`` run with ``user``'s shell startup files seen as empty, by it and its children.

    bash runs ``~/.bashrc`` before every command that comes over SSH. On a machine where
    that file hangs (a ``pyenv init`` waiting a minute on a rehash lock left by a killed
    shell), no login would ever finish; and the tests kill the process groups of remote
    commands, which can leave such a lock behind. ``ip netns exec`` gives the server a
    mount namespace of its own, so an empty file is bind-mounted over each startup file
    there only: a test host's root starts as a fresh machine's would, and this machine's
    files are untouched. Commands over SSH name their programs by absolute paths.
    """
    home = Path(pwd.getpwnam(user).pw_dir)
    present = [home / name for name in _STARTUP_FILES if (home / name).is_file()]
    if not present:
        return argv
    empty = workdir / "empty-startup-file"
    empty.write_text("")
    mounts = "; ".join(
        f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(f))}" for f in present
    )
    return ["sh", "-c", f'set -e; {mounts}; exec "$@"', "sh", *argv]


def _keygen(path: Path) -> None:
    """Make an ed25519 key pair without passphrase at ``path`` and ``path.pub``."""
    _checked(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "jaxsys-test", "-f", str(path)],
        "ssh-keygen failed",
    )


def _checked(argv: list[str], failure: str) -> None:
    """Run ``argv``; raise RuntimeError starting with ``failure`` if it does not succeed."""
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_COMMAND_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{failure}: {proc.stderr.strip() or proc.returncode}")


def _config(
    address: str, *, host_key: Path, authorized_keys: Path, pid_file: Path, tmpdir=None
) -> str:
    """The text of an ``sshd_config`` for a server listening on ``address`` (its sessions'
    ``TMPDIR`` is ``tmpdir`` when given)."""
    lines = [
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "GSSAPIAuthentication no",
        "UsePAM no",
        # The keys live under a test folder whose parents sshd would otherwise require
        # to be root-owned and unwritable by others.
        "StrictModes no",
        f"PidFile {pid_file}",
        "PermitUserEnvironment no",
        # The namespaces have no name server; a reverse lookup would only stall logins.
        "UseDNS no",
        "LogLevel ERROR",
        # Modern scp speaks SFTP; the in-process server needs no helper binary.
        "Subsystem sftp internal-sftp",
        # Launchers open many connections at once; the default drops some of them.
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
    ]
    if tmpdir is not None:
        lines.append(f"SetEnv TMPDIR={tmpdir}")
    return "\n".join(lines) + "\n"


def _sshd_pids(ns: str) -> list[int]:
    """Process ids inside namespace ``ns`` whose executable is :data:`SSHD`."""
    found = []
    for pid in netns.namespace_pids(ns):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/exe") == str(SSHD):
                found.append(pid)
    return found


def _parent(pid: int) -> int | None:
    """Parent process id of ``pid``, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may itself contain spaces or parentheses.
    return int(stat.rpartition(")")[2].split()[1])


def _stop(find: Callable[[], list[int]], timeout: float = _STOP_TIMEOUT) -> list[int]:
    """Signal the processes ``find`` returns until it returns none.

    SIGTERM first, so that an sshd stops its own children and parents can reap; SIGKILL
    for whatever remains after half of ``timeout``.

    Returns
    -------
    list of int
        Processes still found when ``timeout`` ran out.
    """
    start = time.monotonic()
    while pids := find():
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            return pids
        sig = signal.SIGTERM if elapsed < timeout / 2 else signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)
    return []
