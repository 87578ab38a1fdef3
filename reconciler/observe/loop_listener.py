"""Whether a listener on this host is a loop's own, proven from /proc before a token is sent to it; and who holds a
port, in words.

A local user can bind the loop's port while the loop is down (a crash, an upgrade, a restart's gap) and answer as
it would: a client that sends the API token there gives it away. So a client of the tool connects first and sends
its request, and its token, only once the other end is proven (``prove``): when the connection's far end is a
socket of this host's network namespace (a loopback address, or one of the host's own), every socket listening
there (``/proc/net/tcp`` and ``tcp6``, the same read and parse as the planner's and the enter's port checks,
``reconciler.observe.net``) must be held by processes run by root (or by the running user, as the tool's own files
may be), one of them the loop of the host asked for: the process holding that host's lock file open, whose pid the
file records (``reconciler.store.lock``); and the connection's own socket at the far end must be of root's (or the
running user's) too, so a listener that took the connection and closed before the proof is caught. A far end
that is no socket of this host is another host's, which only TLS can prove; it is left to the caller.

``proven_opener`` is urllib's opener with that proof in each connection's ``connect``: what fails it raises
``ListenerNotProven`` before a byte is sent. Used by ``reconciler.observe.fleet`` (``fleet status`` and the canary
check of ``source.after``); ``holders_text`` names who holds a port, for the loop's listener that cannot bind.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import pwd
import socket
import stat
from collections.abc import Iterable
from typing import Any

from reconciler.observe.net import TCP_LISTEN, TcpSocket, read_comm, read_tcp_sockets, socket_holders
from reconciler.store.lock import lock_file_name


class ListenerNotProven(OSError):
    """The far end of a connection is a socket of this host that is not proven the loop's: nothing was sent."""


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _plain(address: str) -> str:
    """An address as /proc/net/tcp's parse writes it, a v4-mapped one as its IPv4 address, a zone index dropped."""
    addr = ipaddress.ip_address(address.split("%")[0])
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return str(mapped if mapped is not None else addr)


def _reaches(listener: TcpSocket, address: str) -> bool:
    """Whether a connection to ``address`` could be taken by ``listener`` (its own address, or a wildcard)."""
    return _plain(listener.address) in (address, "0.0.0.0", "::")


def listening_on(sockets: Iterable[TcpSocket], address: str, port: int) -> list[TcpSocket]:
    """Pure: the sockets listening where a connection to ``address``:``port`` may land."""
    plain = _plain(address)
    return [s for s in sockets if s.state == TCP_LISTEN and s.port == port and _reaches(s, plain)]


