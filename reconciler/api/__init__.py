"""The HTTP JSON API of ``reconciler run``, with MCP at ``/mcp``, ``/metrics`` and ``/healthz`` on one listener.

A Starlette app served by uvicorn in a thread of the loop (``Supervisor``), a thin front-end over the service layer
(``reconciler.service``) like the command line and ``reconciler mcp``. The routes (``ENDPOINTS``), each one function
below with its request model, and the OpenAPI document at ``/v1/openapi.json`` generated from them:

    GET  /v1/status          status --json
    GET  /v1/plan[?save=true] plan --json (with save: kept under the state dir, its "plan_id" for POST /v1/apply)
    GET  /v1/shm             shm status --json
    GET  /v1/audit[?since=]  the audit trail (since: epoch seconds, an ISO time, or an age like 15m, 2h, 7d)
    GET  /v1/probe?recipe=R[&suite=S]  probe R --suite S --json: a suite of the recipe's probes against its lane
    POST /v1/shm/reclaim     {"confirm": true, "paths": [...]}: the guarded cleanup (without confirm a dry run)
    POST /v1/apply           {"plan_id": "..."}: a plan saved by /v1/plan?save=true, refused when stale
    GET  /v1/openapi.json    this API as OpenAPI 3.1
    /mcp                     the MCP server (reconciler.mcp_server), streamable HTTP
    GET  /metrics, /healthz  without a token (Prometheus and supervisors)

Each answer's body is exactly the command line's ``--json`` (redacted once more on its way out); the command's exit
code rides in ``X-Reconciler-Exit-Code``. A POST whose command would exit non-zero (a refused reclaim, a stale or
blocked apply) answers 409 with the same body; an invalid configuration 422; a bad request 400.

Security, in the order the ``Guard`` checks a request, before any route sees it:

- ``Host:`` (and ``Origin:`` when sent) must name this listener: its bind address (``localhost`` too on loopback;
  any address literal on a wildcard bind) or a name given with ``--api-host``; else 421. A web page that rebinds
  its own name to 127.0.0.1 reads nothing, not even ``/metrics`` or ``/healthz``;
- every path but ``/metrics`` and ``/healthz`` needs ``Authorization: Bearer TOKEN`` (compared in constant time),
  reads included. The token comes from ``--api-token-file``, ``$RECONCILER_API_TOKEN``, or a file generated on first
  start (0600, ``$RECONCILER_STATE_DIR/HOST/api-token``), each file trusted by owner and mode; its name (the file's
  name, or ``env``) is the caller in the audit trail, its value is never logged or answered;
- event streams (``GET /mcp``) are bounded: ``MAX_STREAMS`` open, ``MAX_STREAMS_PER_TOKEN`` a token; past them 429;
- a body is read whole first, within ``BODY_TIMEOUT_S``: over ``MAX_BODY`` bytes is 413, chunked or not. Every body
  is JSON, read by one strict parser (``reconciler.base.jsonstrict``: a duplicate key or nesting too deep is 400) whatever
  the headers say: it needs exactly one ``Content-Type`` header, ``application/json`` (parameters allowed), else 400;
  a header that must be single (Host, Authorization, Content-Length, Origin, Content-Type) sent twice is 400.

Every refusal (400, 401, 403, 408, 413, 421, 429) is counted in ``reconciler_http_refusals_total`` by status and
reason, and logged (``api-refused``) and audited at most ``REFUSALS_AUDITED`` times a peer in ``REFUSAL_WINDOW_S``;
what is dropped beyond is summed up when the window ends ("N more refusals from PEER dropped in the last M s").

The listener is loopback unless ``--api-allow-remote`` is given, and then only with a token given explicitly. It
cannot be silenced (``guarded_protocol``): a peer is a local user (the uid owning the connecting socket, found by
the kernel's ``sock_diag``; a local user has every loopback address, so an address says nothing) or a remote
address; each peer holds at most a ``PEER_SHARE``-th of the connections and all of them ``max_connections`` (past
either the oldest idle one is closed for the new one); a client must send its request head within
``HEAD_TIMEOUT_S``; an answer whose bytes the client does not take for ``WRITE_TIMEOUT_S`` drops its connection (and
a request pipelined behind an answer not taken waits for it); /healthz and /metrics have a small pool of their own
(``HEALTH_SLOTS``, ``HEALTH_PER_PEER`` a peer) for connections past those bounds; /metrics is rendered in a worker
thread, once for all the scrapes waiting; the service calls run in a bounded pool of worker threads, the open-file
limit is raised at start, an error in its event loop is logged and never ends it, and a listener that stops anyway
is started again (or the loop exits 1 for its supervisor to restart it).

A destructive call (a confirmed reclaim, an apply) takes the loop's pass lock: it waits for a pass to end, and no
pass starts while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import os
import re
import resource
import secrets
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from reconciler.base.errors import ReconcilerError
from reconciler.loop.runtime import PassGate

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from reconciler.service import HostService

MAX_BODY = 64 << 10
TOKEN_ENV = "RECONCILER_API_TOKEN"
TOKEN_FILE = "api-token"
MIN_TOKEN_CHARS = 16
PUBLIC = frozenset({"/metrics", "/healthz"})  # every other path needs the token
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII without spaces: what a header can carry

# The listener's bounds. A scrape, a call of the API or MCP is one short request; these leave room for many at once
# and none for a client that holds connections open doing nothing.
HEAD_TIMEOUT_S = 10.0  # from connecting (or the previous answer) to a complete request head
BODY_TIMEOUT_S = 10.0  # to receive the whole body once the head is in
KEEP_ALIVE_S = 5.0  # an idle kept-alive connection is closed after this
MAX_CONNECTIONS = 256  # open connections at most (fewer under a low open-file limit: ``connection_cap``)
# Connections the kernel completes before the listener accepts them (capped by net.core.somaxconn). Past it the
# kernel drops a new connection's SYN and the client sends it again a second or more later: with 128, clients that
# reconnected as fast as they were refused kept it full, and a health check waited up to 3 s to be accepted.
BACKLOG = 1024
MAX_HEAD_BYTES = 16 << 10  # a request line and headers larger than this are refused by h11
RESTARTS_PER_HOUR = 5  # listener restarts before the loop gives up and exits 1
# A client that does not take its answer: once the bytes waiting to be sent to it have not gone down for this long,
# its connection is dropped (an answer is one write; a client that reads slowly but steadily is never cut off).
WRITE_TIMEOUT_S = 10.0
# A peer is a local user (the uid owning the connecting socket, whatever loopback address it connects from) or a
# remote address (an IPv6 one by its /64). Each holds at most this share of the connections (``peer_cap``).
PEER_SHARE = 8
# /healthz and /metrics have a small pool of their own: a connection past the bounds above may still ask one of
# them, once, within HEALTH_TIMEOUT_S (its head and its answer), at most HEALTH_PER_PEER of them a peer.
HEALTH_SLOTS = 16
HEALTH_PER_PEER = 2
HEALTH_TIMEOUT_S = 2.0
# Event streams (GET /mcp): open at most, in all and per token.
MAX_STREAMS = 32
MAX_STREAMS_PER_TOKEN = 16
# Refusals (401, 403, 408, 413, 421, 429, a bad header, type or body) are all counted; each peer's are logged and
# audited at most REFUSALS_AUDITED a window, the rest summed up in one record and one line when the window ends.
REFUSALS_AUDITED = 10
REFUSAL_WINDOW_S = 60.0
REFUSAL_PEERS = 256  # peers tracked at once; past them, refusals share one "other peers" account
# The scope's state keys by which the protocol tells the Guard who a connection's peer is and which pool it is in.
STATE_PEER = "reconciler.peer"
STATE_POOL = "reconciler.pool"


class ApiSetupError(ReconcilerError):
    """The API cannot be served as asked: a token file that is unusable, a remote address without the flag."""


class _BadRequest(Exception):
    pass


# ---------------------------------------------------------------- the token


@dataclass(frozen=True)
class ApiToken:
    value: str
    name: str  # who the caller is in the audit trail: the token file's name, or "env"
    source: str  # "file" | "env" | "generated"
    path: str | None = None
    created: bool = False  # generated by this start (else found from an earlier one)

    def matches(self, presented: bytes) -> bool:
        return hmac.compare_digest(presented, self.value.encode())

    def describe(self) -> str:
        """Where the token is, for the log: never its value."""
        if self.source == "generated":
            return f"{self.path} ({'generated' if self.created else 'generated on an earlier start'})"
        return {"env": f"${TOKEN_ENV}", "file": f"{self.path}"}[self.source]


def _check_value(value: str, where: str) -> str:
    value = value.strip()
    if not value:
        raise ApiSetupError(f"{where} is empty: put a token (at least {MIN_TOKEN_CHARS} characters) in it")
    if len(value) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.match(value):
        raise ApiSetupError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} printable characters and no spaces")
    return value


def _read_token_file(path: Path) -> str:
    """A token file trusted by owner and mode (``reconciler.base.fsafe``): the running user's, readable by no one else."""
    from reconciler.base import fsafe

    try:
        data = fsafe.read_trusted(path, what="the API token file", secret=True, limit=4096)
    except fsafe.UnsafePath as exc:
        raise ApiSetupError(str(exc)) from None
    except OSError as exc:
        raise ApiSetupError(f"cannot read the API token file {path}: {exc.strerror or exc}") from None
    try:
        return _check_value(data.decode("ascii"), f"the API token file {path}")
    except UnicodeDecodeError:
        raise ApiSetupError(f"the API token file {path}: not a printable ASCII token") from None


