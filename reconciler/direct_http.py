"""HTTP to a lane's own endpoints (health, probes, drain metrics): straight to the URL, never through a proxy named by
http_proxy/HTTP_PROXY in the environment (a proxy would answer, or fail, for a server it is not).

The opener is built on first use, so commands that probe nothing do not import urllib.request and http.client.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def opener() -> Any:
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def errors() -> tuple[type[BaseException], ...]:
    """What a failed request raises: refused, reset, timed out, or an answer that is not HTTP."""
    import http.client
    import urllib.error

    return (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)
