"""The HTTP JSON API of ``reconciler run``, with MCP at ``/mcp``, ``/metrics`` and ``/healthz`` on one listener.

A Starlette app served by uvicorn in a thread of the loop (``Supervisor``), a thin front-end over the service layer
(``reconciler.service``) like the command line and ``reconciler mcp``. The routes (``ENDPOINTS``), each one function
of ``routes`` with its request model, and the OpenAPI document at ``/v1/openapi.json`` generated from them:

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
    GET  /, /page/...        the host's status page (``reconciler.api.page``): a login form turns the token into a
                             session cookie; its forms POST with a CSRF token

Each answer's body is exactly the command line's ``--json`` (redacted once more on its way out); the command's exit
code rides in ``X-Reconciler-Exit-Code``. A POST whose command would exit non-zero (a refused reclaim, a stale or
blocked apply) answers 409 with the same body; an invalid configuration 422; a bad request 400.

Security, in the order the ``Guard`` checks a request, before any route sees it:

- ``Host:`` (and ``Origin:`` when sent) must name this listener: its bind address (``localhost`` too on loopback;
  any address literal on a wildcard bind) or a name given with ``--api-host``; else 421. A web page that rebinds
  its own name to 127.0.0.1 reads nothing, not even ``/metrics`` or ``/healthz``;
- every path but ``/metrics``, ``/healthz`` and the status page's (``/`` and ``/page/...``, behind a session cookie
  its login form gives for the same token) needs ``Authorization: Bearer TOKEN`` (compared in constant time), reads
  included. The token comes from ``--api-token-file``, ``$RECONCILER_API_TOKEN``, or a file generated on first
  start (0600, ``$RECONCILER_STATE_DIR/HOST/api-token``), each file trusted by owner and mode; its name (the file's
  name, or ``env``) is the caller in the audit trail, its value is never logged or answered. Beside it the read
  token (``api-token-read``, generated likewise) is answered on the routes ``scopes.ROUTES`` calls read and refused
  (403, naming its scope) on those it calls write; a route not in that table needs the full token;
- event streams (``GET /mcp``) are bounded: ``MAX_STREAMS`` open, ``MAX_STREAMS_PER_TOKEN`` a token; past them 429;
- a body is read whole first, within ``BODY_TIMEOUT_S``: over ``MAX_BODY`` bytes is 413, chunked or not. Every body
  is JSON, read by one strict parser (``reconciler.base.jsonstrict``: a duplicate key or nesting too deep is 400)
  whatever the headers say: it needs exactly one ``Content-Type`` header, ``application/json`` (parameters allowed),
  else 400; a header that must be single (Host, Authorization, Content-Length, Origin, Content-Type) sent twice is 400.

Every refusal (400, 401, 403, 408, 413, 421, 429) is counted in ``reconciler_http_refusals_total`` by status and
reason, and logged (``api-refused``) and audited at most ``REFUSALS_AUDITED`` times a peer in ``REFUSAL_WINDOW_S``;
what is dropped beyond is summed up when the window ends ("N more refusals from PEER dropped in the last M s").

The listener is loopback unless ``--api-allow-remote`` is given, and then only with a token given explicitly and
over TLS (host.yaml's ``api.tls``: uvicorn's own, checked first by ``tls.check_tls``; under it /metrics needs a
token too), or plain HTTP where ``api.insecure`` says so. It cannot be silenced (``guarded_protocol``): a peer is a local user (the uid owning the connecting socket, found by
the kernel's ``sock_diag``; a local user has every loopback address, so an address says nothing) or a remote
address; each peer holds at most a ``PEER_SHARE``-th of the connections and all of them ``max_connections`` (past
either the oldest idle one is closed for the new one); a client must send its request head within
``HEAD_TIMEOUT_S``; an answer whose bytes the client does not take for ``WRITE_TIMEOUT_S`` drops its connection (and
a request pipelined behind an answer not taken waits for it); /healthz and /metrics have a small pool of their own
(``HEALTH_SLOTS``, ``HEALTH_PER_PEER`` a peer) for connections past those bounds; /metrics is rendered in a worker
thread, once for all the scrapes waiting; the service calls run in a bounded pool of worker threads, the open-file
limit is raised at start, an error in its event loop is logged and never ends it, and a listener that stops anyway
is started again (or the loop exits 1 for its supervisor to restart it). An address another process holds (a local
user who bound the port while the loop was down) never ends the loop: the supervisor binds it again with backoff,
saying who holds it, while the loop reconciles.

A destructive call (a confirmed reclaim, an apply) takes the loop's pass lock: it waits for a pass to end, and no
pass starts while it runs.

This ``__init__`` is the package's one facade: it assembles the app (``build_app``) and hands the loop what it
serves it with (``split_addr``, ``resolve_tokens``, ``check_tls``, ``check_exposure``, ``Supervisor``). The parts,
each in its module: ``limits`` (the bounds), ``errors``, ``tokens``, ``scopes`` (which token each route needs),
``tls``, ``hosts`` (addresses and names), ``peers``, ``refusals``,
``guard``, ``request_models``, ``routes``, ``endpoints`` (the table and the OpenAPI document), ``protocol`` (the
connection-level bounds) and ``listener``. The loop's pass lock and pass gate are ``reconciler.loop.runtime``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from reconciler.api.endpoints import ENDPOINTS
from reconciler.api.guard import Guard
from reconciler.api.hosts import AllowedHosts, check_exposure, split_addr
from reconciler.api.limits import MAX_BODY
from reconciler.api.listener import Supervisor
from reconciler.api.page import ROUTES as PAGE_ROUTES
from reconciler.api.page import page_state
from reconciler.api.refusals import Refusals
from reconciler.api.routes import AppContext, not_routed
from reconciler.api.tls import TlsFiles, check_tls
from reconciler.api.tokens import PUBLIC, Tokens, resolve_tokens

__all__ = ["Supervisor", "build_app", "check_exposure", "check_tls", "resolve_tokens", "split_addr"]


def build_app(
    root: str,
    *,
    tokens: Tokens,
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
    tls: TlsFiles | None = None,
    on_verdict: Callable[[Any], None] | None = None,
) -> Any:
    """The ASGI app (the ``Guard`` around Starlette): ``ENDPOINTS``, and MCP at /mcp. ``host``: the host's name, for
    the audit records of refused requests; ``port``: the listener's (the Host check); ``on_refusal(status, reason)``
    and ``on_drop(reason)``: the metrics of refused requests and dropped connections; ``tls``: the listener serves
    HTTPS with it (its ``Listener`` reads it from the app) and /metrics then needs a token too; ``on_verdict``: the
    metrics of the host's verdict, set from the page's snapshot at each scrape (with ``health``: a loop's)."""
    # An optional SDK (mcp, through the MCP server: about half a second of imports), loaded here rather than with the
    # package, so that a listener refused for its address or its token (``split_addr``, ``check_exposure``) is
    # refused as soon as before.
    from reconciler.mcp_server import build_server

    ctx = AppContext(
        root, tokens, pass_lock, host=host, log=log, metrics=metrics, health=health, cancel=cancel, hooks=hooks
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
        routes=[*(Route(ep.path, ep.handler, methods=[ep.method]) for ep in ENDPOINTS), *PAGE_ROUTES, *mcp_app.routes],
        lifespan=lifespan,
        exception_handlers={404: not_routed, 405: not_routed},
    )
    app.state.ctx = ctx
    refusals = Refusals(log=log, audit=ctx.audit, on_count=on_refusal, on_drop=on_drop)
    app.state.page = page_state(ctx, refusals, busy=getattr(pass_lock, "busy", None), cancel=cancel)
    ctx.verdict = app.state.page.snapshot.verdict if health is not None else None
    ctx.on_verdict = on_verdict
    public = PUBLIC if tls is None else frozenset({"/healthz"})
    guard = Guard(app, tokens=tokens, allowed=allowed, max_body=max_body, refusals=refusals, public=public)
    guard.tls = tls
    return guard