def resolve_token(host: str, *, token_file: str | None = None, environ: dict[str, str] | None = None) -> ApiToken:
    """The API's token: ``--api-token-file``, else ``$RECONCILER_API_TOKEN``, else the host's generated one (made
    now, 0600, in the checked state directory, when there is none yet)."""
    from reconciler.base import fsafe
    from reconciler.store.state import StateError, checked_host_dir

    env = os.environ if environ is None else environ
    if token_file:
        path = Path(token_file)
        return ApiToken(_read_token_file(path), path.name, "file", str(path))
    if env.get(TOKEN_ENV) is not None:
        return ApiToken(_check_value(env[TOKEN_ENV], f"${TOKEN_ENV}"), "env", "env")
    try:
        path = checked_host_dir(host, create=True) / TOKEN_FILE
    except StateError as exc:
        raise ApiSetupError(f"{exc} (or give a token with --api-token-file or ${TOKEN_ENV})") from None
    value = secrets.token_urlsafe(32)
    try:
        fsafe.write_atomic(path, value + "\n", replace=False)
    except FileExistsError:
        return ApiToken(_read_token_file(path), path.name, "generated", str(path))
    except OSError as exc:
        raise ApiSetupError(
            f"cannot create the API token file {path}: {exc.strerror or exc} (give one with "
            f"--api-token-file or ${TOKEN_ENV})"
        ) from None
    return ApiToken(value, path.name, "generated", str(path), created=True)


# ---------------------------------------------------------------- the listener's address and names


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; an empty host is 127.0.0.1); ValueError when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    n = int(port)
    if not 0 <= n <= 65535:
        raise ValueError(f"port {n} is out of range")
    return host, n


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (OSError when the address is in use or not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def check_exposure(host: str, *, allow_remote: bool, token: ApiToken) -> None:
    """Loopback by default; any other address needs ``--api-allow-remote`` and a token given explicitly."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ApiSetupError(
            f"{host} is not a loopback address: the API and MCP (and their destructive calls) would be reachable "
            "from other machines. Pass --api-allow-remote to mean it (with a token of your own), or listen on "
            "127.0.0.1"
        )
    if token.source == "generated":
        raise ApiSetupError(f"--api-allow-remote needs a token given explicitly: --api-token-file FILE or ${TOKEN_ENV}")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class AllowedHosts:
    """The ``Host:`` values this listener answers to. A DNS-rebinding page always sends a name of its own, so an
    address literal of the listener is safe; a name is accepted only when given (``--api-host``) or ``localhost``
    on loopback."""

    port: int
    names: frozenset[str]  # lowercase names and address literals (IPv6 without brackets)
    any_address: bool = False  # a wildcard bind (0.0.0.0, ::): any address literal

    @classmethod
    def of(cls, bind_host: str, port: int, names: Sequence[str] = ()) -> AllowedHosts:
        allowed = {n.strip().lower().strip("[]") for n in names if n.strip()}
        ip = _ip(bind_host)
        wildcard = ip is not None and ip.is_unspecified
        if ip is None:
            allowed.add(bind_host.lower())
        elif not wildcard:
            allowed.add(str(ip))
        if is_loopback(bind_host) or wildcard:
            allowed.add("localhost")  # no page can make it name another machine
        return cls(port=port, names=frozenset(allowed), any_address=wildcard)

    def permits(self, host_header: str) -> bool:
        host, port = _split_host_header(host_header)
        if host is None or (port is not None and port != self.port):
            return False
        if host in self.names:
            return True
        return self.any_address and _ip(host) is not None

    def permits_origin(self, origin: str) -> bool:
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or "/" in rest:
            return False
        return self.permits(rest)

    def describe(self) -> str:
        shown = sorted(f"[{n}]" if ":" in n else n for n in self.names)
        return ", ".join(shown) + (" or any address of this machine" if self.any_address else "")

    def mcp_security(self) -> Any:
        """The MCP SDK's own Host/Origin check, from the same names (the ``Guard`` has checked them already)."""
        from mcp.server.transport_security import TransportSecuritySettings

        if self.any_address:
            return TransportSecuritySettings(enable_dns_rebinding_protection=False)
        hosts = [f"[{n}]" if ":" in n else n for n in sorted(self.names)]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[*hosts, *(f"{h}:{self.port}" for h in hosts)],
            allowed_origins=[f"{s}://{h}{p}" for s in ("http", "https") for h in hosts for p in ("", f":{self.port}")],
        )


