"""What the listener refused, counted, logged and audited within bounds: ``Refusal`` (one refused request or
connection), ``Refusals`` (the account: every refusal counted, each peer's logged and audited at most
``REFUSALS_AUDITED`` a ``REFUSAL_WINDOW_S``, the rest summed up when the window ends) and ``_RateLimit`` (a burst a
window, for the listener's own log lines).

Called by the guard and the protocol (``refuse``, ``connection_dropped``) and by the listener (``flush`` when it
stops).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.api.limits import REFUSAL_PEERS, REFUSAL_WINDOW_S, REFUSALS_AUDITED


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
