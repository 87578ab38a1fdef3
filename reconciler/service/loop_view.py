"""What a running loop holds, as the planner takes it: ``plan``, ``status`` and ``apply`` plan with the loop's view
(the lanes it holds in backoff, the last converged topology its fallback serves), so they show and do what the loop
does meanwhile. Read from the loop's published state (``reconciler.store.loop_state``); called by the service's
calls (``reconciler.service.host_service``, ``reconciler.service.status``).
"""

from __future__ import annotations

import time
from typing import Any

from reconciler.base.units import clip
from reconciler.store.history import last_topology
from reconciler.store.loop_state import read_loop_state


def loop_view(host: str) -> dict[str, Any]:
    """What a running loop holds, as the planner's keyword arguments (``hold``, ``last_good``, ``next_attempt``):
    ``plan`` and ``status`` then show what the loop does meanwhile (a held lane, its fallback). Empty without a
    live loop or with nothing held."""
    state = read_loop_state(host) or {}
    now = time.time()
    hold: dict[str, str] = {}
    next_attempt: dict[str, float] = {}
    backoff = state.get("backoff")
    for key, e in (backoff if isinstance(backoff, dict) else {}).items():
        try:
            until = float(e["until"])
        except (KeyError, TypeError, ValueError):
            continue
        if until > now:
            hold[key] = (
                f"in backoff after {e.get('failures', '?')} failed enter(s) (the running loop's); next try "
                f"in {until - now:.0f} s (last error: {clip(str(e.get('last_error', '')), 300)})"
            )
            next_attempt[key] = until - now
    if not hold:
        return {}
    return {"hold": hold, "last_good": last_topology(host), "next_attempt": next_attempt}