def _split_host_header(value: str) -> tuple[str | None, int | None]:
    value = value.strip().lower()
    if not value or any(c.isspace() or c in "/@\\" for c in value):
        return None, None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest and not rest.startswith(":"):
            return None, None
        port = rest[1:]
    else:
        host, _, port = value.partition(":")
        if ":" in port:
            return None, None
    if port and not port.isdigit():
        return None, None
    return host.rstrip("."), (int(port) if port else None)


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON read strictly (``reconciler.base.jsonstrict``: no duplicate key, bounded nesting); _BadRequest."""
    from reconciler.base import jsonstrict

    try:
        return jsonstrict.loads(raw)
    except jsonstrict.StrictJsonError as exc:
        msg = str(exc)
        raise _BadRequest("the body is not JSON" if msg == "not JSON" else f"the body: {msg}") from None


# ---------------------------------------------------------------- who a peer is


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
        from reconciler.observe.net import read_tcp_sockets, socket_owner

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


# ---------------------------------------------------------------- the guard


class _RateLimit:
    """At most ``burst`` events a ``window_s``; ``take()`` says whether this one may be recorded and how many were
    suppressed before it."""

    def __init__(self, burst: int, window_s: float = 60.0):
        self.burst = burst
        self.window_s = window_s
        self._start = 0.0
        self._count = 0
        self._suppressed = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[bool, int]:
        with self._lock:
            now = time.monotonic()
            if now - self._start >= self.window_s:
                self._start, self._count = now, 0
            if self._count >= self.burst:
                self._suppressed += 1
                return False, 0
            self._count += 1
            suppressed, self._suppressed = self._suppressed, 0
            return True, suppressed


@dataclass(frozen=True)
class Refusal:
    """One request (or connection) the listener refused, as it is counted, logged and audited."""

    status: int  # what the client got: 400, 401, 403, 408, 413, 421, 429
    reason: str  # the label of ``reconciler_http_refusals_total`` (a fixed set: host, origin, token, ...)
    detail: str  # what the client was told
    peer: str  # ``peer_of``: whose bounds and whose account
    address: str  # ADDR:PORT
    path: str = "-"
    front: str = "api"
    action: str = "request"
    who: str | None = None  # the caller in the audit trail: the token's name once it was shown, else the address


@dataclass
class _Window:
    start: float
    recorded: int = 0
    dropped: int = 0
    timer: threading.Timer | None = None


class Refusals:
    """Every refusal of the listener, counted (``on_count(status, reason)``, the loop's metrics) and logged
    (``api-refused``) and audited at most ``burst`` times a peer in a ``window_s``: what is dropped beyond is summed
    up when that window ends, in one log line (``api-refusals-dropped``) and one record (action
    ``refusals-dropped``), "N more refusals from PEER dropped in the last M s". A connection the listener drops
    (``connection_dropped``: an answer not taken, an idle one closed for room) is counted only."""

    def __init__(
        self,
        *,
        log: Callable[..., None] | None = None,
        audit: Callable[[dict[str, Any]], None] | None = None,
        on_count: Callable[[int, str], None] | None = None,
        on_drop: Callable[[str], None] | None = None,
        burst: int = REFUSALS_AUDITED,
        window_s: float = REFUSAL_WINDOW_S,
    ):
        self.log = log
        self.audit = audit
        self.on_count = on_count
        self.on_drop = on_drop
        self.burst = burst
        self.window_s = window_s
        self._peers: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def refuse(self, r: Refusal) -> None:
        if self.on_count is not None:
            with contextlib.suppress(ValueError):  # a reason the metrics do not know is still logged
                self.on_count(r.status, r.reason)
        now = time.monotonic()
        with self._lock:
            peer = r.peer
            if peer not in self._peers and len(self._peers) >= REFUSAL_PEERS:
                for p in [p for p, w in self._peers.items() if now - w.start >= self.window_s and not w.dropped]:
                    del self._peers[p]
                if len(self._peers) >= REFUSAL_PEERS:
                    peer = "other peers"
            w = self._peers.get(peer)
            if w is None or (now - w.start >= self.window_s and not w.dropped):
                w = self._peers[peer] = _Window(now)
            if w.recorded < self.burst:
                w.recorded += 1
                record = True
            else:
                w.dropped += 1
                record = False
                if w.timer is None:
                    w.timer = threading.Timer(max(0.0, w.start + self.window_s - now), self._summarise, (peer,))
                    w.timer.daemon = True
                    w.timer.start()
        if record:
            self._write(r)

    def connection_dropped(self, reason: str) -> None:
        if self.on_drop is not None:
            with contextlib.suppress(ValueError):
                self.on_drop(reason)

    def flush(self) -> None:
        """Sum up every window with refusals dropped now (the listener stops)."""
        with self._lock:
            peers = [p for p, w in self._peers.items() if w.dropped]
        for p in peers:
            self._summarise(p)

    def _summarise(self, peer: str) -> None:
        with self._lock:
            w = self._peers.pop(peer, None)
        if w is None or not w.dropped:
            return
        if w.timer is not None:
            w.timer.cancel()
        seconds = max(1, round(time.monotonic() - w.start))
        text = f"{w.dropped} more refusals from {peer} dropped in the last {seconds} s"
        with contextlib.suppress(Exception):  # a log that cannot be written must not end the timer's thread
            if self.log is not None:
                self.log("api-refusals-dropped", peer=peer, count=w.dropped, seconds=seconds, message=text)
            if self.audit is not None:
                self.audit(
                    {
                        "front": "api",
                        "who": peer,
                        "peer": peer,
                        "action": "refusals-dropped",
                        "outcome": "refused",
                        "count": w.dropped,
                        "seconds": seconds,
                        "reason": text,
                    }
                )

    def _write(self, r: Refusal) -> None:
        if self.log is not None:
            self.log("api-refused", status=r.status, reason=r.detail, path=r.path, peer=r.peer, address=r.address)
        if self.audit is not None:
            self.audit(
                {
                    "front": r.front,
                    "who": r.who or r.address,
                    "action": r.action,
                    "outcome": "refused",
                    "status": r.status,
                    "reason": r.detail,
                    "path": r.path,
                    "peer": r.peer,
                }
            )


class Guard:
    """Pure ASGI middleware in front of every route: ``Host:``/``Origin:``, the bearer token on every path but
    ``PUBLIC``, the event streams within their bounds, and the body read whole within its limits and parsed strictly
    as JSON, whatever its headers say. Every refusal goes to ``refusals``."""

    def __init__(
        self,
        app: Any,
        *,
        token: ApiToken,
        allowed: AllowedHosts,
        max_body: int = MAX_BODY,
        refusals: Refusals | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_streams: int = MAX_STREAMS,
        max_streams_per_token: int = MAX_STREAMS_PER_TOKEN,
    ):
        self.app = app
        self.token = token
        self.allowed = allowed
        self.max_body = max_body
        self.refusals = refusals or Refusals()
        self.body_timeout_s = body_timeout_s
        self.max_streams = max_streams
        self.max_streams_per_token = max_streams_per_token
        self._streams: dict[str, int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.get("state") or {}
        if state.get(STATE_POOL) == "health":
            send = _closing(send)  # one answer on a connection of the health pool
        req = _Req(scope, str(state.get(STATE_PEER) or peer_of(scope.get("client"), None)))
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or []:
            if k in headers and k in (b"host", b"authorization", b"content-length", b"origin", b"content-type"):
                await self._refuse(send, req, 400, "header", f"the {k.decode()} header is sent twice")
                return
            headers[k] = v
        path = req.path
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.allowed.permits(host):
            why = (
                f"this listener does not answer to Host {host[:100]!r}; it "
                f"answers to {self.allowed.describe()} (--api-host NAME adds a name)"
            )
            await self._refuse(send, req, 421, "host", why)
            return
        origin = headers.get(b"origin")
        if origin is not None and not self.allowed.permits_origin(origin.decode("latin-1")):
            await self._refuse(send, req, 403, "origin", "requests from web pages of another origin are refused")
            return
        if state.get(STATE_POOL) == "health" and path not in PUBLIC:
            why = (
                f"too many connections from {req.peer}: only /healthz and /metrics are answered on this one; "
                "close some, or retry later"
            )
            await self._refuse(send, req, 429, "connections", why, extra=[(b"retry-after", b"5")])
            return
        if path not in PUBLIC:
            auth = headers.get(b"authorization", b"")
            scheme, _, presented = auth.partition(b" ")
            why = ""
            if not auth or scheme.lower() != b"bearer":
                why = "no bearer token: send Authorization: Bearer TOKEN"
            elif not self.token.matches(presented.strip()):
                why = "wrong token"
            if why:
                bearer = [(b"www-authenticate", b'Bearer realm="reconciler"')]
                await self._refuse(send, req, 401, "token", why, action="authenticate", extra=bearer)
                return
            req.who = self.token.name
        if b"content-length" in headers or b"transfer-encoding" in headers:
            body = await self._read_body(headers, receive, send, req)
            if body is None:
                return
            receive = _replay(body, receive)
        if path == "/mcp" and req.method == "GET":
            await self._stream(scope, receive, send, req)
            return
        await self.app(scope, receive, send)

    async def _stream(self, scope: Any, receive: Any, send: Any, req: _Req) -> None:
        """An event stream (GET /mcp), within ``max_streams`` open in all and ``max_streams_per_token`` a token."""
        key = self.token.name
        total = sum(self._streams.values())
        if total >= self.max_streams or self._streams.get(key, 0) >= self.max_streams_per_token:
            why = (
                f"too many event streams open ({total}; at most {self.max_streams}, "
                f"{self.max_streams_per_token} a token): close one, or retry later"
            )
            await self._refuse(send, req, 429, "streams", why, extra=[(b"retry-after", b"30")])
            return
        self._streams[key] = self._streams.get(key, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._streams[key] -= 1

    async def _read_body(self, headers: dict[bytes, bytes], receive: Any, send: Any, req: _Req) -> bytes | None:
        """The whole body, strictly JSON when there is one; None once a refusal was answered (413, 408, 400)."""
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._refuse_body(send, req, 400, "header", "Content-Length is not a number")
                return None
            if int(length) > self.max_body:
                await self._refuse_body(send, req, 413, "body-size", f"request body over {self.max_body} bytes")
                return None
        chunks: list[bytes] = []
        size = 0
        try:
            with anyio_fail_after(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        await self._drain(receive, message, size)
                        why = f"request body over {self.max_body} bytes"
                        await self._refuse_body(send, req, 413, "body-size", why, close=True)
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            why = f"the body did not arrive within {self.body_timeout_s:.0f} s"
            await self._refuse_body(send, req, 408, "body-timeout", why, close=True)
            return None
        body = b"".join(chunks)
        if body.strip():
            # Every body here is JSON, read by one strict parser whatever the header says: the header must say
            # exactly that, once (a list of types, or a second header, would leave a reader to pick one).
            ctype = headers.get(b"content-type")
            media = (ctype or b"").split(b";")[0].strip().lower()
            if media != b"application/json":
                shown = ctype.decode("latin-1")[:100] if ctype is not None else "none"
                why = f"send the body as JSON with one header 'Content-Type: application/json', not {shown!r}"
                await self._refuse_body(send, req, 400, "content-type", why)
                return None
            try:
                strict_json(body)
            except _BadRequest as exc:
                await self._refuse_body(send, req, 400, "body-json", str(exc))
                return None
        return body

    async def _drain(self, receive: Any, message: dict[str, Any], size: int) -> None:
        """Read and drop the rest of an oversized body (up to 16 times the limit), so the 413 reaches the client
        instead of a reset from the unread data."""
        while message.get("more_body", False) and size <= 16 * self.max_body:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))

    async def _refuse_body(
        self, send: Any, req: _Req, status: int, reason: str, why: str, *, close: bool = False
    ) -> None:
        """A body refused before any route read it: audited as a refused call of its route (a destructive one by
        its name, /mcp as an MCP request)."""
        front, action = _BODY_ACTIONS.get(req.path, ("api", "request"))
        await self._refuse(
            send, req, status, reason, why, front=front, action=action, audit=f"bad request: {why}", close=close
        )

    async def _refuse(
        self,
        send: Any,
        req: _Req,
        status: int,
        reason: str,
        why: str,
        *,
        front: str = "api",
        action: str = "request",
        audit: str | None = None,
        extra: Sequence[tuple[bytes, bytes]] = (),
        close: bool = False,
    ) -> None:
        self.refusals.refuse(
            Refusal(
                status,
                reason,
                audit or why,
                req.peer,
                req.address,
                req.path,
                front=front,
                action=action,
                who=req.who,
            )
        )
        await _send_json(send, status, {"error": why}, extra=extra, close=close)


_BODY_ACTIONS = {"/v1/shm/reclaim": ("api", "shm-reclaim"), "/v1/apply": ("api", "apply"), "/mcp": ("mcp", "request")}


class _Req:
    """What the Guard knows of a request while it checks it."""

    def __init__(self, scope: Any, peer: str):
        self.path = str(scope.get("path", ""))[:200]
        self.method = str(scope.get("method", ""))
        self.peer = peer
        self.address = _address(scope.get("client"))
        self.who: str | None = None


def _closing(send: Any) -> Any:
    """``send`` with ``Connection: close`` on the answer."""

    async def closing(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing


def anyio_fail_after(seconds: float) -> Any:
    import anyio

    return anyio.fail_after(seconds)


def _replay(body: bytes, receive: Any) -> Callable[[], Awaitable[Any]]:
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_json(
    send: Any, status: int, body: dict[str, Any], *, extra: Sequence[tuple[bytes, bytes]] = (), close: bool = False
) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


# ---------------------------------------------------------------- request models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReclaimBody(_Strict):
    """POST /v1/shm/reclaim: the guarded cleanup of orphan offload files."""

    confirm: StrictBool = Field(False, description="remove the orphans (JSON true, nothing else); without it a dry run")
    paths: list[str] | None = Field(
        None, max_length=4096, description="remove nothing but these paths (from a dry run)"
    )


class ApplyBody(_Strict):
    """POST /v1/apply: carry out a plan saved by GET /v1/plan?save=true."""

    plan_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="from GET /v1/plan?save=true")


class _Query(BaseModel):
    # A query string carries text only: its values are read as pydantic reads text (save=true, save=1).
    model_config = ConfigDict(extra="forbid")


class PlanQuery(_Query):
    save: bool = Field(False, description="keep the plan; its plan_id is for POST /v1/apply")


class AuditQuery(_Query):
    since: str | None = Field(None, description="epoch seconds, an ISO time, or an age: 90s, 15m, 2h, 7d")


PROBE_RECIPE = r"^[a-z0-9][a-z0-9._-]{0,127}$"  # a recipe's name, as the loader accepts it
PROBE_SUITES = ("preflight", "regression", "all")


_PROBE_RECIPE = re.compile(PROBE_RECIPE[1:-1])  # fullmatch: '$' alone would let a trailing newline through


def probe_params(recipe: str | None, suite: str | None) -> tuple[str, str]:
    """``GET /v1/probe``'s query, checked before anything runs: a recipe name and a suite."""
    if not recipe or not _PROBE_RECIPE.fullmatch(recipe):
        raise _BadRequest("recipe: give the recipe's name (lowercase letters, digits and '._-'), e.g. ?recipe=omni")
    suite = suite or "preflight"
    if suite not in PROBE_SUITES:
        raise _BadRequest(f"suite: {suite!r} is not one of {', '.join(PROBE_SUITES)}")
    return recipe, suite


class ProbeQuery(_Query):
    recipe: str = Field(pattern=PROBE_RECIPE, description="the recipe's name (its file stem under configs/recipes/)")
    suite: Literal["preflight", "regression", "all"] = Field(
        "preflight", description="preflight (what every enter runs), regression (on demand) or all"
    )


class ErrorBody(BaseModel):
    """What a refused request gets (the command-line answers carry their own ``error`` object instead)."""

    error: str | dict[str, Any]
    problems: list[dict[str, Any]] | None = Field(None, description="422: each problem with path, line, message")


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _query(request: Request, model: type[BaseModel]) -> Any:
    params = request.query_params
    for key in params:
        if len(params.getlist(key)) > 1:
            raise _BadRequest(f"{key} is given more than once")
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        raise _BadRequest(_errors(exc)) from None


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()  # read whole and checked by the Guard already
    if not raw.strip():
        data: Any = {}
    else:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise _BadRequest(f"send the body as application/json, not {ctype}")
        data = strict_json(raw)
    if not isinstance(data, dict):
        raise _BadRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _BadRequest(_errors(exc)) from None


# ---------------------------------------------------------------- what the routes share


@dataclass
class AppContext:
    """Everything a route needs, on ``app.state.ctx``: the root, the caller's token, the loop's pass lock and the
    loop's metrics and health."""

    root: str
    token: ApiToken
    pass_lock: Any
    host: str | None = None
    log: Callable[..., None] | None = None
    metrics: Callable[[], bytes] | None = None
    health: Callable[[], tuple[int, dict[str, Any]]] | None = None
    cancel: threading.Event | None = None
    hooks: Any = None
    scrape: SharedScrape = field(default_factory=lambda: SharedScrape())

    def service(self, front: str) -> HostService:
        from reconciler.service import Caller, HostService

        kwargs: dict[str, Any] = {"hooks": self.hooks} if self.hooks is not None else {}
        return HostService(
            self.root,
            caller=Caller(front, self.token.name),
            pass_lock=PassGate(self.pass_lock, self.log, front),
            **kwargs,
        )

    def audit(self, record: dict[str, Any]) -> None:
        """One record in the host's audit trail (an audit that cannot be written is logged, never fatal here)."""
        if self.host is None:
            return
        from reconciler.store.audit import audit_log

        try:
            audit_log(self.host).append(record)
        except ReconcilerError as exc:
            if self.log:
                self.log("audit-error", error=str(exc))

    def refused_request(self, front: str, action: str, reason: str) -> None:
        """A destructive request refused before it reached the service (a bad body): audited with why."""
        self.audit({"front": front, "who": self.token.name, "action": action, "outcome": "refused", "reason": reason})


class SharedScrape:
    """``/metrics`` rendered in a worker thread, once for all the scrapes waiting for it: a scrape joins the next
    render to start (never one begun before it arrived, so it sees everything counted before it asked). A render
    takes tens of milliseconds; made in the event loop for each request, a few dozen clients asking for it over and
    over kept /healthz waiting for seconds."""

    def __init__(self) -> None:
        self._next: asyncio.Future[bytes] | None = None
        self._running = False

    async def get(self, render: Callable[[], bytes]) -> bytes:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            if not self._running:
                asyncio.get_running_loop().create_task(self._run(render))
        return await asyncio.shield(self._next)

    async def _run(self, render: Callable[[], bytes]) -> None:
        import anyio.to_thread

        while self._next is not None:
            fut, self._next = self._next, None
            self._running = True
            try:
                fut.set_result(await anyio.to_thread.run_sync(render))
            except Exception as exc:  # noqa: BLE001 - every scrape waiting for this render gets its error
                fut.set_exception(exc)
            finally:
                self._running = False


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx


def _answer(res: Any, *, write: bool) -> Response:
    from starlette.responses import JSONResponse

    from reconciler.base.redact import redact_data

    code = res.exit_code
    status = 409 if write and code != 0 else 200
    return JSONResponse(redact_data(res.to_json()), status_code=status, headers={"X-Reconciler-Exit-Code": str(code)})


async def _run(request: Request, call: Callable[[HostService], Any], *, write: bool = False) -> Response:
    """One service call in a worker thread, its result or error as the answer (never a traceback)."""
    import anyio.to_thread
    from starlette.responses import JSONResponse

    from reconciler.base.errors import ConfigError
    from reconciler.base.redact import redact_text

    ctx = _ctx(request)
    try:
        res = await anyio.to_thread.run_sync(lambda: call(ctx.service("api")))
    except ConfigError as exc:
        return JSONResponse(
            {
                "error": "invalid configuration",
                "problems": [{"path": p.path, "line": p.line, "message": redact_text(p.message)} for p in exc.problems],
            },
            status_code=422,
        )
    except ReconcilerError as exc:
        return JSONResponse({"error": redact_text(str(exc))}, status_code=409)
    except Exception as exc:  # noqa: BLE001 - an answer, never a traceback, and the loop goes on
        if ctx.log:
            ctx.log("api-error", path=request.url.path, error=f"{type(exc).__name__}: {exc}"[:300])
        return JSONResponse(
            {"error": f"internal error ({type(exc).__name__}); see the reconciler's log"}, status_code=500
        )
    return _answer(res, write=write)


def _bad(request: Request, exc: _BadRequest, *, action: str | None = None) -> Response:
    from starlette.responses import JSONResponse

    if action is not None:
        _ctx(request).refused_request("api", action, f"bad request: {exc}")
    return JSONResponse({"error": str(exc)}, status_code=400)


# ---------------------------------------------------------------- the routes, one function each


async def get_status(request: Request) -> Response:
    """``status --json``."""
    try:
        _query(request, _Query)
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.status())


