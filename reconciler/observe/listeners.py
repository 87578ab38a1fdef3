"""Who listens on a port: the TCP sockets listening in this host's network namespace, and the processes holding them.

Read (``read_listeners``: ``/proc/net/tcp`` and ``/proc/net/tcp6``, then the fds of every process for the
sockets that matter) and parse (``parse_proc_net_tcp``: pure, tested on captured text) apart, like the other
observers. Called by ``reconciler.observe.observe`` for the ports of the recipes' health and probe URLs, so that the
planner can tell, before anything stops, whether an enter's port is taken by something other than its own lane.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Container
from dataclasses import replace

from reconciler.observe.procfs import container_of_pid, read_comm
from reconciler.observed import Listener

TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN state in /proc/net/tcp's "st" column


def _ipv4(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    return ".".join(str(b) for b in reversed(raw))  # one 32-bit word in host (little-endian) order


def _ipv6(hexaddr: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four 32-bit words, each little-endian
    addr = ipaddress.IPv6Address(words)
    mapped = addr.ipv4_mapped
    return f"::ffff:{mapped}" if mapped is not None else str(addr)


def parse_proc_net_tcp(text: str, *, v6: bool = False) -> list[Listener]:
    """Pure: the listening sockets of one ``/proc/net/tcp`` (or ``tcp6``) text, without their processes."""
    out: list[Listener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        addr, _, port = fields[1].partition(":")
        try:
            out.append(
                Listener(
                    address=_ipv6(addr) if v6 else _ipv4(addr),
                    port=int(port, 16),
                    inode=int(fields[9]),
                )
            )
        except ValueError:
            continue
    return out


def socket_inode(link: str) -> int | None:
    """Pure: the inode of an fd's link text ``socket:[12345]``, else None."""
    if link.startswith("socket:[") and link.endswith("]"):
        try:
            return int(link[8:-1])
        except ValueError:
            return None
    return None


def _holders(inodes: Collection[int], proc_root: str) -> dict[int, int]:
    """socket inode -> a pid holding it, for the inodes asked about (the scan ends once all are found)."""
    want = set(inodes)
    found: dict[int, int] = {}
    try:
        pids = [int(n) for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        return found
    # Newest first: the lanes' servers (and a stale one) are younger than the system's daemons, so the scan ends
    # sooner on a host whose listeners are found.
    for pid in sorted(pids, reverse=True):
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read: its sockets stay unattributed
        for fd in fds:
            try:
                ino = socket_inode(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if ino in want and ino not in found:
                found[ino] = pid
        if len(found) == len(want):
            break
    return found


def read_listeners(
    ports: Collection[int], *, known_containers: Container[str] | None, proc_root: str = "/proc"
) -> tuple[frozenset[int], tuple[Listener, ...]]:
    """The listeners on ``ports`` with their processes and containers (``known_containers``: the engine's ids a
    pid's cgroup is confirmed against). Returns the ports looked up (none when /proc/net cannot be read: then no
    port is judged) and the listeners found."""
    if not ports:
        return frozenset(), ()
    found: list[Listener] = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"{proc_root}/net/{name}", encoding="ascii", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue  # a kernel without IPv6: no tcp6
        except OSError:
            return frozenset(), ()
        found += [x for x in parse_proc_net_tcp(text, v6=v6) if x.port in ports]
    holders = _holders({x.inode for x in found}, proc_root) if found else {}
    out = []
    for x in found:
        pid = holders.get(x.inode)
        if pid is None:
            out.append(x)
            continue
        cid = container_of_pid(pid, known_containers, proc_root) if known_containers is not None else None
        out.append(replace(x, pid=pid, command=read_comm(pid, proc_root), container_id=cid))
    return frozenset(ports), tuple(out)
