"""A private Slurm for tests: munged and slurmctld here, one slurmd in each of three
network-namespace hosts.

Everything lives in one temporary directory (configuration, munge key and socket, state,
spools, logs); nothing under /etc or /run is touched, and no systemd is needed. Clients
(``sbatch``, ``squeue``, ``srun``, a kernel started by a test) find this Slurm through
``SLURM_CONF``, which :attr:`SlurmHosts.env` carries.

Each slurmd runs in its host's network namespace, entered with ``nsenter --net`` (``ip
netns exec`` remounts /sys, and slurmd then stops for want of /sys/fs/cgroup), in a UTS
and mount namespace of its own: the host is called ``hostI``, and a hosts file bound over
/etc/hosts names every host and this machine (at the bridge's address). Processes that a
job starts inherit all three namespaces.

Needs root, ``munged``, ``slurmctld``, ``slurmd``, the Slurm clients, ``nsenter`` and
``unshare``; :func:`available` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests import netns
from tests.harness import TAG_VAR

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "srun")
# Seconds allowed for the daemons to come up, and for the queue to drain at teardown.
START_TIMEOUT = 30.0
DRAIN_TIMEOUT = 20.0
# The MessageTimeout clients read while slurmctld is stopped: a client tries to connect once
# a second for MessageTimeout seconds (10 by default) before it says "Unable to contact slurm
# controller", so an outage's every failing command then takes about 1 s instead of 9.
OUTAGE_MESSAGE_TIMEOUT = 2


def available() -> str | None:
    """Why a private Slurm cannot run here, or None if it can."""
    missing = [t for t in (*TOOLS, "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: install slurm-wlm and munge "
            "(apt-get install slurm-wlm munge)"
        )
    return netns.available()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _conf(d: Path, bridge: str, hosts: list[tuple[str, str]], port: int) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs=4 RealMemory=2000 State=UNKNOWN"
        for name, addr in hosts
    )
    return f"""\
