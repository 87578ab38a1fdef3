"""The page's sessions: the API token given once on the login form becomes a random session id in an ``HttpOnly``,
``SameSite=Strict`` cookie (``Secure`` when the listener is reached over TLS), never a token in a URL; each session
has the scope of the token it was opened with (one opened with the read token changes nothing), its own CSRF token
that every form of the page carries, and a message to show once after an action.

Kept in memory by the listener's app (a restarted listener asks for the token again). Used by
``reconciler.api.page.handlers``.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

COOKIE = "reconciler_session"
SESSION_TTL_S = 12 * 3600.0  # a session ends this long after the login
MAX_SESSIONS = 64  # past them the oldest session ends


@dataclass
class Session:
    sid: str
    who: str  # the token's name: the caller of the audit trail
    csrf: str
    created: float
    flash: dict[str, Any] | None = None
    scope: str = "write"  # the token's: "read" is refused every action reconciler.api.scopes calls a write

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


@dataclass
class Sessions:
    ttl_s: float = SESSION_TTL_S
    limit: int = MAX_SESSIONS
    _by_id: dict[str, Session] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, who: str, *, scope: str) -> Session:
        s = Session(secrets.token_urlsafe(32), who, secrets.token_urlsafe(32), time.monotonic(), scope=scope)
        with self._lock:
            self._expire()
            while len(self._by_id) >= self.limit:
                oldest = min(self._by_id.values(), key=lambda x: x.created)
                del self._by_id[oldest.sid]
            self._by_id[s.sid] = s
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            self._expire()
            return self._by_id.get(sid)

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self._by_id.items() if now - s.created > self.ttl_s]:
            del self._by_id[sid]


def cookie_header(sid: str, *, secure: bool, clear: bool = False) -> str:
    """The ``Set-Cookie`` value of a session (or of its end: ``clear``)."""
    value = "" if clear else sid
    parts = [f"{COOKIE}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if clear:
        parts.append("Max-Age=0")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)
