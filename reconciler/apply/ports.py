"""Who holds a lane's ports, from /proc, never by asking: an enter's port checks (``PortChecks``).

``lane_ports`` lists every port an enter sends a request to (its health URL, its probes' base URLs);
``_port_listeners`` reads who listens there (the host's own ``HostIO.listeners``: the steps ask ``self.io``).
Before the container exists nothing may listen there; before the health answer and the probes are trusted, every
listener must be a process of the container (a squatter is named, never asked: ``PortSquatted``). Used by
``reconciler.apply.enter``.
"""

from __future__ import annotations

import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from reconciler.apply.context import ActionContext
from reconciler.apply.errors import PortSquatted
from reconciler.model import Recipe
from reconciler.observe import procfs
from reconciler.observe.net import TcpListener, read_comm, read_tcp_listeners, socket_holders
from reconciler.plan.actions import Action


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


def _holders_text(held: list[tuple[TcpListener, list[PortHolder]]]) -> str:
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


class PortChecks(ActionContext):
    """An enter's checks of its lane's health and probe ports: free before its container exists, the container's
    own before anything is asked there."""

    def _check_ports_free(self, action: Action, recipe: Recipe) -> None:
        """Preflight: nothing listens on the lane's health and probe ports before its container exists; whatever
        does is named (read from /proc, never asked: a squatter must not receive a request)."""
        ports = lane_ports(recipe)
        if not ports:
            return
        view = self.io.listeners(ports)
        if view is None:
            return  # /proc/net unreadable here: the HTTP check below still refuses anything that answers
        for port, held in sorted(view.items()):
            if held:
                raise PortSquatted(
                    f"port {port} ({ports[port]}) of recipe {action.recipe} is already bound before "
                    f"{action.container} is started: {_holders_text(held)}. Its health check and probes could not "
                    "tell the new engine from it, so nothing was asked there and nothing was created. Stop what "
                    "listens there, or give the recipe another port and health.url"
                )

    def _port_verdict(self, action: Action, cid: str, recipe: Recipe) -> tuple[bool, str]:
        """Whether every listener on the lane's health and probe ports is a process of container ``cid``:
        (True, "") when each port has listeners and all are its own; (False, why) while one is not listening yet
        or its holder is not known. A listener of another process raises PortSquatted, naming it."""
        ports = lane_ports(recipe)
        if not ports or recipe.container.network != "host":
            return True, ""  # off the host's network, the host's sockets are not where its ports are
        view = self.io.listeners(ports)
        if view is None:
            return False, "the listening sockets could not be read from /proc/net/tcp"
        for port, held in sorted(view.items()):
            if not held:
                return False, f"nothing listens on port {port} ({ports[port]}) yet"
            for listener, holders in held:
                if not holders:
                    return False, (
                        f"port {port} ({ports[port]}) is held by a socket of uid {listener.uid} "
                        f"({listener.where}, inode {listener.inode}) that no readable process holds"
                    )
                foreign = [h for h in holders if not h.of(cid)]
                if foreign:
                    raise PortSquatted(
                        f"port {port} ({ports[port]}) of {action.container} is held by "
                        f"{_holders_text([(listener, foreign)])}, not by a process of the container: another "
                        "process took the lane's port while it started, so its health answer and probes would "
                        "come from that process. Nothing was asked there; stop what listens there, or give the "
                        "recipe another port and health.url"
                    )
        return True, ""

    def _ports_ours(self, action: Action, cid: str, recipe: Recipe) -> bool:
        ok, why = self._port_verdict(action, cid, recipe)
        if ok:
            self._unknown_listeners.pop(cid, None)
        elif why:
            self._unknown_listeners[cid] = why
        return ok

    def _require_ports_ours(self, action: Action, cid: str, recipe: Recipe) -> None:
        """Before the probes: the ports are still the container's own (PortSquatted names a holder that is not)."""
        ok, why = self._port_verdict(action, cid, recipe)
        if not ok:
            raise PortSquatted(f"{action.container}'s probes were not sent: {why}")
