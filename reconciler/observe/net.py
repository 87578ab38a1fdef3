"""Who listens on a TCP port: /proc/net/tcp and tcp6 (the listening sockets, by inode) and /proc/PID/fd (which
process holds each socket), each a read (I/O) and a pure parse tested on captured text.

Called by the apply layer: an enter counts a health answer or sends a probe only once every listener on the lane's
ports is a process of the lane's own container (``reconciler.observe.procfs`` attributes a pid to its container by
its cgroup), and its preflight names whatever listens there before the container exists. Another user that binds a
lane's port first is named, never asked. Self-contained, so that any observer can share it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Collection
from dataclasses import dataclass

TCP_LISTEN = 0x0A  # the kernel's TCP_LISTEN in the 'st' column


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


def _address(hex_addr: str) -> str:
    """A /proc/net/tcp{,6} address: 32-bit words in host byte order (little-endian on every Linux this runs on)."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def parse_proc_net_tcp(text: str) -> list[TcpListener]:
    """Pure: the listening sockets of a /proc/net/tcp or /proc/net/tcp6 text (the header and other states are
    skipped, as is a line that does not parse)."""
    out: list[TcpListener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            if int(fields[3], 16) != TCP_LISTEN:
                continue
            addr, _, port = fields[1].partition(":")
            out.append(TcpListener(_address(addr), int(port, 16), int(fields[7]), int(fields[9])))
        except ValueError:
            continue
    return out


def read_tcp_listeners(proc_root: str = "/proc") -> list[TcpListener]:
    """Every listening TCP socket (IPv4 and IPv6) of the reading process's network namespace. OSError when
    /proc/net/tcp cannot be read; a missing tcp6 is a host without IPv6."""
    with open(f"{proc_root}/net/tcp", encoding="ascii", errors="replace") as fh:
        out = parse_proc_net_tcp(fh.read())
    try:
        with open(f"{proc_root}/net/tcp6", encoding="ascii", errors="replace") as fh:
            out += parse_proc_net_tcp(fh.read())
    except FileNotFoundError:
        pass
    return out


_SOCKET_LINK = re.compile(r"socket:\[(\d+)\]")


def parse_socket_link(target: str) -> int | None:
    """Pure: the socket inode of a /proc/PID/fd/N link's target (``socket:[12345]``), else None."""
    m = _SOCKET_LINK.fullmatch(target)
    return int(m.group(1)) if m else None


def socket_holders(inodes: Collection[int], proc_root: str = "/proc") -> dict[int, set[int]]:
    """inode -> the pids whose open files include that socket, for each of ``inodes`` some process holds. A
    process that ended or whose fds cannot be read is skipped: a socket no pid is found for is missing from the
    answer, and the caller treats it as not known, never as its own."""
    want = set(inodes)
    found: dict[int, set[int]] = {}
    if not want:
        return found
    try:
        names = [n for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        return found
    for name in names:
        fd_dir = f"{proc_root}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                inode = parse_socket_link(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if inode in want:
                found.setdefault(inode, set()).add(int(name))
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
