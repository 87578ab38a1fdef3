"""Who a connection's peer is, for its bounds and its refusals: a local user (the uid owning the connecting socket,
asked of the kernel by ``sock_diag``, else read from ``/proc/net/tcp{,6}``) or a remote address (an IPv6 one by
its /64).

Called by the protocol when a connection is made (``peer_of``) and by the guard for a request whose connection
has no peer recorded.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable
from typing import Any

from reconciler.api.hosts import _ip
from reconciler.observe.net import read_tcp_sockets, socket_owner

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF


def diag_request(client: tuple[str, int], server: tuple[str, int], seq: int = 1) -> bytes | None:
    """The netlink ``sock_diag`` request that looks up the one TCP socket going from ``client`` to ``server`` (the
    client's end, whose owner is the question). None for an address that is not one. Pure."""
    try:
        src, dst = ipaddress.ip_address(client[0].split("%")[0]), ipaddress.ip_address(server[0].split("%")[0])
    except ValueError:
        return None
    if src.version != dst.version:
        return None
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
    req += struct.pack("!HH", client[1], server[1]) + src.packed.ljust(16, b"\0") + dst.packed.ljust(16, b"\0")
    req += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    return struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, 1, seq, 0) + req  # NLM_F_REQUEST


def diag_owner(answer: bytes) -> int | None:
    """The uid in a ``sock_diag`` answer (an ``inet_diag_msg``); None when the kernel found no such socket, or one
    no process holds any more (inode 0). Pure."""
    if len(answer) < 16:
        return None
    _, kind, _, _, _ = struct.unpack_from("=IHHII", answer)
    if kind != _SOCK_DIAG_BY_FAMILY or len(answer) < 16 + 72:
        return None
    uid, inode = struct.unpack_from("=II", answer, 16 + 64)
    return uid if inode else None


def _diag_lookup(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """Ask the kernel (one exact lookup, however many sockets there are; OSError where netlink is not to be had)."""
    req = diag_request(client, server)
    if req is None:
        return None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(req, (0, 0))
        return diag_owner(nl.recv(8192))


def peer_of(
    client: tuple[Any, ...] | None,
    server: tuple[Any, ...] | None,
    *,
    diag: Callable[[tuple[str, int], tuple[str, int]], int | None] | None = _diag_lookup,
) -> str:
    """Who a connection is, for its bounds and its refusals: ``uid N`` when the connecting socket is this machine's
    (the kernel's ``sock_diag`` finds the socket going from the client's address to ours, or else
    ``/proc/net/tcp{,6}`` lists it; a local user has every loopback address,
    127.0.0.2 as much as 127.0.0.1, so its address says nothing), else its address (an IPv6 one by its /64)."""
    if not client:
        return "?"
    ip, port = str(client[0]), int(client[1])
    if server and diag:
        try:
            uid = diag((ip, port), (str(server[0]), int(server[1])))
            if uid is None and ":" in ip:  # a v4-mapped peer: the client's socket may be an IPv4 one
                v4 = [_ip(ip.split("%")[0]), _ip(str(server[0]).split("%")[0])]
                if all(a is not None and a.version == 6 and a.ipv4_mapped for a in v4):
                    uid = diag((str(v4[0].ipv4_mapped), port), (str(v4[1].ipv4_mapped), int(server[1])))  # type: ignore[union-attr]
            if uid is not None:
                return f"uid {uid}"
            server = None  # the kernel knows no such local socket: a remote peer
        except OSError:
            pass  # no netlink here: the tables say it (slower: each read lists every socket)
    if server:
        try:
            uid = socket_owner(read_tcp_sockets(local_port=port), (ip, port), (str(server[0]), int(server[1])))
        except OSError:
            uid = None  # /proc/net unreadable: its address says who it is
        if uid is not None:
            return f"uid {uid}"
    addr = _ip(ip.split("%")[0])
    if addr is not None and addr.version == 6 and addr.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr.ipv4_mapped if addr is not None and addr.version == 6 and addr.ipv4_mapped else ip)


def _address(client: tuple[Any, ...] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
