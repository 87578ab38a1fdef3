"""TCP sockets of this host's network namespace: /proc/net/tcp and tcp6 (every socket, with its addresses, state,
owner and inode) and /proc/PID/fd (which processes hold a socket), each a read (I/O) and a pure parse tested on
captured text (tests/data/net).

The one reader of these files, for every caller: the planner's view of who listens on an enter's ports
(``reconciler.observe.listeners``), the apply layer's proof that a lane's port is its own (an enter counts a health
answer or sends a probe only once every listener on the lane's ports is a process of the lane's own container, and
its preflight names whatever listens there before the container exists; another user that binds a lane's port
first is named, never asked), and the HTTP listener's owner of a connecting socket where netlink's ``sock_diag`` is
missing (``reconciler.api.peers.peer_of``). Standard library only, so that any observer can share it.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

TCP_LISTEN = 0x0A  # the kernel's TCP_LISTEN in the 'st' column


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of this network namespace, as a line of /proc/net/tcp{,6} lists it."""

    address: str  # the local address, as ipaddress writes it ("127.0.0.1", "::", "::ffff:127.0.0.1")
    port: int
    remote_address: str
    remote_port: int
    state: int  # the kernel's TCP state (TCP_LISTEN, 0x01 established, ...)
    uid: int  # the socket's owner, as the kernel records it
    inode: int  # 0 for a socket no process holds any more (TIME_WAIT, say)


@dataclass(frozen=True)
class TcpListener:
    """One listening TCP socket of this network namespace."""

    address: str  # the local address, as ipaddress writes it ("127.0.0.1", "::")
    port: int
    uid: int  # the socket's owner, as the kernel records it
    inode: int

    @property
    def where(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


@functools.lru_cache(maxsize=4096)  # a table names few addresses many times over (127.0.0.1, ::)
def _address(hex_addr: str) -> str:
    """A /proc/net/tcp{,6} address: 32-bit words in host byte order (little-endian on every Linux this runs on). A
    v4-mapped IPv6 address is written ``::ffff:A.B.C.D`` (as Python 3.13's ipaddress does), so that it reads as the
    IPv4 address it stands for."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return f"::ffff:{mapped}" if mapped is not None else str(addr)


def _endpoint(field: str) -> tuple[str, int]:
    addr, _, port = field.partition(":")
    return _address(addr), int(port, 16)


def parse_tcp_sockets(text: str, *, local_port: int | None = None) -> list[TcpSocket]:
    """Pure: every socket of a /proc/net/tcp or /proc/net/tcp6 text (the header is skipped, as is a line that does
    not parse); with ``local_port``, only the sockets on that local port (a busy host lists thousands, and a line
    not on it is passed over before it is split)."""
    out: list[TcpSocket] = []
    mark = f":{local_port:04X} " if local_port is not None else ""
    for line in text.splitlines()[1:]:
        if mark and mark not in line:
            continue
        fields = line.split()
        if len(fields) < 10 or (mark and not fields[1].endswith(mark[:-1])):
            continue
        # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        try:
            local, remote = _endpoint(fields[1]), _endpoint(fields[2])
            out.append(TcpSocket(*local, *remote, int(fields[3], 16), int(fields[7]), int(fields[9])))
        except ValueError:
            continue
    return out


def listeners_of(sockets: Iterable[TcpSocket]) -> list[TcpListener]:
    """Pure: the listening sockets among ``sockets``."""
    return [TcpListener(s.address, s.port, s.uid, s.inode) for s in sockets if s.state == TCP_LISTEN]


def parse_proc_net_tcp(text: str) -> list[TcpListener]:
    """Pure: the listening sockets of a /proc/net/tcp or /proc/net/tcp6 text (other states are skipped)."""
    return listeners_of(parse_tcp_sockets(text))


def _unmapped(address: str) -> str | None:
    """An address as ``_address`` writes it, a v4-mapped one as its IPv4 address (a zone index dropped); None for
    what is no address."""
    try:
        addr = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return str(mapped if mapped is not None else addr)


def socket_owner(sockets: Iterable[TcpSocket], local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """Pure: the uid owning the socket going from ``local`` to ``remote`` (a v4-mapped address matches its IPv4
    address, as the client's socket may be either); None when there is none, or when it is a socket no process
    holds any more (its inode 0, its uid then root's)."""
    want = (_unmapped(local[0]), local[1], _unmapped(remote[0]), remote[1])
    if want[0] is None or want[2] is None:
        return None
    for s in sockets:
        ends = (s.port, s.remote_port) == (want[1], want[3])
        if ends and s.inode and (_unmapped(s.address), _unmapped(s.remote_address)) == (want[0], want[2]):
            return s.uid
    return None


def read_tcp_sockets(proc_root: str = "/proc", *, local_port: int | None = None) -> list[TcpSocket]:
    """Every TCP socket (IPv4 and IPv6) of the reading process's network namespace (with ``local_port``, those on
    it). OSError when /proc/net/tcp cannot be read; a missing tcp6 is a host without IPv6."""
    with open(f"{proc_root}/net/tcp", encoding="ascii", errors="replace") as fh:
        out = parse_tcp_sockets(fh.read(), local_port=local_port)
    try:
        with open(f"{proc_root}/net/tcp6", encoding="ascii", errors="replace") as fh:
            out += parse_tcp_sockets(fh.read(), local_port=local_port)
    except FileNotFoundError:
        pass
    return out


def read_tcp_listeners(proc_root: str = "/proc") -> list[TcpListener]:
    """Every listening TCP socket (IPv4 and IPv6) of the reading process's network namespace; OSError as
    ``read_tcp_sockets``."""
    return listeners_of(read_tcp_sockets(proc_root))


_SOCKET_LINK = re.compile(r"socket:\[(\d+)\]")


def parse_socket_link(target: str) -> int | None:
    """Pure: the socket inode of a /proc/PID/fd/N link's target (``socket:[12345]``), else None."""
    m = _SOCKET_LINK.fullmatch(target)
    return int(m.group(1)) if m else None


def socket_holders(inodes: Collection[int], proc_root: str = "/proc", *, every: bool = True) -> dict[int, set[int]]:
    """inode -> the pids whose open files include that socket, for each of ``inodes`` some process holds. A
    process that ended or whose fds cannot be read is skipped: a socket no pid is found for is missing from the
    answer, and the caller treats it as not known, never as its own.

    Processes are read newest first: the lanes' servers (and a stale one) are younger than the system's daemons.
    With ``every`` False the scan ends once each socket has a holder, the newest one (enough to name who listens)."""
    want = set(inodes)
    found: dict[int, set[int]] = {}
    if not want:
        return found
    try:
        pids = sorted((int(n) for n in os.listdir(proc_root) if n.isdigit()), reverse=True)
    except OSError:
        return found
    for pid in pids:
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read: its sockets stay unattributed
        for fd in fds:
            try:
                inode = parse_socket_link(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if inode in want and (every or inode not in found):
                found.setdefault(inode, set()).add(pid)
        if not every and len(found) == len(want):
            break
    return found


def read_comm(pid: int, proc_root: str = "/proc") -> str:
    """The program name of a pid (/proc/PID/comm, at most 15 characters, set by the process itself, so anything
    unprintable in it is shown escaped); '?' when it is gone or unreadable."""
    try:
        with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            name = fh.read().rstrip("\n")
    except OSError:
        return "?"
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
