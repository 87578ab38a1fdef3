"""``reconciler prune``: the failed containers this install kept for their logs (never another's), listed, or
removed under the host's lock, each only while it is still stopped, each removal in the audit trail.

Called by ``reconciler.service.host_service.HostService.prune``, with its ``CallContext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.apply.engine_ops import EngineOps
from reconciler.apply.host_io import REAL_IO
from reconciler.base.errors import ReconcilerError
from reconciler.plan.observed import INACTIVE_STATES
from reconciler.plan.planner import kept_failed
from reconciler.service.results import PruneResult
from reconciler.store import state

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def prune_kept_failed(ctx: CallContext, *, confirm: bool) -> PruneResult:
    """The failed containers of this install kept for their logs: listed (a dry run), or with ``confirm`` removed,
    all of them at once, each only while it is still stopped (logged in the audit trail)."""
    desired = ctx.desired()
    host = desired.host.name
    observer = (ctx.io or REAL_IO).engine(desired.host)

    def look() -> list[Any]:
        containers, source = observer.observe()
        if not source.ok:
            raise ReconcilerError(f"docker source unavailable: {source.detail}; nothing pruned")
        return kept_failed(host, containers, state.read_ownership(host))

    def describe(c: Any) -> dict[str, Any]:
        return {
            "name": c.name,
            "id": c.id,
            "recipe": c.recipe,
            "gpus": list(c.slots),
            "state": c.state,
            "exit_code": c.exit_code,
        }

    if not confirm:
        return PruneResult(host, False, [describe(c) for c in look()])
    with ctx.exclusive(host, "prune"):
        found = look()
        ops = EngineOps(connect=observer.writes, url=observer.url, ping=observer.ping)
        res = PruneResult(host, True, [describe(c) for c in found])
        for c in found:
            try:
                status = (ops.inspect(c.id).get("State") or {}).get("Status")
                if status not in INACTIVE_STATES:
                    res.failed.append({"name": c.name, "reason": f"it is {status} now: left as it is"})
                    continue
                ops.remove(c.id)
            except Exception as exc:  # noqa: BLE001 - say which one could not be removed, and go on
                res.failed.append({"name": c.name, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            res.removed.append(c.name)
            ctx.record(host, "prune", outcome="ok", reason=f"removed kept failed container {c.name}", container=c.name)
        return res