ClusterName=jaxsystest
SlurmctldHost={socket.gethostname()}({bridge})
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
KillWait=2
MinJobAge=2
SlurmdParameters=config_overrides
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _reachable_mounts(paths: Sequence[str], stage: Path) -> str:
    """Shell commands that make ``paths`` reachable by every user in a mount namespace.

    A folder behind one that only its owner may enter (root's home, 0700, where pyenv keeps
    the interpreter) is unreachable for another user's job. In the slurmd's own mount
    namespace (which its jobs inherit), each such closed ancestor is covered by an empty
    tmpfs of mode 0755 and the paths are bound back in at their own place; nothing changes
    outside that namespace, and the paths' own modes are kept.
    """
    closed: dict[str, list[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            ancestor = str(Path(*parts[:i]))
            if not os.stat(ancestor).st_mode & 0o001:
                closed.setdefault(ancestor, []).append(path)
                break
    cmds = []
    for k, (ancestor, inside) in enumerate(closed.items()):
        pairs = [(stage / f"{k}-{j}", p) for j, p in enumerate(inside)]
        cmds += [f"mkdir -p {s} && mount --bind {p} {s}" for s, p in pairs]
        cmds.append(f"mount -t tmpfs -o mode=0755 jaxsys-reach {ancestor}")
        cmds += [f"mkdir -p {p} && mount --bind {s} {p}" for s, p in pairs]
    return "".join(f"{c} && " for c in cmds)


class SlurmHosts:
    """A private Slurm cluster of ``n`` namespace hosts (``host0`` ... ``host{n-1}``).

    Attributes
    ----------
    hosts : netns.TestHosts
        The namespaces; host ``i`` runs the slurmd of node ``host{i}``.
    env : dict
        What a client needs: ``SLURM_CONF``.
    dir : Path
        The temporary directory holding everything.
    """

    __test__ = False

    def __init__(self, n: int = 3, *, other_users: Sequence[str] = ()):
        # other_users: folders (an interpreter, a venv) that jobs of users other than root
        # must reach; with any, the munge socket and slurm.conf are reachable by every user.
        self.n = n
        self.other_users = [str(Path(p).resolve()) for p in other_users]
        self.hosts = netns.TestHosts(n, prefix="slm", pin_hostname=False)
        self.dir = Path(tempfile.mkdtemp(prefix="jaxsys-slurm-"))
        self._conf_text = ""
        self.env: dict[str, str] = {}
        self._procs: list[subprocess.Popen] = []
        self.node_names = [f"host{i}" for i in range(n)]

    def __enter__(self) -> SlurmHosts:
        try:
            self.hosts.__enter__()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _daemon(self, argv: list[str], log: str) -> None:
        # The daemons outlive a test module's processes: without its tag, so that the
        # census of what a test left behind does not count them. Jobs take their
        # environment from sbatch, not from slurmd, so engines still carry the tag.
        env = {k: v for k, v in os.environ.items() if k != TAG_VAR}
        with open(self.dir / "log" / log, "wb") as out:
            self._procs.append(
                subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
                )
            )

    def _start(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "log", *(f"spool/{h}" for h in self.node_names)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        # Other users' sbatch must reach munged's socket and read slurm.conf (the key stays 0400).
        mode = 0o711 if self.other_users else 0o700
        os.chmod(d, mode)
        os.chmod(d / "munge", mode)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        bridge = self.hosts.bridge_address
        pairs = list(zip(self.node_names, self.hosts.host_addresses, strict=True))
        hosts_file = d / "hosts"
        hosts_file.write_text(
            "127.0.0.1 localhost\n"
            f"{bridge} {socket.gethostname()}\n" + "".join(f"{a} {h}\n" for h, a in pairs)
        )
        conf = d / "slurm.conf"
        self._conf_text = _conf(d, bridge, pairs, _free_port())
        conf.write_text(self._conf_text)
        self.env = {"SLURM_CONF": str(conf)}
        os.environ.update(self.env)
        m = d / "munge"
        self._daemon(
            [
                "munged", "-F", "--force", f"--socket={m}/munge.sock", f"--key-file={key}",
                f"--pid-file={m}/munged.pid", f"--log-file={d}/log/munged.log",
                f"--seed-file={m}/seed",
            ],
            "munged.out",
        )  # fmt: skip
        self._wait(lambda: (m / "munge.sock").exists(), "munged's socket")
        self._daemon(["slurmctld", "-D", "-f", str(conf)], "slurmctld.out")
        for i, name in enumerate(self.node_names):
            inner = (
                f"hostname {name} && mount --bind {hosts_file} /etc/hosts && "
                f"{_reachable_mounts(self.other_users, d / 'reach')}"
                f"exec slurmd -D -N {name} -f {conf}"
            )
            self._daemon(
                [
                    "nsenter", f"--net=/run/netns/{self.hosts.namespaces[i]}",
                    "unshare", "--uts", "--mount", "sh", "-c", inner,
                ],
                f"slurmd-{name}.out",
            )  # fmt: skip
        self._wait(self._all_idle, f"{self.n} idle Slurm nodes")
        # A node can be listed idle before its slurmd answers; the first job on it then
        # fails. One step on every node proves they all run jobs.
        r = subprocess.run(
            ["srun", f"--nodes={self.n}", "--ntasks-per-node=1", "true"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT * 2,
        )
        if r.returncode != 0:
            raise RuntimeError(f"a first job failed: {r.stderr.strip()}; logs in {d}/log")

    def _write_conf(self, text: str) -> None:
        # Replaced in one step: a client reading it meanwhile sees one whole file.
        tmp = self.dir / "slurm.conf.new"
        tmp.write_text(text)
        os.replace(tmp, self.dir / "slurm.conf")

    def _all_idle(self) -> bool:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10
        )
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return len(states) == self.n and all(s == "idle" for s in states.values())

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            dead = [p.args[0] for p in self._procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited; logs in {self.dir}/log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {START_TIMEOUT:g} s; logs in {self.dir}/log")
            time.sleep(0.1)

    def _controller(self) -> subprocess.Popen | None:
        return next((p for p in self._procs if p.args[0] == "slurmctld"), None)

    def stop_controller(self) -> None:
        """Stop slurmctld (its state saved); clients get "Unable to contact slurm controller"
        and the slurmds keep running their jobs until :meth:`start_controller`."""
        p = self._controller()
        assert p is not None and p.poll() is None, "slurmctld is not running"
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(START_TIMEOUT)
        self._procs.remove(p)
        # Only clients read slurm.conf from now until start_controller: the running slurmds
        # keep what they read, and slurmctld starts again from the file as it was.
        self._write_conf(self._conf_text + f"MessageTimeout={OUTAGE_MESSAGE_TIMEOUT}\n")

    def start_controller(self) -> None:
        """Start slurmctld again from its saved state, and wait until it answers."""
        assert self._controller() is None, "slurmctld runs already"
        self._write_conf(self._conf_text)
        self._daemon(["slurmctld", "-D", "-f", str(self.dir / "slurm.conf")], "slurmctld.out")

        def answers() -> bool:
            r = subprocess.run(["squeue", "-h"], capture_output=True, timeout=30, check=False)
            return r.returncode == 0

        self._wait(answers, "slurmctld answering")

    # -- what tests ask ----------------------------------------------------------------------

    def queue(self) -> list[str]:
        """``JOBID STATE`` of every job in the queue."""
        r = subprocess.run(
            ["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=10
        )
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout: float = DRAIN_TIMEOUT) -> float:
        """Seconds until the queue was empty; raises if it is not within ``timeout``."""
        t0 = time.monotonic()
        while self.queue():
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"jobs still queued after {timeout:g} s: {self.queue()}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def namespace_pids(self) -> list[int]:
        """Pids in the hosts' namespaces other than the slurmd daemons."""
        ours = {p.pid for p in self._procs}
        pids = []
        for ns in self.hosts.namespaces:
            for pid in netns.namespace_pids(ns):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if pid in ours or any(b"slurmd" in part for part in cmd[:1]):
                    continue
                pids.append(pid)
        return pids

    def log_tail(self, lines: int = 20) -> str:
        """The end of every daemon's log, for a failing test's report."""
        parts = []
        for path in sorted((self.dir / "log").glob("*.log")):
            parts.append(f"== {path.name}\n" + "".join(path.read_text().splitlines(True)[-lines:]))
        return "\n".join(parts)

    def close(self) -> None:
        """Cancel every job, stop the daemons, remove the namespaces and the directory."""
        if self.env:
            subprocess.run(["scancel", "--full", "-s", "KILL", "-u", "root"], timeout=10,
                           capture_output=True, check=False)  # fmt: skip
            subprocess.run(["scancel", "-u", "root"], capture_output=True, timeout=10, check=False)
        for p in reversed(self._procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self._procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self._procs = []
        for k in self.env:
            if os.environ.get(k) == self.env[k]:
                del os.environ[k]
        self.hosts.close()
        shutil.rmtree(self.dir, ignore_errors=True)
