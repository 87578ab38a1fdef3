"""The ASGI middleware in front of every route (``Guard``): ``Host:``/``Origin:``, the bearer token on every path
but ``PUBLIC`` and the status page's (``reconciler.api.page.paths``: its own session cookie) and the token's scope
for the route (``reconciler.api.scopes``: a read token on a write route is 403), the event streams within their
bounds, and the body read whole within its limits and parsed strictly as JSON, whatever its headers
say (a form on the page's paths); every refusal answered as JSON and given to the ``Refusals`` account.

Built around the Starlette app by ``reconciler.api.build_app``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from reconciler.api.errors import _BadRequest
from reconciler.api.hosts import AllowedHosts
from reconciler.api.limits import (
    BODY_TIMEOUT_S,
    MAX_BODY,
    MAX_STREAMS,
    MAX_STREAMS_PER_TOKEN,
    STATE_CALLER,
    STATE_PEER,
    STATE_POOL,
)
from reconciler.api.page.paths import FORM_TYPE, is_page_path
from reconciler.api.peers import _address, peer_of
from reconciler.api.refusals import Refusal, Refusals
from reconciler.api.request_models import strict_json
from reconciler.api.scopes import needed, refusal
from reconciler.api.tokens import PUBLIC, Tokens


class Guard:
    """Pure ASGI middleware in front of every route: ``Host:``/``Origin:``, a bearer token on every path but
    ``public`` (``PUBLIC``; under TLS /healthz alone) and its scope for the route, the event streams within their
    bounds, and the body read whole within its limits and parsed strictly as JSON, whatever its headers say. Every
    refusal goes to ``refusals``."""

    def __init__(
        self,
        app: Any,
        *,
        tokens: Tokens,
        allowed: AllowedHosts,
        public: frozenset[str] = PUBLIC,
        max_body: int = MAX_BODY,
        refusals: Refusals | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_streams: int = MAX_STREAMS,
        max_streams_per_token: int = MAX_STREAMS_PER_TOKEN,
    ):
        self.app = app
        self.tokens = tokens
        self.public = public
        self.allowed = allowed
        self.max_body = max_body
        self.refusals = refusals or Refusals()
        self.body_timeout_s = body_timeout_s
        self.max_streams = max_streams
        self.max_streams_per_token = max_streams_per_token
        self._streams: dict[str, int] = {}
        self.tls: Any = None  # the listener's TlsFiles (reconciler.api.tls), read by its Listener

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
        # The status page's paths check their own session cookie (a login form gives it), never a bearer token.
        page = is_page_path(path)
        auth = headers.get(b"authorization", b"")
        if path not in self.public and not page and not await self._authorized(scope, send, req, auth):
            return
        if b"content-length" in headers or b"transfer-encoding" in headers:
            body = await self._read_body(headers, receive, send, req, form=page)
            if body is None:
                return
            receive = _replay(body, receive)
        if path == "/mcp" and req.method == "GET":
            await self._stream(scope, receive, send, req)
            return
        await self.app(scope, receive, send)

    async def _authorized(self, scope: Any, send: Any, req: _Req, auth: bytes) -> bool:
        """Whether the request's bearer token is one of the listener's, of a scope its route allows; else the
        refusal answered (401, or 403 naming the scope). The token's name goes to the routes as the caller."""
        scheme, _, presented = auth.partition(b" ")
        token = self.tokens.match(presented.strip()) if auth and scheme.lower() == b"bearer" else None
        if token is None:
            why = (
                "wrong token"
                if auth and scheme.lower() == b"bearer"
                else "no bearer token: send Authorization: Bearer TOKEN"
            )
            bearer = [(b"www-authenticate", b'Bearer realm="reconciler"')]
            await self._refuse(send, req, 401, "token", why, action="authenticate", extra=bearer)
            return False
        req.who = token.name
        need = needed(req.method, req.path)
        if not token.allows(need):
            why = refusal(token.scope, req.method, req.path)
            await self._refuse(
                send, req, 403, "scope", why, action="authorize", fields={"scope": token.scope, "needs": need}
            )
            return False
        scope.setdefault("state", {})[STATE_CALLER] = token
        return True

    async def _stream(self, scope: Any, receive: Any, send: Any, req: _Req) -> None:
        """An event stream (GET /mcp), within ``max_streams`` open in all and ``max_streams_per_token`` a token."""
        key = req.who or "-"
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

    async def _read_body(
        self, headers: dict[bytes, bytes], receive: Any, send: Any, req: _Req, *, form: bool = False
    ) -> bytes | None:
        """The whole body, strictly JSON when there is one (a form for the status page's paths: ``form``); None
        once a refusal was answered (413, 408, 400)."""
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
            with anyio.fail_after(self.body_timeout_s):
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
        if body.strip() and form:
            ctype = headers.get(b"content-type")
            if (ctype or b"").split(b";")[0].strip().lower() != FORM_TYPE:
                shown = ctype.decode("latin-1")[:100] if ctype is not None else "none"
                why = f"the page's forms are sent as {FORM_TYPE.decode()}, not {shown!r}"
                await self._refuse_body(send, req, 400, "content-type", why)
                return None
        elif body.strip():
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
        fields: dict[str, str] | None = None,
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
        await _send_json(send, status, {"error": why, **(fields or {})}, extra=extra, close=close)


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
