"""Who listens on a port: the TCP sockets listening in this host's network namespace, and the processes holding them.

The sockets and their holders are read by ``reconciler.observe.net`` (``/proc/net/tcp`` and ``/proc/net/tcp6``,
then the fds of every process for the sockets that matter; its parse is pure, tested on captured text); this adds
each holder's command and container. Called by ``reconciler.observe.observe`` for the ports of the recipes' health
and probe URLs, so that the planner can tell, before anything stops, whether an enter's port is taken by something
other than its own lane.
"""

from __future__ import annotations

from collections.abc import Collection, Container

from reconciler.observe.net import read_tcp_listeners, socket_holders
from reconciler.observe.procfs import container_of_pid, read_comm
from reconciler.plan.observed import Listener


def read_listeners(
    ports: Collection[int], *, known_containers: Container[str] | None, proc_root: str = "/proc"
) -> tuple[frozenset[int], tuple[Listener, ...]]:
    """The listeners on ``ports`` with their processes and containers (``known_containers``: the engine's ids a
    pid's cgroup is confirmed against). Returns the ports looked up (none when /proc/net cannot be read: then no
    port is judged) and the listeners found."""
    if not ports:
        return frozenset(), ()
    try:
        found = [x for x in read_tcp_listeners(proc_root) if x.port in ports]
    except OSError:
        return frozenset(), ()
    holders = socket_holders([x.inode for x in found], proc_root, every=False)
    out = []
    for x in found:
        pids = holders.get(x.inode)
        if not pids:
            out.append(Listener(address=x.address, port=x.port, inode=x.inode))
            continue
        pid = max(pids)
        cid = container_of_pid(pid, known_containers, proc_root) if known_containers is not None else None
        out.append(
            Listener(
                address=x.address,
                port=x.port,
                inode=x.inode,
                pid=pid,
                command=read_comm(pid, proc_root),
                container_id=cid,
            )
        )
    return frozenset(ports), tuple(out)
