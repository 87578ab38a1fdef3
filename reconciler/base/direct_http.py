"""HTTP to a lane's own endpoints (health, probes, drain metrics): straight to the URL, never through a proxy named by
http_proxy/HTTP_PROXY in the environment (a proxy would answer, or fail, for a server it is not), and never to
another URL a redirect names: a 3xx is an answer of its own (an error), so a health URL that redirects to another
address never counts as healthy.

The opener is built on first use, so commands that probe nothing do not import urllib.request and http.client. An
opener given an ``ssl.SSLContext`` verifies an https:// peer with it (a fleet host's CA).
"""

from __future__ import annotations

import functools
from typing import Any


def opener(context: Any = None) -> Any:
    """The opener (one for all when ``context`` is None; a new one with that TLS context else)."""
    return _opener() if context is None else _build(context)


@functools.cache
def _opener() -> Any:
    return _build(None)


def _build(context: Any) -> Any:
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # urllib then raises HTTPError with the 3xx status

    tls = [urllib.request.HTTPSHandler(context=context)] if context is not None else []
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirects(), *tls)


def errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises: refused, reset, timed out, or an answer that is not HTTP."""
    import http.client
    import urllib.error

    return (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)
