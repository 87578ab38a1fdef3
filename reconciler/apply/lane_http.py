"""Plain HTTP to a lane's own port on this host, never through a proxy named in the environment (a proxy would
answer, or fail, for a server it is not): one request and its answer, and how an answer is quoted in a reason.

Called by the functional probes (``reconciler.apply.probes``, ``reconciler.apply.probe_answers``) and by the reader
of vLLM's metrics (``reconciler.apply.vllm_metrics``).
"""

from __future__ import annotations

import json
from typing import Any

from reconciler.base import direct_http

SHOWN = 200  # characters of an answer quoted in a reason


def quote(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return repr(text if len(text) <= SHOWN else text[:SHOWN] + "…")


def body_text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


class Answer:
    def __init__(self, status: int, body: bytes, ctype: str):
        self.status = status
        self.body = body
        self.ctype = ctype


def request(url: str, payload: dict[str, Any] | None, timeout: float) -> Answer:
    # The start-up budget: urllib.request (http.client, email, ssl) is loaded by the first request to a lane, as
    # direct_http's opener is, not by every command that imports the apply layer.
    import urllib.error
    import urllib.request

    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")  # noqa: S310 - the recipe's own URL: http(s) on loopback (model.check_probe_url)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:
            return Answer(resp.status, resp.read(), resp.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(), exc.headers.get("Content-Type", "") if exc.headers else "")