async def get_plan(request: Request) -> Response:
    """``plan --json``; with ``save`` the plan is kept and its ``plan_id`` is for POST /v1/apply."""
    try:
        q = _query(request, PlanQuery)
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.plan(save=q.save))


async def get_shm(request: Request) -> Response:
    """``shm status --json`` (read-only)."""
    try:
        _query(request, _Query)
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.shm_status())


async def get_audit(request: Request) -> Response:
    """The audit trail, since a time when ``since`` is given (parsed like the command line's ``--since``)."""
    from reconciler.service import parse_since

    try:
        q = _query(request, AuditQuery)
        try:
            since = parse_since(q.since)
        except ValueError as exc:
            raise _BadRequest(f"since={q.since!r}: {exc}") from None
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.audit(since=since))


async def get_probe(request: Request) -> Response:
    """``probe RECIPE --suite SUITE --json``: one suite of a recipe's probes against its running lane."""
    try:
        recipe, suite = probe_params(request.query_params.get("recipe"), request.query_params.get("suite"))
        _query(request, ProbeQuery)  # and nothing else in the query
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.probe(recipe, suite=suite))


async def post_reclaim(request: Request) -> Response:
    """``shm reclaim --json``: a dry run unless ``confirm`` is JSON true."""
    try:
        body = await _body(request, ReclaimBody)
    except _BadRequest as exc:
        return _bad(request, exc, action="shm-reclaim")
    return await _run(request, lambda s: s.shm_reclaim(confirm=body.confirm, paths=body.paths), write=True)


