"""Which token each route of the listener needs, in one table (``ROUTES``): ``public`` (no token), ``read`` (the read
token suffices: nothing on the host changes) or ``write`` (the full token: a route that changes anything, or may).

Every route the app serves is in it, the status page's and MCP's included: tests/contract/test_api_scopes.py fails
on a route the table does not classify, and on an entry no route answers, so a new route is classified when it is
added. A path and method the table does not know needs the full token (fail closed).

Read by the guard (a bearer token's scope: 403 naming the scope), the page's handlers (a session's scope, from the
token it was opened with) and the plan route (``save`` keeps a plan for an apply: a write). Imports nothing, so
every module of the API can import it (the paths are written out: the contract test holds them to the routes).
"""

from __future__ import annotations

PUBLIC, READ, WRITE = "public", "read", "write"
ANY = "*"  # every method (MCP's one path answers GET, POST and DELETE)
STATIC = "/page/static/"  # the page's static files, one route for all

ROUTES: dict[tuple[str, str], str] = {
    # The HTTP API (reconciler.api.endpoints)
    ("GET", "/v1/status"): READ,
    ("GET", "/v1/plan"): READ,  # with save=true a write: the plan kept is what POST /v1/apply takes
    ("GET", "/v1/shm"): READ,
    ("GET", "/v1/audit"): READ,
    ("GET", "/v1/probe"): READ,  # the lane's own endpoints asked; nothing on the host changes
    ("POST", "/v1/shm/reclaim"): WRITE,  # a dry run too: the read token reads /v1/shm
    ("POST", "/v1/apply"): WRITE,
    ("POST", "/v1/switch"): WRITE,
    ("POST", "/v1/sync"): WRITE,
    ("POST", "/v1/promote"): WRITE,
    ("GET", "/v1/openapi.json"): READ,
    ("GET", "/metrics"): PUBLIC,  # under TLS a token (read) is needed: ``Guard``'s public paths
    ("GET", "/healthz"): PUBLIC,
    # MCP: host_manage applies and reclaims; its tools are not told apart here, so all of it needs the full token.
    (ANY, "/mcp"): WRITE,
    # The status page (reconciler.api.page.handlers): a session has the scope of the token it was opened with.
    ("GET", "/"): READ,
    ("GET", "/page/login"): PUBLIC,
    ("POST", "/page/login"): PUBLIC,
    ("POST", "/page/logout"): READ,
    ("GET", "/page/live"): READ,
    ("GET", STATIC + "{name}"): PUBLIC,
    ("POST", "/page/plan"): WRITE,  # the plan is kept for the apply form beside it
    ("POST", "/page/apply"): WRITE,
    ("POST", "/page/switch"): WRITE,
    ("POST", "/page/reclaim"): WRITE,
    ("POST", "/page/probe"): READ,
}


def needed(method: str, path: str) -> str:
    """The scope a request needs: its route's in ``ROUTES``, else ``write``."""
    method = "GET" if method == "HEAD" else method
    if path.startswith(STATIC) and method == "GET":
        return ROUTES[("GET", STATIC + "{name}")]
    return ROUTES.get((method, path)) or ROUTES.get((ANY, path)) or WRITE


def refusal(scope: str, method: str, path: str, *, what: str = "") -> str:
    """Why a token of ``scope`` is refused for a request (the 403's error)."""
    return (
        f"this token has the {scope} scope: {what or f'{method} {path}'} needs the write scope (the full API "
        "token); the read token reads status, plan, shm, audit, probes and metrics"
    )
