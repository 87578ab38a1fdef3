"""The connection-level bounds of the listener: ``guarded_protocol`` (uvicorn's h11 protocol with a deadline for the
request head, a share of the connections a peer and a cap in all, the health pool past them, and a deadline for
an answer the client does not take), and the figures it is built with (``raise_nofile``, ``connection_cap``,
``peer_cap``).

Called by the listener (``reconciler.api.listener``) for each uvicorn server it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from reconciler.api.limits import (
    HEALTH_PER_PEER,
    HEALTH_SLOTS,
    HEALTH_TIMEOUT_S,
    MAX_CONNECTIONS,
    PEER_SHARE,
    STATE_PEER,
    STATE_POOL,
    WRITE_TIMEOUT_S,
)
from reconciler.api.peers import _address, peer_of
from reconciler.api.refusals import Refusal, Refusals


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


@dataclass(frozen=True)
class _Bounds:
    """The figures one listener's protocol is built with (``guarded_protocol``'s arguments)."""

    max_connections: int
    head_timeout_s: float
    per_peer: int
    health_slots: int
    health_per_peer: int
    health_timeout_s: float
    write_timeout_s: float
    refusals: Refusals | None
    peer: Callable[[Any, Any], str]


class _Pools:
    """The connections one listener holds, by pool ("main" | "health") and by peer; and whether its sweep of the
    write deadlines runs."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, int]] = {"main": {}, "health": {}}
        self.sweeping = False

    def count(self, pool: str, who: str, n: int) -> None:
        held = self.held[pool]
        held[who] = held.get(who, 0) + n
        if held[who] <= 0:
            del held[who]

    def of(self, pool: str, who: str) -> int:
        return self.held[pool].get(who, 0)

    def total(self, pool: str) -> int:
        return sum(self.held[pool].values())


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of ``guarded_protocol``; each listener has a subclass of its own, with
    its ``bounds`` and its ``pools``."""

    bounds: ClassVar[_Bounds]
    pools: ClassVar[_Pools]
    _head_timer: asyncio.TimerHandle | None = None
    _since = 0.0
    _peer = "?"
    _pool: str | None = None  # "main" | "health"; None once released
    _stall: float | None = None  # since when the bytes waiting to be sent have not gone down
    _waiting = 0
    _after_drain = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # Writing pauses as soon as a byte waits beyond the kernel's buffer, and resumes once none does. asyncio's TLS
        # transport pauses at a size >= high (its plain one at > high): high=0 there paused every answer for good.
        tls = transport.get_extra_info("ssl_object") is not None
        transport.set_write_buffer_limits(high=1 if tls else 0)
        self._since = self.loop.time()
        self._peer = self.bounds.peer(self.client, self.server)
        pool = self._admit()
        if pool is None:
            transport.abort()
            self._refuse_full()
            return
        self._pool = pool
        self.pools.count(pool, self._peer, 1)
        self.app_state = {**self.app_state, STATE_PEER: self._peer, STATE_POOL: pool}
        if not self.pools.sweeping:
            self.pools.sweeping = True
            self.loop.call_later(1.0, _sweep, self.loop, self.connections)
        self._arm()

    def _refuse_full(self) -> None:
        """A connection past every bound, closed at once: counted (429) like a refused request."""
        b = self.bounds
        if b.refusals is not None:
            b.refusals.refuse(
                Refusal(
                    429,
                    "connections",
                    f"too many connections from {self._peer} (at most {b.per_peer}, and {b.health_per_peer} "
                    "more for /healthz and /metrics): closed at once",
                    self._peer,
                    _address(self.client),
                )
            )

    def _admit(self) -> str | None:
        b, pools = self.bounds, self.pools
        others = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)]
        if pools.of("main", self._peer) >= b.per_peer:
            idle = [c for c in others if c._pool == "main" and c._peer == self._peer and c._idle()]
        elif pools.total("main") >= b.max_connections:
            idle = [c for c in others if c._pool == "main" and c._idle()]
        else:
            return "main"
        if idle:
            min(idle, key=lambda c: c._since)._drop("evicted")
            return "main"
        if pools.total("health") < b.health_slots and pools.of("health", self._peer) < b.health_per_peer:
            return "health"
        return None

    def _release(self) -> None:
        if self._pool is not None:
            self.pools.count(self._pool, self._peer, -1)
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
        if self.bounds.refusals is not None:
            self.bounds.refusals.connection_dropped(reason)

    def _check_write(self, now: float) -> None:
        """Called every second: drop the connection once its waiting bytes have not gone down for too long."""
        if self._pool is None or self.transport is None:
            return
        waiting = self.transport.get_write_buffer_size()
        b = self.bounds
        if waiting == 0:
            self._stall = None
        elif self._stall is None or waiting < self._waiting:
            self._stall = now
        elif now - self._stall >= (b.health_timeout_s if self._pool == "health" else b.write_timeout_s):
            self._drop("write-timeout")
        self._waiting = waiting

    def _idle(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is None or bool(getattr(cycle, "response_complete", True))

    def _arm(self) -> None:
        self._disarm()
        wait = self.bounds.health_timeout_s if self._pool == "health" else self.bounds.head_timeout_s
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
    """Every second while the listener serves: each connection's write deadline."""
    now = loop.time()
    for c in list(connections):
        if isinstance(c, GuardedH11Protocol):
            c._check_write(now)
    loop.call_later(1.0, _sweep, loop, connections)


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
    bounds = _Bounds(
        max_connections=max_connections,
        head_timeout_s=head_timeout_s,
        per_peer=per_peer or peer_cap(max_connections),
        health_slots=health_slots,
        health_per_peer=health_per_peer,
        health_timeout_s=health_timeout_s,
        write_timeout_s=write_timeout_s,
        refusals=refusals,
        peer=peer,
    )

    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"bounds": bounds, "pools": _Pools()})