def _uids(pid: int, proc_root: str) -> tuple[int, ...] | None:
    """A process's real, effective, saved and filesystem uids (/proc/PID/status: its directory's owner is no proof,
    a process that makes itself undumpable has it shown as root's); None when it is gone."""
    try:
        with open(f"{proc_root}/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return tuple(int(x) for x in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return None


def _lock_pid(pid: int, host: str, proc_root: str) -> int | None:
    """The pid recorded in the lock file of ``host`` that process ``pid`` holds open (read through its own
    descriptor, so whatever its runtime directory), or None when it holds none."""
    name = lock_file_name(host)
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            if os.path.basename(os.readlink(f"{fd_dir}/{fd}")) != name:
                continue
            f = os.open(f"{fd_dir}/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in _trusted() or st.st_mode & 0o022:
                continue
            data = json.loads(os.pread(f, 4096, 0) or b"{}")
            return int(data["pid"]) if isinstance(data, dict) and isinstance(data.get("pid"), int) else None
        except (OSError, ValueError):
            continue
        finally:
            os.close(f)
    return None


def _trusted() -> frozenset[int]:
    """Whom a listener may belong to: root, or the user running this client (as the tool's own files may be)."""
    return frozenset({0, os.geteuid()})


def _describe(sock: TcpSocket, pids: Iterable[int], proc_root: str) -> str:
    where = f"[{sock.address}]:{sock.port}" if ":" in sock.address else f"{sock.address}:{sock.port}"
    named = [f"pid {pid} ({read_comm(pid, proc_root)}, {_user(sock.uid)})" for pid in sorted(pids)]
    return f"{', '.join(named) or f'a socket of {_user(sock.uid)} that no readable process holds'} on {where}"


def holders_text(address: str, port: int, proc_root: str = "/proc") -> str:
    """Who listens where a connection to ``address``:``port`` may land, in words (pid, program, user, address);
    '' when no one does or /proc/net cannot be read."""
    try:
        found = listening_on(read_tcp_sockets(proc_root, local_port=port), address, port)
    except (OSError, ValueError):
        return ""
    holders = socket_holders([s.inode for s in found], proc_root) if found else {}
    return "; ".join(_describe(s, holders.get(s.inode, ()), proc_root) for s in found)


def _far_end(sockets: Iterable[TcpSocket], near: tuple[str, int], far: tuple[str, int]) -> TcpSocket | None:
    """Pure: the socket of this host at the far end of the connection from ``near`` to ``far``, if it is here."""
    want = (_plain(far[0]), far[1], _plain(near[0]), near[1])
    for s in sockets:
        if s.state != TCP_LISTEN and (_plain(s.address), s.port, _plain(s.remote_address), s.remote_port) == want:
            return s
    return None


def prove(sock: socket.socket, host: str, proc_root: str = "/proc") -> None:
    """Raise ``ListenerNotProven`` unless the far end of the connected ``sock`` is the loop of ``host`` (or no
    socket of this host at all: another host's, which only TLS can prove). Nothing has been sent on ``sock``."""
    near = sock.getsockname()[:2]
    far = sock.getpeername()[:2]
    where = f"[{far[0]}]:{far[1]}" if ":" in far[0] else f"{far[0]}:{far[1]}"
    try:
        sockets = read_tcp_sockets(proc_root, local_port=far[1])
    except OSError as exc:
        if ipaddress.ip_address(_plain(far[0])).is_loopback:
            raise ListenerNotProven(f"who listens on {where} cannot be read ({exc.strerror or exc})") from None
        return
    end = _far_end(sockets, near, far)
    if end is None:
        if ipaddress.ip_address(_plain(far[0])).is_loopback:
            raise ListenerNotProven(f"the connection to {where} is not in /proc/net/tcp, so its listener is unknown")
        return  # another host's: TLS's to prove
    mine = f"the loop of host {host!r} (a process of root's holding its lock file)"
    listeners = listening_on(sockets, far[0], far[1])
    holders = socket_holders([s.inode for s in listeners] + ([end.inode] if end.inode else []), proc_root)
    trusted = _trusted()
    loop = False
    for s in listeners:
        pids = holders.get(s.inode, set())
        foreign = [pid for pid in pids if not set(_uids(pid, proc_root) or (-1,)) <= trusted]
        if s.uid not in trusted or foreign or not pids:
            raise ListenerNotProven(
                f"{where} is held by {_describe(s, pids, proc_root)}, not by {mine}: another user took the loop's "
                "port (or its holder cannot be read: run as root)"
            )
        loop = loop or any(_lock_pid(pid, host, proc_root) == pid for pid in pids)
    if end.uid not in trusted:  # a listener that took the connection and went away before the proof
        raise ListenerNotProven(
            f"{where} answered from a socket of {_user(end.uid)}, not {mine}: another user holds the loop's port"
        )
    if not listeners:
        raise ListenerNotProven(f"no socket listens on {where} any more: it cannot be told to be {mine}")
    if not loop:
        held = "; ".join(_describe(s, holders.get(s.inode, ()), proc_root) for s in listeners)
        raise ListenerNotProven(f"{where} is held by {held}, which holds no lock file of host {host!r}: not {mine}")


@functools.cache
def proven_opener(host: str, context: Any = None) -> Any:
    """urllib's opener for the loop of ``host``: straight to the URL (no proxy, no redirect followed, as
    ``reconciler.base.direct_http``), each connection proven (``prove``) before its request is sent; an https:// peer
    verified with ``context`` (an ``ssl.SSLContext``: a fleet host's CA) when one is given."""
    # Built on first use (the start-up budget: a command that asks no loop imports neither).
    import http.client
    import urllib.request

    class Proven:
        sock: socket.socket

        def connect(self) -> None:
            super().connect()  # type: ignore[misc]
            try:
                prove(self.sock, host)
            except BaseException:
                self.sock.close()
                raise

    class ProvenHTTP(Proven, http.client.HTTPConnection):
        pass

    class ProvenHTTPS(Proven, http.client.HTTPSConnection):
        pass

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(ProvenHTTP, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(ProvenHTTPS, req, context=self._context)  # type: ignore[attr-defined]

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # urllib then raises HTTPError with the 3xx status

    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), NoRedirects(), HTTPHandler(), HTTPSHandler(context=context)
    )
