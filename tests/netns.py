"""Separate "hosts" on one machine, made of Linux network namespaces, and packet capture.

A test that needs processes on different network addresses (a cluster whose engines are
not all on loopback) builds a small private network with :class:`TestHosts`: one Linux
bridge in the root namespace and one network namespace per host, each joined to the bridge
by a veth pair. Nothing is routed beyond that network: IP forwarding and NAT are left
alone, so the namespaces can reach each other and the bridge's own address, and nothing
else. :class:`Capture` records the TCP traffic that crosses the bridge, so a test can check
which bytes went over the wire in plaintext.

All of this needs root (or ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``), ``ip`` from iproute2
and, for captures, ``tcpdump``. :func:`available` says whether that is the case here.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Candidate third octets for the private subnet 10.231.<k>.0/24; the first that nothing
# on this machine uses is taken, so a run never shadows a network the machine relies on.
SUBNET_CHOICES = (77, 78, 79, 141, 142, 143, 205, 206)

# Where ``ip netns exec NAME`` looks for files to bind-mount over /etc for that namespace.
NETNS_ETC = Path("/etc/netns")

# Serialises choosing a subnet and creating interfaces, so that two runs at the same time
# on one machine (e.g. pytest-xdist workers) do not both take the same free subnet. A lock
# every run shares must outlive each run, so it lives where machine-wide locks belong
# (/run/lock, emptied at boot), not among the temporary files a run must leave clean.
_LOCK_DIR = Path("/run/lock")
_LOCK_PATH = (
    _LOCK_DIR if os.access(_LOCK_DIR, os.W_OK) else Path(tempfile.gettempdir())
) / "jaxsys-netns.lock"

# Present while /etc/netns exists only because a run made it; whichever run finds it empty
# at teardown removes both, so concurrent runs neither leave it behind nor delete a folder
# the machine had before.
_ETC_MARKER = Path(tempfile.gettempdir()) / "jaxsys-netns.made-etc"

# Bounds for the commands and waits below; every wait in this module is finite.
_IP_TIMEOUT = 15.0
_SETTLE_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0


class NetnsError(RuntimeError):
    """A namespace, link or capture could not be created or removed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` and return the finished process.

    Parameters
    ----------
    *args
        Arguments after ``ip``.
    check
        Raise :class:`NetnsError` with ip's message when it fails.

    Returns
    -------
    subprocess.CompletedProcess
        With text ``stdout`` and ``stderr``.
    """
    proc = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT, check=False
    )
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Hold an exclusive lock shared by every run on this machine."""
    with open(_LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of this machine's addresses and (non-default) routes."""
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        # "2: eth0    inet 192.0.2.2/24 brd ... scope global eth0"
        fields = line.split()
        if "inet" in fields:
            nets.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        fields = line.split()
        # Route lines may start with a type ("local", "broadcast", ...) before the prefix.
        for word in fields[:2]:
            try:
                nets.append(ipaddress.ip_network(word, strict=False))
                break
            except ValueError:
                continue
    return [n for n in nets if n.prefixlen > 0]


def _free_subnet() -> int:
    """Pick a third octet ``k`` such that 10.231.k.0/24 overlaps nothing in use here."""
    used = _networks_in_use()
    for k in SUBNET_CHOICES:
        candidate = ipaddress.ip_network(f"10.231.{k}.0/24")
        if not any(candidate.overlaps(n) for n in used):
            return k
    raise NetnsError(f"every candidate subnet 10.231.{{{SUBNET_CHOICES}}}.0/24 is in use")


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def namespace_names() -> list[str]:
    """Names of the network namespaces that ``ip netns`` knows about.

    Returns
    -------
    list of str
        One name per namespace, without ip's "(id: N)" suffix.
    """
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Process ids of the processes running inside namespace ``name``.

    Parameters
    ----------
    name
        A namespace name as given to ``ip netns add``.

    Returns
    -------
    list of int
        Empty when the namespace has no processes or does not exist.
    """
    out = _ip("netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def timed(argv: Sequence[str], timeout: float, kill_after: float = 5.0) -> list[str]:
    """Wrap ``argv`` in coreutils ``timeout``, escalating to SIGKILL.

    JAX installs a SIGTERM handler (for preemption notices) and keeps running after
    ``timeout`` sends SIGTERM, so a plain ``timeout`` would not bound it; ``-k`` does.

    Parameters
    ----------
    argv
        The command.
    timeout
        Seconds before SIGTERM.
    kill_after
        Seconds after SIGTERM before SIGKILL.

    Returns
    -------
    list of str
        The wrapped command line.
    """
    return ["timeout", "-k", f"{kill_after:g}", f"{timeout:g}", *argv]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group led by ``proc`` and reap ``proc``.

    The process must have been started with ``start_new_session=True`` so that it leads
    its own group; ``timeout`` and its child are both in that group.

    Parameters
    ----------
    proc
        A process started by this test.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_TIMEOUT)


@cache
def available(need_capture: bool = False) -> str | None:
    """Whether network namespaces (and optionally captures) can be made here.

    The check actually creates, and removes, a namespace, a bridge and a veth pair, since
    containers often lack the capability or the kernel modules even as root.

    Parameters
    ----------
    need_capture
        Also require ``tcpdump``.

    Returns
    -------
    str or None
        None when everything works, else a reason fit for ``pytest.skip``.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "timeout") + (("tcpdump",) if need_capture else ()):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (Debian: iproute2, coreutils, tcpdump)"
    tag = secrets.token_hex(2)
    ns, br, veth = f"jxp{tag}", f"jxp{tag}b", f"jxp{tag}v"
    try:
        with _machine_lock():
            _free_subnet()
        _ip("netns", "add", ns)
        _ip("link", "add", br, "type", "bridge")
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create network namespaces here: {e}"
    finally:
        _ip("link", "del", veth, check=False)
        _ip("link", "del", br, check=False)
        _ip("netns", "del", ns, check=False)
    return None


class TestHosts:
    """``n`` network namespaces on a private bridge, one per pretend host.

    Host ``i`` lives in namespace ``namespaces[i]``, whose only non-loopback interface is
    ``eth0`` with address ``host_addresses[i]`` (10.231.k.(10+i)/24). The bridge in the
    root namespace has ``bridge_address`` (10.231.k.1), which is how a process in a
    namespace reaches a server in the root namespace. The namespaces' default route
    points at the bridge, but since forwarding stays off, nothing beyond it is reachable.

    With ``pin_hostname`` (the default) each namespace gets its own ``/etc/hosts`` (via
    ``ip netns exec``'s /etc/netns bind mounts) in which this machine's hostname resolves
    to the host's own address, and ``host0``, ``host1``, ... name every host. That is what
    gloo (JAX's CPU collectives) needs: it binds to the address of ``gethostname()``,
    which otherwise resolves to loopback and leaves the peers unable to connect.

    Setup happens on ``__enter__``; teardown on ``__exit__`` or, failing that, at exit.
    Teardown kills whatever still runs inside the namespaces and removes every namespace,
    link and file that setup made. It may run more than once.

    Parameters
    ----------
    n
        Number of hosts (1 to 200).
    prefix
        Start of every name this instance creates; at most 6 letters or digits so that
        interface names stay within Linux's 15 characters.
    pin_hostname
        Write the per-namespace hosts files described above.

    Attributes
    ----------
    bridge : str
        The bridge's interface name in the root namespace.
    bridge_address : str
        The bridge's IPv4 address, set on entry.
    host_addresses : list of str
        IPv4 address of host ``i``, set on entry.
    namespaces : list of str
        Namespace name of host ``i``.
    hostnames : list of str
        Names of the hosts in the per-namespace hosts files.
    interface : str
        Name of each host's link to the bridge, inside its namespace.
    """

    # Not a test class, despite the name.
    __test__ = False

    interface = "eth0"

    def __init__(self, n: int, prefix: str = "jx", *, pin_hostname: bool = True) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n must be between 1 and 200, not {n}")
        if not (prefix.isascii() and prefix.isalnum() and len(prefix) <= 6):
            raise ValueError(f"prefix must be up to 6 letters or digits, not {prefix!r}")
        self.n = n
        self.pin_hostname = pin_hostname
        self._tag = prefix + secrets.token_hex(2)
        self.bridge = f"{prefix}b{self._tag[len(prefix) :]}"
        self.namespaces = [f"{self._tag}-{i}" for i in range(n)]
        self.hostnames = [f"host{i}" for i in range(n)]
        self._veths = [f"{self._tag}h{i}" for i in range(n)]
        self.bridge_address = ""
        self.host_addresses: list[str] = []
        self._active = False

    def __enter__(self) -> TestHosts:
        # Registered before anything exists so that a crash midway still cleans up.
        self._active = True
        atexit.register(self.close)
        try:
            with _machine_lock():
                self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _setup(self) -> None:
        taken = set(namespace_names())
        if any(ns in taken for ns in self.namespaces) or _link_exists(self.bridge):
            raise NetnsError(f"names starting with {self._tag!r} are already in use")
        k = _free_subnet()
        self.bridge_address = f"10.231.{k}.1"
        self.host_addresses = [f"10.231.{k}.{10 + i}" for i in range(self.n)]

        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth, addr) in enumerate(
            zip(self.namespaces, self._veths, self.host_addresses, strict=True)
        ):
            _ip("netns", "add", ns)
            # Created as a pair with its far end already in the namespace, then renamed
            # there, so every host sees the same "eth0" whatever its index.
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}n", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "link", "set", f"{veth}n", "name", self.interface)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", self.interface)
            _ip("-n", ns, "link", "set", self.interface, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.bridge_address)
            if self.pin_hostname:
                self._write_hosts_file(i)

    def _write_hosts_file(self, i: int) -> None:
        if not NETNS_ETC.exists():
            _ETC_MARKER.touch()
            NETNS_ETC.mkdir(parents=True)
        d = NETNS_ETC / self.namespaces[i]
        d.mkdir(exist_ok=True)
        lines = [
            "127.0.0.1 localhost",
            "::1 localhost ip6-localhost ip6-loopback",
            f"{self.host_addresses[i]} {socket.gethostname()}",
        ]
        lines += [f"{a} {h}" for a, h in zip(self.host_addresses, self.hostnames, strict=True)]
        (d / "hosts").write_text("\n".join(lines) + "\n")

    def exec_prefix(self, i: int) -> list[str]:
        """The command-line prefix that runs a command inside host ``i``'s namespace.

        Parameters
        ----------
        i
            Host index.

        Returns
        -------
        list of str
            ``["ip", "netns", "exec", namespaces[i]]``.
        """
        return ["ip", "netns", "exec", self.namespaces[i]]

    def popen(
        self, i: int, argv: Sequence[str], timeout: float, **kwargs: object
    ) -> subprocess.Popen:
        """Start ``argv`` inside host ``i``, bounded by ``timeout`` seconds.

        The process leads a new session, so :func:`kill_group` stops it and its children.

        Parameters
        ----------
        i
            Host index.
        argv
            The command.
        timeout
            Seconds the command may run before it is terminated, then killed.
        **kwargs
            Passed to :class:`subprocess.Popen` (``stdout``, ``env``, ...).

        Returns
        -------
        subprocess.Popen
            The started ``timeout`` process.
        """
        return subprocess.Popen(
            timed([*self.exec_prefix(i), *argv], timeout), start_new_session=True, **kwargs
        )

    def close(self) -> None:
        """Tear everything down; safe to call again, and quiet about what is gone already."""
        if not self._active:
            return
        self._active = False
        atexit.unregister(self.close)
        problems = []
        existing = set(namespace_names())
        for ns in self.namespaces:
            if ns in existing:
                problems += self._kill_processes(ns)
        with _machine_lock():
            for veth in self._veths:
                # Deleting one end removes the pair; doing it here rather than relying on
                # namespace deletion makes it synchronous.
                _ip("link", "del", veth, check=False)
            for ns in self.namespaces:
                _ip("netns", "del", ns, check=False)
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            _ip("link", "del", self.bridge, check=False)
            if _ETC_MARKER.exists():
                with contextlib.suppress(OSError):
                    NETNS_ETC.rmdir()  # fails while another run still has files there
                    _ETC_MARKER.unlink()
        problems += self.leftovers()
        if problems:
            warnings.warn(f"network namespace teardown: {problems}", stacklevel=2)

    def _kill_processes(self, ns: str) -> list[str]:
        deadline = time.monotonic() + _SETTLE_TIMEOUT
        while pids := namespace_pids(ns):
            if time.monotonic() > deadline:
                return [f"processes survive in {ns}: {pids}"]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return []

    def leftovers(self) -> list[str]:
        """What this instance created that still exists (empty after a clean teardown).

        Returns
        -------
        list of str
            Descriptions of surviving namespaces, links and hosts-file folders.
        """
        left = [f"namespace {ns}" for ns in self.namespaces if ns in set(namespace_names())]
        left += [f"link {name}" for name in [self.bridge, *self._veths] if _link_exists(name)]
        left += [f"folder {NETNS_ETC / ns}" for ns in self.namespaces if (NETNS_ETC / ns).exists()]
        return left


@dataclass(frozen=True)
class Segment:
    """One captured TCP segment.

    Attributes
    ----------
    src, dst : str
        IPv4 source and destination addresses.
    sport, dport : int
        TCP source and destination ports.
    seq : int
        TCP sequence number.
    payload : bytes
        The segment's data (possibly empty).
    """

    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    payload: bytes

    @property
    def flow(self) -> tuple[str, int, str, int]:
        """``(src, sport, dst, dport)``: one direction of one connection."""
        return (self.src, self.sport, self.dst, self.dport)


# pcap link types understood by the parser.
_LINKTYPE_ETHERNET = 1
_LINKTYPE_LINUX_SLL = 113
_LINKTYPE_LINUX_SLL2 = 276
_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_VLAN = (0x8100, 0x88A8)


def read_pcap(path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """Read a classic (not pcapng) capture file.

    Parameters
    ----------
    path
        The file.

    Yields
    ------
    tuple of (int, bytes)
        The file's link type and each packet's captured bytes, in capture order. A final
        record cut short (tcpdump stopped mid-write) is dropped.
    """
    data = Path(path).read_bytes()
    if len(data) < 24:
        return
    magic = data[:4]
    # Microsecond and nanosecond variants, written little- or big-endian.
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file (magic {magic.hex()})")
    (linktype,) = struct.unpack_from(endian + "I", data, 20)
    linktype &= 0xFFFF  # the upper bits may carry FCS information
    off = 24
    while off + 16 <= len(data):
        _, _, incl_len, _ = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        if off + incl_len > len(data):
            break
        yield linktype, data[off : off + incl_len]
        off += incl_len


def parse_tcp(linktype: int, frame: bytes) -> Segment | None:
    """Decode an IPv4 TCP segment from one captured frame.

    Parameters
    ----------
    linktype
        The capture's pcap link type (Ethernet, Linux cooked v1 or v2).
    frame
        The captured bytes.

    Returns
    -------
    Segment or None
        None for anything that is not an unfragmented IPv4 TCP segment.
    """
    try:
        if linktype == _LINKTYPE_ETHERNET:
            (ethertype,) = struct.unpack_from("!H", frame, 12)
            off = 14
            while ethertype in _ETHERTYPE_VLAN:
                (ethertype,) = struct.unpack_from("!H", frame, off + 2)
                off += 4
        elif linktype == _LINKTYPE_LINUX_SLL:
            (ethertype,) = struct.unpack_from("!H", frame, 14)
            off = 16
        elif linktype == _LINKTYPE_LINUX_SLL2:
            (ethertype,) = struct.unpack_from("!H", frame, 0)
            off = 20
        else:
            return None
        if ethertype != _ETHERTYPE_IPV4:
            return None
        ip = frame[off:]
        if ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_TCP:
            return None
        ihl = (ip[0] & 0x0F) * 4
        total_len, frag = struct.unpack_from("!H2xH", ip, 2)
        if frag & 0x3FFF:  # more-fragments flag or a fragment offset
            return None
        # Trim Ethernet padding; a length of 0 marks a segmentation-offload super-packet.
        if total_len:
            ip = ip[:total_len]
        tcp = ip[ihl:]
        sport, dport, seq = struct.unpack_from("!HHI", tcp, 0)
        data_off = (tcp[12] >> 4) * 4
        return Segment(
            src=socket.inet_ntoa(ip[12:16]),
            sport=sport,
            dst=socket.inet_ntoa(ip[16:20]),
            dport=dport,
            seq=seq,
            payload=bytes(tcp[data_off:]),
        )
    except (struct.error, IndexError):
        return None  # truncated by the snapshot length


def bpf_filter(ports: Iterable[int] | None) -> str:
    """A tcpdump filter for TCP, on ``ports`` if given.

    Parameters
    ----------
    ports
        TCP ports (either end of a connection), or None for all TCP.

    Returns
    -------
    str
        For example ``"tcp and (port 1 or port 2)"``.
    """
    ports = sorted(set(ports or ()))
    if not ports:
        return "tcp"
    return "tcp and (" + " or ".join(f"port {int(p)}" for p in ports) + ")"


class Capture:
    """Record TCP traffic on an interface with tcpdump while the context is open.

    On entry, tcpdump starts and the context waits until it is listening, so no packet
    sent inside the block is missed. On exit it is stopped with SIGINT (then SIGKILL),
    which makes it flush the file. Reading methods work after exit.

    Parameters
    ----------
    interface
        Interface to listen on, typically :attr:`TestHosts.bridge`; a capture there sees
        traffic between namespaces as well as traffic to the bridge address.
    pcap
        Output file. tcpdump's messages go to the same path with ``.log`` appended.
    ports
        Only capture TCP segments to or from these ports; None captures all TCP.
    """

    def __init__(
        self,
        interface: str,
        pcap: str | os.PathLike,
        ports: Iterable[int] | None = None,
    ) -> None:
        self.interface = interface
        self.pcap = Path(pcap)
        self.log = self.pcap.with_name(self.pcap.name + ".log")
        self.filter = bpf_filter(ports)
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> Capture:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = _SETTLE_TIMEOUT) -> None:
        """Start tcpdump and wait until it is capturing.

        Parameters
        ----------
        timeout
            Seconds to wait for tcpdump to report that it listens.
        """
        with open(self.log, "wb") as log:
            # --immediate-mode: hand each packet over as it arrives (otherwise the kernel
            # holds them for up to a second, and SIGINT drops what it holds); -U: write
            # each packet at once; -Z root: keep the right to write into root-only folders.
            self._proc = subprocess.Popen(
                ["tcpdump", "-i", self.interface, "--immediate-mode", "-U", "-n", "-Z", "root"]
                + ["-w", str(self.pcap), self.filter],
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while b"listening on" not in self.log.read_bytes():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise NetnsError(f"tcpdump did not start: {self.log.read_text().strip()}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop tcpdump (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._settle()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                kill_group(proc)

    def _settle(self, quiet: float = 0.3, limit: float = 3.0) -> None:
        """Wait until the file has not grown for ``quiet`` seconds (at most ``limit``).

        Packets sent just before the stop may still be on their way to tcpdump.
        """
        deadline = time.monotonic() + limit
        size, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            now_size = self.pcap.stat().st_size if self.pcap.exists() else 0
            if now_size != size:
                size, since = now_size, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.05)

    def segments(self) -> list[Segment]:
        """Every captured IPv4 TCP segment, in capture order.

        Returns
        -------
        list of Segment
        """
        if not self.pcap.exists():
            return []
        found = (parse_tcp(lt, frame) for lt, frame in read_pcap(self.pcap))
        return [s for s in found if s is not None]

    def payload_bytes(self) -> bytes:
        """All captured TCP payloads concatenated in capture order.

        Returns
        -------
        bytes
        """
        return b"".join(s.payload for s in self.segments())

    def streams(self) -> dict[tuple[str, int, str, int], bytes]:
        """The payload of each direction of each connection.

        Retransmitted segments (same sequence number and length) are counted once, so a
        marker split across segments is found whole.

        Returns
        -------
        dict
            ``(src, sport, dst, dport)`` to that direction's bytes, in capture order.
        """
        seen: set[tuple[tuple[str, int, str, int], int, int]] = set()
        parts: dict[tuple[str, int, str, int], list[bytes]] = {}
        for s in self.segments():
            key = (s.flow, s.seq, len(s.payload))
            if not s.payload or key in seen:
                continue
            seen.add(key)
            parts.setdefault(s.flow, []).append(s.payload)
        return {flow: b"".join(p) for flow, p in parts.items()}

    def flows(self) -> set[tuple[str, int, str, int]]:
        """Every ``(src, sport, dst, dport)`` seen, with or without payload.

        Returns
        -------
        set of tuple
        """
        return {s.flow for s in self.segments()}

    def contains(self, marker: bytes) -> bool:
        """Whether ``marker`` went over the captured link in plaintext.

        Parameters
        ----------
        marker
            Bytes to look for.

        Returns
        -------
        bool
            True if some connection's byte stream, or the concatenation of all payloads,
            contains ``marker``.
        """
        if any(marker in data for data in self.streams().values()):
            return True
        return marker in self.payload_bytes()
