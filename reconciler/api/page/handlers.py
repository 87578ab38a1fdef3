"""The page's routes: the page itself (``/``), its login and logout, the live part it polls (``/page/live``), its
static files, and its actions, each a POST form with the session's CSRF token that makes the same service call
with the same checks as the API's endpoint, audited as the web front-end (``web``) with the token's name; a session
opened with the read token is refused (403) every action ``reconciler.api.scopes`` calls a write:

    POST /page/plan     the plan saved now (as GET /v1/plan?save=true), shown with its id and the form to apply it
    POST /page/apply    that plan by its id (as POST /v1/apply): refused as stale when the host changed meanwhile
    POST /page/switch   the manifest's topology set (as ``reconciler switch``; the loop converges it)
    POST /page/reclaim  a dry run and its list; confirmed, exactly those paths (as POST /v1/shm/reclaim)
    POST /page/probe    a probe suite of a lane (as GET /v1/probe)

Every answer carries a strict Content-Security-Policy (``HEADERS``): scripts and styles from the listener alone,
none inline, nothing from any other origin. Built into the app by ``reconciler.api.build_app``.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

import reconciler.api.page.paths as paths
import reconciler.api.page.sections as sections
from reconciler.api.errors import _BadRequest
from reconciler.api.limits import STATE_PEER
from reconciler.api.page.markup import el, size
from reconciler.api.page.sessions import COOKIE, Session, Sessions, cookie_header
from reconciler.api.page.snapshot import PageProgress, Snapshot
from reconciler.api.page.templates import Html, render, static_file
from reconciler.api.peers import _address, peer_of
from reconciler.api.refusals import Refusal, Refusals
from reconciler.api.request_models import probe_params
from reconciler.api.scopes import WRITE, needed, refusal
from reconciler.api.tokens import TOKEN_ENV
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.base.redact import redact_data, redact_text
from reconciler.base.requests import is_plan_id
from reconciler.service import HostService

FRONT = "web"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # no-referrer would make a form's Origin "null", which the Guard refuses
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
STATIC = {
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
APPLY_WAIT_S = 1.5  # an apply still running after this is followed on the page itself
MAX_FIELDS = 4200  # a confirmed reclaim names each path (the API's body takes up to 4096)
GRAFANA = "examples/grafana-dashboard.json"  # named, not linked: the page loads and links nothing of another origin
_TOPOLOGY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


@dataclass
class PageState:
    """What the page's routes share, on ``app.state.page``."""

    service: Callable[[str], HostService]  # the service as the web front-end, for a caller (a token's name)
    refusals: Refusals
    snapshot: Snapshot
    progress: PageProgress
    cancel: threading.Event | None = None
    sessions: Sessions = field(default_factory=Sessions)


def _state(request: Request) -> PageState:
    return request.app.state.page


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return HTMLResponse(body, status_code=status, headers={**HEADERS, **(headers or {})})


def _redirect(to: str, headers: dict[str, str] | None = None) -> Response:
    return RedirectResponse(to, status_code=303, headers={**HEADERS, **(headers or {})})


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _session(request: Request) -> Session | None:
    return _state(request).sessions.get(request.cookies.get(COOKIE))


def _refuse(request: Request, status: int, reason: str, why: str, *, action: str, who: str | None = None) -> None:
    """A page request refused: counted, logged and audited as the API's refusals are (per peer, within bounds)."""
    scope = request.scope
    state = scope.get("state") or {}
    peer = str(state.get(STATE_PEER) or peer_of(scope.get("client"), None))
    _state(request).refusals.refuse(
        Refusal(
            status,
            reason,
            why,
            peer,
            _address(scope.get("client")),
            request.url.path[:200],
            front=FRONT,
            action=action,
            who=who,
        )
    )


