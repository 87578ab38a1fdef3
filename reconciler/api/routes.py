"""The API's routes, one function each (``get_status``, ``get_plan``, ``get_shm``, ``get_audit``, ``get_probe``,
``post_reclaim``, ``post_apply``, ``post_switch``, ``post_sync``, ``get_metrics``, ``get_healthz``), and what they share: ``AppContext`` (on
``app.state.ctx``: the root, the token, the loop's pass lock, metrics and health), ``SharedScrape`` (/metrics
rendered once for all the scrapes waiting) and ``_run`` (one service call in a worker thread, its answer or its
error, never a traceback).

Each answer's body is the command line's ``--json``, redacted once more; the table of routes and the OpenAPI
document are ``reconciler.api.endpoints``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler.api.errors import _BadRequest
from reconciler.api.limits import STATE_CALLER
from reconciler.api.request_models import (
    ApplyBody,
    AuditQuery,
    PlanQuery,
    ProbeQuery,
    PromoteBody,
    ReclaimBody,
    SwitchBody,
    SyncBody,
    _body,
    _Query,
    _query,
    probe_params,
)
from reconciler.api.scopes import WRITE, refusal
from reconciler.api.tokens import ApiToken, Tokens
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.base.redact import redact_data, redact_text
from reconciler.loop.health import with_verdict
from reconciler.loop.metrics import CONTENT_TYPE
from reconciler.loop.runtime import PassGate
from reconciler.plan.verdict import Verdict
from reconciler.service import Caller, HostService, parse_since
from reconciler.store.audit import audit_log


@dataclass
class AppContext:
    """Everything a route needs, on ``app.state.ctx``: the root, the listener's tokens, the loop's pass lock and the
    loop's metrics and health."""

    root: str
    tokens: Tokens
    pass_lock: Any
    host: str | None = None
    log: Callable[..., None] | None = None
    metrics: Callable[[], bytes] | None = None
    health: Callable[[], tuple[int, dict[str, Any]]] | None = None
    cancel: threading.Event | None = None
    hooks: Any = None
    scrape: SharedScrape = field(default_factory=lambda: SharedScrape())
    # The host's verdict now (the status page's snapshot: one look shared by the page, /healthz and /metrics), and
    # what the metrics make of it (``reconciler_drift``, ``reconciler_verdict``).
    verdict: Callable[[], Verdict | None] | None = None
    on_verdict: Callable[[Verdict], None] | None = None

    def service(self, front: str, who: str | None = None) -> HostService:
        """The service for ``front``, its caller ``who`` (a token's name; by default the full token's)."""
        kwargs: dict[str, Any] = {"hooks": self.hooks} if self.hooks is not None else {}
        return HostService(
            self.root,
            caller=Caller(front, who or self.tokens.full.name),
            pass_lock=PassGate(self.pass_lock, self.log, front),
            **kwargs,
        )

    def audit(self, record: dict[str, Any]) -> None:
        """One record in the host's audit trail (an audit that cannot be written is logged, never fatal here)."""
        if self.host is None:
            return
        try:
            audit_log(self.host).append(record)
        except ReconcilerError as exc:
            if self.log:
                self.log("audit-error", error=str(exc))

    def refused_request(self, front: str, action: str, reason: str, who: str | None = None) -> None:
        """A destructive request refused before it reached the service (a bad body): audited with why."""
        who = who or self.tokens.full.name
        self.audit({"front": front, "who": who, "action": action, "outcome": "refused", "reason": reason})


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


def _caller(request: Request) -> ApiToken | None:
    """The token the request came with (the Guard put it there)."""
    token = (request.scope.get("state") or {}).get(STATE_CALLER)
    return token if isinstance(token, ApiToken) else None


def _who(request: Request) -> str | None:
    token = _caller(request)
    return token.name if token is not None else None


def _answer(res: Any, *, write: bool) -> Response:
    code = res.exit_code
    status = 409 if write and code != 0 else 200
    return JSONResponse(redact_data(res.to_json()), status_code=status, headers={"X-Reconciler-Exit-Code": str(code)})