async def post_apply(request: Request) -> Response:
    """Apply a plan saved by GET /v1/plan?save=true, exactly, or refuse it as stale."""
    try:
        body = await _body(request, ApplyBody)
    except _BadRequest as exc:
        return _bad(request, exc, action="apply")
    cancel = _ctx(request).cancel
    return await _run(request, lambda s: s.apply_saved(body.plan_id, cancel=cancel), write=True)


async def get_openapi(request: Request) -> Response:
    """This API as OpenAPI 3.1."""
    from starlette.responses import JSONResponse

    return JSONResponse(openapi())


async def get_metrics(request: Request) -> Response:
    """The loop's Prometheus metrics (no token: Prometheus scrapes it)."""
    from starlette.responses import JSONResponse, Response

    metrics = _ctx(request).metrics
    if metrics is None:
        return JSONResponse({"error": "no metrics here"}, status_code=404)
    from reconciler.loop.metrics import CONTENT_TYPE

    return Response(await _ctx(request).scrape.get(metrics), media_type=CONTENT_TYPE)


async def get_healthz(request: Request) -> Response:
    """200 after a recent pass that read every source, else 503 with why (no token: supervisors ask it)."""
    from starlette.responses import JSONResponse

    from reconciler.base.redact import redact_data

    health = _ctx(request).health
    if health is None:
        return JSONResponse({"ok": True})
    code, body = health()
    return JSONResponse(redact_data(body), status_code=code)