async def _form(request: Request) -> dict[str, list[str]]:
    """The form body (read whole and bounded by the Guard already); ``_BadRequest`` for one that is not a form."""
    raw = await request.body()
    try:
        text = raw.decode("ascii")
        return urllib.parse.parse_qs(text, keep_blank_values=True, strict_parsing=bool(text), max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _BadRequest(f"the form body: {exc}") from None


def _one(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    if values is None:
        return None
    if len(values) != 1:
        raise _BadRequest(f"{name} is given more than once")
    return values[0]


async def _checked(request: Request, action: str) -> tuple[Session, dict[str, list[str]]] | Response:
    """The session and the form of an action, or the refusal answered: no session (401), a session of the read
    token on a write (403, before its form is read), a CSRF token missing or wrong (403), a body that is no form
    (400)."""
    session = _session(request)
    if session is None:
        _refuse(request, 401, "token", "no session: log in on the page", action=action)
        return _html(_login_page(request, "No session (or it ended): log in, then try again."), 401)
    need = needed(request.method, request.url.path)
    if session.scope != WRITE and need == WRITE:
        why = refusal(session.scope, request.method, request.url.path)
        _refuse(request, 403, "scope", why, action=action, who=session.who)
        return _html(_message_page("Refused", f"This session was opened with the read token: {why}."), 403)
    try:
        form = await _form(request)
        presented = _one(form, "csrf")
    except _BadRequest as exc:
        _refuse(request, 400, "body-json", f"bad request: {exc}", action=action, who=session.who)
        return _html(_message_page("Refused", str(exc)), 400)
    if not session.csrf_ok(presented):
        _refuse(request, 403, "origin", "the form's CSRF token is missing or wrong", action=action, who=session.who)
        return _html(_message_page("Refused", "The form's CSRF token is missing or wrong: reload the page."), 403)
    return session, form


def _message_page(title: str, text: str, kind: str = "message") -> str:
    return render("review.html", title=title, kind=kind, body=el("p", text, id="message"))


def _service(request: Request, session: Session) -> HostService:
    """The service as the web front-end: the caller is the token's name the session was opened with."""
    return _state(request).service(session.who)


async def _call(request: Request, session: Session, call: Callable[[HostService], Any]) -> tuple[Any, str | None]:
    """One service call in a worker thread: (result, None) or (None, the error in words, redacted)."""
    try:
        return await anyio.to_thread.run_sync(lambda: call(_service(request, session))), None
    except ConfigError as exc:
        return None, redact_text(
            "invalid configuration: " + "; ".join(f"{p.path}:{p.line}: {p.message}" for p in exc.problems)
        )
    except ReconcilerError as exc:
        return None, redact_text(str(exc))


# ---------------------------------------------------------------- the page


async def _live(request: Request) -> tuple[str, Html]:
    """The snapshot's ETag and markup; where the host cannot be looked at (a host file that does not validate), the
    error in words instead, as ``status`` gives it."""
    try:
        return await anyio.to_thread.run_sync(_state(request).snapshot.current)
    except ConfigError as exc:
        text = "; ".join(f"{p.path}:{p.line}: {p.message}" for p in exc.problems)
        return "", el("p", redact_text(f"The files do not validate: {text}"), id="error", class_="error")
    except ReconcilerError as exc:
        return "", el("p", redact_text(str(exc)), id="error", class_="error")


async def get_page(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return _redirect(paths.LOGIN)
    st = _state(request)
    etag, live = await _live(request)
    data = st.snapshot.data
    message, session.flash = session.flash, None
    running = (
        sorted({c.get("recipe") for c in (data.status.get("containers") or []) if c.get("recipe")}) if data else []
    )
    actions = sections.actions_section(
        session.csrf,
        topologies=data.topologies if data else (),
        topology=data.topology if data else None,
        recipes=[str(r) for r in running],
        read_only=session.scope != WRITE,
    )
    body = render(
        "page.html",
        host=(data.status.get("host") if data else "") or "",
        grafana=GRAFANA,
        csrf=session.csrf,
        flash=sections.flash(message),
        etag=etag,
        live=live,
        actions=actions,
    )
    return _html(body)


async def get_live(request: Request) -> Response:
    if _session(request) is None:
        return Response("log in again", status_code=401, media_type="text/plain", headers=HEADERS)
    etag, live = await _live(request)
    tag = f'"{etag}"'
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers={**HEADERS, "etag": tag})
    return _html(live, headers={"etag": tag})


async def get_static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return Response("no such file", status_code=404, media_type="text/plain", headers=HEADERS)
    return Response(
        static_file(name), media_type=STATIC[name], headers={**HEADERS, "cache-control": "private, max-age=300"}
    )


# ---------------------------------------------------------------- login


def _login_page(request: Request, message: str = "") -> str:
    """The login form, saying where the token is and that the tool asks for it nowhere else: a look-alike page of
    another user's on the loop's port (bound while the loop was down) asks for it too."""
    token = request.app.state.ctx.tokens.full
    where = f"the file {token.path}" if token.path else f"the loop's environment (${TOKEN_ENV})"
    return render(
        "login.html",
        where=where,
        message=el("p", message, id="login-error", class_="error") if message else Html(""),
    )


async def get_login(request: Request) -> Response:
    if _session(request) is not None:
        return _redirect(paths.ROOT)
    return _html(_login_page(request))


async def post_login(request: Request) -> Response:
    try:
        form = await _form(request)
        token = _one(form, "token") or ""
    except _BadRequest as exc:
        _refuse(request, 400, "body-json", f"bad request: {exc}", action="authenticate")
        return _html(_login_page(request, str(exc)), 400)
    matched = request.app.state.ctx.tokens.match(token.strip().encode()) if token else None
    if matched is None:
        _refuse(request, 401, "token", "wrong token" if token else "no token", action="authenticate")
        return _html(_login_page(request, "Wrong token: nothing was opened."), 401)
    session = _state(request).sessions.open(matched.name, scope=matched.scope)
    return _redirect(paths.ROOT, {"set-cookie": cookie_header(session.sid, secure=_secure(request))})


async def post_logout(request: Request) -> Response:
    checked = await _checked(request, "logout")
    if isinstance(checked, Response):
        return checked
    session, _ = checked
    _state(request).sessions.close(session.sid)
    return _redirect(paths.LOGIN, {"set-cookie": cookie_header("", secure=_secure(request), clear=True)})


# ---------------------------------------------------------------- actions


def _flash(session: Session, text: str, *, kind: str = "info", outcome: str = "") -> None:
    session.flash = redact_data({"text": text, "kind": kind, "outcome": outcome})


async def post_plan(request: Request) -> Response:
    checked = await _checked(request, "plan")
    if isinstance(checked, Response):
        return checked
    session, _ = checked
    res, error = await _call(request, session, lambda s: s.plan(save=True))
    if error is not None:
        return _html(_message_page("The plan could not be made", error), 409)
    body = sections.plan_review(redact_data(res.to_json()), session.csrf)
    return _html(render("review.html", title="Review the plan", kind="plan", body=body))


def _applied_text(plan_id: str, result: dict[str, Any]) -> tuple[str, str]:
    """The flash after an apply: its result, and what went wrong where it did."""
    outcome = str(result.get("result") or "")
    if outcome == "stale":
        changes = "; ".join(str(c) for c in (result.get("changes") or [])[:3])
        return f"Plan {plan_id[:8]} was refused: it is stale ({changes}). Review the plan again.", outcome
    failed = [a for a in result.get("actions") or () if isinstance(a, dict) and a.get("result") != "ok"]
    why = "; ".join(
        f"{a.get('kind')} {a.get('recipe') or ''}: {a.get('result')}: {a.get('detail')}" for a in failed[:3]
    )
    return f"Plan {plan_id[:8]}: {outcome}." + (f" {why}" if why else ""), outcome


async def post_apply(request: Request) -> Response:
    checked = await _checked(request, "apply")
    if isinstance(checked, Response):
        return checked
    session, form = checked
    try:
        plan_id = _one(form, "plan_id") or ""
        if not is_plan_id(plan_id):
            raise _BadRequest("plan_id: give the id of a plan this page showed (32 hex digits)")
    except _BadRequest as exc:
        _service(request, session).record_refusal("apply", f"bad request: {exc}")
        return _html(_message_page("Refused", str(exc)), 400)
    st = _state(request)
    done = threading.Event()

    def run() -> None:
        try:
            res = _service(request, session).apply_saved(plan_id, progress=st.progress, cancel=st.cancel)
            text, outcome = _applied_text(plan_id, res.to_json())
            _flash(session, text, kind="ok" if res.exit_code == 0 else "error", outcome=outcome)
        except ReconcilerError as exc:
            _flash(session, f"Plan {plan_id[:8]} was refused: {exc}", kind="error", outcome="refused")
        except Exception as exc:  # noqa: BLE001 - the page says so, and the listener goes on
            _flash(session, f"Plan {plan_id[:8]} failed: {type(exc).__name__}", kind="error", outcome="error")
        finally:
            done.set()

    threading.Thread(target=run, name="page-apply", daemon=True).start()
    if not await anyio.to_thread.run_sync(lambda: done.wait(APPLY_WAIT_S)):
        _flash(session, f"Applying plan {plan_id[:8]}: its lanes below show each phase.", outcome="running")
    return _redirect(paths.ROOT)


async def post_switch(request: Request) -> Response:
    checked = await _checked(request, "switch")
    if isinstance(checked, Response):
        return checked
    session, form = checked
    name = _one(form, "topology") or ""
    if not _TOPOLOGY.fullmatch(name):
        _service(request, session).record_refusal("switch", f"bad request: topology {name[:64]!r} is not a name")
        return _html(_message_page("Refused", "topology: give the name of one of the manifest's topologies"), 400)
    res, error = await _call(request, session, lambda s: s.switch(name))
    if error is not None:
        _flash(session, f"Switch refused: {error}", kind="error", outcome="refused")
    else:
        j = res.to_json()
        text = (
            f"Topology {j['topology']} set (was {j['from']}); the loop converges it."
            if j["changed"]
            else f"Topology {name} already runs."
        )
        _flash(session, text, kind="ok", outcome="switched")
    return _redirect(paths.ROOT)


async def post_reclaim(request: Request) -> Response:
    checked = await _checked(request, "shm-reclaim")
    if isinstance(checked, Response):
        return checked
    session, form = checked
    try:
        confirm = _one(form, "confirm") == "yes"
    except _BadRequest as exc:
        return _html(_message_page("Refused", str(exc)), 400)
    chosen = form.get("path") or []
    if not confirm:
        res, error = await _call(request, session, lambda s: s.shm_reclaim(confirm=False))
        if error is not None:
            return _html(_message_page("The dry run failed", error), 409)
        body = sections.reclaim_review(redact_data(res.to_json()), session.csrf)
        return _html(render("review.html", title="Reclaim orphan offload files", kind="reclaim", body=body))
    if not chosen:
        return _html(_message_page("Refused", "Confirm a dry run's list: no path was named."), 400)
    res, error = await _call(request, session, lambda s: s.shm_reclaim(confirm=True, paths=chosen))
    if error is not None:
        _flash(session, f"Reclaim refused: {error}", kind="error", outcome="refused")
    else:
        j = res.to_json()
        ok = res.exit_code == 0
        kept = "; ".join(f"{k.get('path')}: {k.get('reason')}" for k in j.get("kept") or () if isinstance(k, dict))
        text = f"Reclaimed {len(j.get('reclaimed') or [])} file(s), {size(j.get('reclaimed_bytes') or 0)}" + (
            "" if ok else f"; refused: {j.get('error') or kept}"
        )
        _flash(session, text, kind="ok" if ok else "error", outcome="reclaimed" if ok else "refused")
    return _redirect(paths.ROOT)


async def post_probe(request: Request) -> Response:
    checked = await _checked(request, "probe")
    if isinstance(checked, Response):
        return checked
    session, form = checked
    try:
        recipe, suite = probe_params(_one(form, "recipe"), _one(form, "suite"))
    except _BadRequest as exc:
        return _html(_message_page("Refused", str(exc)), 400)
    res, error = await _call(request, session, lambda s: s.probe(recipe, suite=suite))
    if error is not None:
        _flash(session, f"Probe refused: {error}", kind="error", outcome="refused")
    else:
        probes = res.to_json().get("probes") or []
        passed = sum(1 for p in probes if p.get("ok"))
        text = f"Probe suite {suite} of {recipe}: {passed}/{len(probes)} passed."
        _flash(session, text, kind="ok" if res.exit_code == 0 else "error", outcome="probed")
    return _redirect(paths.ROOT)


ROUTES = (
    Route(paths.ROOT, get_page, methods=["GET"]),
    Route(paths.LOGIN, get_login, methods=["GET"]),
    Route(paths.LOGIN, post_login, methods=["POST"]),
    Route(paths.LOGOUT, post_logout, methods=["POST"]),
    Route(paths.LIVE, get_live, methods=["GET"]),
    Route(paths.STATIC + "{name}", get_static, methods=["GET"]),
    Route(paths.PLAN, post_plan, methods=["POST"]),
    Route(paths.APPLY, post_apply, methods=["POST"]),
    Route(paths.SWITCH, post_switch, methods=["POST"]),
    Route(paths.RECLAIM, post_reclaim, methods=["POST"]),
    Route(paths.PROBE, post_probe, methods=["POST"]),
)