async def _run(request: Request, call: Callable[[HostService], Any], *, write: bool = False) -> Response:
    """One service call in a worker thread, its result or error as the answer (never a traceback)."""
    ctx = _ctx(request)
    try:
        res = await anyio.to_thread.run_sync(lambda: call(ctx.service("api", _who(request))))
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
    if action is not None:
        _ctx(request).refused_request("api", action, f"bad request: {exc}", _who(request))
    return JSONResponse({"error": str(exc)}, status_code=400)


async def not_routed(request: Request, exc: Exception) -> Response:
    """A path no route serves (404), or a method its route does not take (405): JSON like every other error, with
    where to look (405 keeps its ``Allow`` header)."""
    status = getattr(exc, "status_code", 404)
    headers = getattr(exc, "headers", None) or {}
    where = f"{request.method} {request.url.path}"
    if status == 405:
        allowed = headers.get("Allow", "")
        why = f"{where}: this route does not take {request.method}" + (f"; it takes {allowed}" if allowed else "")
    else:
        why = f"{where}: no such route; GET /v1/openapi.json lists them"
    return JSONResponse({"error": why}, status_code=status, headers=headers)


# ---------------------------------------------------------------- the routes, one function each


async def get_status(request: Request) -> Response:
    """``status --json``."""
    try:
        _query(request, _Query)
    except _BadRequest as exc:
        return _bad(request, exc)
    return await _run(request, lambda s: s.status())


async def get_plan(request: Request) -> Response:
    """``plan --json``; with ``save`` the plan is kept and its ``plan_id`` is for POST /v1/apply: a write (403 to
    the read token)."""
    try:
        q = _query(request, PlanQuery)
    except _BadRequest as exc:
        return _bad(request, exc)
    token = _caller(request)
    if q.save and token is not None and not token.allows(WRITE):
        why = refusal(token.scope, "GET", "/v1/plan", what="save=true (a plan kept for POST /v1/apply)")
        return JSONResponse({"error": why, "scope": token.scope, "needs": WRITE}, status_code=403)
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


async def post_switch(request: Request) -> Response:
    """``switch NAME --json``: the manifest's running topology set to NAME; the loop converges it (its file watch)."""
    try:
        body = await _body(request, SwitchBody)
    except _BadRequest as exc:
        return _bad(request, exc, action="switch")
    return await _run(request, lambda s: s.switch(body.topology), write=True)


async def post_promote(request: Request) -> Response:
    """``promote ALIAS RECIPE --json``: the alias set to RECIPE when its evidence passes every gate of the alias."""
    try:
        body = await _body(request, PromoteBody)
    except _BadRequest as exc:
        return _bad(request, exc, action="promote")
    return await _run(request, lambda s: s.promote(body.alias, body.recipe), write=True)


async def post_sync(request: Request) -> Response:
    """``sync --json``: fetch the host's git source now; its newest commit taken where it may be (the loop converges
    it at once: the record it writes is watched)."""
    try:
        await _body(request, SyncBody)
    except _BadRequest as exc:
        return _bad(request, exc, action="sync")
    return await _run(request, lambda s: s.sync(), write=True)


async def get_metrics(request: Request) -> Response:
    """The loop's Prometheus metrics (no token: Prometheus scrapes it)."""
    ctx = _ctx(request)
    metrics = ctx.metrics
    if metrics is None:
        return JSONResponse({"error": "no metrics here"}, status_code=404)
    verdict, on_verdict = ctx.verdict, ctx.on_verdict

    def render() -> bytes:
        # The verdict gauges as of this scrape, from the look every view shares (made again only on a change).
        if verdict is not None and on_verdict is not None and (v := verdict()) is not None:
            on_verdict(v)
        return metrics()

    return Response(await ctx.scrape.get(render), media_type=CONTENT_TYPE)


async def get_healthz(request: Request) -> Response:
    """200 after a recent pass that read every source, else 503 with why (no token: supervisors ask it)."""
    health = _ctx(request).health
    if health is None:
        return JSONResponse({"ok": True})
    code, body = health()
    verdict = _ctx(request).verdict
    if verdict is not None:
        body = with_verdict(body, await anyio.to_thread.run_sync(verdict))
    return JSONResponse(redact_data(body), status_code=code)
