"""What answers a lane's URLs: whether its health URL answers 2xx, and what (if anything) listens at a URL.

Never through a proxy (``reconciler.base.direct_http``). Called by the enter's waits and preflight
(``reconciler.apply.enter``) and the drain (``reconciler.apply.drain``) through the host's I/O seams
(``HostIO.lanes``: ``health_ok`` and ``answer``).
"""

from __future__ import annotations

import socket

from reconciler.base import direct_http


def _http_ok(url: str) -> bool:
    """The health URL answers 2xx (never through a proxy: reconciler.base.direct_http)."""
    try:
        with direct_http.opener().open(url, timeout=1.0) as resp:
            return 200 <= resp.status < 300
    except direct_http.errors():
        return False


def _http_answer(url: str, *, timeout: float = 1.0) -> str | None:
    """What answers ``url`` now, in words ("HTTP 200", "HTTP 404", a connection that says nothing), or None when
    nothing listens there (the connection is refused, the host is unknown or unreachable). Never via a proxy."""
    import urllib.error  # on first use, as direct_http's opener (the start-up budget)
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError:
        return None  # refused, unreachable, unknown host, or no answer to the connect: nothing listens
    try:
        with direct_http.opener().open(url, timeout=timeout) as resp:
            return f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except direct_http.errors() as exc:
        reason = getattr(exc, "reason", exc)
        return f"a listener on port {port} that accepts connections ({type(reason).__name__})"