@dataclass(frozen=True)
class Endpoint:
    """One route: what serves it and what the OpenAPI document says of it."""

    path: str
    method: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    responses: dict[str, str] = field(default_factory=dict)
    command: bool = True  # answers with the command line's --json and its exit code
    public: bool = False


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/status", "GET", get_status, "status --json"),
    Endpoint("/v1/plan", "GET", get_plan, "plan --json (dry run)", query=PlanQuery),
    Endpoint("/v1/shm", "GET", get_shm, "shm status --json (read-only)"),
    Endpoint("/v1/audit", "GET", get_audit, "the audit trail", query=AuditQuery),
    Endpoint(
        "/v1/probe",
        "GET",
        get_probe,
        "probe RECIPE --suite SUITE --json: one suite of a recipe's functional "
        "probes against its running lane (read-only for the host; the run goes to the audit trail)",
        query=ProbeQuery,
    ),
    Endpoint(
        "/v1/shm/reclaim",
        "POST",
        post_reclaim,
        "shm reclaim --json: a dry run unless confirm",
        body=ReclaimBody,
        responses={"409": "refused or failed (the body says why)"},
    ),
    Endpoint(
        "/v1/apply",
        "POST",
        post_apply,
        "apply a saved plan; refused when stale",
        body=ApplyBody,
        responses={"409": "stale, blocked or failed (the body says which)"},
    ),
    Endpoint("/v1/openapi.json", "GET", get_openapi, "this description", command=False),
    Endpoint("/metrics", "GET", get_metrics, "Prometheus metrics (text exposition format)", command=False, public=True),
    Endpoint(
        "/healthz",
        "GET",
        get_healthz,
        "200 after a recent pass that read every source, else 503",
        command=False,
        public=True,
        responses={"503": "no recent pass, or a source unavailable"},
    ),
)


