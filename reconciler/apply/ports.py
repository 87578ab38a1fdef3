"""Who holds a lane's ports, from /proc, never by asking: the seam ``HostIO.listeners`` and what it answers.

``lane_ports`` lists every port an enter sends a request to (its health URL, its probes' base URLs);
``_port_listeners`` reads who listens there (the host's own ``HostIO.listeners``: the steps ask ``ctx.io``), as a
``PortView`` of ``PortHolder``; ``holders_text`` puts them in words. The checks an enter makes of them are
``reconciler.apply.port_checks``; this module stands on /proc alone, below the steps' context and the host's seams.
"""

from __future__ import annotations

import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from reconciler.model import Recipe
from reconciler.observe import procfs
from reconciler.observe.net import TcpListener, read_comm, read_tcp_listeners, socket_holders


def _url_port(url: str) -> int | None:
    parts = urlsplit(url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def lane_ports(recipe: Recipe) -> dict[int, str]:
    """port -> what asks there (its health URL, a probe's base URL), of every port an enter sends a request to."""
    out: dict[int, str] = {}
    urls = [("health.url", recipe.health.url)]
    origin = recipe.api_origin()
    urls += [(f"probe {p.name!r}", p.base_url or origin) for p in recipe.suite("preflight")]
    for what, url in urls:
        port = _url_port(url) if url else None
        if port is not None:
            out.setdefault(port, what)
    return out


@dataclass(frozen=True)
class PortHolder:
    """A process holding a listening socket: its pid, program and the container ids on its cgroup path."""

    pid: int
    comm: str
    containers: tuple[str, ...]

    def of(self, cid: str) -> bool:
        """In container ``cid`` (its cgroup path names it, as offload holders are attributed)."""
        return any(c == cid or (len(cid) >= 12 and c.startswith(cid)) for c in self.containers)


PortView = dict[int, list[tuple[TcpListener, list[PortHolder]]]]


def _port_listeners(ports: Mapping[int, str]) -> PortView | None:
    """port -> each socket listening on it (any local address) with the processes that hold it, from /proc; None
    when /proc/net/tcp cannot be read."""
    try:
        listeners = [sock for sock in read_tcp_listeners() if sock.port in ports]
    except OSError:
        return None
    pids = socket_holders([sock.inode for sock in listeners]) if listeners else {}
    view: PortView = {port: [] for port in ports}
    for sock in listeners:
        holders = [
            PortHolder(pid, read_comm(pid), procfs.container_candidates_of_pid(pid))
            for pid in sorted(pids.get(sock.inode, ()))
        ]
        view[sock.port].append((sock, holders))
    return view


def holders_text(held: list[tuple[TcpListener, list[PortHolder]]]) -> str:
    """The holders of listening sockets in words: pid, program, user, container, address."""
    parts = []
    for sock, holders in held:
        if not holders:
            parts.append(f"a socket of uid {sock.uid} on {sock.where} that no readable process holds")
        for h in holders:
            where = f" in container {h.containers[0][:12]}" if h.containers else ""
            parts.append(f"pid {h.pid} ({h.comm}, {_user_name(sock.uid)}){where} listening on {sock.where}")
    return "; ".join(parts)


def _user_name(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
