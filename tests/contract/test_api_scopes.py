"""Every route the listener serves is classified in ``reconciler.api.scopes.ROUTES`` (public, read or write), and the
table names no route the app does not serve: a route added without its scope fails here, before a read token can
reach it. The writes the read token must never make are write (apply, switch, reclaim, sync, MCP, the page's
forms that change something); what is not in the table needs the full token."""

from __future__ import annotations

import threading

from starlette.routing import Mount, Route

from reconciler.api import build_app
from reconciler.api.scopes import ANY, PUBLIC, READ, ROUTES, WRITE, needed
from reconciler.api.tokens import READ as READ_SCOPE
from reconciler.api.tokens import ApiToken, Tokens

FULL = ApiToken("f" * 32, "api-token", "file", "/x/api-token")
READ_TOKEN = ApiToken("r" * 32, "api-token-read", "generated", "/x/api-token-read", scope=READ_SCOPE)


def _served() -> set[tuple[str, str]]:
    """(method, path) of every route of the app ``reconciler run`` serves (HEAD is GET's)."""
    guard = build_app("/nonexistent", tokens=Tokens(FULL, READ_TOKEN), pass_lock=threading.Lock())
    out: set[tuple[str, str]] = set()
    for route in guard.app.routes:
        assert isinstance(route, (Route, Mount)), route
        methods = getattr(route, "methods", None)
        for method in sorted(methods - {"HEAD"}) if methods else [ANY]:
            out.add((method, route.path))
    return out


def test_every_route_is_classified_and_every_entry_is_a_route() -> None:
    served = _served()
    unclassified = sorted(served - set(ROUTES))
    assert unclassified == [], f"classify these routes in reconciler/api/scopes.py ROUTES: {unclassified}"
    stale = sorted(set(ROUTES) - served)
    assert stale == [], f"reconciler/api/scopes.py ROUTES names routes the app does not serve: {stale}"
    assert set(ROUTES.values()) <= {PUBLIC, READ, WRITE}


def test_the_writes_are_write_and_what_is_unknown_needs_the_full_token() -> None:
    for method, path in [
        ("POST", "/v1/apply"),
        ("POST", "/v1/switch"),
        ("POST", "/v1/shm/reclaim"),
        ("POST", "/v1/sync"),
        ("POST", "/mcp"),
        ("GET", "/mcp"),
        ("DELETE", "/mcp"),
        ("POST", "/page/apply"),
        ("POST", "/page/switch"),
        ("POST", "/page/reclaim"),
        ("POST", "/page/plan"),
        ("PUT", "/v1/status"),
        ("GET", "/v1/anything-new"),
    ]:
        assert needed(method, path) == WRITE, (method, path)
    # Whatever is not a GET of the API is a write, but for the page's login, logout and probe.
    for (method, path), scope in ROUTES.items():
        if path.startswith("/v1/") and method != "GET":
            assert scope == WRITE, (method, path)
    assert needed("HEAD", "/v1/status") == READ and needed("GET", "/page/static/page.css") == PUBLIC
    assert READ_TOKEN.allows(READ) and READ_TOKEN.allows(PUBLIC) and not READ_TOKEN.allows(WRITE)
    assert FULL.allows(WRITE) and FULL.allows(READ)


def test_a_token_is_matched_by_value_and_the_read_one_is_never_the_full_one() -> None:
    tokens = Tokens(FULL, READ_TOKEN)
    assert tokens.match(b"f" * 32) is FULL and tokens.match(b"r" * 32) is READ_TOKEN
    assert tokens.match(b"x" * 32) is None and Tokens(FULL).match(b"r" * 32) is None