def openapi() -> dict[str, Any]:
    """This API as OpenAPI 3.1, generated from ``ENDPOINTS`` and their pydantic models."""
    ref = "#/components/schemas/{model}"
    schemas: dict[str, Any] = {}

    def schema_of(model: type[BaseModel]) -> dict[str, Any]:
        s = model.model_json_schema(ref_template=ref)
        schemas.update(s.pop("$defs", {}))
        return s

    error = {"description": "", "content": {"application/json": {"schema": {"$ref": ref.format(model="ErrorBody")}}}}
    schemas["ErrorBody"] = schema_of(ErrorBody)
    command = {"type": "object", "additionalProperties": True}
    paths: dict[str, Any] = {}
    for ep in ENDPOINTS:
        responses: dict[str, Any] = {}
        if ep.command:
            responses["200"] = {
                "description": "the command line's --json",
                "content": {"application/json": {"schema": command}},
                "headers": {
                    "X-Reconciler-Exit-Code": {
                        "schema": {"type": "integer"},
                        "description": "the command line's exit code",
                    }
                },
            }
        elif ep.path == "/metrics":
            responses["200"] = {
                "description": "text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        else:
            responses["200"] = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
        if not ep.public:
            responses["401"] = {**error, "description": "no token, or a wrong one"}
        responses["421"] = {**error, "description": "a Host header this listener does not answer to"}
        if ep.query is not None or ep.body is not None:
            responses["400"] = {**error, "description": "a bad request: the error says which field and why"}
        if ep.body is not None:
            responses["413"] = {**error, "description": f"a body over {MAX_BODY} bytes"}
        if ep.command:
            responses["422"] = {**error, "description": "the configuration is invalid (problems with file:line)"}
        for code, text in ep.responses.items():
            # A refused or failed command answers its own --json (409); /healthz its report either way (503).
            answer = {"409": command, "503": {"type": "object"}}.get(code)
            responses[code] = (
                {"description": text, "content": {"application/json": {"schema": answer}}}
                if answer is not None
                else {**error, "description": text}
            )
        op: dict[str, Any] = {"summary": ep.summary, "operationId": ep.handler.__name__, "responses": responses}
        if ep.public:
            op["security"] = []
        if ep.query is not None:
            q = schema_of(ep.query)
            required = set(q.get("required", []))
            op["parameters"] = [
                {
                    "name": name,
                    "in": "query",
                    "required": name in required,
                    "schema": {k: v for k, v in prop.items() if k not in ("description", "title")},
                    **({"description": prop["description"]} if "description" in prop else {}),
                }
                for name, prop in q.get("properties", {}).items()
            ]
        if ep.body is not None:
            name = ep.body.__name__
            schemas[name] = schema_of(ep.body)
            op["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": {"$ref": ref.format(model=name)}}},
            }
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    paths["/mcp"] = {
        "post": {
            "summary": "MCP (streamable HTTP): host_status, host_plan, host_shared_memory, host_probe, host_manage",
            "operationId": "mcp",
            "responses": {
                "200": {"description": "a JSON-RPC answer"},
                "401": {**error, "description": "no token, or a wrong one"},
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "reconciler",
            "version": _version(),
            "description": "The HTTP API of `reconciler run`: the same guarded operations as the command line.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": schemas},
        "security": [{"bearer": []}],
        "paths": paths,
    }


def _version() -> str:
    from reconciler import __version__

    return __version__


def build_app(
    root: str,
    *,
    token: ApiToken,
    pass_lock: Any,
    bind_host: str = "127.0.0.1",
    port: int = 0,
    api_hosts: Sequence[str] = (),
    host: str | None = None,
    log: Callable[..., None] | None = None,
    metrics: Callable[[], bytes] | None = None,
    health: Callable[[], tuple[int, dict[str, Any]]] | None = None,
    cancel: threading.Event | None = None,
    max_body: int = MAX_BODY,
    hooks: Any = None,
    on_refusal: Callable[[int, str], None] | None = None,
    on_drop: Callable[[str], None] | None = None,
) -> Any:
    """The ASGI app (the ``Guard`` around Starlette): ``ENDPOINTS``, and MCP at /mcp. ``host``: the host's name, for
    the audit records of refused requests; ``port``: the listener's (the Host check); ``on_refusal(status, reason)``
    and ``on_drop(reason)``: the metrics of refused requests and dropped connections."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from reconciler.mcp_server import build_server

    ctx = AppContext(
        root, token, pass_lock, host=host, log=log, metrics=metrics, health=health, cancel=cancel, hooks=hooks
    )
    allowed = AllowedHosts.of(bind_host, port, api_hosts)
    mcp = build_server(
        lambda: ctx.service("mcp"), on_refused=lambda reason: ctx.refused_request("mcp", "host_manage", reason)
    )
    mcp_app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        transport_security=allowed.mcp_security(),
        host=bind_host,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    app = Starlette(
        routes=[*(Route(ep.path, ep.handler, methods=[ep.method]) for ep in ENDPOINTS), *mcp_app.routes],
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    refusals = Refusals(log=log, audit=ctx.audit, on_count=on_refusal, on_drop=on_drop)
    return Guard(app, token=token, allowed=allowed, max_body=max_body, refusals=refusals)


# ---------------------------------------------------------------- serving it, and keeping it served


def raise_nofile(log: Callable[..., None] | None = None, *, want: int = 65536) -> int:
    """Raise the soft open-file limit towards the hard one (at most ``want``); the soft limit now. With the common
    default of 1,024, a thousand idle connections took every descriptor the process had."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            if log:
                log(
                    "nofile-raised", soft=target, was=soft, hard="unlimited" if hard == resource.RLIM_INFINITY else hard
                )
            return target
        except (ValueError, OSError) as exc:
            if log:
                log("nofile-unchanged", soft=soft, hard=hard, error=str(exc))
    return soft if soft != resource.RLIM_INFINITY else want


def connection_cap(nofile: int) -> int:
    """The listener's share of the open-file limit: a quarter of it, within 16 .. ``MAX_CONNECTIONS``."""
    return max(16, min(MAX_CONNECTIONS, nofile // 4))


def peer_cap(max_connections: int) -> int:
    """The connections one peer may hold: a ``PEER_SHARE``-th of the listener's, at least 4."""
    return max(4, max_connections // PEER_SHARE)


def guarded_protocol(
    *,
    max_connections: int,
    head_timeout_s: float,
    per_peer: int | None = None,
    health_slots: int = HEALTH_SLOTS,
    health_per_peer: int = HEALTH_PER_PEER,
    health_timeout_s: float = HEALTH_TIMEOUT_S,
    write_timeout_s: float = WRITE_TIMEOUT_S,
    refusals: Refusals | None = None,
    peer: Callable[[Any, Any], str] = peer_of,
) -> type:
    """uvicorn's h11 protocol with the bounds it lacks:

    - a connection must send a complete request head within ``head_timeout_s`` (after connecting, and after each
      answer);
    - each peer (``peer_of``) holds at most ``per_peer`` connections and all of them ``max_connections``; past
      either, the oldest idle connection of that peer (or of any, for the total) is closed for the new one;
    - past them with none idle, the connection joins the health pool (``health_slots``, ``health_per_peer`` a
      peer): one request for /healthz or /metrics (others are refused, 429), head and answer within
      ``health_timeout_s``; past that pool too it is closed at once (429, counted);
    - an answer the client does not take (the bytes waiting for it not gone down in ``write_timeout_s``) drops its
      connection: a connection in the middle of an answer is never idle, so without this a client that never
      reads held its connection, and its share of the bounds, for good."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    cap = per_peer or peer_cap(max_connections)
    pools: dict[str, dict[str, int]] = {"main": {}, "health": {}}
    sweeping: list[bool] = []

    def count(pool: str, who: str, n: int) -> None:
        held = pools[pool]
        held[who] = held.get(who, 0) + n
        if held[who] <= 0:
            del held[who]

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _since = 0.0
        _peer = "?"
        _pool: str | None = None  # "main" | "health"; None once released
        _stall: float | None = None  # since when the bytes waiting to be sent have not gone down
        _waiting = 0
        _after_drain = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            # Writing pauses as soon as a byte waits beyond the kernel's buffer, and resumes once none does.
            transport.set_write_buffer_limits(high=0)
            self._since = self.loop.time()
            self._peer = peer(self.client, self.server)
            pool = self._admit()
            if pool is None:
                transport.abort()
                if refusals is not None:
                    refusals.refuse(
                        Refusal(
                            429,
                            "connections",
                            f"too many connections from {self._peer} (at most {cap}, and {health_per_peer} "
                            "more for /healthz and /metrics): closed at once",
                            self._peer,
                            _address(self.client),
                        )
                    )
                return
            self._pool = pool
            count(pool, self._peer, 1)
            self.app_state = {**self.app_state, STATE_PEER: self._peer, STATE_POOL: pool}
            if not sweeping:
                sweeping.append(True)
                self.loop.call_later(1.0, _sweep, self.loop, self.connections)
            self._arm()

        def _admit(self) -> str | None:
            main = pools["main"]
            others = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)]
            if main.get(self._peer, 0) >= cap:
                idle = [c for c in others if c._pool == "main" and c._peer == self._peer and c._idle()]
            elif sum(main.values()) >= max_connections:
                idle = [c for c in others if c._pool == "main" and c._idle()]
            else:
                return "main"
            if idle:
                min(idle, key=lambda c: c._since)._drop("evicted")
                return "main"
            held = pools["health"]
            if sum(held.values()) < health_slots and held.get(self._peer, 0) < health_per_peer:
                return "health"
            return None

        def _release(self) -> None:
            if self._pool is not None:
                count(self._pool, self._peer, -1)
                self._pool = None

        def _drop(self, reason: str) -> None:
            self._release()
            self._disarm()
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                # A reset, and the kernel's buffer freed with it: closed plainly, the kernel would keep trying to
                # send what a client that never reads will not take, and that client would see its connection open.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()
            if refusals is not None:
                refusals.connection_dropped(reason)

        def _check_write(self, now: float) -> None:
            """Called every second: drop the connection once its waiting bytes have not gone down for too long."""
            if self._pool is None or self.transport is None:
                return
            waiting = self.transport.get_write_buffer_size()
            if waiting == 0:
                self._stall = None
            elif self._stall is None or waiting < self._waiting:
                self._stall = now
            elif now - self._stall >= (health_timeout_s if self._pool == "health" else write_timeout_s):
                self._drop("write-timeout")
            self._waiting = waiting

        def _idle(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(getattr(cycle, "response_complete", True))

        def _arm(self) -> None:
            self._disarm()
            wait = health_timeout_s if self._pool == "health" else head_timeout_s
            self._head_timer = self.loop.call_later(wait, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self._idle() and not self.transport.is_closing():
                self.transport.close()  # what is still waiting to be sent goes, or the write deadline drops it

        def on_response_complete(self) -> None:
            if self.flow is not None and self.flow.write_paused and not self.transport.is_closing():
                # The answer is not taken yet: a request pipelined behind it waits (a client that never reads gets
                # one answer made, not one for every request it sent), and the write deadline runs.
                self._after_drain = True
                return
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._after_drain:
                self._after_drain = False
                self.on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            self._disarm()
            super().connection_lost(exc)

    def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for c in list(connections):
            if isinstance(c, GuardedH11Protocol):
                c._check_write(now)
        loop.call_later(1.0, _sweep, loop, connections)

    return GuardedH11Protocol


class LogBridge:
    """A ``logging.Handler`` for the libraries' own log records (uvicorn, asyncio, the MCP SDK): into the loop's log
    (escaped and redacted like every line), never raising. Installed on the root logger before the MCP server is
    built, so the SDK's rich console handler (which imports modules while handling an error, and so raised again
    when no descriptor was left) is never installed."""

    def __init__(self, log: Callable[..., None]):
        import logging

        limit = _RateLimit(30)  # a client sending garbage makes uvicorn warn each time: the log is not its to fill

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    ok, suppressed = limit.take()
                    if not ok:
                        return
                    log(
                        "library-log",
                        logger=record.name,
                        level=record.levelname.lower(),
                        message=record.getMessage()[:500],
                        suppressed_before=suppressed,
                        **({"error": repr(record.exc_info[1])[:300]} if record.exc_info else {}),
                    )
                except Exception:  # noqa: BLE001 - a log record that cannot be written must not end its thread
                    self.handleError(record)

            def handleError(self, record: logging.LogRecord) -> None:
                return  # nowhere safer to report it than the log that just failed

        self.handler = _Handler(level=logging.WARNING)

    def install(self) -> None:
        import logging

        root = logging.getLogger()
        if self.handler not in root.handlers:
            root.addHandler(self.handler)
        if root.level > logging.WARNING or root.level == logging.NOTSET:
            root.setLevel(logging.WARNING)


class Listener:
    """uvicorn serving ``app`` on an already bound socket, in a daemon thread, with an event loop whose errors are
    logged (``http-loop-error``, rate-limited) and never end it: an ``accept`` that fails for want of descriptors
    (EMFILE) is retried by asyncio a second later."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        log: Callable[..., None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ):
        import uvicorn

        self.sock = sock
        self.log = log
        self.refusals: Refusals | None = getattr(app, "refusals", None)  # the Guard's: one account per listener
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ws="none",
            # No limit_concurrency: uvicorn counts open connections in it, so idle ones would turn every scrape into
            # a 503. Connections are bounded by the protocol below; the work of requests by the worker threads
            # (anyio's pool) that run the service calls.
            timeout_graceful_shutdown=3,
            timeout_keep_alive=int(KEEP_ALIVE_S),
            backlog=BACKLOG,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            http=guarded_protocol(
                max_connections=max_connections, head_timeout_s=HEAD_TIMEOUT_S, refusals=self.refusals
            ),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self.error: BaseException | None = None
        self.stopping = False
        self._errors = _RateLimit(5)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        try:
            exc = context.get("exception")
            ok, suppressed = self._errors.take()
            if not ok or self.log is None:
                return
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
                self.log(
                    "http-accept-failed",
                    error=exc.strerror or str(exc),
                    suppressed_before=suppressed,
                    action=f"new connections wait a second; idle ones are closed after {HEAD_TIMEOUT_S:.0f} s",
                )
            else:
                self.log(
                    "http-loop-error",
                    message=str(context.get("message", ""))[:300],
                    error=repr(exc)[:300] if exc else "-",
                    suppressed_before=suppressed,
                )
        except Exception:  # noqa: BLE001 - asyncio's handler of last resort: raising here ended the listener
            return

    async def _main(self) -> None:
        asyncio.get_running_loop().set_exception_handler(self._loop_error)
        await self.server.serve(sockets=[self.sock])

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by start() and by the supervisor
            self.error = exc

    def start(self, timeout: float = 15.0) -> Listener:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self.sock.close()
                raise ApiSetupError(f"the HTTP listener did not start: {self.error or 'timed out'}")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def shutdown(self) -> None:
        self.stopping = True
        self.server.should_exit = True
        self.thread.join(timeout=5)
        if self.refusals is not None:
            self.refusals.flush()
        with contextlib.suppress(OSError):
            self.sock.close()


class Supervisor:
    """The listener of ``reconciler run``, kept serving: a listener whose thread ends while the loop runs is logged
    (``http-listener-died``), counted (``on_restart``) and started again on the same address with a fresh app; past
    ``RESTARTS_PER_HOUR`` restarts ``on_fatal`` is called (the loop then exits 1, for systemd to restart it)."""

    def __init__(
        self,
        make_app: Callable[[int], Any],
        host: str,
        port: int,
        *,
        log: Callable[..., None],
        on_restart: Callable[[], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        check_every_s: float = 1.0,
    ):
        self.make_app = make_app
        self.host = host
        self.log = log
        self.on_restart = on_restart
        self.on_fatal = on_fatal
        self.check_every_s = check_every_s
        self._stop = threading.Event()
        self._restarts: list[float] = []
        LogBridge(log).install()
        self.max_connections = connection_cap(raise_nofile(log))
        sock = bind(host, port)
        try:
            self.listener = Listener(
                make_app(sock.getsockname()[1]), sock, log=log, max_connections=self.max_connections
            )
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]

    def start(self) -> Supervisor:
        self.listener.start()
        threading.Thread(target=self._watch, name="http-watch", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.check_every_s):
            current = self.listener
            if current.thread.is_alive() or current.stopping:
                continue
            why = repr(current.error)[:300] if current.error else "its thread ended"
            now = time.monotonic()
            self._restarts = [t for t in self._restarts if now - t < 3600] + [now]
            if len(self._restarts) > RESTARTS_PER_HOUR:
                self.log("http-listener-died", error=why, action="giving up: exiting 1 for the supervisor to restart")
                if self.on_fatal:
                    self.on_fatal(why)
                return
            self.log("http-listener-died", error=why, action="starting it again", restarts=len(self._restarts))
            if self.on_restart:
                self.on_restart()
            with contextlib.suppress(OSError):
                current.sock.close()
            try:
                sock = bind(self.host, self.port)
                self.listener = Listener(
                    self.make_app(self.port), sock, log=self.log, max_connections=self.max_connections
                ).start()
                self.log("http-listener-restarted", port=self.port)
            except (OSError, ReconcilerError) as exc:
                self.log(
                    "http-listener-died",
                    error=str(exc)[:300],
                    action="giving up: exiting 1 for the supervisor to restart",
                )
                if self.on_fatal:
                    self.on_fatal(str(exc))
                return

    def alive(self) -> bool:
        return self.listener.thread.is_alive()

    def shutdown(self) -> None:
        self._stop.set()
        self.listener.shutdown()
