"""The host's status page at ``/`` on the loop's listener: server-rendered HTML, live, safe.

A front-end over the service layer like the API beside it (``reconciler.service``; never the command line or MCP),
served by the same Starlette app behind the same ``Guard`` (the Host check against DNS rebinding, bounded bodies),
with a session cookie instead of a bearer token (``sessions``): the token is given once on a login form. The parts:
``paths`` (what is the page's), ``templates`` and ``markup`` (escaped by construction), ``view`` (header, slot and
lane cards), ``sections`` (plan, tmpfs, audit trail, forms), ``snapshot`` (one view for every browser, made again
when something may have changed), ``handlers`` (the routes, the CSP). Templates and static files are package data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from reconciler.api.page.handlers import FRONT, ROUTES, PageState
from reconciler.api.page.snapshot import PageProgress, Snapshot
from reconciler.api.refusals import Refusals

__all__ = ["ROUTES", "page_state"]


def page_state(
    ctx: Any,
    refusals: Refusals,
    *,
    busy: Callable[[], bool] | None = None,
    cancel: threading.Event | None = None,
) -> PageState:
    """What the page's routes share: ``ctx`` is the API's ``AppContext`` (its root, token and service)."""
    progress = PageProgress()
    snapshot = Snapshot(ctx.root, lambda: ctx.service(FRONT), health=ctx.health, busy=busy, progress=progress)
    return PageState(lambda who: ctx.service(FRONT, who), refusals, snapshot, progress, cancel=cancel)
